"""The ``semantic-orm`` command: worker, reindex, status, requeue and eval.

Each command names the application's index as ``module:attribute``; importing that module must
define the models and the :class:`~semantic_orm.index.SemanticIndex`, installed on a
``sessionmaker`` bound to the engine (or pass ``--db URL``)::

    semantic-orm worker myapp.search:index
    semantic-orm reindex myapp.search:index myapp.models:Article [--all]
    semantic-orm reindex myapp.search:index myapp.models:Article --rebuild [--no-switch]
    semantic-orm status myapp.search:index [--json]
    semantic-orm gc myapp.search:index [--dry-run] [--json]
    semantic-orm requeue myapp.search:index
    semantic-orm eval myapp.search:index myapp.models:Article gold.jsonl --k 5 [--json] [--lenient]

``reindex --rebuild`` re-embeds into a new collection while searches keep using the current one,
then switches (after a model or chunk-settings change; see
:func:`semantic_orm.maintenance.rebuild`). ``gc`` drops the collections of dropped or renamed
columns and abandoned rebuilds; ``--dry-run`` only lists them. ``status`` shows lag and drift.

``eval`` searches each gold question (see :mod:`semantic_orm.evaluation` for the file format and
the metrics) and prints Recall@k by row and by span, MRR@k and nDCG@10, then the failed questions
with what was retrieved instead; ``--json`` prints the same as JSON.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

from . import outbox
from .evaluation import evaluate, load_gold
from .exc import ConfigurationError
from .index import SemanticIndex
from .maintenance import gc, rebuild, reconcile, reindex, status
from .search import DEFAULT_MODE, SEARCH_MODES
from .worker import Worker

__all__ = ["main"]


def _load(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"expected module:attribute, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _index(spec: str) -> SemanticIndex:
    found = _load(spec)
    if not isinstance(found, SemanticIndex):
        raise ConfigurationError(f"{spec} is a {type(found).__name__}, not a SemanticIndex")
    return found


def _engine(index: SemanticIndex, url: str | None) -> Engine:
    return create_engine(url) if url else index.engine_for()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``semantic-orm`` command."""
    parser = argparse.ArgumentParser(prog="semantic-orm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("worker", "drain the outbox"),
        ("reindex", "embed rows that have no vectors"),
        ("status", "show index lag per column"),
        ("requeue", "retry dead-lettered jobs"),
        ("eval", "measure retrieval quality on a gold set"),
        ("gc", "drop collections no column uses"),
        ("reconcile", "queue rows whose index differs from SQL (raw SQL, cascades)"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("index", help="module:attribute of the SemanticIndex")
        cmd.add_argument("--db", help="database URL (default: the index's installed engine)")
        if name == "worker":
            cmd.add_argument("--once", action="store_true", help="stop when no job is due")
            cmd.add_argument("--batch", type=int, default=256)
            cmd.add_argument("--poll", type=float, default=1.0)
        if name == "reindex":
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
            cmd.add_argument("--batch", type=int, default=None)
        if name == "gc":
            cmd.add_argument("--dry-run", action="store_true", help="list, do not drop")
            cmd.add_argument(
                "--force",
                action="store_true",
                help="allow an empty collection prefix on a Qdrant server",
            )
            cmd.add_argument("--json", action="store_true")
        if name == "status":
            cmd.add_argument("--json", action="store_true")
        if name == "reconcile":
            cmd.add_argument("model", nargs="?", help="module:Class (default: every column)")
            cmd.add_argument("--restart", action="store_true", help="ignore the checkpoint")
            cmd.add_argument("--no-process", action="store_true", help="only queue the jobs")
            cmd.add_argument("--batch", type=int, default=1000)
            cmd.add_argument("--json", action="store_true")
        if name == "eval":
            cmd.add_argument("model", help="module:Class of the model")
            cmd.add_argument("gold", help='JSON lines: {"question", "pk", "span": [start, end]}')
            cmd.add_argument("--k", type=int, default=5, help="cut-off for Recall@k and MRR@k")
            cmd.add_argument("--mode", choices=SEARCH_MODES, default=DEFAULT_MODE)
            cmd.add_argument("--column", help="semantic attribute, if the model has several")
            cmd.add_argument(
                "--lenient", action="store_true", help="count overlapping or adjacent passages"
            )
            cmd.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        index = _index(args.index)
        engine = _engine(index, args.db)
        if args.command == "worker":
            worker = Worker(index, engine, batch_size=args.batch, poll_interval=args.poll)
            try:
                worker.run(stop_when_idle=args.once)
            except KeyboardInterrupt:
                pass
            print(f"semantic-orm worker: {worker.processed} jobs done", file=sys.stderr)
        elif args.command == "reindex" and args.rebuild:
            model = _load(args.model)
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
        elif args.command == "reindex":
            model = _load(args.model)
            n = reindex(
                index, model, engine, all_rows=args.all, batch_size=args.batch or 500, progress=True
            )
            print(f"queued and processed {n} rows of {model.__name__}")
        elif args.command == "gc":
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
        elif args.command == "status":
            rows = [s.as_dict() for s in status(index, engine)]
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                print(
                    f"{'column':30} {'rows':>8} {'indexed':>8} {'pending':>8} {'dead':>6} "
                    f"{'oldest pending':>15}"
                )
                for r in rows:
                    age = r["oldest_pending_age_s"]
                    print(
                        f"{r['column']:30} {r['rows']:>8} {r['indexed_rows']:>8} "
                        f"{r['pending_jobs']:>8} {r['dead_jobs']:>6} "
                        f"{'-' if age is None else f'{age:.0f} s':>15}"
                    )
                    for setting, (old, new) in r["drift"].items():
                        print(f"  drift: {setting} {old!r} -> {new!r} (reindex --rebuild)")
        elif args.command == "eval":
            model = _load(args.model)
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
        elif args.command == "reconcile":
            model = _load(args.model) if args.model else None
            reconciled = reconcile(
                index,
                model,
                engine,
                batch_size=args.batch,
                process=not args.no_process,
                restart=args.restart,
                progress=not args.json,
            )
            if args.json:
                print(json.dumps([r.as_dict() for r in reconciled], indent=2))
            for found_rows in [] if args.json else reconciled:
                print(
                    f"{found_rows.column}: {found_rows.rows} rows compared, "
                    f"{found_rows.in_sync} in sync; queued {found_rows.missing} missing, "
                    f"{found_rows.changed} changed, {found_rows.emptied} emptied, "
                    f"{found_rows.orphans} orphaned" + (" (resumed)" if found_rows.resumed else "")
                )
        elif args.command == "requeue":
            with engine.begin() as conn:
                n = outbox.requeue_dead(conn)
            print(f"requeued {n} dead-lettered jobs")
    except ConfigurationError as exc:
        print(f"semantic-orm: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
