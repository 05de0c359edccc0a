"""The ``semantic-orm`` command, run in-process against a small application module.

``tests/cli_app.py`` reads its database URL and vector directory from the environment, as a real
deployment does. SQLite and PostgreSQL, the fake embedder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from semantic_orm.cli import main as cli_main

from .helpers import WORDS, doc_text, unload_cli_app
from .models import Article, Base


@pytest.fixture
def tables(engine: Engine) -> Engine:
    Base.metadata.create_all(engine)
    return engine


def test_cli_status_reindex_and_worker(
    tables: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    import importlib

    monkeypatch.setenv("SEMANTIC_ORM_TEST_DB", tables.url.render_as_string(hide_password=False))
    monkeypatch.setenv("SEMANTIC_ORM_TEST_VECTORS", str(tmp_path / "cli-vectors"))
    sys.modules.pop("tests.cli_app", None)
    app = importlib.import_module("tests.cli_app")
    with app.Session() as s:
        s.add_all(Article(title=f"t{i}", content=f"row {i}") for i in range(4))
        s.commit()  # deferred: jobs wait for the worker
    assert cli_main(["status", "tests.cli_app:index", "--json"]) == 0
    (row,) = [r for r in json.loads(capsys.readouterr().out) if r["column"] == "Article.content"]
    assert row["column"] == "Article.content" and row["pending_jobs"] == 4
    assert row["indexed_rows"] == 0 and row["oldest_pending_age_s"] >= 0
    assert cli_main(["worker", "tests.cli_app:index", "--once", "--poll", "0.01"]) == 0
    assert "4 jobs done" in capsys.readouterr().err
    assert cli_main(["reindex", "tests.cli_app:index", "tests.models:Article", "--all"]) == 0
    assert "queued and processed 4 rows of Article" in capsys.readouterr().out
    assert cli_main(["status", "tests.cli_app:index"]) == 0
    table = capsys.readouterr().out
    assert "Article.content" in table and " 4 " in table
    assert cli_main(["status", "tests.cli_app"]) == 2  # not module:attribute
    assert "expected module:attribute" in capsys.readouterr().err
    assert cli_main(["status", "tests.cli_app:Session"]) == 2
    assert "not a SemanticIndex" in capsys.readouterr().err
    unload_cli_app(app)


def test_cli_rebuild_and_gc(
    engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    import importlib
    import sys

    from semantic_orm.cli import main as cli_main
    from tests.models import Article, Base

    monkeypatch.setenv("SEMANTIC_ORM_TEST_DB", engine.url.render_as_string(hide_password=False))
    monkeypatch.setenv("SEMANTIC_ORM_TEST_VECTORS", str(tmp_path / "cli-vectors"))
    Base.metadata.create_all(engine)
    sys.modules.pop("tests.cli_app", None)
    app = importlib.import_module("tests.cli_app")
    try:
        with app.Session() as s:
            s.add_all(Article(id=i, title=f"t{i}", content=doc_text(i)) for i in range(5))
            s.commit()
        assert cli_main(["worker", "tests.cli_app:index", "--once", "--poll", "0.01"]) == 0
        capsys.readouterr()
        argv = ["reindex", "tests.cli_app:index", "tests.models:Article", "--rebuild"]
        assert cli_main([*argv, "--no-switch"]) == 0
        out = capsys.readouterr().out
        assert "Article.content: rebuilt 5 rows" in out and "not switched yet" in out
        assert cli_main(["gc", "tests.cli_app:index", "--dry-run"]) == 0
        assert "no orphan collections" in capsys.readouterr().out  # a resumable rebuild is kept
        assert cli_main(argv) == 0
        out = capsys.readouterr().out
        assert "0 chunks embedded" in out and "switched 'article__content'" in out
        assert cli_main(["status", "tests.cli_app:index", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        (row,) = [r for r in rows if r["column"] == "Article.content"]
        assert row["drift"] == {} and row["indexed_rows"] == 5 and row["pending_jobs"] == 0
        with app.Session() as s:
            hits = Article.semantic_search(s, WORDS[2], limit=1, mode="keyword")
            assert [h.obj.id for h in hits] == [2]
    finally:
        unload_cli_app(app)


@pytest.fixture
def app(tables: Engine, tmp_path: Path, monkeypatch: Any) -> Any:
    """``tests.cli_app`` imported afresh on this test's database and vector directory."""
    import importlib

    monkeypatch.setenv("SEMANTIC_ORM_TEST_DB", tables.url.render_as_string(hide_password=False))
    monkeypatch.setenv("SEMANTIC_ORM_TEST_VECTORS", str(tmp_path / "cli-vectors"))
    sys.modules.pop("tests.cli_app", None)
    module = importlib.import_module("tests.cli_app")
    yield module
    unload_cli_app(module)


