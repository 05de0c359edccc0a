"""The vector-store protocol, on both real Qdrant adapters (Edge and qdrant-client local mode)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from semantic_orm import (
    CollectionMismatchError,
    ConfigurationError,
    EdgeStore,
    QdrantClientStore,
    keywords,
)
from semantic_orm.stores import CollectionSpec, VectorPoint, VectorStore, point_id

SPEC = CollectionSpec(name="doc__body", dimension=4, model="m-4", metadata={"chunker": {"x": 1}})


def vec(*values: float) -> np.ndarray:
    v = np.asarray(values, dtype=np.float32)
    return v / np.linalg.norm(v)


def row_points(pk: str, vectors: list[np.ndarray]) -> list[VectorPoint]:
    return [
        VectorPoint(
            point_id(SPEC.name, pk, i),
            v,
            {
                "table": "doc",
                "pk": pk,
                "column": "body",
                "chunk_index": i,
                "start_offset": i * 10,
                "end_offset": i * 10 + 9,
                "total_chunks": len(vectors),
            },
        )
        for i, v in enumerate(vectors)
    ]


def test_point_ids_are_deterministic_and_distinct() -> None:
    assert point_id("c", "1", 0) == point_id("c", "1", 0)
    assert (
        len(
            {
                point_id("c", "1", 0),
                point_id("c", "1", 1),
                point_id("c", "2", 0),
                point_id("d", "1", 0),
            }
        )
        == 4
    )


def test_satisfies_protocol(store: VectorStore) -> None:
    assert isinstance(store, VectorStore)


def test_upsert_search_and_payload(store: VectorStore) -> None:
    store.ensure_collection(SPEC)
    store.ensure_collection(SPEC)  # idempotent
    store.upsert(SPEC.name, row_points("1", [vec(1, 0, 0, 0), vec(0, 1, 0, 0)]))
    store.upsert(SPEC.name, row_points("2", [vec(0, 0, 1, 0)]))
    hits = store.search(SPEC.name, vec(0.1, 1, 0, 0), 2)
    assert [(h.payload["pk"], h.payload["chunk_index"]) for h in hits] == [("1", 1), ("1", 0)]
    assert hits[0].score == pytest.approx(float(vec(0.1, 1, 0, 0) @ vec(0, 1, 0, 0)), abs=1e-5)
    assert hits[0].payload["start_offset"] == 10 and hits[0].payload["total_chunks"] == 2
    assert store.search(SPEC.name, vec(1, 1, 1, 1), 10, score_threshold=0.99) == []


def test_upserting_the_same_ids_overwrites(store: VectorStore) -> None:
    store.ensure_collection(SPEC)
    pts = row_points("1", [vec(1, 0, 0, 0)] * 20)  # 20 points, batch size 7 -> 3 batches
    store.upsert(SPEC.name, pts)
    store.upsert(SPEC.name, pts)
    assert store.count(SPEC.name) == 20
    assert len(store.points(SPEC.name, "1")) == 20


def test_delete_rows_prunes_and_removes(store: VectorStore) -> None:
    store.ensure_collection(SPEC)
    store.upsert(SPEC.name, row_points("1", [vec(1, 0, 0, 0)] * 5))
    store.upsert(SPEC.name, row_points("2", [vec(0, 1, 0, 0)] * 3))
    store.upsert(SPEC.name, row_points("3", [vec(0, 0, 1, 0)] * 2))
    store.delete_rows(SPEC.name, [("1", 2), ("2", 0)])
    assert sorted(p.payload["chunk_index"] for p in store.points(SPEC.name, "1")) == [0, 1]
    assert store.points(SPEC.name, "2") == []
    assert len(store.points(SPEC.name, "3")) == 2


def test_missing_collection_reads_as_empty(store: VectorStore) -> None:
    assert store.count("nope") == 0
    assert store.search("nope", vec(1, 0, 0, 0), 5) == []
    assert store.points("nope") == []
    store.delete_rows("nope", [("1", 0)])


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        (
            CollectionSpec("doc__body", 8, "m-4"),
            r"holds 4-dimensional vectors from model 'm-4'.*8-dimensional vectors from model 'm-4'",
        ),
        (CollectionSpec("doc__body", 4, "other"), r"from model 'm-4'.*from model 'other'"),
    ],
)
def test_mismatched_collection_is_refused_naming_both(
    store: VectorStore, spec: CollectionSpec, pattern: str
) -> None:
    store.ensure_collection(SPEC)
    if isinstance(store, QdrantClientStore):
        store._known.clear()  # as a fresh process would see it
    with pytest.raises(CollectionMismatchError, match=pattern):
        store.ensure_collection(spec)


def test_drop_collection(store: VectorStore) -> None:
    store.ensure_collection(SPEC)
    store.upsert(SPEC.name, row_points("1", [vec(1, 0, 0, 0)]))
    store.drop_collection(SPEC.name)
    assert store.count(SPEC.name) == 0
    store.ensure_collection(SPEC)
    assert store.count(SPEC.name) == 0


def test_edge_persists_and_records_metadata(tmp_path: Path) -> None:
    first = EdgeStore(tmp_path / "v")
    first.ensure_collection(SPEC)
    first.upsert(SPEC.name, row_points("1", [vec(1, 0, 0, 0), vec(0, 1, 0, 0)]))
    second = EdgeStore(tmp_path / "v")  # same directory, same process: shares the shard
    assert second.count(SPEC.name) == 2
    first.close()
    second.close()
    reopened = EdgeStore(tmp_path / "v")
    assert reopened.count(SPEC.name) == 2
    assert reopened.collection_info(SPEC.name) == {
        "chunker": {"x": 1},
        "model": "m-4",
        "dimension": 4,
        "layout": "dense+bm25",
    }
    with pytest.raises(CollectionMismatchError):
        reopened.ensure_collection(CollectionSpec("doc__body", 4, "other"))
    reopened.close()
    assert (tmp_path / "v" / "doc__body" / "semantic_orm.json").is_file()


def test_client_records_metadata() -> None:
    store = QdrantClientStore(location=":memory:")
    store.ensure_collection(SPEC)
    info = store.collection_info(SPEC.name)
    assert info is not None and info["model"] == "m-4" and info["dimension"] == 4
    store.close()


def test_bad_store_settings() -> None:
    with pytest.raises(ConfigurationError, match="batch_size"):
        EdgeStore("x", batch_size=0)
    with pytest.raises(ConfigurationError, match="exactly one of"):
        QdrantClientStore()
    with pytest.raises(ConfigurationError, match="exactly one of"):
        QdrantClientStore("http://localhost:6333", location=":memory:")
    with pytest.raises(ConfigurationError, match="collection name"):
        EdgeStore("x").ensure_collection(CollectionSpec("../escape", 4, "m"))


def keyword_points(texts: dict[str, str], vectors: dict[str, np.ndarray]) -> list[VectorPoint]:
    return [
        VectorPoint(p.id, p.vector, p.payload, keywords.document_vector(texts[pk]))
        for pk in texts
        for p in row_points(pk, [vectors[pk]])
    ]


def test_keyword_and_hybrid_search(store: VectorStore) -> None:
    texts = {
        "a": "The invoice references part XR-7734 for the pump.",
        "b": "Pumps move water through pipes.",
        "c": "Gardens need water in summer.",
    }
    vectors = {"a": vec(0, 0, 1, 0), "b": vec(1, 0, 0, 0), "c": vec(0.9, 0.1, 0, 0)}
    store.ensure_collection(SPEC)
    store.upsert(SPEC.name, keyword_points(texts, vectors))
    query = vec(1, 0, 0, 0)  # dense query close to b and c, far from a
    dense = store.search(SPEC.name, query, 3, mode="dense")
    assert [h.payload["pk"] for h in dense] == ["b", "c", "a"]
    code = keywords.query_vector("xr-7734")
    found = store.search(SPEC.name, None, 3, sparse=code, mode="keyword")
    assert [h.payload["pk"] for h in found] == ["a"]  # only rows sharing a term come back
    assert found[0].score > 0
    sparse = keywords.query_vector("XR-7734 water")
    hybrid = store.search(SPEC.name, query, 3, sparse=sparse, mode="hybrid")
    by_pk = {h.payload["pk"]: h.score for h in hybrid}
    # RRF, k=60, ranks from 0: a is first by keyword, third (rank 2) by cosine
    assert set(by_pk) == {"a", "b", "c"}
    assert by_pk["a"] == pytest.approx(1 / 60 + 1 / 62, rel=1e-4)
    assert by_pk["a"] > by_pk["c"]
    # hybrid with a cosine threshold: dense candidates below it are not fused
    strict = store.search(SPEC.name, query, 3, sparse=sparse, mode="hybrid", score_threshold=0.99)
    strict_scores = {h.payload["pk"]: h.score for h in strict}
    assert strict_scores["a"] == pytest.approx(1 / 60, rel=1e-4)  # keyword list only
    # vectors read back for incremental updates are the dense ones
    (point,) = store.existing(SPEC.name, ["a"])
    assert point.vector is not None and np.allclose(point.vector, vectors["a"])


def test_collection_of_the_old_single_vector_layout_is_refused(tmp_path: Path) -> None:
    import json

    import qdrant_client
    import qdrant_edge as qe

    cdir = tmp_path / "v" / SPEC.name
    cdir.mkdir(parents=True)
    config = qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=4, distance=qe.Distance.Cosine))
    qe.EdgeShard.create(str(cdir / "shard"), config).close()
    old_meta = {"chunker": {"x": 1}, "model": "m-4", "dimension": 4}
    (cdir / "semantic_orm.json").write_text(json.dumps(old_meta), "utf-8")
    edge = EdgeStore(tmp_path / "v")
    with pytest.raises(CollectionMismatchError, match="older semantic_orm"):
        edge.ensure_collection(SPEC)
    edge.close()

    client = QdrantClientStore(location=":memory:")
    models = qdrant_client.models
    client.client.create_collection(
        SPEC.name,
        vectors_config=models.VectorParams(size=4, distance=models.Distance.COSINE),
        metadata=old_meta,
    )
    with pytest.raises(CollectionMismatchError, match="older semantic_orm"):
        client.ensure_collection(SPEC)
    client.client.delete_collection(SPEC.name)
    client.client.create_collection(  # no metadata at all (pre-1.16 server): judged by layout
        SPEC.name, vectors_config=models.VectorParams(size=4, distance=models.Distance.COSINE)
    )
    with pytest.raises(CollectionMismatchError, match="older semantic_orm"):
        client.ensure_collection(SPEC)
    client.close()
