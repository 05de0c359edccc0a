"""The ONNX backends of :class:`~semantic_orm.embedding.SentenceTransformerEmbedder`: one
export of the model, run by ONNX Runtime (``backend="onnx"``) or OpenVINO (``"openvino"``).

A sentence-transformers model made of a BERT-family ``Transformer``, a ``Pooling`` layer and
optionally ``Normalize`` (all-MiniLM-L6-v2, BGE, E5, GTE, Arctic-embed...) is exported from its
local weights with ``torch.onnx.export`` on first use, its attention and normalisation layers
fused into ONNX Runtime's ``Attention``/``SkipLayerNormalization``/``BiasGelu`` kernels (checked
against the traced graph, else left traced), quantised to dynamic int8 with
``onnxruntime.quantization.quantize_dynamic`` (``precision="int8"``; weights 7-bit on x86 CPUs
without VNNI, whose int8 products saturate in 16 bits: ``avx2``/``avx512``, full 8-bit on
``avx512_vnni``/``avx_vnni``/``arm64``), and then run with plain ``onnxruntime`` and the model's own
tokenizer: no optimum, so sentence-transformers is not downgraded. Pooling follows the model's
``1_Pooling/config.json``.

OpenVINO reads the same fp32 export (its ONNX front end knows the fused kernels) and compiles it
for the CPU in ``fp32`` or, on a CPU it runs bfloat16 on, ``bf16`` (the precision read back from
the compiled model); on first use of an export with an OpenVINO version and precision, its
hidden states are compared with ONNX Runtime's on the probe batch and the result recorded
beside the export. The plain ``openvino`` package is all it needs beyond the export's own (no
optimum-intel, which pins older transformers), imported without its usage telemetry. A compiled
model is not shared between threads: each thread that encodes gets its own infer request.

The export is cached in a directory keyed by the model's path and weight files, the precision,
the quantisation layout, the onnxruntime version and the recipe (bumped when the way exports
are made changes; :func:`export_dir`): the first process exports, later ones load the file. It
is written into a temporary directory and renamed into place, so two processes exporting at
once never leave a half-written model (the loser's copy is discarded).

Nothing here imports onnxruntime, openvino, torch or transformers until a model is loaded or
exported.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import stat
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from .chunking import encoding_lock
from .exc import ConfigurationError, EmbeddingError, MissingDependencyError
from .forking import RenewedLock

__all__ = [
    "OnnxModel",
    "export_dir",
    "onnx_available",
    "pooling_modes",
    "pooling_width",
    "quantization_layout",
    "supports_onnx",
]

log = logging.getLogger("semantic_orm")

ONNX_HINT = "pip install 'semantic-orm[onnx]' (onnxruntime and onnx)"
OPENVINO_HINT = "pip install 'semantic-orm[openvino]' (openvino, and the embed extra's export)"
PRECISIONS = {"onnx": ("int8", "fp32"), "openvino": ("fp32", "bf16")}
"""The precisions each runtime of an export offers, its default first."""
_OPENVINO_HINTS = {"fp32": "f32", "bf16": "bf16"}
"""OpenVINO's ``INFERENCE_PRECISION_HINT`` for each precision."""
_OPENVINO_TOLERANCE = {"fp32": 1e-3, "bf16": 2e-2}
"""Largest difference in a hidden state between OpenVINO and ONNX Runtime on the same export,
relative to the largest hidden state: all-MiniLM-L6-v2 differs by 6e-7 in fp32 and 3e-3 in
bf16; a kernel read wrongly (a mask ignored) differs by whole units."""
_OPENVINO_CHECKS = "openvino.json"
"""The file of an export recording the OpenVINO versions and precisions checked against it."""
_ABSENT = object()
"""What :func:`_import_openvino` remembers of a module that was not in ``sys.modules``."""
_OPENVINO_IMPORT = threading.Lock()
"""Held while openvino is imported (:func:`_import_openvino`)."""
_MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta"})
_POOLING = {
    "cls": "cls_token",
    "mean": "mean_tokens",
    "max": "max_tokens",
    "lasttoken": "lasttoken",
}
"""The pooling modes this backend runs: sentence-transformers 6's names, and the older ones
(``pooling_mode_<old>: true``) that models saved before it carry."""
_LEGACY_POOLING = {old: new for new, old in _POOLING.items()}
"""Sentence-transformers 6's name of each older ``pooling_mode_<old>`` flag."""
_FILE = "model.onnx"
_RECIPE = 2
"""How exports are made (part of the cache key): 2 fuses attention and quantises weights to
int8, 7-bit where the CPU sums int8 products in 16 bits."""
_FUSION_TOLERANCE = 1e-3
"""Largest difference in a hidden state between the fused and the traced graph (fp32), relative
to the largest hidden state (at least 1)."""
_SATURATING = frozenset({"avx2", "avx512"})
"""Layouts without VNNI: their u8 x s8 products are summed pairwise into 16 bits, which full
8-bit weights can overflow."""