def test_version_and_one_line_errors(app: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from semantic_orm import __version__

    with pytest.raises(SystemExit) as done:
        cli_main(["--version"])
    assert done.value.code == 0 and __version__ in capsys.readouterr().out
    assert cli_main(["status", "no_such_module:index"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("semantic-orm: cannot import 'no_such_module'") and "Traceback" not in err
    assert cli_main(["status", "tests.cli_app:missing"]) == 2
    assert "has no attribute 'missing'" in capsys.readouterr().err
    assert cli_main(["reindex", "tests.cli_app:index", "tests.models:Nope"]) == 2
    assert "has no attribute 'Nope'" in capsys.readouterr().err
    # not a model where one is named (a traceback, or "database error", with status 1)
    for argv, said in (
        (["reindex", "tests.cli_app:index", "tests.cli_app:engine"], "is a Engine, not a model"),
        (["reindex", "tests.cli_app:index", "tests.models:Base"], "a class no mapper maps"),
        (["reconcile", "tests.cli_app:index", "tests.cli_app:Session"], "is a sessionmaker"),
        (["reindex", "tests.cli_app:index", "tests.models:Article", "--no-switch"], "--rebuild"),
        (["status", "tests.cli_app:index", "--db", "not a url"], "--db 'not a url'"),
    ):
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, argv
    # options that would do nothing (a batch of 0: exit 0, the work not done), or fail late
    for argv in (
        ["worker", "tests.cli_app:index", "--once", "--batch", "0"],
        ["reconcile", "tests.cli_app:index", "--batch", "-1"],
        ["reindex", "tests.cli_app:index", "tests.models:Article", "--batch", "0"],
        ["worker", "tests.cli_app:index", "--poll", "-1"],
        ["eval", "tests.cli_app:index", "tests.models:Article", "gold.jsonl", "--k", "0"],
    ):
        with pytest.raises(SystemExit) as refused:
            cli_main(argv)
        assert refused.value.code == 2, argv
        assert "must be" in capsys.readouterr().err, argv


def test_an_async_database_url_is_used_with_its_blocking_driver(tmp_path: Path) -> None:
    """The README says an async URL works for ``--db``, and an index installed on an async
    factory needs none: the commands, which block, failed on SQLAlchemy's MissingGreenlet,
    and before the application's first transaction they found no engine at all (the README's
    FastAPI stack: ``semantic-orm worker myapp.search:index`` asked for the Engine)."""
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    from semantic_orm import SemanticIndex
    from semantic_orm.cli import _engine
    from semantic_orm.testing import HashEmbedder, MemoryStore

    url = f"sqlite+aiosqlite:///{tmp_path / 'app.sqlite3'}"
    index = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder())
    factory = async_sessionmaker(create_async_engine(url))
    index.install(factory)
    try:
        for given in (_engine(index, None), _engine(index, url)):
            assert given.url.drivername == "sqlite" and not given.dialect.is_async
            assert given.url.database == str(tmp_path / "app.sqlite3")
            with given.connect() as conn:  # (a blocking connection works)
                assert conn.exec_driver_sql("select 1").scalar() == 1
    finally:
        index.uninstall(factory)


def test_an_async_factory_beside_a_blocking_one_leaves_the_blocking_engine_the_default(
    tmp_path: Path,
) -> None:
    """An application that installs one database through an async factory and a blocking
    one (an API and its scripts): ``drain()`` and the commands use the blocking engine, as
    they did before the async factory's engine was known at install."""
    from sqlalchemy import create_engine
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
    from sqlalchemy.orm import sessionmaker

    from semantic_orm import SemanticIndex
    from semantic_orm.cli import _engine
    from semantic_orm.testing import HashEmbedder, MemoryStore

    path = tmp_path / "app.sqlite3"
    index = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder())
    factories = [
        async_sessionmaker(create_async_engine(f"sqlite+aiosqlite:///{path}")),
        sessionmaker(create_engine(f"sqlite:///{path}")),
    ]
    for factory in factories:
        index.install(factory)
    try:
        blocking = factories[1].kw["bind"]
        assert index.engine_for() is blocking and _engine(index, None) is blocking
        assert index.drain().claimed == 0  # (it found an engine: no job yet)
    finally:
        for factory in factories:
            index.uninstall(factory)


def test_an_index_whose_sessions_choose_their_engine_asks_for_a_database_url() -> None:
    """Flask-SQLAlchemy's ``db.session`` picks its engine per request, inside an application
    context: a command cannot know it, and must say what to pass."""
    from sqlalchemy.orm import scoped_session, sessionmaker

    from semantic_orm import ConfigurationError, SemanticIndex
    from semantic_orm.cli import _engine
    from semantic_orm.testing import HashEmbedder, MemoryStore

    index = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder())
    session = scoped_session(sessionmaker())
    index.install(session)
    try:
        with pytest.raises(ConfigurationError, match="pass --db URL"):
            _engine(index, None)
    finally:
        index.uninstall(session)


