"""Helpers shared by the test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import select
from sqlalchemy.engine import Engine

from semantic_orm import EmbeddingError, outbox, processing
from semantic_orm.applying import text_hash
from semantic_orm.chunking import fit, tokenizer_lock
from semantic_orm.mapping import row_key, semantic_columns
from semantic_orm.stores.base import PointPayload
from semantic_orm.testing import HashEmbedder

from .models import Article

COLL = "article__content"
LONG = "\n\n".join(
    f"Paragraph {i} talks about topic number {i}. It has a second sentence about item {i}."
    for i in range(12)
)
"""Twelve short paragraphs: a text that makes several chunks in every chunker."""


def jobs(engine: Engine) -> list[dict[str, Any]]:
    """The outbox rows, oldest first (empty if the table was never created)."""
    if not sa_inspect(engine).has_table(outbox.OUTBOX_TABLE):
        return []
    with engine.connect() as conn:
        rows = conn.execute(select(outbox.outbox).order_by(outbox.outbox.c.id))
        return [dict(r._mapping) for r in rows]


def pending(engine: Engine) -> list[dict[str, Any]]:
    """Outbox rows that are not dead-lettered."""
    return [j for j in jobs(engine) if not j["dead"]]


def settled(engine: Engine, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The outbox rows once the finished jobs of inline commits are deleted.

    On SQLite those are deleted by the next commit, or a moment after theirs by a timer
    (``DeferredSettle``), not by the commit's own sync: wait (at most ``timeout`` s) for the
    outbox to empty, and return what is left.
    """
    deadline = time.monotonic() + timeout
    while True:
        rows = jobs(engine)
        if not rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.02)


def payloads(store: Any, pk: Any, collection: str = COLL) -> list[dict[str, Any]]:
    """A row's point payloads, by chunk index."""
    key = row_key(pk if isinstance(pk, tuple) else (pk,))
    return sorted(
        (dict(p.payload) for p in store.points(collection, key)), key=lambda p: p["chunk_index"]
    )


def expected_points(model: Any, attr: str, text: str | None) -> list[tuple[int, int, int, int]]:
    """(index, start, end, total) of the chunks ``text`` must have for ``model.attr``."""
    if not text:
        return []
    (col,) = [c for c in semantic_columns(sa_inspect(model)) if c.key == attr]
    chunker = col.settings.make_chunker()
    return [(c.index, c.start_offset, c.end_offset, c.total_chunks) for c in chunker.chunk(text)]


def assert_index_matches_database(
    engine: Engine,
    store: Any,
    model: Any = Article,
    attr: str = "content",
    collection: str = COLL,
) -> int:
    """Every row's points are exactly its current text's chunks, with that text; nothing else.

    Returns the number of points.
    """
    mapper = sa_inspect(model)
    column = getattr(model, attr)
    with engine.connect() as conn:
        rows = {
            row_key(tuple(r)[:-1]): r[-1] for r in conn.execute(select(*mapper.primary_key, column))
        }
    by_row: dict[str, list[dict[str, Any]]] = {}
    for point in store.points(collection):
        by_row.setdefault(str(point.payload["pk"]), []).append(dict(point.payload))
    total = 0
    for key, text in rows.items():
        found = sorted(by_row.pop(key, []), key=lambda p: p["chunk_index"])
        want = expected_points(model, attr, text)
        got = [
            (p["chunk_index"], p["start_offset"], p["end_offset"], p["total_chunks"]) for p in found
        ]
        assert got == want, f"row {key}: points {got} != chunks {want}"
        for p in found:
            piece = (text or "")[p["start_offset"] : p["end_offset"]]
            stored = PointPayload.from_dict(p).chunk_hash
            assert stored == text_hash(piece), f"row {key}: stale text"
        total += len(want)
    assert not by_row, f"points of rows absent from SQL: {sorted(by_row)[:5]}"
    assert store.count(collection) == total
    return total


class PoisonEmbedder(HashEmbedder):
    """Fails, permanently, on any batch holding the word POISON."""

    def encode(self, texts: Any) -> Any:
        if any("POISON" in t for t in texts):
            raise EmbeddingError("this text poisons the model")
        return super().encode(texts)


def points_of(index: Any, pk: Any, collection: str = COLL) -> list[dict[str, Any]]:
    """A row's point payloads in ``index``'s store, by chunk index."""
    return payloads(index.store, pk, collection)


def pysqlite_recipe(engine: Engine) -> Engine:
    """SQLAlchemy's documented pysqlite recipe: driver-level transactions off, an explicit BEGIN.

    Without it a SAVEPOINT opened first in a transaction is committed by its RELEASE, and a later
    ROLLBACK undoes nothing.
    """

    @sa.event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = None

    @sa.event.listens_for(engine, "begin")
    def _explicit_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


