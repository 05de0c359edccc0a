"""The store protocols, on both Qdrant adapters (Edge, qdrant-client local mode) and the
in-memory double shipped in ``semantic_orm.testing``: all three must behave alike."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from semantic_orm import (
    CollectionMismatchError,
    ConfigurationError,
    EdgeStore,
    QdrantClientStore,
    VectorStoreError,
    keywords,
)
from semantic_orm.stores import (
    CollectionSpec,
    SearchRequest,
    Store,
    StoreAdmin,
    VectorPoint,
    VectorStore,
    point_id,
)
from semantic_orm.stores.base import (
    DatetimeRange,
    Filter,
    IsNull,
    Match,
    MatchAny,
    MatchExcept,
    PayloadIndex,
    Range,
    Ranking,
)
from semantic_orm.testing import MemoryStore

from .helpers import in_a_forked_child

SPEC = CollectionSpec(name="doc__body", dimension=4, model="m-4", metadata={"chunker": {"x": 1}})


@pytest.fixture(params=["edge", "client", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Both real adapters and the in-memory double."""
    made: Store
    if request.param == "edge":
        made = EdgeStore(tmp_path / "vectors", batch_size=7)
    elif request.param == "client":
        made = QdrantClientStore(location=":memory:", batch_size=7)
    else:
        made = MemoryStore()
    yield made
    made.close()


def dense(vector: np.ndarray, limit: int, **kw: float) -> SearchRequest:
    return SearchRequest((Ranking("dense", vector, limit, **kw),))  # type: ignore[arg-type]


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


def test_satisfies_protocols(store: Store) -> None:
    assert isinstance(store, VectorStore) and isinstance(store, StoreAdmin)


def test_upsert_search_and_payload(store: VectorStore) -> None:
    store.ensure_collection(SPEC)
    store.ensure_collection(SPEC)  # idempotent
    store.upsert(SPEC.name, row_points("1", [vec(1, 0, 0, 0), vec(0, 1, 0, 0)]))
    store.upsert(SPEC.name, row_points("2", [vec(0, 0, 1, 0)]))
    (hits,) = store.query(SPEC.name, dense(vec(0.1, 1, 0, 0), 2))
    assert [(h.payload["pk"], h.payload["chunk_index"]) for h in hits] == [("1", 1), ("1", 0)]
    assert hits[0].score == pytest.approx(float(vec(0.1, 1, 0, 0) @ vec(0, 1, 0, 0)), abs=1e-5)
    assert hits[0].payload["start_offset"] == 10 and hits[0].payload["total_chunks"] == 2
    assert store.query(SPEC.name, dense(vec(1, 1, 1, 1), 10, threshold=0.99)) == [[]]
    (page,) = store.query(SPEC.name, SearchRequest((Ranking("dense", vec(0.1, 1, 0, 0), 2, 1),)))
    assert [(h.payload["pk"], h.payload["chunk_index"]) for h in page] == [("1", 0), ("2", 0)]


