"""The ``semantic-orm`` command: worker, status, reindex, reconcile, requeue, gc and eval.

Each command names the application's index as ``module:attribute``. Importing that module must
define the :class:`~semantic_orm.index.SemanticIndex` and import the models (their columns are
found in the process's ORM registries; ``models=`` on the index narrows them). The database is
the engine the index was installed with (a bound ``sessionmaker``), or ``--db URL`` (with that
engine's execution options, a tenant's ``schema_translate_map``, when there is one)::

    semantic-orm worker myapp.search:index [--once] [--interval 10]
    semantic-orm status myapp.search:index [--json]
    semantic-orm reindex myapp.search:index myapp.models:Article [--all]
    semantic-orm reindex myapp.search:index myapp.models:Article --rebuild [--no-switch]
    semantic-orm reconcile myapp.search:index [myapp.models:Article] [--restart]
    semantic-orm requeue myapp.search:index [Article.content | article.content] [--pk 42]
    semantic-orm gc myapp.search:index [--dry-run] [--json]
    semantic-orm eval myapp.search:index myapp.models:Article gold.jsonl --k 5 [--json]
    semantic-orm --version

``worker`` prints what it did (done, retried, dead, pending, lag) every ``--interval`` seconds.
``status`` shows, per column, rows, indexed rows, pending, retrying and dead jobs, lag, drift,
and the last errors grouped by cause. Both stop with a non-zero status when jobs name a table
and column no loaded model maps (the models were not imported). ``reindex --rebuild`` re-embeds
into a new collection while searches keep using the current one, then switches (see
:func:`semantic_orm.maintenance.rebuild`); ``reconcile`` queues what writes no session saw left
behind (:func:`semantic_orm.maintenance.reconcile`); ``gc`` drops the collections of dropped or
renamed columns.

Errors are one line on stderr, never a traceback: exit status 2 for a usage or configuration
error (a wrong ``module:attribute``, an object that is not a model where one is named, a
missing table, a ``--batch`` under 1), 1 for a failure of the database or the
vector store (a Qdrant Edge directory held by another process). ``worker`` without ``--once``
(a service) waits out a database that fails for a while (unreachable, restarting, locked): a
line for each failed pass, the wait doubling from ``--poll`` up to 30 s, then on. An error no
wait mends (a wrong path, database name or password, a missing table) stops it with status 1,
as ``--once``, unless a pass already worked (the settings are right: then it waits that out
too, but for a table missing on PostgreSQL, a ``ProgrammingError``, which always stops it).
A database with none of the tables of the index's models (the wrong ``--db``, the migrations
not run) stops ``status``, ``reconcile`` and ``worker --once`` with status 2; the service says
so and waits for them (an application may make them at its start). The service stops on Ctrl-C
(status 130) and SIGTERM (143) alike. Commands that embed nothing (``status``, ``requeue``,
``gc``) do not load the model.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType
from typing import Any

from sqlalchemy import Engine, create_engine, inspect
from sqlalchemy.exc import ArgumentError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from . import outbox
from .evaluation import evaluate, load_gold
from .exc import ConfigurationError, SemanticORMError, first_line, is_database_outage
from .index import SemanticIndex
from .maintenance import (
    ColumnStatus,
    gc,
    present_columns,
    rebuild,
    reconcile,
    reindex,
    status,
    unmapped_jobs,
)
from .processing import failure_wait
from .search import DEFAULT_MODE, SEARCH_MODES
from .version import __version__
from .worker import Worker

__all__ = ["main"]


def _load(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"expected module:attribute, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r} (from {spec!r}): {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigurationError(f"{module_name!r} has no attribute {attr!r}") from None
    return obj


def _index(spec: str) -> SemanticIndex:
    found = _load(spec)
    if not isinstance(found, SemanticIndex):
        raise ConfigurationError(f"{spec} is a {type(found).__name__}, not a SemanticIndex")
    return found


def _engine(index: SemanticIndex, url: str | None) -> Engine:
    """The index's installed engine, or one on ``url`` with that engine's execution options
    (a tenant's ``schema_translate_map``: without it the command read and wrote the tables of
    the schema the models declare, another tenant's, into this tenant's collections); either
    with its dialect's blocking driver where it has an async one (:func:`_blocking`)."""
    if not url:
        try:
            known = index.engine_for()
        except ConfigurationError:
            found = index.async_engine_for()  # installed on an async factory, unused yet
            if found is None:
                raise ConfigurationError(
                    "the index knows no one database: pass --db URL (an index installed on "
                    "sessions that choose their engine per request, as Flask-SQLAlchemy's "
                    "db.session, or on several engines)"
                ) from None
            known = found
        return _blocking(known)
    try:
        engine = create_engine(url)
    except ArgumentError as exc:  # not a URL, or an unknown driver
        raise ConfigurationError(f"--db {url!r}: {exc}") from None
    try:
        installed = index.engine_for()
    except ConfigurationError:  # no one engine installed: nothing to carry over
        return _blocking(engine)
    return _blocking(_with_options(engine, installed.get_execution_options()))


