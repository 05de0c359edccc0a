"""Event-loop health of an async application: stalls during a commit's sync, and search throughput.

The same work, in one run, two ways, on aiosqlite + Qdrant Edge + all-MiniLM-L6-v2:

* **ours**: an ``AsyncSession`` from an ``async_sessionmaker`` the index is installed on. The
  commit of 50 SciFact abstracts only writes rows and jobs; the sync runs as a task (SQL awaited
  on the loop, the model and the store in a worker thread), awaited here with ``index.adrain()``.
  Searches are ``await Model.asemantic_search(session, ...)``.
* **baseline**: the same work done with the synchronous API inside the loop: a sync ``Session``
  commits, the sync runs where it is called (``index.drain()``), and searches are
  ``Model.semantic_search`` called from the coroutines.

A probe task ticks every millisecond; the longest gap between two ticks is the longest stall of
the loop (``max_loop_stall_ms``). Search throughput: 32 concurrent searches at a time, for a few
rounds, searches per second.

    pip install -e '.[bench]'        # aiosqlite comes with the asyncio extra
    python bench/async.py [--scifact ../shared/datasets/scifact] [--docs 50] [--index-docs 300]

The last line is JSON: {"max_loop_stall_ms", "baseline_max_loop_stall_ms",
"concurrent_search_per_s", "baseline_concurrent_search_per_s"}.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from semantic_orm import (
    EdgeStore,
    SemanticIndex,
    SemanticSearchMixin,
    SemanticText,
    SentenceTransformerEmbedder,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SCIFACT = ROOT.parent / "shared" / "datasets" / "scifact"


def check_dependencies(scifact: Path) -> None:
    missing = [
        m for m in ("aiosqlite", "sentence_transformers") if importlib.util.find_spec(m) is None
    ]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: pip install -e '.[bench]'")
    if not (scifact / "corpus.jsonl").exists():
        sys.exit(f"no SciFact corpus in {scifact} (pass --scifact DIR)")


def load(scifact: Path, n: int) -> tuple[list[tuple[str, str]], list[str]]:
    docs = []
    with open(scifact / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            docs.append((row["title"][:200], f"{row['title']}\n\n{row['text']}"))
            if len(docs) >= n:
                break
    with open(scifact / "queries.jsonl", encoding="utf-8") as fh:
        queries = [json.loads(line)["text"] for line in fh]
    return docs, queries


class Probe:
    """Ticks every millisecond and remembers the longest gap."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last)
            last = now

    async def __aenter__(self) -> Probe:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task


class Base(DeclarativeBase):
    pass


class Doc(SemanticSearchMixin, Base):
    __tablename__ = "doc"
    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(200))
    body: Mapped[str | None] = mapped_column(SemanticText())


async def main_async(args: argparse.Namespace) -> dict[str, float]:
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    docs, queries = load(args.scifact, args.docs * 2 + args.index_docs)
    work = Path(tempfile.mkdtemp(prefix="semantic_orm_async_"))
    try:
        url = work / "app.sqlite3"
        aengine = create_async_engine(f"sqlite+aiosqlite:///{url}")
        engine = create_engine(f"sqlite:///{url}")
        Base.metadata.create_all(engine)
        embedder = SentenceTransformerEmbedder()
        embedder.encode(["warm up the model"])
        index = SemanticIndex(store=EdgeStore(work / "vectors"), embedder=embedder)
        async_factory = async_sessionmaker(aengine, expire_on_commit=False)
        sync_factory = sessionmaker(engine, expire_on_commit=False)
        index.install(async_factory)
        index.install(sync_factory)

        # a corpus to search, and a first commit each way so that nothing is cold
        with sync_factory() as s:
            s.add_all(Doc(title=t, body=b) for t, b in docs[: args.index_docs])
            s.commit()  # inside the loop: the sync goes to a worker thread...
        await index.adrain(aengine, timeout=1800)  # ...which must be done before measuring
        ours_docs = docs[args.index_docs : args.index_docs + args.docs]
        base_docs = docs[args.index_docs + args.docs : args.index_docs + 2 * args.docs]

        async def ours_commit() -> None:
            async with async_factory() as s:
                s.add_all(Doc(title=t, body=b) for t, b in ours_docs)
                await s.commit()
            await index.adrain(aengine, timeout=600)

        async def baseline_commit() -> None:
            with sync_factory() as s:  # the sync API, called from a coroutine
                s.add_all(Doc(title=t, body=b) for t, b in base_docs)
                s.commit()
            index.drain(engine, timeout=600)  # the same sync, run where it is called

        async with Probe() as probe:
            await ours_commit()
        stall = probe.longest
        async with Probe() as probe:
            await baseline_commit()
        baseline_stall = probe.longest
        print(f"longest loop stall during a {args.docs}-document commit and its sync")
        print(f"  ours (AsyncSession)          {stall * 1000:9.1f} ms")
        print(f"  baseline (sync Session)      {baseline_stall * 1000:9.1f} ms")

        async def ours_search(q: str) -> Any:
            async with async_factory() as s:
                return await Doc.asemantic_search(s, q, limit=5)

        async def baseline_search(q: str) -> Any:
            with sync_factory() as s:
                return Doc.semantic_search(s, q, limit=5)

        rates = {}
        for name, fn in (("ours", ours_search), ("baseline", baseline_search)) * 2:
            started = time.perf_counter()
            done = 0
            for r in range(args.rounds):
                batch = [queries[(r * 32 + i) % len(queries)] for i in range(32)]
                await asyncio.gather(*(fn(q) for q in batch))
                done += len(batch)
            rates[name] = done / (time.perf_counter() - started)  # the second round counts
        print("searches per second, 32 at a time")
        print(f"  ours (asemantic_search)      {rates['ours']:9.1f}")
        print(f"  baseline (semantic_search)   {rates['baseline']:9.1f}")
        index.close()
        await aengine.dispose()
        engine.dispose()
        return {
            "max_loop_stall_ms": round(stall * 1000, 2),
            "baseline_max_loop_stall_ms": round(baseline_stall * 1000, 2),
            "concurrent_search_per_s": round(rates["ours"], 2),
            "baseline_concurrent_search_per_s": round(rates["baseline"], 2),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scifact", type=Path, default=DEFAULT_SCIFACT)
    parser.add_argument("--docs", type=int, default=50, help="documents in the measured commit")
    parser.add_argument("--index-docs", type=int, default=300, help="documents searched")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of 32 concurrent searches")
    args = parser.parse_args()
    check_dependencies(args.scifact)
    print(json.dumps(asyncio.run(main_async(args))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
