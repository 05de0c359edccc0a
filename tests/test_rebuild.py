"""Embedding-config drift, ``rebuild`` (``reindex --rebuild``) and ``gc``, on each database/store.

A column whose chunk settings or model changed is refused with an error that names the change and
the fix; ``rebuild`` re-embeds into a new collection while searches run from another thread, then
switches, and is resumable; ``gc`` finds the collections of dropped columns.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from semantic_orm import (
    ConfigurationError,
    EdgeStore,
    EmbeddingDriftError,
    QdrantClientStore,
    SemanticIndex,
    SemanticSearchMixin,
    SemanticText,
    VectorStore,
    binding,
    outbox,
)
from semantic_orm.maintenance import REBUILD_MARK, gc, rebuild, rebuild_name, status
from semantic_orm.testing import HashEmbedder

from .helpers import WORDS, doc_text


def make_model(chunk_size: int) -> Any:
    """The same table and column, declared with another chunk size (a new app version)."""

    class Base(DeclarativeBase):
        pass

    class Doc(SemanticSearchMixin, Base):
        __tablename__ = "doc"
        id: Mapped[int] = mapped_column(primary_key=True)
        title: Mapped[str] = mapped_column(String(50))
        body: Mapped[str | None] = mapped_column(SemanticText(chunk_size=chunk_size, overlap=0))

    return Doc


def setup_app(
    engine: Engine, store: VectorStore, model: Any, embedder: HashEmbedder, rows: int
) -> tuple[SemanticIndex, sessionmaker[Any]]:
    model.metadata.create_all(engine)
    idx = SemanticIndex(store=store, embedder=embedder, models=[model])
    factory = sessionmaker(engine, expire_on_commit=False)
    idx.install(factory)
    if rows:
        with factory() as s:
            s.add_all(model(id=i, title=f"t{i}", body=doc_text(i)) for i in range(rows))
            s.commit()
    return idx, factory


def physical(store: VectorStore) -> set[str]:
    """Every collection the store really holds, including those behind aliases."""
    if isinstance(store, QdrantClientStore):
        return {c.name for c in store.client.get_collections().collections}
    assert isinstance(store, EdgeStore)
    return {d.name for d in store.path.iterdir()}


def wait_for_search(searcher: Searcher) -> None:
    """Block until the searcher finishes one more search."""
    seen = searcher.done
    deadline = time.monotonic() + 5
    while searcher.done == seen and time.monotonic() < deadline:
        time.sleep(0.001)
    assert searcher.done > seen, "the searcher stalled"


class Searcher(threading.Thread):
    """Searches in a loop; records every exception and every wrong top hit."""

    def __init__(self, factory: sessionmaker[Any], model: Any, rows: int) -> None:
        super().__init__(daemon=True)
        self.factory, self.model, self.rows = factory, model, rows
        self.stop = threading.Event()
        self.done = 0
        self.failures: list[str] = []

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            target = i % self.rows
            try:
                with self.factory() as s:
                    hits = self.model.semantic_search(s, WORDS[target], limit=3, mode="keyword")
                if not hits or hits[0].obj.id != target:
                    self.failures.append(f"{WORDS[target]}: {[h.obj.id for h in hits]}")
            except Exception as exc:  # a failed search is what this test counts
                self.failures.append(repr(exc))
            self.done += 1
            i += 1

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=30)


class ProgressSpy(io.StringIO):
    """A progress stream that waits until the searcher has run during each batch."""

    def __init__(self, searcher: Searcher) -> None:
        super().__init__()
        self.searcher = searcher
        self.during = 0

    def write(self, text: str) -> int:
        seen = self.searcher.done
        deadline = time.monotonic() + 5
        while self.searcher.done == seen and time.monotonic() < deadline:
            time.sleep(0.001)
        self.during += self.searcher.done - seen
        return super().write(text)


ROWS = 12


def test_chunk_size_change_is_detected_then_rebuilt_while_searches_run(
    engine: Engine,
    store: VectorStore,
    hash_embedder: HashEmbedder,
    caplog: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old_model = make_model(chunk_size=200)
    old_idx, old_factory = setup_app(engine, store, old_model, hash_embedder, ROWS)
    old_idx.uninstall(old_factory)  # the old deployment stops writing

    new_model = make_model(chunk_size=120)
    idx, factory = setup_app(engine, store, new_model, hash_embedder, 0)
    # detected on start, with what changed and the command that fixes it
    with pytest.raises(EmbeddingDriftError) as info:
        idx.verify()
    message = str(info.value)
    assert "Doc.body" in message and "chunker.chunk_size: 200 -> 120" in message
    assert "--rebuild" in message and "semantic-orm reindex" in message
    assert info.value.changes == {"chunker.chunk_size": (200, 120)}
    (col_status,) = status(idx, engine)
    assert col_status.drift == {"chunker.chunk_size": (200, 120)}

    # writes are refused (the job waits in the outbox), searches still answer from the old one
    with factory() as s:
        s.get(new_model, 3).body = "mistral " + doc_text(3)
        s.commit()
    with engine.connect() as conn:
        pending = outbox.counts(conn)[("doc", "body")]["pending"]
    assert pending == 1
    with caplog.at_level(logging.WARNING, logger="semantic_orm"), factory() as s:
        assert new_model.semantic_search(s, WORDS[5], limit=1, mode="keyword")[0].obj.id == 5
    assert "chunker.chunk_size" in caplog.text

    searcher = Searcher(factory, new_model, ROWS)
    searcher.start()
    spy = ProgressSpy(searcher)
    switch = store.replace_collection
    around: list[int] = []

    def switch_between_searches(collection: str, source: str) -> None:
        wait_for_search(searcher)  # a search just before the switch...
        switch(collection, source)
        wait_for_search(searcher)  # ...and one just after, from the new collection
        around.append(searcher.done)

    monkeypatch.setattr(store, "replace_collection", switch_between_searches)
    try:
        (report,) = rebuild(idx, new_model, engine, batch_size=3, progress=spy)
    finally:
        searcher.finish()
    assert searcher.failures == []
    assert spy.during >= 4  # searches ran during every batch of the rebuild
    assert len(around) == 1 and searcher.done > around[0]  # and around and after the switch
    assert report.switched and report.rows == ROWS and report.failed == ()
    assert report.built_in == rebuild_name(idx, idx.columns()[0])

    # the collection now holds 120-character chunks, with the write made during the drift
    info_after = idx.store.collection_info("doc__body")
    assert info_after is not None and info_after["chunker"]["chunk_size"] == 120
    points = idx.store.points("doc__body")
    assert points and all(
        p.payload["end_offset"] - p.payload["start_offset"] <= 120 for p in points
    )
    assert len({p.payload["pk"] for p in points}) == ROWS
    idx.verify()  # no drift left
    assert status(idx, engine)[0].drift == {}
    with engine.connect() as conn:
        assert outbox.counts(conn).get(("doc", "body"), {}).get("pending", 0) == 0
    with factory() as s:
        hits = new_model.semantic_search(s, "mistral", limit=1, mode="keyword")
        assert [h.obj.id for h in hits] == [3]
        # writes work again, into the new collection
        s.get(new_model, 4).body = "sirocco " + doc_text(4)
        s.commit()
        assert new_model.semantic_search(s, "sirocco", limit=1, mode="keyword")[0].obj.id == 4
    assert idx.store.list_collections() == ["doc__body"]
    assert len(physical(store)) == 1  # the old collection is gone, and no build is left


def test_model_change_is_refused_then_rebuilt_and_resumed(
    engine: Engine, store: VectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_model(chunk_size=150)
    old_idx, old_factory = setup_app(engine, store, model, HashEmbedder(dimension=64), ROWS)

    new_idx = SemanticIndex(store=store, embedder=HashEmbedder(dimension=32, name="hash-32"))
    new_factory = sessionmaker(engine)
    # searching with the new model would compare unrelated vector spaces: refused, clearly
    with new_factory() as s, pytest.raises(EmbeddingDriftError) as info:
        model.semantic_search(s, "harbor", index=new_idx)
    assert "model: 'hash-embedder' -> 'hash-32'" in str(info.value)
    assert "dimension: 64 -> 32" in str(info.value)

    # build while the old deployment searches; an interruption loses nothing done
    searcher = Searcher(old_factory, model, ROWS)
    searcher.start()

    class Interrupt(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.writes = 0

        def write(self, text: str) -> int:
            self.writes += 1
            if self.writes == 2:  # after the second batch
                raise KeyboardInterrupt
            return super().write(text)

    try:
        with pytest.raises(KeyboardInterrupt):
            rebuild(new_idx, model, engine, batch_size=4, switch=False, progress=Interrupt())
        (first,) = rebuild(new_idx, model, engine, batch_size=4, switch=False)
    finally:
        searcher.finish()
    assert searcher.failures == [] and searcher.done > 0
    assert not first.switched
    embedded_by_resume = first.embedded
    assert 0 < embedded_by_resume  # the rows after the interruption
    total = new_idx.store.count(first.built_in)
    assert embedded_by_resume < total  # the first two batches were not embedded again
    # the old collection still serves the old model until the switch
    assert new_idx.store.collection_info("doc__body")["dimension"] == 64  # type: ignore[index]

    with old_factory() as s:  # the old deployment still writes before the switch
        s.delete(s.get(model, 0))
        s.commit()
    (second,) = rebuild(new_idx, model, engine, batch_size=4)
    assert second.switched and second.embedded == 0  # resumed: nothing left to embed
    assert new_idx.store.points("doc__body", "0") == []  # the row deleted meanwhile is gone
    assert new_idx.store.collection_info("doc__body")["dimension"] == 32  # type: ignore[index]
    # the old deployment, still running, looks at the collection again (after RECHECK s): it
    # kept writing its model's vectors into the switched collection, and searching it
    monkeypatch.setattr(binding, "RECHECK", 0.0)
    late = ROWS + 1
    with old_factory() as s:
        s.add(model(id=late, title="late", body="a late row about zeppelins"))
        s.commit()
        with pytest.raises(EmbeddingDriftError):
            model.semantic_search(s, "harbor")
    assert new_idx.store.points("doc__body", str(late)) == []  # refused: its job waits
    new_idx.install(new_factory)
    try:
        new_idx.drain(engine, timeout=30)  # (synced by the new model, searched below)
        assert len(new_idx.store.points("doc__body", str(late))) == 1
        with new_factory() as s:
            for i in range(1, ROWS):
                hits = model.semantic_search(s, WORDS[i], limit=1, mode="hybrid")
                assert hits[0].obj.id == i
            assert all(h.obj.id != 0 for h in model.semantic_search(s, WORDS[0], limit=ROWS))
            assert model.semantic_search(s, "zeppelins", limit=1)[0].obj.id == late
    finally:
        new_idx.uninstall(new_factory)
        old_idx.uninstall(old_factory)


def test_gc_lists_then_drops_collections_of_dropped_columns(
    engine: Engine, store: VectorStore, hash_embedder: HashEmbedder, tmp_path: Path
) -> None:
    current = make_model(chunk_size=150)
    idx, _ = setup_app(engine, store, current, hash_embedder, 3)

    class Gone(DeclarativeBase):
        pass

    class Legacy(SemanticSearchMixin, Gone):
        __tablename__ = "legacy"
        id: Mapped[int] = mapped_column(primary_key=True)
        text: Mapped[str | None] = mapped_column(SemanticText(chunk_size=100, overlap=0))

    class Kept(SemanticSearchMixin, Gone):
        __tablename__ = "kept"
        id: Mapped[int] = mapped_column(primary_key=True)
        text: Mapped[str | None] = mapped_column(SemanticText(chunk_size=100, overlap=0))

    other = SemanticIndex(store=store, embedder=hash_embedder)
    other_factory = sessionmaker(engine)
    Gone.metadata.create_all(engine)
    other.install(other_factory)
    with other_factory() as s:
        s.add_all([Legacy(id=1, text="old vectors"), Kept(id=1, text="model not imported")])
        s.commit()
    other.uninstall(other_factory)
    Legacy.__table__.drop(engine)  # type: ignore[attr-defined]
    # an abandoned rebuild for settings nobody declares any more
    stale = make_model(chunk_size=90)
    stale_idx = SemanticIndex(store=store, embedder=hash_embedder)
    rebuild(stale_idx, stale, engine, switch=False)

    found = {o.collection: o for o in gc(idx, engine, dry_run=True, force=True)}
    assert set(found) == {
        "legacy__text",
        "kept__text",
        rebuild_name(stale_idx, stale_idx.columns()[0]),
    }
    assert found["legacy__text"].removable and found["legacy__text"].points == 1
    assert "gone from the database" in found["legacy__text"].reason
    assert not found["kept__text"].removable and "still exists" in found["kept__text"].reason
    names = set(store.list_collections())
    assert set(found) <= names  # a dry run drops nothing

    if isinstance(store, QdrantClientStore):  # a shared server needs a prefix, or force
        with pytest.raises(ConfigurationError, match="collection_prefix"):
            gc(idx, engine)
    gc(idx, engine, force=True)
    names = set(store.list_collections())
    assert "legacy__text" not in names and "kept__text" in names
    assert not [n for n in names if REBUILD_MARK in n]
    assert "doc__body" in names and store.count("doc__body") > 0
    assert gc(idx, engine, dry_run=True, force=True)[0].collection == "kept__text"
    assert not [n for n in physical(store) if n.startswith("legacy__text")]


def test_gc_refuses_an_index_that_knows_no_model(
    engine: Engine, store: VectorStore, hash_embedder: HashEmbedder
) -> None:
    idx = SemanticIndex(store=store, embedder=hash_embedder, models=[])
    with pytest.raises(Exception, match="knows no SemanticText column"):
        gc(idx, engine, dry_run=True, force=True)


HOLDER = """
import sys, time
from semantic_orm import EdgeStore
from semantic_orm.stores.base import CollectionSpec
store = EdgeStore(sys.argv[1])
store.ensure_collection(CollectionSpec("live", 4, "m"))
print("ready", flush=True)
time.sleep(60)
"""


def test_edge_refuses_to_switch_a_collection_another_process_holds(tmp_path: Path) -> None:
    import subprocess
    import sys

    from semantic_orm import VectorStoreError
    from semantic_orm.stores.base import CollectionSpec

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        store = EdgeStore(tmp_path)
        store.ensure_collection(CollectionSpec("build", 4, "m"))
        with pytest.raises(VectorStoreError, match="one process at a time"):
            store.replace_collection("live", "build")
        assert (tmp_path / "live" / "semantic_orm.json").exists()  # untouched
        assert store.list_collections() == ["build", "live"]
        store.close()
    finally:
        holder.kill()
        holder.wait()