def _has_tables(index: SemanticIndex, engine: Engine) -> None:
    """Refuse a database that holds none of the tables of the index's models (the wrong
    ``--db``, or the migrations not run): a command reported an empty table, exit 0, and
    created the outbox there. A database that does not answer is left to the command (the
    worker waits it out)."""
    columns = index.columns()
    try:
        if not columns or present_columns(index, engine):
            return
    except (OperationalError, InterfaceError):
        return
    tables = sorted({c.column.table.fullname for c in columns})
    raise ConfigurationError(
        f"{engine.url.render_as_string(hide_password=True)} has none of the tables of the "
        f"index's models ({', '.join(tables)}): the wrong --db, or the migrations not run"
    )


_BLOCKING_DRIVERS = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg"}
"""The driver the commands use for a database whose URL names an async one."""


def _blocking(engine: Engine) -> Engine:
    """``engine``, or where its driver is an async one (``sqlite+aiosqlite``,
    ``postgresql+asyncpg``: it runs only awaited, and the commands block) an engine on the same
    database with its dialect's blocking driver and the same execution options."""
    if not engine.dialect.is_async:
        return engine
    url = engine.url
    driver = _BLOCKING_DRIVERS.get(url.get_backend_name())
    if driver is None:
        raise ConfigurationError(
            f"{url.drivername} is an async driver, which the commands cannot use: pass --db "
            "with the database's URL for a blocking driver"
        )
    return _with_options(create_engine(url.set(drivername=driver)), engine.get_execution_options())


def _with_options(engine: Engine, options: Mapping[str, Any]) -> Engine:
    return engine.execution_options(**options) if options else engine


def _model(spec: str) -> type[Any]:
    """The mapped class ``spec`` names."""
    found = _load(spec)
    if isinstance(found, type) and inspect(found, raiseerr=False) is not None:
        return found
    what = "a class no mapper maps" if isinstance(found, type) else f"a {type(found).__name__}"
    raise ConfigurationError(f"{spec} is {what}, not a model (module:Class of a mapped class)")