def onnx_available() -> bool:
    """Whether onnxruntime and onnx are installed (checked without importing them)."""
    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _bert_config(path: Path, transformer: Path) -> dict[str, Any]:
    """The Transformer module's ``sentence_bert_config.json`` (in its folder, or the model's)."""
    return _read_json(transformer / "sentence_bert_config.json") or _read_json(
        path / "sentence_bert_config.json"
    )


def _lowercasing(tokenizer: Any) -> None:
    """Make ``tokenizer`` lowercase what it reads, as sentence-transformers does for a model
    whose ``sentence_bert_config.json`` says ``do_lower_case`` (BAAI's bge-*-en-v1.5): a
    ``Lowercase`` normalizer first, unless one is there already."""
    from tokenizers.normalizers import Lowercase
    from tokenizers.normalizers import Sequence as Normalizers

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # (a slow tokenizer: its own flag)
        with contextlib.suppress(AttributeError):
            tokenizer.do_lower_case = True
        return
    normalizer = backend.normalizer
    present: list[Any] = (
        list(cast(Any, normalizer)) if isinstance(normalizer, Normalizers) else [normalizer]
    )
    if any(isinstance(n, Lowercase) for n in present):
        return
    backend.normalizer = Normalizers([Lowercase(), *(n for n in present if n is not None)])


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
    if _pooling_mode(pooling) is None or pooling.get("include_prompt") is False:
        return None
    return str(transformer), pooling


def pooling_modes(pooling: dict[str, Any]) -> list[str]:
    """The enabled modes of a ``1_Pooling/config.json``, in sentence-transformers 6's names
    (``"mean"``, ``"cls"``...), read from its ``pooling_mode`` or from the older
    ``pooling_mode_<name>: true`` flags."""
    mode = pooling.get("pooling_mode")
    if mode is not None:
        if isinstance(mode, str):
            return [mode]
        return [str(m) for m in mode] if isinstance(mode, list) else []
    return [
        _LEGACY_POOLING.get(key[len("pooling_mode_") :], key[len("pooling_mode_") :])
        for key, on in pooling.items()
        if key.startswith("pooling_mode_") and on
    ]


def pooling_width(pooling: dict[str, Any]) -> Any:
    """The token embedding width a ``1_Pooling/config.json`` declares (either key), if any."""
    return pooling.get("embedding_dimension", pooling.get("word_embedding_dimension"))


def _pooling_mode(pooling: dict[str, Any]) -> str | None:
    """The one pooling mode of a ``1_Pooling/config.json``, as this backend names it, if it is
    one this backend runs."""
    modes = pooling_modes(pooling)
    return _POOLING.get(modes[0]) if len(modes) == 1 else None


def supports_onnx(path: str) -> bool:
    """Whether the local model at ``path`` can run on this backend (BERT-family encoder,
    one pooling mode, no Dense layer); hub names that are not local paths cannot."""
    return _layout(Path(path)) is not None


def quantization_layout(machine: str | None = None, cpuinfo: str | None = None) -> str:
    """The int8 layout of this CPU (or of ``machine`` with ``/proc/cpuinfo`` text ``cpuinfo``):
    ``arm64``, ``avx512_vnni``, ``avx_vnni``, ``avx512`` or ``avx2``. The last two lack VNNI
    and get 7-bit weights (:data:`_SATURATING`)."""
    if (machine or platform.machine()).lower() in {"aarch64", "arm64"}:
        return "arm64"
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text("utf-8", "replace")
        except OSError:
            cpuinfo = ""
    flags = set(cpuinfo.split())
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    if "avx_vnni" in flags:  # 256-bit VNNI (Alder Lake, Zen 5...): no 16-bit saturation either
        return "avx_vnni"
    if "avx512f" in flags:
        return "avx512"
    return "avx2"