def test_a_database_url_keeps_the_installed_engines_schema_translation(tmp_path: Path) -> None:
    """``--db`` for a tenant's index (its engine translates the models' schema to the
    tenant's): the command read and wrote the tables the models declare, another tenant's,
    into this tenant's collections."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import sessionmaker

    from semantic_orm import SemanticIndex
    from semantic_orm.cli import _engine
    from semantic_orm.testing import HashEmbedder, MemoryStore

    url = f"sqlite:///{tmp_path / 'tenant.sqlite3'}"
    tenant = create_engine(url).execution_options(schema_translate_map={None: "acme"})
    index = SemanticIndex(
        store=MemoryStore(),
        embedder=HashEmbedder(),
        collection_prefix="acme__",
        create_outbox=False,
    )
    factory = sessionmaker(tenant)
    index.install(factory)
    try:
        given = _engine(index, url)
        assert given.get_execution_options()["schema_translate_map"] == {None: "acme"}
        assert given.url == tenant.url and given is not tenant
        assert _engine(index, None) is tenant
    finally:
        index.uninstall(factory)


def test_a_missing_table_is_one_line(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    import importlib

    monkeypatch.setenv("SEMANTIC_ORM_TEST_DB", f"sqlite:///{tmp_path / 'empty.sqlite3'}")
    monkeypatch.setenv("SEMANTIC_ORM_TEST_VECTORS", str(tmp_path / "v"))
    sys.modules.pop("tests.cli_app", None)
    module = importlib.import_module("tests.cli_app")
    try:
        code = cli_main(["reindex", "tests.cli_app:index", "tests.models:Article"])
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]  # after the progress bar's line
        assert code == 2 and last.startswith("semantic-orm: database error:")  # (a setting)
        assert "article" in last and "Traceback" not in err
        # a database with none of the models' tables (the wrong --db, the migrations not
        # run): status, reconcile and the worker reported nothing and exited 0
        for argv in (["status"], ["reconcile"], ["worker", "--once"]):
            assert cli_main([argv[0], "tests.cli_app:index", *argv[1:]]) == 2, argv
            err = capsys.readouterr().err
            assert "has none of the tables of the index's models" in err, (argv, err)
            assert "article" in err and "the migrations not run" in err
        # the service waits for them instead (an application may make them at its start)

        def stop(waits: list[float]) -> None:
            raise KeyboardInterrupt

        assert _service([], monkeypatch, stop) == 130
        err = capsys.readouterr().err
        assert "has none of the tables of the index's models" in err and "waiting for them" in err
    finally:
        unload_cli_app(module)


def test_jobs_no_loaded_model_maps_are_reported(
    app: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from semantic_orm import outbox

    with app.engine.begin() as conn:
        outbox.enqueue(conn, [outbox.JobKey("ghost", "body", "1")])
    assert cli_main(["status", "tests.cli_app:index"]) == 1
    assert "1 jobs name ghost.body, which no loaded model maps" in capsys.readouterr().err
    assert cli_main(["worker", "tests.cli_app:index", "--once", "--poll", "0.01"]) == 2
    assert "ghost.body" in capsys.readouterr().err


def test_status_groups_errors_and_requeue_takes_a_column_and_a_row(
    app: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from semantic_orm import outbox

    with app.Session() as s:
        s.add_all(Article(id=i, title="t", content=f"row {i}") for i in (1, 2))
        s.commit()
    with app.engine.begin() as conn:  # both jobs failed for good, for the same reason
        conn.execute(
            outbox.outbox.update().values(dead=True, attempts=5, last_error="EmbeddingError: boom")
        )
    assert cli_main(["status", "tests.cli_app:index"]) == 0
    out = capsys.readouterr().out
    assert "2 dead: EmbeddingError: boom" in out
    assert cli_main(["requeue", "tests.cli_app:index", "Article.content", "--pk", "2"]) == 0
    assert "requeued 1 dead-lettered jobs" in capsys.readouterr().out
    assert cli_main(["worker", "tests.cli_app:index", "--once", "--poll", "0.01"]) == 0
    assert "1 jobs done" in capsys.readouterr().err
    assert cli_main(["requeue", "tests.cli_app:index", "article.content"]) == 0
    assert "requeued 1 dead-lettered jobs" in capsys.readouterr().out


def test_commands_that_embed_nothing_load_no_model(tables: Engine, tmp_path: Path) -> None:
    from sqlalchemy.orm import sessionmaker

    from semantic_orm import EdgeStore, SemanticIndex, SentenceTransformerEmbedder
    from semantic_orm.maintenance import gc, status

    embedder = SentenceTransformerEmbedder()
    idx = SemanticIndex(store=EdgeStore(tmp_path / "v"), embedder=embedder, models=[Article])
    factory = sessionmaker(tables)
    idx.install(factory)
    with factory() as s:
        s.add(Article(id=1, title="t", content=None))  # nothing to embed
        s.commit()
    status(idx, tables)
    gc(idx, tables, dry_run=True)
    assert not embedder.loaded
    idx.uninstall(factory)
    idx.close()


HOLDER = """
import os, sys, time
sys.path.insert(0, os.environ["ROOT"])
import tests.cli_app as app
from tests.models import Article
with app.Session() as s:
    s.add(Article(id=1, title="t", content="the first process holds the shard"))
    s.commit()