WORDS = [
    "harbor", "glacier", "violin", "orchard", "comet", "lantern", "meadow", "falcon", "quartz",
    "saffron", "tundra", "walnut", "zephyr", "basalt", "cobalt", "dune", "ember", "fjord",
    "geyser", "hazel", "iris", "jasper", "kelp", "lagoon",
]  # fmt: skip


def doc_text(i: int) -> str:
    """A few hundred characters whose rare word identifies row ``i``."""
    word = WORDS[i]
    filler = " ".join(f"common{j} words repeated here" for j in range(8))
    return f"{word} {word} appears in the opening. {filler}. The closing mentions {word} again."


@contextlib.contextmanager
def reads_of(engine: Engine, table: str) -> Iterator[list[str]]:
    """The ``SELECT`` statements reading ``table`` on ``engine`` (a sync engine, or an async
    engine's ``sync_engine``) while the block runs."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and f"FROM {table}" in statement:
            seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def foreign_keys_on(engine: Engine) -> Engine:
    """``engine`` with SQLite's foreign keys enforced (``ON DELETE CASCADE`` runs), as
    PostgreSQL always does; connections already pooled are dropped."""
    if engine.dialect.name == "sqlite":

        @sa.event.listens_for(engine, "connect")
        def _fk(dbapi_conn: Any, record: Any) -> None:
            dbapi_conn.execute("PRAGMA foreign_keys=ON")

        engine.dispose()
    return engine


def in_a_forked_child(work: Callable[[], Any], timeout: float = 60.0) -> tuple[int, Any]:
    """Run ``work`` in a child forked from this process; its pid and what it returned (through
    JSON). The child's exception fails the test with its traceback; a child that hangs past
    ``timeout`` is killed and fails it too."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave without running the parent's exit hooks
        status = 1
        try:
            try:
                out = json.dumps({"returned": work()})
                status = 0
            except BaseException:
                out = json.dumps({"raised": traceback.format_exc()})
            with os.fdopen(write, "w") as pipe:
                pipe.write(out)
        finally:
            os._exit(status)
    os.close(write)
    os.set_blocking(read, False)
    received = b""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(read, 65536):
                received += chunk
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            with contextlib.suppress(BlockingIOError):
                while chunk := os.read(read, 65536):
                    received += chunk
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"the forked child hung for {timeout} s")
        time.sleep(0.02)
    os.close(read)
    report = json.loads(received or b"{}")
    assert "raised" not in report, f"the forked child failed:\n{report['raised']}"
    assert os.waitstatus_to_exitcode(status) == 0 and "returned" in report, report
    return pid, report["returned"]


def unload_cli_app(app: Any) -> None:
    """Undo importing ``tests/cli_app.py``: its index off its factory (a factory left installed
    would share sessions with another test's install on ``Session``), closed, and forgotten."""
    app.index.uninstall(app.Session)
    app.index.close()
    app.engine.dispose()
    sys.modules.pop("tests.cli_app", None)


def async_url(url: sa.URL) -> sa.URL:
    """``url`` with the async driver the tests use for its database (aiosqlite, asyncpg)."""
    sqlite = url.get_backend_name() == "sqlite"
    return url.set(drivername="sqlite+aiosqlite" if sqlite else "postgresql+asyncpg")


def settle_fails_once(monkeypatch: Any) -> list[int]:
    """Make the next settle of a pass fail as a database that refuses it would (locked, gone);
    the list counts the settles tried."""
    original = processing._Pass.settle
    tries: list[int] = []

    def settle(self: Any, conn: Any) -> None:
        tries.append(len(self.jobs))
        if len(tries) == 1:
            raise sa.exc.OperationalError("DELETE", {}, Exception("database is locked"))
        original(self, conn)

    monkeypatch.setattr(processing._Pass, "settle", settle)
    return tries


def tokenizer_held_in(monkeypatch: Any, model: Any, method: str) -> list[bool]:
    """Record, at each call of ``model.method``, whether the calling thread holds the lock of
    ``model.tokenizer`` (the locks taken as with transformers 4, which needs them)."""
    monkeypatch.setattr(fit, "_borrows", True)
    lock = tokenizer_lock(model.tokenizer)
    held: list[bool] = []
    original = getattr(model, method)

    def checked(*args: Any, **kwargs: Any) -> Any:
        held.append(lock._held_by(threading.get_ident()))  # type: ignore[attr-defined]
        return original(*args, **kwargs)

    monkeypatch.setattr(model, method, checked)
    return held