def default_cache_dir() -> Path:
    """``$SEMANTIC_ORM_CACHE``, else ``$XDG_CACHE_HOME/semantic_orm``, else
    ``~/.cache/semantic_orm``; where that cannot be written (a container's read-only or missing
    home), a directory of this user's under the system's temporary directory, with a warning."""
    found = os.environ.get("SEMANTIC_ORM_CACHE")
    if found:
        return Path(found)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    wanted = Path(base) / "semantic_orm"
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        if os.access(wanted, os.W_OK):
            return wanted
    except OSError:
        pass
    return _temporary_cache(wanted)


_temporary_lock = RenewedLock()
_made: list[Path] = []  # this process's own fallback, once made (removed at exit)
_warned: set[Path] = set()


def _temporary_cache(wanted: Path) -> Path:
    """A cache only this user can write under the temporary directory: ``semantic_orm-<uid>``
    while it is this user's and closed to others (checked at each use: another user could
    have made it first, and exports are loaded from it), else a private directory of this
    process's, removed at exit."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    shared = Path(tempfile.gettempdir()) / f"semantic_orm-{uid}"
    with _temporary_lock:
        if uid is not None and _private(shared, uid):
            chosen = shared
        else:
            if not _made:
                made = Path(tempfile.mkdtemp(prefix="semantic_orm-"))
                atexit.register(shutil.rmtree, made, ignore_errors=True)
                _made.append(made)
            chosen = _made[0]
        if chosen in _warned:
            return chosen
        _warned.add(chosen)
    refused = (
        f" ({shared} is not this user's alone)" if uid is not None and chosen != shared else ""
    )
    warnings.warn(
        f"semantic_orm cannot write its cache in {wanted}: ONNX exports go to {chosen}{refused}; "
        "set SEMANTIC_ORM_CACHE, or cache_dir=, to a lasting writable directory",
        stacklevel=3,
    )
    return chosen


def _private(path: Path, uid: int) -> bool:
    """Whether ``path`` is (made) a directory of user ``uid`` that no one else can write."""
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == uid
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def export_dir(path: str, precision: str, cache_dir: str | os.PathLike[str] | None) -> Path:
    """Where the export of the model at ``path`` with ``precision`` lives (or will).

    Keyed by the model's resolved path, the size, modification time and sampled content of its
    files (:func:`_sample`), the precision, the int8 layout, the onnxruntime version and the
    export recipe, so a retrained model, another CPU family, an onnxruntime upgrade or a new way
    of exporting gets its own export.
    """
    import onnxruntime

    root = Path(path).resolve()
    files = sorted(
        (str(p.relative_to(root)), *_sample(p))
        for p in root.rglob("*")
        if p.is_file() and p.suffix in {".safetensors", ".bin", ".json", ".txt"}
    )
    layout = quantization_layout() if precision == "int8" else "none"
    key = json.dumps([str(root), files, precision, layout, onnxruntime.__version__, _RECIPE])
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).hexdigest()
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return base / "onnx" / f"{root.name}-{precision}-{digest}"


def _sample(path: Path, block: int = 1 << 16) -> tuple[int, int, str]:
    """``path``'s size, modification time (whole seconds) and a digest of its first, middle and
    last ``block`` bytes: weights retrained in place keep their files' sizes, and a build that
    fixes timestamps their modification times."""
    digest = hashlib.blake2b(digest_size=8)
    info = path.stat()
    size = info.st_size
    with path.open("rb") as f:
        for start in sorted({0, max(0, size // 2 - block // 2), max(0, size - block)}):
            f.seek(start)
            digest.update(f.read(block))
    return size, int(info.st_mtime), digest.hexdigest()


def _sweep(final: Path, age: float = 3600.0) -> None:
    """Remove what exports of ``final`` left half-written over ``age`` seconds ago (their
    process was killed: an export takes a minute)."""
    cutoff = time.time() - age
    for left in final.parent.glob(f".{final.name}.*"):
        with contextlib.suppress(OSError):
            if left.is_dir() and left.stat().st_mtime < cutoff:
                shutil.rmtree(left, ignore_errors=True)


def _export(path: str, transformer: str, precision: str, final: Path) -> None:
    """Export (and quantise) the model into ``final``, atomically."""
    try:
        import onnx  # noqa: F401  (torch.onnx.export and the quantiser need it)
        import torch
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from transformers import AutoModel
    except ImportError as exc:
        raise MissingDependencyError(
            f"exporting {path!r} to ONNX needs onnx, torch and transformers: pip install "
            "'semantic-orm[embed]' (it brings onnx and onnxruntime too); "
            f"missing: {exc.name or exc}"
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
    _sweep(final)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        bert = AutoModel.from_pretrained(transformer, attn_implementation="eager").eval()
        ids = torch.ones(2, 16, dtype=torch.long)
        names = ["input_ids", "attention_mask", "token_type_ids"]
        traced = tmp / "traced.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            # the TorchScript exporter is deprecated, but the dynamo one does not trace BERT here
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(
                LastHidden(bert),
                (ids, ids, torch.zeros_like(ids)),
                str(traced),
                input_names=names,
                output_names=["last_hidden_state"],
                dynamic_axes={n: {0: "batch", 1: "seq"} for n in [*names, "last_hidden_state"]},
                opset_version=17,
                dynamo=False,
            )
        config = _read_json(Path(transformer) / "config.json")
        fp32 = tmp / ("fp32.onnx" if precision == "int8" else _FILE)
        fused = _fuse_attention(traced, fp32, config)
        if not fused:
            traced.rename(fp32)
        if precision == "int8":
            quantize_dynamic(
                str(fp32),
                str(tmp / _FILE),
                per_channel=True,
                # 7-bit weights where int8 products are summed in 16 bits (x86 without VNNI)
                reduce_range=quantization_layout() in _SATURATING,
                weight_type=QuantType.QInt8,
                # contrib ops (Attention) defeat shape inference: their outputs are float
                extra_options={"DefaultTensorType": 1},
            )
        for leftover in (traced, fp32):
            if leftover.name != _FILE:
                leftover.unlink(missing_ok=True)
        record = tmp / "export.json"
        record.write_text(
            json.dumps({"model": path, "precision": precision, "recipe": _RECIPE, "fused": fused}),
            "utf-8",
        )
        # readable as the files in it are (mkdtemp made it its owner's alone: a cache warmed
        # by one user, at an image's build, is used by another)
        readable = record.stat().st_mode & 0o666
        os.chmod(tmp, readable | (readable & 0o444) >> 2)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / _FILE).exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fuse_attention(source: Path, target: Path, config: dict[str, Any]) -> bool:
    """Write ``source`` with ONNX Runtime's BERT fusions to ``target``; whether it did.

    Each layer's attention becomes one ``Attention`` kernel (one packed QKV product, quantised
    as a whole, instead of three products, two transposes, a scale, a mask and a softmax), and
    layer norms and GELUs are fused with their additions. The mask stays the raw one (no
    assumption on the padding side) and the embeddings are left alone (RoBERTa's positions
    differ from BERT's). The fused graph is used only if it gives the traced graph's output on
    a padded probe batch; any failure leaves the traced graph (correct, slower).
    """
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    if not isinstance(heads, int) or not isinstance(hidden, int):
        return False
    if any(p != source for p in source.parent.iterdir()):
        return False  # weights in external files (a model over 2 GB): left as traced
    try:
        import onnx
        from onnxruntime.transformers import optimizer
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.onnx_model import OnnxModel as Graph

        graph = Graph(_scales_as_divisions(onnx.load(str(source))))
        graph.topological_sort()
        options = FusionOptions("bert")
        options.enable_embed_layer_norm = False
        options.use_raw_attention_mask(True)
        optimised = optimizer.optimize_model(
            graph.model,
            model_type="bert",
            num_heads=heads,
            hidden_size=hidden,
            opt_level=0,
            optimization_options=options,
        )
        if not optimised.get_fused_operator_statistics().get("Attention"):
            return False
        optimised.save_model_to_file(str(target))
        if _same_output(source, target, int(config.get("vocab_size") or 1000)):
            return True
        log.debug("semantic_orm: the fused graph of %s differs from the traced one", source)
    except Exception:  # the fusion is an optimisation: never a reason to fail an export
        log.debug("semantic_orm: fusing the attention of %s failed", source, exc_info=True)
    target.unlink(missing_ok=True)
    return False


def _scales_as_divisions(model: Any) -> Any:
    """``model`` with each attention score scale (``MatMul`` -> ``Mul`` by a constant ->
    ``Add`` (the mask) -> ``Softmax``) written as the equivalent ``Div``.

    The fusion recognises the scale either way but finds it as "the first ``Mul`` feeding the
    mask's ``Add``", and the traced mask is a ``Mul`` too: as a ``Div`` the scale cannot be
    taken for the mask, nor the mask for the scale.
    """
    from onnx import helper, numpy_helper

    nodes = model.graph.node
    inverses: dict[str, str] = {}  # one inverse per scale constant, however many use it
    made = {out: node for node in nodes for out in node.output}
    used: dict[str, list[Any]] = {}
    for node in nodes:
        for name in node.input:
            used.setdefault(name, []).append(node)
    for node in list(nodes):
        if node.op_type != "Mul" or len(node.input) != 2:
            continue
        product, scale = (made.get(name) for name in node.input)
        after = used.get(node.output[0], [])
        if (
            product is None
            or product.op_type != "MatMul"
            or scale is None
            or scale.op_type != "Constant"
            or len(after) != 1
            or after[0].op_type != "Add"
            or not any(n.op_type == "Softmax" for n in used.get(after[0].output[0], []))
        ):
            continue
        value = numpy_helper.to_array(scale.attribute[0].t)
        if value.size != 1 or not value.any():
            continue
        inverse = inverses.get(node.input[1])
        if inverse is None:
            inverse = inverses[node.input[1]] = f"{node.input[1]}/inverse"
            nodes.append(
                helper.make_node(
                    "Constant", [], [inverse], value=numpy_helper.from_array(1 / value)
                )
            )
        node.op_type, node.input[1] = "Div", inverse
    return model


def _same_output(source: Path, target: Path, vocabulary: int) -> bool:
    """Whether two graphs of one encoder give the same hidden states (within
    :data:`_FUSION_TOLERANCE` of the largest one) on the real tokens of a padded probe batch."""
    return _probe_difference(source, _onnxruntime_run(target), vocabulary) <= _FUSION_TOLERANCE


_Run = Callable[[dict[str, npt.NDArray[np.int64]]], npt.NDArray[np.float32]]
"""A graph's last hidden state for a batch of inputs (the graph's own input names)."""


def _onnxruntime_run(path: Path) -> _Run:
    """Run the graph at ``path`` with ONNX Runtime on the CPU (its warnings quiet)."""
    import onnxruntime

    quiet = onnxruntime.SessionOptions()
    quiet.log_severity_level = 3
    session = onnxruntime.InferenceSession(str(path), quiet, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def run(feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        return np.asarray(session.run(None, {k: v for k, v in feeds.items() if k in names})[0])

    return run


def _probe_difference(source: Path, other: _Run, vocabulary: int) -> float:
    """The largest difference between the hidden states ONNX Runtime computes with the graph
    at ``source`` and those of ``other``, on the real tokens of a padded probe batch, relative
    to the largest hidden state (at least 1)."""
    probe = _probe_batch(vocabulary)
    expected, found = _onnxruntime_run(source)(probe), other(probe)
    mask = probe["attention_mask"][..., None]
    scale = max(1.0, float(np.abs(expected * mask).max()))
    return float(np.abs((expected - found) * mask).max()) / scale


def _probe_batch(vocabulary: int) -> dict[str, npt.NDArray[np.int64]]:
    """Three sequences, two of them padded, for comparing a rewritten graph with its source."""
    rng = np.random.default_rng(0)
    ids = rng.integers(5, max(6, min(vocabulary, 30_000)), (3, 19))
    mask = np.ones_like(ids)
    mask[1, 11:] = 0
    mask[2, 4:] = 0
    ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


class OnnxModel:
    """A sentence-transformers model run from its ONNX export (see the module docstring).

    Offers the part of ``SentenceTransformer`` the embedder uses: ``tokenizer``,
    ``max_seq_length``, ``prompts``, ``default_prompt_name``, ``get_embedding_dimension()`` and
    ``encode(texts, batch_size=..., prompt=...)``.

    Args:
        path: Local model directory.
        precision: ``backend="onnx"``: ``"int8"`` (dynamic quantisation) or ``"fp32"``;
            ``backend="openvino"``: ``"fp32"`` or ``"bf16"`` (:data:`PRECISIONS`).
        cache_dir: Where exports are kept (default :func:`default_cache_dir`).
        backend: The runtime: ``"onnx"`` (ONNX Runtime) or ``"openvino"``.

    Raises:
        MissingDependencyError: The runtime is not installed (the message names the extra).
        ConfigurationError: A precision the runtime does not offer, ``bf16`` on a CPU without
            bfloat16 instructions, or a model of another architecture.
    """

    exported: bool
    """Whether constructing this model exported it (``False``: the cached export was reused)."""

    def __init__(
        self,
        path: str,
        precision: str,
        cache_dir: str | os.PathLike[str] | None = None,
        backend: str = "onnx",
    ) -> None:
        hint = OPENVINO_HINT if backend == "openvino" else ONNX_HINT
        try:
            import onnxruntime
        except ImportError as exc:
            raise MissingDependencyError(
                f"backend={backend!r} needs onnxruntime (to export the model): {hint}"
            ) from exc
        offered = PRECISIONS.get(backend)
        if offered is None:
            raise ConfigurationError(
                f"OnnxModel backend must be one of {', '.join(PRECISIONS)}, got {backend!r}"
            )
        if precision not in offered:
            raise ConfigurationError(
                f"backend={backend!r} supports precision {' or '.join(map(repr, offered))}, "
                f"got {precision!r}"
            )
        layout = _layout(Path(path))
        if layout is None:
            raise ConfigurationError(
                f"backend={backend!r} needs a local sentence-transformers model made of a "
                f"BERT-family Transformer, one Pooling mode and optionally Normalize; {path!r} "
                "is not one (use backend='torch')"
            )
        transformer, pooling = layout
        self.backend = backend
        compiled = _openvino_model(precision) if backend == "openvino" else None
        export = "int8" if precision == "int8" else "fp32"  # OpenVINO reads the fp32 one
        self.directory = export_dir(path, export, cache_dir)
        self.exported = False
        if not (self.directory / _FILE).exists():
            _export(path, transformer, export, self.directory)
            self.exported = True
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise MissingDependencyError(
                f"backend={backend!r} reads the model's tokenizer with transformers: "
                "pip install 'semantic-orm[embed]'"
            ) from exc
        self.tokenizer = AutoTokenizer.from_pretrained(transformer)
        st_config = _read_json(Path(path) / "config_sentence_transformers.json")
        bert_config = _bert_config(Path(path), Path(transformer))
        config = _read_json(Path(transformer) / "config.json")
        window = bert_config.get("max_seq_length")
        if not window:  # as sentence-transformers reads it: the tokenizer's, within the model's
            # positions (a tokenizer that does not say gives a huge number)
            window = self.tokenizer.model_max_length
            positions = config.get("max_position_embeddings")
            if isinstance(positions, int) and positions > 0:
                window = min(window, positions)
        self.max_seq_length = int(window)
        if bert_config.get("do_lower_case"):
            _lowercasing(self.tokenizer)
        self.prompts: dict[str, str] = dict(st_config.get("prompts") or {})
        self.default_prompt_name: str | None = st_config.get("default_prompt_name")
        self._mode = str(_pooling_mode(pooling))
        self._dimension = int(pooling_width(pooling))
        if compiled is not None:
            self._compiled = compiled(self.directory / _FILE)
            self._inputs = {name for i in self._compiled.inputs for name in i.get_names()}
            self._requests = threading.local()
            self._check_openvino(precision, int(config.get("vocab_size") or 1000))
        else:
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
        with encoding_lock(self.tokenizer):  # (the model itself runs batches side by side)
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
            hidden = self._run(feeds)
        except Exception as exc:
            raise EmbeddingError(
                f"{self.backend} model {self.directory} failed to encode: {exc}"
            ) from exc
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

    def _check_openvino(self, precision: str, vocabulary: int) -> None:
        """Check once per export, OpenVINO version and precision that OpenVINO computes the
        export as ONNX Runtime does (the fused kernels are ONNX Runtime's, and the fusion was
        checked only there); the result is recorded in the export's :data:`_OPENVINO_CHECKS`.

        Raises:
            ConfigurationError: The two disagree beyond :data:`_OPENVINO_TOLERANCE`.
        """
        openvino = _import_openvino()
        record = self.directory / _OPENVINO_CHECKS
        key = f"{openvino.__version__}/{precision}"
        checked = _read_json(record)
        if key in checked:
            return
        difference = _probe_difference(
            self.directory / _FILE,
            lambda feeds: self._run({k: v for k, v in feeds.items() if k in self._inputs}),
            vocabulary,
        )
        if difference > _OPENVINO_TOLERANCE[precision]:
            raise ConfigurationError(
                f"OpenVINO {openvino.__version__} computes {self.directory / _FILE} unlike ONNX "
                f"Runtime (hidden states differ by {difference:.3g} of the largest, more than "
                f"{_OPENVINO_TOLERANCE[precision]:g}): backend='openvino' "
                f"precision={precision!r} cannot run this model; use backend='onnx'"
            )
        checked[key] = float(f"{difference:.3g}")
        try:  # a cache that cannot be written only means checking again next time
            tmp = record.with_name(f".{record.name}.{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(json.dumps(checked, sort_keys=True), "utf-8")
            os.replace(tmp, record)
        except OSError:
            log.debug("semantic_orm: could not record the OpenVINO check in %s", record)

    def _run(self, feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        """The last hidden state of one tokenised batch."""
        if self.backend != "openvino":
            return np.asarray(self.session.run(None, feeds)[0])
        request = getattr(self._requests, "request", None)
        if request is None:  # an infer request serves one thread at a time
            request = self._requests.request = self._compiled.create_infer_request()
        return np.asarray(request.infer(feeds)[0])


def _openvino_model(precision: str) -> Any:
    """A function compiling an ONNX file for this CPU in ``precision`` with OpenVINO; checked
    (the runtime installed, bf16 supported) before any export."""
    openvino = _import_openvino()
    core = openvino.Core()
    if precision == "bf16" and "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        raise ConfigurationError(
            "backend='openvino' precision='bf16' needs a CPU OpenVINO runs bfloat16 on "
            "(AVX512_BF16 or AMX, or AVX2 with AVX-VNNI-INT8/NE-CONVERT); this one is not one: "
            "use precision='fp32'"
        )
    wanted = _OPENVINO_HINTS[precision]

    def compiled(path: Path) -> Any:
        model = core.compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": wanted})
        running = model.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        if running != wanted:  # the recorded precision must be the one that runs
            raise ConfigurationError(
                f"OpenVINO compiled {path} in {running}, not {precision} "
                f"(backend='openvino' precision={precision!r})"
            )
        return model

    return compiled


def _import_openvino() -> Any:
    """The ``openvino`` module, imported without its usage telemetry if this process has not
    imported it yet.

    ``import openvino`` starts the telemetry of its model converter, which (with no consent
    file) writes files under ``~/intel`` and sends usage events to Intel from a forked process.
    A library must not do that from its users' processes: the converter's own stub is taken
    instead (it falls back to it when ``openvino_telemetry`` cannot be imported). An app that
    imported ``openvino`` itself keeps what it chose. One thread imports at a time (the marker
    is process-wide); ``import openvino`` itself waits for an import under way elsewhere.

    Raises:
        MissingDependencyError: openvino cannot be imported (the message names the cause).
    """
    modules: dict[str, Any] = sys.modules  # Any: None marks a module as missing
    with _OPENVINO_IMPORT:
        fresh = modules.get("openvino") is None  # None: marked missing, the import says so
        saved = modules.pop("openvino_telemetry", _ABSENT) if fresh else _ABSENT
        if fresh:
            modules["openvino_telemetry"] = None  # its import raises ImportError
        try:
            import openvino
        except ImportError as exc:
            raise MissingDependencyError(
                f"backend='openvino' needs openvino ({exc}): {OPENVINO_HINT}"
            ) from exc
        finally:
            if fresh:
                modules.pop("openvino_telemetry", None)
                if saved is not _ABSENT:
                    modules["openvino_telemetry"] = saved
    return openvino