app.index.drain(app.engine, timeout=30)
print("ready", flush=True)
time.sleep(120)
"""


def test_a_second_process_on_an_edge_directory_gets_one_clear_error(
    tables: Engine, tmp_path: Path, monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib
    import os
    import subprocess

    from semantic_orm import VectorStoreError

    env = {
        **os.environ,
        "ROOT": str(Path(__file__).resolve().parents[1]),
        "SEMANTIC_ORM_TEST_DB": tables.url.render_as_string(hide_password=False),
        "SEMANTIC_ORM_TEST_VECTORS": str(tmp_path / "shared-vectors"),
    }
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        for name in ("SEMANTIC_ORM_TEST_DB", "SEMANTIC_ORM_TEST_VECTORS"):
            monkeypatch.setenv(name, env[name])
        sys.modules.pop("tests.cli_app", None)
        app = importlib.import_module("tests.cli_app")
        with app.Session() as s, pytest.raises(VectorStoreError) as info:
            Article.semantic_search(s, "first process", limit=1, index=app.index)
        message = str(info.value)
        assert str(tmp_path / "shared-vectors") in message and f"pid {holder.pid}" in message
        assert "QdrantClientStore(url=" in message and "one process" in message
        with app.Session() as s:  # a write still commits; its job waits for the shard
            s.add(Article(id=2, title="t", content="written by the second process"))
            s.commit()
        for argv in (
            ["status", "tests.cli_app:index"],
            ["worker", "tests.cli_app:index", "--once"],
        ):
            assert cli_main(argv) == 1
            err = capsys.readouterr().err
            assert f"pid {holder.pid}" in err and "Traceback" not in err
        unload_cli_app(app)
    finally:
        holder.kill()
        holder.wait()


def test_the_worker_service_waits_out_a_failing_database(tables: Engine, tmp_path: Path) -> None:
    """``worker`` without ``--once`` outlives a database that refuses it for a while (here the
    outbox locked past the driver's lock timeout): a line per failed pass, then the jobs done
    once it works again. ``--once`` still stops at the first failure, with status 1."""
    import os
    import signal
    import sqlite3
    import subprocess
    import threading
    import time

    from sqlalchemy import insert

    from semantic_orm import EdgeStore, outbox

    from .helpers import assert_index_matches_database, pending

    url = tables.url
    sqlite = url.get_backend_name() == "sqlite"
    timeout = {"timeout": "0.2"} if sqlite else {"options": "-c lock_timeout=200"}
    vectors = tmp_path / "worker-vectors"
    env = {
        **os.environ,
        "SEMANTIC_ORM_TEST_DB": url.update_query_dict(timeout).render_as_string(False),
        "SEMANTIC_ORM_TEST_VECTORS": str(vectors),
    }
    with tables.begin() as conn:
        outbox.create_tables(conn)
        rows = [{"id": i, "title": f"t{i}", "content": doc_text(i)} for i in range(3)]
        conn.execute(insert(Article), rows)
        outbox.enqueue(conn, [("article", "content", str(i)) for i in range(3)])
    command = [
        *(sys.executable, "-X", "faulthandler"),
        *("-m", "semantic_orm.cli", "worker", "tests.cli_app:index"),
    ]
    root = Path(__file__).resolve().parents[1]
    if sqlite:
        assert url.database is not None
        locker: Any = sqlite3.connect(url.database, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
    else:
        locker = tables.connect()
        locker.begin()
        locker.exec_driver_sql(f"LOCK TABLE {outbox.OUTBOX_TABLE} IN ACCESS EXCLUSIVE MODE")
    try:
        once = subprocess.run(
            [*command, "--once"], env=env, cwd=root, capture_output=True, text=True, timeout=120
        )
        assert once.returncode == 1, once.stderr
        assert "semantic-orm: database error:" in once.stderr and "Traceback" not in once.stderr
        service = subprocess.Popen(
            [*command, "--poll", "0.05", "--interval", "0.1"],
            env=env,
            cwd=root,
            stderr=subprocess.PIPE,
            text=True,
            # SIGINT as a terminal delivers it: a suite run in the background (``pytest &``)
            # ignores it, and so would its children, Python's Ctrl-C handler not installed
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        assert service.stderr is not None
        # the import installs the index (the outbox left for later, with a warning), then
        # two passes fail, each waiting longer; the service goes on
        lines = [service.stderr.readline() for _ in range(3)]
        assert "the outbox could not be checked at install" in lines[0], lines
        assert all("semantic-orm worker: database error:" in line for line in lines[1:]), lines
        assert "(1 failed in a row)" in lines[1] and "(2 failed in a row)" in lines[2]
        assert service.poll() is None
    finally:
        locker.rollback()
        locker.close()
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(service.stderr.readline, "")))
    reader.start()
    try:  # until its progress line says the jobs are done (it prints one every 0.1 s)
        deadline = time.monotonic() + 60
        while not any("3 jobs done" in line for line in list(seen)):
            assert time.monotonic() < deadline and service.poll() is None, seen
            time.sleep(0.05)
        service.send_signal(signal.SIGINT)
        try:
            service.wait(timeout=60)
        except subprocess.TimeoutExpired:  # where each thread waits
            service.send_signal(signal.SIGABRT)  # faulthandler prints their stacks
            service.wait(timeout=30)
            reader.join(timeout=30)
            pytest.fail("the worker did not stop after SIGINT:\n" + "".join(seen))
    finally:
        service.kill()
        reader.join(timeout=60)
    err = "".join(seen)
    assert service.returncode == 130, err
    assert "the database works again after" in err and "Traceback" not in err
    assert pending(tables) == []
    store = EdgeStore(vectors)
    try:
        assert assert_index_matches_database(tables, store) > 0
    finally:
        store.close()


def _service(argv: list[str], monkeypatch: Any, step: Any) -> int:
    """Run ``semantic-orm worker`` (a service) in-process, ``step(waits)`` called at each of
    its waits instead of sleeping (it raises ``KeyboardInterrupt`` to stop the service)."""
    import time
    import types

    from semantic_orm import cli

    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        step(waits)

    clock = types.SimpleNamespace(sleep=sleep, monotonic=time.monotonic)
    monkeypatch.setattr(cli, "time", clock)
    return cli_main(["worker", "tests.cli_app:index", "--poll", "0.01", *argv])


def test_the_worker_service_stops_at_a_database_no_wait_mends(
    tables: Engine, tmp_path: Path, monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong database (a path in no directory, a database name the server lacks) stops the
    service at its first pass with status 1 and one line, as ``--once`` does; a server not
    there yet (a port nothing listens on, a socket directory without its socket) or out of
    connections is waited out."""
    import importlib

    from sqlalchemy import text

    from .pg_cluster import free_port

    url = tables.url
    cases: list[tuple[Any, int]] = []
    if url.get_backend_name() == "sqlite":
        cases.append((url.set(database=str(tmp_path / "no-such-directory" / "db.sqlite3")), 1))
    else:
        role = f"full_{url.database}"[:60]
        with tables.begin() as conn:  # a role out of connections ("too many connections")
            conn.execute(text(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0"))
        cases += [
            (url.set(database="no_such_database"), 1),
            (url.set(host="127.0.0.1", port=free_port()), 130),
            (url.set(host=str(tmp_path)), 130),  # (no server's socket there)
            (url.set(username=role), 130),
        ]
    for bad, expected in cases:
        monkeypatch.setenv("SEMANTIC_ORM_TEST_DB", bad.render_as_string(hide_password=False))
        monkeypatch.setenv("SEMANTIC_ORM_TEST_VECTORS", str(tmp_path / "v"))
        sys.modules.pop("tests.cli_app", None)
        app = importlib.import_module("tests.cli_app")  # (install warns, and goes on)

        def step(waits: list[float]) -> None:
            if len(waits) == 3:
                raise KeyboardInterrupt

        try:
            code = _service([], monkeypatch, step)
        finally:
            unload_cli_app(app)
        err = capsys.readouterr().err
        assert code == expected, err
        assert "Traceback" not in err
        if expected == 1:
            assert "trying again" not in err
            assert err.strip().splitlines()[-1].startswith("semantic-orm: database error:")
        else:
            assert err.count("trying again") == 3 and "(3 failed in a row)" in err, err
    if url.get_backend_name() != "sqlite":
        with tables.begin() as conn:
            conn.execute(text(f"DROP ROLE {role}"))


def test_the_worker_service_waits_out_any_database_error_once_a_pass_worked(
    app: Any, tables: Engine, monkeypatch: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once a pass worked the settings are right: an error that would stop a service at its
    start (here the outbox gone for a while, as in a migration) is waited out."""
    from sqlalchemy import insert

    from semantic_orm import outbox

    from .helpers import pending

    if tables.url.get_backend_name() != "sqlite":
        pytest.skip("PostgreSQL says a missing table is a ProgrammingError, never waited out")
    with app.Session() as s:
        s.add_all(Article(title=f"t{i}", content=doc_text(i)) for i in range(2))
        s.commit()
    moved = f"{outbox.OUTBOX_TABLE}_moved"

    def step(waits: list[float]) -> None:
        if len(waits) == 1:  # the jobs done: the outbox goes away
            with tables.begin() as conn:
                conn.exec_driver_sql(f"ALTER TABLE {outbox.OUTBOX_TABLE} RENAME TO {moved}")
        elif len(waits) == 3:  # two passes failed: it comes back, with a job
            with tables.begin() as conn:
                conn.exec_driver_sql(f"ALTER TABLE {moved} RENAME TO {outbox.OUTBOX_TABLE}")
                conn.execute(insert(Article).values(id=99, title="t", content=doc_text(9)))
                outbox.enqueue(conn, [("article", "content", "99")])
        elif len(waits) > 4:
            raise KeyboardInterrupt

    assert _service(["--interval", "1000"], monkeypatch, step) == 130
    err = capsys.readouterr().err
    assert "no such table" in err and "(2 failed in a row)" in err, err
    assert "the database works again after 2 failed passes" in err
    assert pending(tables) == []


def test_status_table_says_what_each_refresh_and_drift_needs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from semantic_orm.cli import _status_table
    from semantic_orm.maintenance import ColumnStatus

    state = ColumnStatus(
        column="Article.content",
        collection="article__content",
        rows=3,
        indexed_rows=3,
        pending_jobs=0,
        dead_jobs=0,
        oldest_pending_age=None,
        drift={"chunker.chunk_size": (200, 100)},
        unfilled_filters=["tenant"],
        stale_keywords=("2", "3"),
    )
    _status_table([state])
    out = capsys.readouterr().out
    assert "drift: chunker.chunk_size 200 -> 100 (reindex --rebuild)" in out
    assert "filter_by tenant: not in every payload yet" in out
    assert "keywords: points of analyser '2', this version writes '3'; reindex --all" in out
    assert json.loads(json.dumps(state.as_dict()))["stale_keywords"] == ["2", "3"]


def test_sigterm_stops_the_worker_service_as_ctrl_c_does(tables: Engine, tmp_path: Path) -> None:
    """``docker stop`` and Kubernetes send SIGTERM: it killed the worker wherever it was
    (status -15, mid-pass, no exit handler). It stops as Ctrl-C does, with status 143."""
    import os
    import signal
    import subprocess
    import threading
    import time

    from sqlalchemy import insert

    from semantic_orm import outbox

    from .helpers import pending

    env = {
        **os.environ,
        "SEMANTIC_ORM_TEST_DB": tables.url.render_as_string(False),
        "SEMANTIC_ORM_TEST_VECTORS": str(tmp_path / "worker-vectors"),
    }
    with tables.begin() as conn:
        outbox.create_tables(conn)
        conn.execute(insert(Article), [{"id": 1, "title": "t", "content": doc_text(1)}])
        outbox.enqueue(conn, [("article", "content", "1")])
    service = subprocess.Popen(
        [
            *(sys.executable, "-m", "semantic_orm.cli", "worker", "tests.cli_app:index"),
            *("--poll", "0.05", "--interval", "0.1"),
        ],
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert service.stderr is not None
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(service.stderr.readline, "")))
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any("1 jobs done" in line for line in list(seen)):
            assert time.monotonic() < deadline and service.poll() is None, seen
            time.sleep(0.05)
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=60)
    finally:
        service.kill()
        reader.join(timeout=60)
    assert service.returncode == 143, "".join(seen)
    assert "Traceback" not in "".join(seen) and pending(tables) == []


def test_the_worker_leaves_sigterm_to_a_program_that_handles_it(
    tables: Engine, tmp_path: Path, monkeypatch: Any
) -> None:
    """A program that runs the worker command (``cli.main([...])``) with a SIGTERM handler of
    its own keeps it: the command replaced it with its own."""
    import signal

    monkeypatch.setenv("SEMANTIC_ORM_TEST_DB", tables.url.render_as_string(hide_password=False))
    monkeypatch.setenv("SEMANTIC_ORM_TEST_VECTORS", str(tmp_path / "v"))
    sys.modules.pop("tests.cli_app", None)
    import importlib

    module = importlib.import_module("tests.cli_app")
    seen: list[Any] = []

    def own(signum: int, frame: Any) -> None:  # (never called: the handler is only looked at)
        pass

    def look(waits: list[float]) -> None:
        seen.append(signal.getsignal(signal.SIGTERM))
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, own)
    try:
        assert _service([], monkeypatch, look) == 130
        assert seen == [own]
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        seen.clear()
        assert _service([], monkeypatch, look) == 130
        assert seen and seen[0] is not signal.SIG_DFL  # the command's, while it runs
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # and given back after
    finally:
        signal.signal(signal.SIGTERM, previous)
        unload_cli_app(module)