def test_a_search_reads_only_the_payload_keys_it_names(store: VectorStore) -> None:
    store.ensure_collection(SPEC)
    store.upsert(SPEC.name, row_points("1", [vec(1, 0, 0, 0), vec(0, 1, 0, 0)]))
    ranking = (Ranking("dense", vec(1, 0.1, 0, 0), 2),)
    (some,) = store.query(SPEC.name, SearchRequest(ranking, payload=("pk", "chunk_index")))
    assert [h.payload for h in some] == [
        {"pk": "1", "chunk_index": 0},
        {"pk": "1", "chunk_index": 1},
    ]
    (none,) = store.query(SPEC.name, SearchRequest(ranking, payload=()))
    assert [h.payload for h in none] == [{}, {}] and [h.id for h in none] == [h.id for h in some]
    (whole,) = store.query(SPEC.name, SearchRequest(ranking))
    assert whole[0].payload["total_chunks"] == 2 and whole[0].payload["table"] == "doc"


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
    assert store.query("nope", dense(vec(1, 0, 0, 0), 5)) == [[]]
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
    if isinstance(store, QdrantClientStore):  # as a fresh process would see it
        store = QdrantClientStore(client=store.client)
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


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_uses_the_shard_its_parent_had_open(tmp_path: Path) -> None:
    """A pre-forking server that loaded the app first: the child's copy of the parent's open
    shard would hang on the locks the parent's threads held (or write beside the parent). The
    child opens its own instead and gets the one-process error, saying it was forked; the
    parent goes on. Nor can the child delete the collection from under the parent."""
    store = EdgeStore(tmp_path / "v")
    store.ensure_collection(SPEC)
    store.upsert(SPEC.name, row_points("1", [vec(1, 0, 0, 0)]))

    def write_in_the_child() -> list[str]:
        said = []
        for each in (store, EdgeStore(tmp_path / "v")):
            try:
                each.upsert(SPEC.name, row_points("2", [vec(0, 1, 0, 0)]))
                said.append("wrote")
            except VectorStoreError as exc:
                said.append(str(exc))
        return said

    _, said = in_a_forked_child(write_in_the_child)  # a hung child fails here
    assert len(said) == 2
    for message in said:
        assert f"open in pid {os.getpid()} " in message and "forked from that one" in message
    store.upsert(SPEC.name, row_points("3", [vec(0, 0, 1, 0)]))
    assert store.count(SPEC.name) == 2  # the parent's shard: its own two points, intact

    def drop_in_the_child() -> str:  # as `semantic-orm gc` run beside the app would
        try:
            EdgeStore(tmp_path / "v").drop_collection(SPEC.name)
        except VectorStoreError as exc:
            return str(exc)
        return "dropped"

    _, said = in_a_forked_child(drop_in_the_child)
    assert f"open in pid {os.getpid()} " in said
    store.upsert(SPEC.name, row_points("4", [vec(1, 1, 0, 0)]))
    assert store.count(SPEC.name) == 3 and (tmp_path / "v" / SPEC.name).is_dir()
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_makes_its_own_client_for_a_server(tmp_path: Path) -> None:
    """A client made before the fork holds the parent's connections (two processes reading one
    socket get each other's answers; a gRPC channel does not survive a fork): the child's first
    call makes a client of its own, with the same options, and closing in a child that made
    none closes nothing of the parent's."""
    store = QdrantClientStore(url="http://127.0.0.1:9", timeout=1, check_compatibility=False)
    parents = store.client

    def call_in_the_child() -> list[Any]:
        store.close()  # the parent's connections: left alone
        assert store.client is parents
        try:
            store.count(SPEC.name)
        except VectorStoreError:
            pass  # no server: what matters is which client tried
        made = store.client
        return [made is not parents, type(made) is type(parents), store._options]

    _, (renewed, same_kind, options) = in_a_forked_child(call_in_the_child)
    assert renewed and same_kind and options["url"] == "http://127.0.0.1:9"
    assert store.client is parents  # the parent keeps its own


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_warns_that_a_client_it_was_given_is_its_parents() -> None:
    """A client passed in cannot be made again by the store: the child keeps it, and a warning
    says to make it in each worker."""
    from qdrant_client import QdrantClient

    given = QdrantClient(location=":memory:")
    store = QdrantClientStore(client=given)

    def call_in_the_child() -> list[Any]:
        said: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
        logging.getLogger("semantic_orm").addHandler(handler)
        store.ensure_collection(SPEC)
        store.ensure_collection(SPEC)  # warned once
        return [store.client is given, said]

    _, (kept, said) = in_a_forked_child(call_in_the_child)
    assert kept and len(said) == 1
    assert f"forked from pid {os.getpid()}" in said[0] and "make the client in each" in said[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_writes_into_its_parents_local_directory(tmp_path: Path) -> None:
    """qdrant-client's local mode on disk belongs to one process: a forked child's copy would
    write beside the parent's into the same files. The child is refused, saying why; the
    parent goes on."""
    store = QdrantClientStore(path=str(tmp_path / "local"))
    store.ensure_collection(SPEC)
    store.upsert(SPEC.name, row_points("1", [vec(1, 0, 0, 0)]))

    def write_in_the_child() -> str:
        try:
            store.upsert(SPEC.name, row_points("2", [vec(0, 1, 0, 0)]))
        except VectorStoreError as exc:
            store.close()  # and closing it there touches nothing of the parent's
            return str(exc)
        return "wrote"

    _, said = in_a_forked_child(write_in_the_child)
    assert f"opened in pid {os.getpid()}, which this process was forked from" in said
    store.upsert(SPEC.name, row_points("3", [vec(0, 0, 1, 0)]))
    assert store.count(SPEC.name) == 2
    store.close()


def test_edge_drops_a_collection_whose_shard_cannot_be_read(tmp_path: Path) -> None:
    """Only another process's hold refuses a drop: a shard that cannot be loaded (its files
    damaged) is deleted like any other."""
    store = EdgeStore(tmp_path / "v")
    store.ensure_collection(SPEC)
    store.upsert(SPEC.name, row_points("1", [vec(1, 0, 0, 0)]))
    store.close()
    shard = tmp_path / "v" / SPEC.name / "shard"
    shutil.rmtree(shard)
    shard.write_text("not a shard")
    store = EdgeStore(tmp_path / "v")
    with pytest.raises(VectorStoreError, match="cannot open"):
        store.count(SPEC.name)
    store.drop_collection(SPEC.name)
    assert not (tmp_path / "v" / SPEC.name).exists() and store.list_collections() == []
    store.close()


def test_edge_indexes_the_row_key_and_declared_fields_but_not_the_chunk_number(
    tmp_path: Path,
) -> None:
    """A chunk_index index made every Edge upsert ~20% slower for reconcile's sweep alone: the
    sweep's filter on it scans payloads instead, and still finds each row's first chunk."""
    store = EdgeStore(tmp_path / "v")
    spec = CollectionSpec("doc__body", 4, "m-4", indexes=(PayloadIndex("f.tenant", "keyword"),))
    store.ensure_collection(spec)
    store.upsert(spec.name, row_points("1", [vec(1, 0, 0, 0)] * 3))
    store.upsert(spec.name, row_points("2", [vec(0, 1, 0, 0)] * 2))
    schema = store._require(spec.name).shard.info().payload_schema
    assert set(schema) == {"pk", "f.tenant"}
    first, _ = store.scroll(spec.name, where=Filter(must=(Match("chunk_index", 0),)))
    assert sorted(hit.payload["pk"] for hit in first) == ["1", "2"]
    store.close()
    # QdrantClientStore builds it: a server in strict mode refuses filters on unindexed fields
    client = QdrantClientStore(location=":memory:")
    built: list[str] = []
    create = client.client.create_payload_index

    def recorded(*args: Any, **kwargs: Any) -> Any:
        built.append(kwargs["field_name"])
        return create(*args, **kwargs)

    client.client.create_payload_index = recorded  # type: ignore[method-assign]
    client.ensure_collection(spec)
    assert built == ["pk", "chunk_index", "f.tenant"]


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
    code = keywords.query_vector("xr-7734")
    both = SearchRequest((Ranking("dense", query, 3), Ranking("bm25", code, 3)))
    by_cosine, by_keyword = store.query(SPEC.name, both)  # one request, two rankings
    assert [h.payload["pk"] for h in by_cosine] == ["b", "c", "a"]
    assert [h.payload["pk"] for h in by_keyword] == ["a"]  # only rows sharing a term
    assert by_keyword[0].score > 0
    # vectors read back for incremental updates are the dense ones
    (point,) = store.existing(SPEC.name, ["a"])
    assert point.vector is not None and np.allclose(point.vector, vectors["a"])


def test_vectors_are_stored_as_given_whatever_the_arrays_layout(store: Store) -> None:
    """A row of an embedder's batch, a strided view, a float64 and a big-endian array are all
    stored as their values (the Edge adapter hands the binding the array's buffer, not a
    list)."""
    batch = np.asarray([vec(1, 2, 3, 4), vec(4, 3, 2, 1)], dtype=np.float32)
    wide = np.zeros(8, dtype=np.float32)
    wide[::2] = vec(0.5, -1, 2, 0.25)
    given = {
        "a": batch[1],
        "b": wide[::2],
        "c": vec(1, -2, 0.5, 3).astype(np.float64),
        "d": vec(2, 1, -1, 0.5).astype(">f4"),  # not the machine's byte order
    }
    assert not given["b"].flags["C_CONTIGUOUS"]
    store.ensure_collection(SPEC)
    store.upsert(SPEC.name, [p for pk, v in given.items() for p in row_points(pk, [v])])
    stored = {str(p.payload["pk"]): p.vector for p in store.existing(SPEC.name, list(given))}
    assert stored.keys() == given.keys()
    for pk, vector in given.items():
        assert stored[pk] is not None
        # (a client in local mode normalises again, a last bit apart)
        assert np.allclose(stored[pk], vector, rtol=1e-6, atol=1e-7), pk


def test_keyword_scores_are_bm25_with_idf_alike_on_every_store(store: Store) -> None:
    texts = {str(i): f"word{i % 3} shared filler text number {i}" for i in range(9)}
    vectors = {pk: vec(1, int(pk), 0, 1) for pk in texts}
    store.ensure_collection(SPEC)
    store.upsert(SPEC.name, keyword_points(texts, vectors))
    (found,) = store.query(
        SPEC.name, SearchRequest((Ranking("bm25", keywords.query_vector("word1 shared"), 9),))
    )
    reference = MemoryStore()  # exact BM25 with Qdrant's IDF
    reference.ensure_collection(SPEC)
    reference.upsert(SPEC.name, keyword_points(texts, vectors))
    (expected,) = reference.query(
        SPEC.name, SearchRequest((Ranking("bm25", keywords.query_vector("word1 shared"), 9),))
    )

    def scored(hits: list[Any]) -> list[tuple[float, str]]:
        return sorted((round(-h.score, 4), h.payload["pk"]) for h in hits)

    assert scored(found) == scored(expected)  # ties in any order


def test_filters_mean_the_same_on_every_store(store: Store) -> None:
    store.ensure_collection(SPEC)
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    points = []
    for i in range(6):
        (p,) = row_points(str(i), [vec(1, i, 0, 0)])
        fields = {
            "n": i,
            "tag": "ab"[i % 2],
            "flag": i % 3 == 0,
            "at": (when + dt.timedelta(days=i)).isoformat(),
        }
        if i == 5:
            fields = {}
        points.append(VectorPoint(p.id, p.vector, {**p.payload, "f": fields}))
    store.upsert(SPEC.name, points)

    def pks(flt: Filter) -> list[str]:
        (hits,) = store.query(
            SPEC.name, SearchRequest((Ranking("dense", vec(1, 0, 0, 0), 10),), flt)
        )
        return sorted(h.payload["pk"] for h in hits)

    assert pks(Filter(must=(Match("f.tag", "a"),))) == ["0", "2", "4"]
    assert pks(Filter(must=(MatchAny("f.n", (1, 3)),))) == ["1", "3"]
    assert pks(Filter(must=(MatchExcept("f.tag", ("a",)),))) == ["1", "3"]
    assert pks(Filter(must=(Range("f.n", gte=2, lt=4),))) == ["2", "3"]
    assert pks(Filter(must=(DatetimeRange("f.at", gt=when + dt.timedelta(days=3)),))) == ["4"]
    assert pks(Filter(must=(IsNull("f.n"),))) == ["5"]
    assert pks(Filter(should=(Match("f.n", 0), Match("f.n", 4)))) == ["0", "4"]
    assert pks(Filter(must_not=(Match("f.tag", "a"), IsNull("f.n")))) == ["1", "3"]
    assert pks(
        Filter(
            must=(Filter(should=(Match("f.n", 1), Match("f.n", 2))),), must_not=(Match("f.n", 2),)
        )
    ) == ["1"]


def test_collection_of_the_old_single_vector_layout_is_refused(tmp_path: Path) -> None:

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
