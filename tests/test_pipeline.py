"""Applying: chunk, fit, diff, embed and write each row's current text (the save path's end).

Exact offsets, incremental re-embedding (an edited paragraph embeds only its chunks, moved
chunks keep their vectors), a settings change re-embeds, very large texts, and the signals.
Plumbing tests on SQLite and PostgreSQL and on both store adapters, with the fake embedder.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import astuple
from types import MappingProxyType
from typing import Any

import pytest
from sqlalchemy import inspect
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import sessionmaker

from semantic_orm import EdgeStore, SemanticIndex, signals
from semantic_orm.applying import text_hash
from semantic_orm.maintenance import reconcile, reindex
from semantic_orm.mapping import semantic_columns
from semantic_orm.stores import PointPayload, VectorPoint
from semantic_orm.stores.base import META_SEPARATOR
from semantic_orm.testing import HashEmbedder

from .helpers import COLL, LONG, assert_index_matches_database, points_of
from .models import Article, Base


def test_insert_syncs_chunks_with_exact_offsets(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    with Session() as s:
        art = Article(title="t", content=LONG)
        s.add(art)
        s.commit()
        pts = points_of(index, art.id)
    assert len(pts) > 3
    assert [p["chunk_index"] for p in pts] == list(range(len(pts)))
    for p in pts:
        assert p["pk"] == str(art.id)
        assert p["total_chunks"] == len(pts)
        assert 0 < p["end_offset"] - p["start_offset"] <= 200
    assert pts[0]["start_offset"] == 0
    assert pts[-1]["end_offset"] == len(LONG.rstrip())
    # the library's own values are one string (the collection already says table and column)
    assert not {"table", "column", "hash", "row", "cfg", "kw"} & set(pts[0])
    first = PointPayload.from_dict(pts[0])
    assert first.chunk_hash == text_hash(LONG[: pts[0]["end_offset"]])
    assert first.text_hash == text_hash(LONG)
    binding = index.binding_for(semantic_columns(inspect(Article))[0])
    assert (first.config, first.analyzer) == (binding.fingerprint, binding.analyzer.id)


def test_ten_megabyte_text(Session: sessionmaker[OrmSession], index: SemanticIndex) -> None:
    if not isinstance(index.store, EdgeStore):
        pytest.skip("qdrant-client's local mode is a brute-force test double; Edge is the engine")
    big = ("Une phrase en français, avec des accents: été, où, Noël. " * 40 + "\n\n") * 4400
    assert len(big) > 10_000_000
    with Session() as s:
        art = Article(title="big", content=big)
        s.add(art)
        s.commit()
        total = index.store.count(COLL)
        assert total > len(big) // 200
        sample = points_of(index, art.id)[1234]
        assert big[sample["start_offset"] : sample["end_offset"]].strip() != ""


def test_signals_carry_model_and_payload(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    seen: dict[str, list[dict[str, Any]]] = {
        "chunked": [],
        "embedded": [],
        "synced": [],
        "searched": [],
    }

    def recorder(name: str) -> Any:
        def receive(sender: Any, **kw: Any) -> None:
            seen[name].append({"sender": sender, **kw})

        return receive

    receivers = {name: recorder(name) for name in seen}
    for name, fn in receivers.items():
        getattr(signals, name).connect(fn)
    try:
        with Session() as s:
            art = Article(title="t", content=LONG)
            s.add(art)
            s.commit()
            hits = Article.semantic_search(s, "topic number 3", limit=1)
            s.delete(art)
            s.commit()
    finally:
        for name, fn in receivers.items():
            getattr(signals, name).disconnect(fn)
    (chunked,) = seen["chunked"]
    assert chunked["sender"] is Article and chunked["column"] == "content"
    assert chunked["pk"] == str(art.id) and len(chunked["chunks"]) > 1
    (embedded,) = seen["embedded"]
    assert embedded["count"] == len(chunked["chunks"]) and embedded["model"] == "hash-embedder"
    assert [s["upserted"] for s in seen["synced"]] == [[str(art.id)], []]
    assert seen["synced"][1]["deleted"] == [str(art.id)]
    (searched,) = seen["searched"]
    assert searched["sender"] is Article and searched["query"] == "topic number 3"
    assert searched["hits"] == hits


@pytest.fixture
def tables(engine: Engine) -> Engine:
    Base.metadata.create_all(engine)
    return engine


def test_editing_one_paragraph_embeds_only_its_chunks(tables: Engine, store: Any) -> None:
    embedder = HashEmbedder()
    idx = SemanticIndex(store=store, embedder=embedder)
    factory = sessionmaker(tables, expire_on_commit=False)
    idx.install(factory)
    paras = [f"Paragraph {i} says something about topic {i} and item {i}." for i in range(120)]
    with factory() as s:
        art = Article(title="long", content="\n\n".join(paras))
        s.add(art)
        s.commit()
        total = store.count(COLL)
        assert total >= 30
        first = embedder.texts_encoded
        paras[60] = "Paragraph 60 now says something entirely different."
        art.content = "\n\n".join(paras)
        s.commit()
        assert embedder.texts_encoded - first <= 3  # the chunk(s) touching it, with overlap
        before = embedder.texts_encoded
        art.content = "A new opening paragraph.\n\n" + art.content  # every chunk moves
        s.commit()
        moved = embedder.texts_encoded - before
        assert moved <= 3  # moved chunks keep their vectors: payload updates only
    assert_index_matches_database(tables, store)
    # the vectors of moved chunks are the ones their text would get
    hit = Article.semantic_search(factory(), "Paragraph 45 topic 45 item 45", limit=1, index=idx)
    assert "Paragraph 45" in hit[0].chunk.text
    # moved points are rewritten with keyword vectors recomputed from their text
    kw = Article.semantic_search(
        factory(), "entirely different", limit=1, group_by="chunk", mode="keyword", index=idx
    )
    assert "entirely different" in kw[0].chunk.text


def test_points_written_with_the_former_payload_keys_keep_their_vectors(
    tables: Engine, store: Any
) -> None:
    """Points stored before the digests were packed into one value (one key each, and the
    table and column) are read as they are, and rewritten in the new form by the row's next
    sync without embedding anything."""
    embedder = HashEmbedder()
    idx = SemanticIndex(store=store, embedder=embedder)
    factory = sessionmaker(tables, expire_on_commit=False)
    idx.install(factory)
    with factory() as s:
        kept, edited = Article(title="a", content=LONG), Article(title="b", content=LONG)
        s.add_all([kept, edited])
        s.commit()
    former = []
    for hit in store.existing(COLL, [str(kept.id), str(edited.id)]):
        p = PointPayload.from_dict(hit.payload)
        legacy = {k: v for k, v in hit.payload.items() if k != PointPayload.DIGESTS_KEY}
        legacy |= {"table": "article", "column": "content", "hash": p.chunk_hash}
        legacy |= {"row": p.text_hash, "cfg": p.config, "kw": p.analyzer}
        legacy |= {"meta": dict(p.meta)}  # the chunker's metadata: one nested value
        former.append(VectorPoint(hit.id, hit.vector, legacy))
    store.upsert(COLL, former)
    assert all("cfg" in p and "digests" not in p for p in points_of(idx, kept.id))
    before = embedder.texts_encoded
    with factory() as s:  # a row written while its points have the former keys
        s.get(Article, edited.id).content = LONG + "\n\nOne paragraph more at the end."
        s.commit()
    assert 0 < embedder.texts_encoded - before <= 2  # the new last chunk(s) only
    assert all("digests" in p and "cfg" not in p for p in points_of(idx, edited.id))
    assert all("cfg" in p for p in points_of(idx, kept.id))  # not written: as it was
    (report,) = reconcile(idx, Article, tables)  # both forms read alike
    assert (report.in_sync, report.changed, report.missing) == (2, 0, 0)
    before = embedder.texts_encoded
    assert reindex(idx, Article, tables, all_rows=True) == 2
    assert embedder.texts_encoded == before  # every vector reused
    for pk in (kept.id, edited.id):
        for p in points_of(idx, pk):
            assert "digests" in p and not {"cfg", "hash", "table", "meta"} & set(p)
            assert PointPayload.from_dict(p).meta["section_index"] == 0  # packed in digests
    assert_index_matches_database(tables, store)
    idx.uninstall(factory)


def test_the_packed_digests_read_back_whatever_they_hold() -> None:
    for analyzer in ("2", "2:german", "3:a b"):  # the analyser's id is last: any character
        for whole in ("", "8e16aeffd95e26c8f147"):
            p = PointPayload("7", 0, 0, 5, 1, "1d52", "61dc", analyzer, whole, {"segment": 1})
            assert PointPayload.from_dict(p.to_dict()) == p
    # a payload read without its digests (a search names the keys it reads) has none
    assert PointPayload.from_dict({"pk": "7"}).config == ""


@pytest.mark.parametrize(
    "meta",
    [
        {"section": None, "section_index": 0, "paragraph": 2, "segment": 1},
        {"section": 'Été \x1f 章节 "quoted" {x}', "paragraph": 0},  # JSON escapes the separator
        {"section": "Intro", "type": "code", "types": ["code", "table"]},
        {"type": "prose"},
        {"when": dt.date(2026, 1, 1), "type": "code"},  # not JSON: stored as it is, nested
        {},
    ],
)
def test_chunk_metadata_is_packed_with_the_digests_but_the_chunk_types(
    meta: dict[str, Any],
) -> None:
    """The chunker's metadata is JSON after the digests (one string to convert, not a nested
    value); the chunk types stay a nested value, which searches filter on (``meta.type``)."""
    p = PointPayload("7", 1, 10, 50, 3, "1d52", "61dc", "2:english", "8e16", meta)
    stored = p.to_dict()
    assert PointPayload.from_dict(stored) == p
    # a search ranks its candidates without their metadata and reads that of its hits
    assert PointPayload.meta_of(stored) == meta
    assert PointPayload.from_dict(stored, meta=False) == PointPayload(*astuple(p)[:-2], {}, {})
    # the same metadata built in another order (from a set...) is stored the same: the sync
    # compares payloads, and an unchanged chunk must not be written again
    reordered = dict(reversed(meta.items()))
    again = PointPayload("7", 1, 10, 50, 3, "1d52", "61dc", "2:english", "8e16", reordered)
    assert again.to_dict() == stored
    filtered = {k: v for k, v in meta.items() if k in ("type", "types")}
    if "when" in meta:
        assert stored["meta"] == meta
    else:
        assert stored.get("meta", {}) == filtered
        assert (META_SEPARATOR in stored["digests"]) == bool(set(meta) - set(filtered))
    # as stored before: every key nested, the digests alone
    former = {**stored, "digests": "1d52 8e16 61dc 2:english", "meta": meta}
    assert PointPayload.from_dict(former) == p
    # metadata that does not read as JSON (written by hand) is none, the digests still read
    broken = PointPayload.from_dict({**stored, "digests": f"1d52 8e16 61dc 2{META_SEPARATOR}{{"})
    assert (broken.config, broken.analyzer, broken.meta) == ("61dc", "2", stored.get("meta", {}))


def test_packed_metadata_keeps_values_that_compare_equal_apart() -> None:
    """Packed metadata is reused by its items, never across values that compare equal but
    encode apart (``1 == 1.0 == True``, an int key and a bool key), and a read-only mapping
    packs as a dict does."""
    values = [1, True, 1.0, "1", None, 0, False]
    for round_ in range(2):  # the second round reads what the first one packed
        for value in values:
            for meta in ({"segment": value}, {1: value} if round_ else {True: value}):
                stored = PointPayload.stored("7", 0, 0, 5, 1, "d", meta, {})
                expected = {str(k).lower(): v for k, v in meta.items()}
                assert PointPayload.meta_of(stored) == expected, (meta, stored)
                assert type(PointPayload.meta_of(stored)[next(iter(expected))]) is type(value)
    proxy = MappingProxyType({"section": "Intro", "paragraph": 2})
    assert PointPayload.stored("7", 0, 0, 5, 1, "d", proxy, {}) == PointPayload.stored(
        "7", 0, 0, 5, 1, "d", dict(proxy), {}
    )
    assert "meta" not in PointPayload.stored("7", 0, 0, 5, 1, "d", proxy, {})


def test_search_hits_carry_their_chunks_metadata(tables: Engine, store: Any) -> None:
    """A hit's chunk has the metadata its chunker gave it (read from the packed payload of
    the hits a search returns, not of every candidate it ranks), in every mode."""
    idx = SemanticIndex(store=store, embedder=HashEmbedder())
    factory = sessionmaker(tables, expire_on_commit=False)
    idx.install(factory)
    with factory() as s:
        article = Article(title="t", content=LONG)
        s.add(article)
        s.commit()
    (col,) = semantic_columns(inspect(Article))
    chunks = idx.binding_for(col).chunker.chunk(LONG)
    assert len(chunks) > 2 and all(c.metadata for c in chunks)
    with factory() as s:
        for mode in ("dense", "keyword", "hybrid"):
            hits = Article.semantic_search(
                s, "Paragraph 12", limit=3, group_by="chunk", mode=mode, index=idx
            )
            assert hits, mode
            for hit in hits:
                assert hit.chunk.metadata == chunks[hit.chunk.index].metadata, mode
    idx.uninstall(factory)


def test_reindexing_unchanged_rows_embeds_nothing(tables: Engine, store: Any) -> None:
    embedder = HashEmbedder()
    idx = SemanticIndex(store=store, embedder=embedder)
    factory = sessionmaker(tables, expire_on_commit=False)
    idx.install(factory)
    with factory() as s:
        s.add_all(
            Article(title="t", content="\n\n".join(f"Para {i} of {n}." for i in range(30)))
            for n in range(3)
        )
        s.commit()
    before = embedder.texts_encoded
    assert reindex(idx, Article, tables, all_rows=True) == 3
    assert embedder.texts_encoded == before  # same text, same settings: every vector reused
    assert_index_matches_database(tables, store)
    idx.uninstall(factory)