def _seconds(text: str) -> float:
    """A duration option (``--poll``, ``--interval``): a number of seconds, not negative."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:  # (NaN too)
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def _positive(text: str) -> int:
    """An ``int`` option that must be at least 1 (``--batch``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _unmapped(index: SemanticIndex, engine: Engine) -> int:
    """Print the jobs no loaded model maps; returns how many there are."""
    found = unmapped_jobs(index, engine)
    for (table, column), n in sorted(found.items()):
        print(
            f"semantic-orm: {n} jobs name {table}.{column}, which no loaded model maps: import "
            "the module that defines it in the index's module (or pass models= to "
            "SemanticIndex); a column renamed or dropped since: op.rename_semantic_index or "
            "op.drop_semantic_index in its migration",
            file=sys.stderr,
        )
    return sum(found.values())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="semantic-orm", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"semantic-orm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("worker", "drain the outbox"),
        ("status", "show lag, drift and errors per column"),
        ("reindex", "embed rows that have no vectors (--rebuild: after a settings change)"),
        ("reconcile", "queue rows whose index differs from SQL (raw SQL, cascades)"),
        ("requeue", "retry dead-lettered jobs"),
        ("gc", "drop collections no column uses"),
        ("eval", "measure retrieval quality on a gold set"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("index", help="module:attribute of the SemanticIndex")
        cmd.add_argument("--db", help="database URL (default: the index's installed engine)")
        if name == "worker":
            cmd.add_argument("--once", action="store_true", help="stop when no job is due")
            cmd.add_argument("--batch", type=_positive, default=256)
            cmd.add_argument("--poll", type=_seconds, default=1.0, help="seconds between polls")
            cmd.add_argument(
                "--interval", type=_seconds, default=10.0, help="seconds between progress lines"
            )
        elif name == "reindex":
            cmd.add_argument("model", help="module:Class of the model")
            cmd.add_argument("--all", action="store_true", help="re-queue every row")
            cmd.add_argument(
                "--rebuild",
                action="store_true",
                help="re-embed into a new collection, then switch searches to it",
            )
            cmd.add_argument(
                "--no-switch",
                action="store_true",
                help="with --rebuild: build (or resume) the new collection, do not switch yet",
            )
            cmd.add_argument("--column", help="with --rebuild: only this semantic attribute")
            cmd.add_argument("--batch", type=_positive, default=None)
        elif name == "reconcile":
            cmd.add_argument("model", nargs="?", help="module:Class (default: every column)")
            cmd.add_argument("--restart", action="store_true", help="ignore the checkpoint")
            cmd.add_argument("--no-process", action="store_true", help="only queue the jobs")
            cmd.add_argument("--batch", type=_positive, default=1000)
            cmd.add_argument("--json", action="store_true")
        elif name == "requeue":
            cmd.add_argument(
                "column", nargs="?", help="Model.attribute or table.column (default: every one)"
            )
            cmd.add_argument("--pk", help="only this row (its key as stored: 42, '\"slug\"')")
        elif name == "gc":
            cmd.add_argument("--dry-run", action="store_true", help="list, do not drop")
            cmd.add_argument(
                "--force",
                action="store_true",
                help="allow an empty collection prefix on a Qdrant server",
            )
            cmd.add_argument("--json", action="store_true")
        elif name == "status":
            cmd.add_argument("--json", action="store_true")
        elif name == "eval":
            cmd.add_argument("model", help="module:Class of the model")
            cmd.add_argument("gold", help='JSON lines: {"question", "pk", "span": [start, end]}')
            cmd.add_argument(
                "--k", type=_positive, default=5, help="cut-off for Recall@k and MRR@k"
            )
            cmd.add_argument("--mode", choices=SEARCH_MODES, default=DEFAULT_MODE)
            cmd.add_argument("--column", help="semantic attribute, if the model has several")
            cmd.add_argument(
                "--lenient", action="store_true", help="count overlapping or adjacent passages"
            )
            cmd.add_argument("--json", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``semantic-orm`` command."""
    args = _parser().parse_args(argv)
    try:
        index = _index(args.index)
        engine = _engine(index, args.db)
        if args.command in ("status", "reconcile") or (args.command == "worker" and args.once):
            _has_tables(index, engine)
        elif args.command == "worker":
            try:  # a service may start before the application made its tables: it waits
                _has_tables(index, engine)
            except ConfigurationError as exc:
                print(f"semantic-orm worker: {exc}; waiting for them", file=sys.stderr)
        return int(_COMMANDS[args.command](index, engine, args) or 0)
    except KeyboardInterrupt:
        return 130
    except _Terminated:
        return 143
    except ConfigurationError as exc:
        print(f"semantic-orm: {exc}", file=sys.stderr)
        return 2
    except SemanticORMError as exc:
        print(f"semantic-orm: {exc}", file=sys.stderr)
        return 1
    except SQLAlchemyError as exc:
        print(f"semantic-orm: database error: {first_line(exc)}", file=sys.stderr)
        return 2 if _missing_table(exc) else 1


def _missing_table(error: SQLAlchemyError) -> bool:
    """Whether ``error`` says a table the command reads is not in the database (a setting at
    fault: the wrong ``--db``, or a migration not run)."""
    orig = getattr(error, "orig", None)
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return code == "42P01" or "no such table" in str(orig).lower()


class _Terminated(BaseException):
    """SIGTERM arrived (not an ``Exception``: no pass may take it for a failure of its own)."""


@contextlib.contextmanager
def _sigterm_stops() -> Iterator[None]:
    """SIGTERM (``docker stop``, Kubernetes, systemd) stops the worker as Ctrl-C does, its pass
    unwound and its finished jobs settled, with status 143: it killed the process mid-pass.
    Where SIGTERM is ignored, or handled by the program that runs the command, it stays so."""
    if (
        threading.current_thread() is not threading.main_thread()  # (only there)
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # ignored, or a program's
    ):
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _worker(index: SemanticIndex, engine: Engine, args: argparse.Namespace) -> int:
    with _sigterm_stops():
        return _work(index, engine, args)


def _work(index: SemanticIndex, engine: Engine, args: argparse.Namespace) -> int:
    worker = Worker(index, engine, batch_size=args.batch, poll_interval=args.poll)
    last = time.monotonic()
    failure: BaseException | None = None
    failures = 0  # passes failed in a row, the database unreachable
    worked = False  # a pass ran: the settings are right, whatever fails later is an outage
    while True:
        try:
            report = worker.run_once()
        except (OperationalError, InterfaceError) as exc:
            if args.once or not (worked or is_database_outage(exc)):
                raise  # (a wrong path, database or password: no wait mends it)
            failures += 1
            wait = failure_wait(max(args.poll, 0.05), failures)
            print(
                f"semantic-orm worker: database error: {first_line(exc)}; trying again in "
                f"{wait:.3g} s ({failures} failed in a row)",
                file=sys.stderr,
            )
            time.sleep(wait)
            continue
        worked = True
        if failures and report.claimed and not report.sync.failed:  # (synced something)
            print(
                f"semantic-orm worker: the database works again after {failures} failed passes",
                file=sys.stderr,
            )
            failures = 0
        if report.unknown:
            _unmapped(index, engine)
            return 2
        if report.sync.failed:
            failure = report.sync.failed[-1][1]
        now = time.monotonic()
        if now - last >= args.interval:
            _progress(worker, engine)
            last = now
        if report.claimed == 0 or (args.once and report.done == 0 and report.retried):
            if args.once:
                break
            time.sleep(args.poll)
    _progress(worker, engine)
    if failure is not None and worker.totals.done == 0:
        print(f"semantic-orm worker: no job could be synced: {failure}", file=sys.stderr)
        return 1
    return 0


def _progress(worker: Worker, engine: Engine) -> None:
    t = worker.totals
    line = f"semantic-orm worker: {t.done} jobs done, {t.retried} retried, {t.dead} dead"
    try:
        with engine.connect() as conn:
            counts = outbox.counts(conn)
    except (OperationalError, InterfaceError):  # the database failing: the next pass says so
        print(line, file=sys.stderr)
        return
    pending = sum(c["pending"] for c in counts.values())
    oldest = [c["oldest_pending"] for c in counts.values() if c["oldest_pending"] is not None]
    lag = ""
    if oldest:
        lag = f", lag {(outbox.utcnow() - min(oldest)).total_seconds():.0f} s"
    print(f"{line}, {pending} pending{lag}", file=sys.stderr)


def _status(index: SemanticIndex, engine: Engine, args: argparse.Namespace) -> int:
    found = status(index, engine)
    if args.json:
        print(json.dumps([s.as_dict() for s in found], indent=2, default=str))
    else:
        _status_table(found)
    return 1 if _unmapped(index, engine) else 0


def _status_table(found: list[ColumnStatus]) -> None:
    print(
        f"{'column':30} {'rows':>8} {'indexed':>8} {'pending':>8} {'retrying':>8} {'dead':>6} "
        f"{'oldest pending':>15}"
    )
    for s in found:
        age = s.oldest_pending_age
        print(
            f"{s.column:30} {s.rows:>8} {s.indexed_rows:>8} {s.pending_jobs:>8} "
            f"{s.retrying_jobs:>8} {s.dead_jobs:>6} {'-' if age is None else f'{age:.0f} s':>15}"
        )
        for setting, (old, new) in s.drift.items():
            print(f"  drift: {setting} {old!r} -> {new!r} (reindex --rebuild)")
        state = s.index_state
        if state:
            unindexed = state["points"] - state["indexed"]
            print(
                f"  vector index: {state['points']} points, {unindexed} not yet in the built "
                f"index, {state['segments']} segments"
            )
        if s.unfilled_filters:
            print(
                f"  filter_by {', '.join(s.unfilled_filters)}: not in every payload yet; "
                "where= on them filters in SQL until reindex --all"
            )
        if s.stale_keywords:
            old, new = s.stale_keywords
            print(
                f"  keywords: points of analyser {old!r}, this version writes {new!r}; "
                "reindex --all rewrites them (embeds nothing)"
            )
        for e in s.errors:
            print(f"  {e['jobs']} {e['state']}: {e['error'][:160]} (e.g. row {e['example_pk']})")


def _reindex(index: SemanticIndex, engine: Engine, args: argparse.Namespace) -> int:
    model = _model(args.model)
    if not args.rebuild:
        if args.no_switch or args.column:
            raise ConfigurationError("--no-switch and --column go with --rebuild")
        n = reindex(
            index, model, engine, all_rows=args.all, batch_size=args.batch or 500, progress=True
        )
        print(f"queued and processed {n} rows of {model.__name__}")
        return 0
    for rep in rebuild(
        index,
        model,
        engine,
        column=args.column,
        batch_size=args.batch or 64,
        switch=not args.no_switch,
        progress=True,
    ):
        what = f"switched {rep.collection!r} to it" if rep.switched else "not switched yet"
        print(
            f"{rep.column}: rebuilt {rep.rows} rows in {rep.built_in!r} "
            f"({rep.embedded} chunks embedded, {rep.reused} reused); {what}"
        )
        if rep.failed:
            print(f"  rows that could not be indexed: {', '.join(rep.failed)}")
    return 0


def _reconcile(index: SemanticIndex, engine: Engine, args: argparse.Namespace) -> int:
    model = _model(args.model) if args.model else None
    found = reconcile(
        index,
        model,
        engine,
        batch_size=args.batch,
        process=not args.no_process,
        restart=args.restart,
        progress=not args.json,
    )
    if args.json:
        print(json.dumps([r.as_dict() for r in found], indent=2))
        return 0
    for r in found:
        print(
            f"{r.column}: {r.rows} rows compared, {r.in_sync} in sync; queued {r.missing} "
            f"missing, {r.changed} changed, {r.emptied} emptied, {r.orphans} orphaned"
            + (" (resumed)" if r.resumed else "")
        )
    return 0


def _requeue(index: SemanticIndex, engine: Engine, args: argparse.Namespace) -> int:
    table = column = None
    if args.column:
        table, column = _job_column(index, args.column)
    with engine.begin() as conn:
        n = outbox.requeue_dead(conn, table, column, args.pk)
    print(f"requeued {n} dead-lettered jobs")
    return 0


def _job_column(index: SemanticIndex, name: str) -> tuple[str, str]:
    """``(table, column)`` of ``Model.attribute`` or ``table.column``."""
    left, _, right = name.rpartition(".")
    for col in index.columns():
        if (col.mapped_class.__name__, col.key) == (left, right) or (col.table, col.name) == (
            left,
            right,
        ):
            return col.table, col.name
    if left:
        return left, right  # a column no loaded model maps: its jobs can still be requeued
    raise ConfigurationError(f"expected Model.attribute or table.column, got {name!r}")


def _gc(index: SemanticIndex, engine: Engine, args: argparse.Namespace) -> int:
    found = gc(index, engine, dry_run=args.dry_run, force=args.force)
    if args.json:
        print(json.dumps([o.as_dict() for o in found], indent=2))
    elif not found:
        print("no orphan collections")
    else:
        verb = "would drop" if args.dry_run else "dropped"
        for o in found:
            action = verb if o.removable else "kept"
            print(f"{action:10} {o.collection} ({o.points} points): {o.reason}")
    return 0


def _eval(index: SemanticIndex, engine: Engine, args: argparse.Namespace) -> int:
    model = _model(args.model)
    gold = load_gold(args.gold)
    with Session(engine) as session:
        report = evaluate(
            session,
            model,
            gold,
            k=args.k,
            mode=args.mode,
            lenient=args.lenient,
            column=args.column,
            index=index,
        )
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.table())
    return 0


_COMMANDS = {
    "worker": _worker,
    "status": _status,
    "reindex": _reindex,
    "reconcile": _reconcile,
    "requeue": _requeue,
    "gc": _gc,
    "eval": _eval,
}

if __name__ == "__main__":
    raise SystemExit(main())
