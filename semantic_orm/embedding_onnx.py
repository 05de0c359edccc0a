"""The ONNX Runtime backend of :class:`~semantic_orm.embedding.SentenceTransformerEmbedder`.

A sentence-transformers model made of a BERT-family ``Transformer``, a ``Pooling`` layer and
optionally ``Normalize`` (all-MiniLM-L6-v2, BGE, E5, GTE, Arctic-embed...) is exported from its
local weights with ``torch.onnx.export`` on first use, quantised to dynamic int8 with
``onnxruntime.quantization.quantize_dynamic`` (``precision="int8"``, the weight layout chosen
from the CPU: ``avx512_vnni``/``avx512``/``avx2``/``arm64``), and then run with plain
``onnxruntime`` and the model's own tokenizer: no optimum, so sentence-transformers is not
downgraded. Pooling follows the model's ``1_Pooling/config.json``.

The export is cached in a directory keyed by the model's path and weight files, the precision,
the quantisation layout and the onnxruntime version (:func:`export_dir`): the first process
exports, later ones load the file. It is written into a temporary directory and renamed into
place, so two processes exporting at once never leave a half-written model (the loser's copy
is discarded).

Nothing here imports onnxruntime, torch or transformers until a model is loaded or exported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .exc import ConfigurationError, EmbeddingError, MissingDependencyError

__all__ = [
    "OnnxModel",
    "export_dir",
    "onnx_available",
    "quantization_layout",
    "supports_onnx",
]

ONNX_HINT = "pip install 'semantic-orm[onnx]' (onnxruntime and onnx)"
_MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta"})
_POOLING = ("cls_token", "mean_tokens", "max_tokens", "lasttoken")
_FILE = "model.onnx"


def onnx_available() -> bool:
    """Whether onnxruntime and onnx are installed (checked without importing them)."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _layout(path: Path) -> tuple[str, dict[str, Any]] | None:
    """``(transformer dir, pooling config)`` of a supported local model, else ``None``."""
    try:
        modules = json.loads((path / "modules.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds[:2] != ["Transformer", "Pooling"] or any(k != "Normalize" for k in kinds[2:]):
        return None
    transformer = path / str(modules[0].get("path", ""))
    pooling = _read_json(path / str(modules[1].get("path", "")) / "config.json")
    config = _read_json(transformer / "config.json")
    if config.get("model_type") not in _MODEL_TYPES:
        return None
    modes = [m for m in _POOLING if pooling.get(f"pooling_mode_{m}")]
    if len(modes) != 1 or pooling.get("include_prompt") is False:
        return None
    return str(transformer), pooling


def supports_onnx(path: str) -> bool:
    """Whether the local model at ``path`` can run on this backend (BERT-family encoder,
    one pooling mode, no Dense layer); hub names that are not local paths cannot."""
    return _layout(Path(path)) is not None


def quantization_layout() -> str:
    """The dynamic-int8 weight layout matching this CPU (as optimum names them)."""
    if platform.machine().lower() in {"aarch64", "arm64"}:
        return "arm64"
    try:
        flags = Path("/proc/cpuinfo").read_text("utf-8", "replace")
    except OSError:
        flags = ""
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags:
        return "avx512"
    return "avx2"


def default_cache_dir() -> Path:
    """``$SEMANTIC_ORM_CACHE``, else ``$XDG_CACHE_HOME/semantic_orm``, else
    ``~/.cache/semantic_orm``."""
    found = os.environ.get("SEMANTIC_ORM_CACHE")
    if found:
        return Path(found)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "semantic_orm"


def export_dir(path: str, precision: str, cache_dir: str | os.PathLike[str] | None) -> Path:
    """Where the export of the model at ``path`` with ``precision`` lives (or will).

    Keyed by the model's resolved path, the size and modification time of its files, the
    precision, the int8 layout and the onnxruntime version, so a retrained model, another CPU
    family or an onnxruntime upgrade gets its own export.
    """
    import onnxruntime

    root = Path(path).resolve()
    files = sorted(
        (str(p.relative_to(root)), p.stat().st_size, int(p.stat().st_mtime))
        for p in root.rglob("*")
        if p.is_file() and p.suffix in {".safetensors", ".bin", ".json", ".txt"}
    )
    layout = quantization_layout() if precision == "int8" else "none"
    key = json.dumps([str(root), files, precision, layout, onnxruntime.__version__])
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).hexdigest()
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return base / "onnx" / f"{root.name}-{precision}-{digest}"


def _export(path: str, transformer: str, precision: str, final: Path) -> None:
    """Export (and quantise) the model into ``final``, atomically."""
    try:
        import onnx  # noqa: F401  (torch.onnx.export and the quantiser need it)
        import torch
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from transformers import AutoModel
    except ImportError as exc:
        raise MissingDependencyError(
            f"exporting {path!r} to ONNX needs onnx, torch and transformers: {ONNX_HINT}"
        ) from exc

    class LastHidden(torch.nn.Module):
        """The encoder's last hidden state, with BERT's additive mask built by hand
        (transformers 5's mask helpers do not trace)."""

        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            h = self.model.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
            mask = attention_mask[:, None, None, :].to(h.dtype)
            ext = (1.0 - mask) * torch.finfo(h.dtype).min
            return self.model.encoder(h, attention_mask=ext).last_hidden_state

    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        bert = AutoModel.from_pretrained(transformer, attn_implementation="eager").eval()
        ids = torch.ones(2, 16, dtype=torch.long)
        names = ["input_ids", "attention_mask", "token_type_ids"]
        fp32 = tmp / ("fp32.onnx" if precision == "int8" else _FILE)
        with torch.no_grad(), warnings.catch_warnings():
            # the TorchScript exporter is deprecated, but the dynamo one does not trace BERT here
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(
                LastHidden(bert),
                (ids, ids, torch.zeros_like(ids)),
                str(fp32),
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_axes={n: {0: "batch", 1: "seq"} for n in [*names, "last_hidden_state"]},
                opset_version=17,
                dynamo=False,
            )
        if precision == "int8":
            layout = quantization_layout()
            quantize_dynamic(
                str(fp32),
                str(tmp / _FILE),
                per_channel=True,
                reduce_range=False,
                weight_type=QuantType.QUInt8 if layout == "avx2" else QuantType.QInt8,
            )
            fp32.unlink()
        (tmp / "export.json").write_text(
            json.dumps({"model": path, "precision": precision}), "utf-8"
        )
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / _FILE).exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class OnnxModel:
    """A sentence-transformers model run by ONNX Runtime (see the module docstring).

    Offers the part of ``SentenceTransformer`` the embedder uses: ``tokenizer``,
    ``max_seq_length``, ``prompts``, ``default_prompt_name``, ``get_embedding_dimension()`` and
    ``encode(texts, batch_size=..., prompt=...)``.

    Args:
        path: Local model directory.
        precision: ``"int8"`` (dynamic quantisation) or ``"fp32"``.
        cache_dir: Where exports are kept (default :func:`default_cache_dir`).
    """

    exported: bool
    """Whether constructing this model exported it (``False``: the cached export was reused)."""

    def __init__(
        self, path: str, precision: str, cache_dir: str | os.PathLike[str] | None = None
    ) -> None:
        try:
            import onnxruntime
        except ImportError as exc:
            raise MissingDependencyError(f"backend='onnx' needs onnxruntime: {ONNX_HINT}") from exc
        if precision not in {"int8", "fp32"}:
            raise ConfigurationError(
                f"backend='onnx' supports precision 'int8' or 'fp32', got {precision!r}"
            )
        layout = _layout(Path(path))
        if layout is None:
            raise ConfigurationError(
                f"backend='onnx' needs a local sentence-transformers model made of a BERT-family "
                f"Transformer, one Pooling mode and optionally Normalize; {path!r} is not one "
                "(use backend='torch')"
            )
        transformer, pooling = layout
        self.directory = export_dir(path, precision, cache_dir)
        self.exported = False
        if not (self.directory / _FILE).exists():
            _export(path, transformer, precision, self.directory)
            self.exported = True
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(transformer)
        st_config = _read_json(Path(path) / "config_sentence_transformers.json")
        bert_config = _read_json(Path(path) / "sentence_bert_config.json")
        self.max_seq_length = int(
            bert_config.get("max_seq_length") or self.tokenizer.model_max_length
        )
        self.prompts: dict[str, str] = dict(st_config.get("prompts") or {})
        self.default_prompt_name: str | None = st_config.get("default_prompt_name")
        self._mode = next(m for m in _POOLING if pooling.get(f"pooling_mode_{m}"))
        self._dimension = int(pooling["word_embedding_dimension"])
        options = onnxruntime.SessionOptions()
        self.session = onnxruntime.InferenceSession(
            str(self.directory / _FILE), options, providers=["CPUExecutionProvider"]
        )
        self._inputs = {i.name for i in self.session.get_inputs()}

    def get_embedding_dimension(self) -> int:
        """Length of the sentence embeddings."""
        return self._dimension

    def encode(
        self, texts: Sequence[str], *, batch_size: int = 64, prompt: str | None = None
    ) -> npt.NDArray[np.float32]:
        """Embed ``texts`` (each prefixed with ``prompt``) into L2-normalised rows.

        Texts are sorted by length before batching, as sentence-transformers does.
        """
        items = [f"{prompt or ''}{t}" for t in texts]
        order = np.argsort([-len(t) for t in items], kind="stable")
        out = np.zeros((len(items), self._dimension), dtype=np.float32)
        for start in range(0, len(items), batch_size):
            picked = order[start : start + batch_size]
            out[picked] = self._batch([items[i] for i in picked])
        return out

    def _batch(self, texts: list[str]) -> npt.NDArray[np.float32]:
        enc = self.tokenizer(
            texts,
            padding=True,
            truncation="longest_first",
            max_length=self.max_seq_length,
            return_tensors="np",
        )
        ids = enc["input_ids"].astype(np.int64)
        mask = enc["attention_mask"].astype(np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            types = enc.get("token_type_ids")
            feeds["token_type_ids"] = (
                np.zeros_like(ids) if types is None else types.astype(np.int64)
            )
        try:
            hidden = self.session.run(None, feeds)[0]
        except Exception as exc:
            raise EmbeddingError(f"ONNX model {self.directory} failed to encode: {exc}") from exc
        m = mask[..., None].astype(np.float32)
        if self._mode == "cls_token":
            vectors = hidden[:, 0]
        elif self._mode == "max_tokens":
            vectors = np.where(m > 0, hidden, -1e9).max(axis=1)
        elif self._mode == "lasttoken":
            last = mask.sum(axis=1) - 1
            vectors = hidden[np.arange(len(texts)), last]
        else:
            vectors = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return np.asarray(vectors / np.clip(norms, 1e-12, None), dtype=np.float32)
