"""Search at scale: tenant-filtered and unfiltered search through the ORM against raw Qdrant Edge.

A synthetic corpus (``--chunks`` one-chunk documents spread uniformly over ``--tenants``
tenants; :class:`WordVectors`, a ``HashEmbedder`` with continuous cosines, 384 dimensions,
so that the store's and SQL's costs show, not a model's) is ingested twice, each in its own
process so that peak memory can be compared:

* **raw** (first): the same points (dense and BM25 vectors, payload with the tenant)
  upserted into a Qdrant Edge shard by hand and optimised; the query alone with the same
  payload filter (``raw_query_only_p50_ms``) and the peak memory of a raw ingest. The shard is
  kept for the ORM phase.
* **ours**: through the ORM as an application does (SQLite, ``SemanticText(filter_by=
  ("tenant_id",), tenant="tenant_id")``, inline sync, commits of 1,000 rows, the default
  ``EdgeStore``; no manual optimise call). Unfiltered search is timed at 10,000 chunks and at
  the end. Then a 200-row inline commit is timed with 100,000 unrelated jobs pending in the
  outbox, against none (five pairs, after a build of the index, so that no background build
  falls inside a timing), and the peak memory is read. Last, for random tenants,
  ``semantic_search(..., where=Doc.tenant_id == t, limit=10, mode="dense")`` is timed query by
  query beside its baseline, in alternating order, so that both meet the same machine: the
  query embedded, the raw shard queried by hand with the same payload filter, and the 10 rows
  loaded by primary key (what an app must do to answer the same search; the same baseline as
  ``bench/ingest.py``'s search ratio): ``raw_filtered_p50_ms``.

    pip install -e '.[bench]'          # needs only the edge extra
    python bench/filtered.py [--chunks 200000] [--tenants 1000] [--queries 200]

The last line is JSON: {"chunks", "filtered_p50_ms", "filtered_p95_ms", "unfiltered_p50_ms",
"raw_filtered_p50_ms", "raw_query_only_p50_ms", "filtered_vs_unfiltered", "filtered_vs_raw",
"complete_pages", "unfiltered_p50_ms_10k", "growth_10k_to_200k", "rss_vs_raw",
"inline_commit_backlog_100k_vs_0"}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Integer, create_engine, delete, insert, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from semantic_orm import SemanticText
from semantic_orm.testing import HashEmbedder

ROOT = Path(__file__).resolve().parents[1]
_SYLLABLES = "ka lo mi re su ta ne vo pi da gu fe zo ri ba".split()
WORDS = sorted({"".join(random.Random(n).choices(_SYLLABLES, k=3)) for n in range(20_000)})
"""A few thousand made-up words: bag-of-words vectors of random texts rarely tie, as real
embeddings do not."""


class WordVectors(HashEmbedder):
    """``HashEmbedder`` with a fixed random Gaussian vector per word instead of one signed
    dimension: as cheap, but its cosines are continuous like a real model's (with one dimension
    per word most chunks tie at the same few cosines, and ties are what a search must read to
    the end of)."""

    def __init__(self, dimension: int = 384) -> None:
        super().__init__(dimension, name="word-vectors")
        self._vectors: dict[str, np.ndarray[Any, Any]] = {}

    def encode(self, texts: Sequence[str]) -> np.ndarray[Any, Any]:
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.split():
                vector = self._vectors.get(word)
                if vector is None:
                    seed = zlib.crc32(word.encode("utf-8"))
                    vector = np.random.default_rng(seed).standard_normal(self.dimension)
                    vector = self._vectors[word] = vector.astype(np.float32)
                out[row] += vector
            out[row] /= max(float(np.linalg.norm(out[row])), 1e-9)
        return out


class Base(DeclarativeBase):
    pass


class Doc(Base):
    __tablename__ = "doc"
    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(Integer)
    body: Mapped[str] = mapped_column(SemanticText(filter_by=("tenant_id",), tenant="tenant_id"))


def check_dependencies() -> None:
    missing = [m for m in ("qdrant_edge", "sqlalchemy") if importlib.util.find_spec(m) is None]
    if missing:
        sys.exit(f"missing {', '.join(missing)}: pip install -e '.[bench]'")


def text(i: int) -> str:
    rng = random.Random(i)
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 40)))


def tenant(i: int, tenants: int) -> int:
    return i % tenants


def queries(n: int, tenants: int) -> list[tuple[str, int]]:
    rng = random.Random(99)
    return [
        (" ".join(rng.choice(WORDS) for _ in range(3)), rng.randrange(tenants)) for _ in range(n)
    ]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- ours: through the ORM ---------------------------------------------------------------------


def run_orm(args: argparse.Namespace, tmp: Path, raw_shard: Path) -> dict[str, Any]:
    from semantic_orm import EdgeStore, SemanticIndex, outbox, semantic_search

    engine = create_engine(f"sqlite:///{tmp / 'app.sqlite3'}")
    Base.metadata.create_all(engine)
    index = SemanticIndex(store=EdgeStore(tmp / "vectors"), embedder=WordVectors(384))
    factory = sessionmaker(engine, expire_on_commit=False)
    index.install(factory)
    qs = queries(args.queries, args.tenants)

    def unfiltered(n: int) -> list[float]:
        times = []
        with factory() as s:
            for q, _ in qs[:n]:
                started = time.perf_counter()
                semantic_search(s, Doc, q, limit=10, mode="dense")
                times.append((time.perf_counter() - started) * 1000)
                s.expunge_all()
        return times

    out: dict[str, Any] = {}
    started = time.perf_counter()
    done = 0
    while done < args.chunks:
        with factory() as s:
            for i in range(done, min(done + 1000, args.chunks)):
                s.add(Doc(id=i + 1, tenant_id=tenant(i, args.tenants), body=text(i)))
            s.commit()
        done = min(done + 1000, args.chunks)
        if done == min(10_000, args.chunks):
            out["unfiltered_p50_ms_10k"] = statistics.median(unfiltered(100))
        if done % 20_000 == 0:
            print(f"  ours: {done:,} chunks in {time.perf_counter() - started:.0f} s", flush=True)
    out["ingest_s"] = time.perf_counter() - started
    index.drain(engine)
    plain = unfiltered(args.queries)
    out.update(
        unfiltered_p50_ms=statistics.median(plain),
        unfiltered_p95_ms=pct(plain, 0.95),
        chunks=index.store.count("doc__body"),
    )

    # a 200-row inline commit, with and without 100,000 unrelated jobs waiting for a retry
    def commit_200(start: int) -> float:
        with factory() as s:
            for i in range(start, start + 200):
                s.add(Doc(id=i + 1, tenant_id=tenant(i, args.tenants), body=text(i)))
            begun = time.perf_counter()
            s.commit()
            return time.perf_counter() - begun

    # in pairs, the backlog inserted before each backlog commit and deleted after it, so both
    # halves of a pair see the same machine; after a build of the index, so that no background
    # build (which holds the GIL for seconds) falls inside one of the timings
    index.store.optimize("doc__body")
    later = outbox.utcnow() + dt.timedelta(days=365)
    pending = [
        {
            "table_name": "other",
            "column_name": "text",
            "row_pk": str(k),
            "attempts": 1,
            "failures": 1,
            "next_attempt_at": later,
            "created_at": later,
        }
        for k in range(100_000)
    ]
    base = args.chunks + 10
    empty, backlog = [], []
    for k in range(5):
        empty.append(commit_200(base + 2 * k * 200))
        with engine.begin() as conn:
            conn.execute(insert(outbox.outbox), pending)
        backlog.append(commit_200(base + (2 * k + 1) * 200))
        with engine.begin() as conn:
            conn.execute(delete(outbox.outbox).where(outbox.outbox.c.table_name == "other"))
    out["inline_commit_s"] = statistics.median(empty)
    out["inline_commit_backlog_s"] = statistics.median(backlog)
    out["rss_mb"] = peak_rss_mb()  # before the raw side's shard is loaded into this process

    # the tenant-filtered search against the baseline, query by query, in alternating order
    # (both sides at the same moment of a shared machine): the raw side's shard (the same
    # points, built and optimised by the raw phase), queried by hand with the same payload
    # filter, then the matching rows loaded by primary key (what any app must do with the ids)
    import qdrant_edge as qe

    embedder = WordVectors(384)
    shard = qe.EdgeShard.load(str(raw_shard))

    def raw_search(s: Any, q: str, t: int) -> None:
        vector = embedder.encode([q])[0].tolist()  # the query's embedding: work either way
        found = shard.query(
            qe.QueryRequest(
                query=qe.Query.Nearest(vector, using="dense"),
                filter=qe.Filter(must=[qe.FieldCondition("tenant", match=qe.MatchValue(t))]),
                limit=10,
                with_payload=True,
            )
        )
        ids = [int(p.payload["pk"]) for p in found]
        rows = {d.id: d for d in s.scalars(select(Doc).where(Doc.id.in_(ids)))}
        assert len(rows) == len(ids)

    def ours_search(s: Any, q: str, t: int) -> bool:
        hits = semantic_search(s, Doc, q, limit=10, mode="dense", where=Doc.tenant_id == t)
        return len(hits) == 10 and all(h.obj.tenant_id == t for h in hits)

    ours_ms, raw_ms, complete = [], [], 0
    with factory() as s:
        for n, (q, t) in enumerate(qs):
            for side in ("ours", "raw") if n % 2 == 0 else ("raw", "ours"):
                begun = time.perf_counter()
                if side == "ours":
                    complete += ours_search(s, q, t)
                    ours_ms.append((time.perf_counter() - begun) * 1000)
                else:
                    raw_search(s, q, t)
                    raw_ms.append((time.perf_counter() - begun) * 1000)
                s.expunge_all()
    shard.close()
    index.close()
    out.update(
        filtered_p50_ms=statistics.median(ours_ms),
        filtered_p95_ms=pct(ours_ms, 0.95),
        raw_query_select_p50_ms=statistics.median(raw_ms),
        complete_pages=complete / len(ours_ms),
    )
    return out


# -- raw: the same points, by hand -------------------------------------------------------------


def run_raw(args: argparse.Namespace, raw_shard: Path) -> dict[str, Any]:
    import qdrant_edge as qe

    from semantic_orm import keywords

    embedder = WordVectors(384)
    config = qe.EdgeConfig(
        vectors={"dense": qe.EdgeVectorParams(size=384, distance=qe.Distance.Cosine)},
        sparse_vectors={"bm25": qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
    )
    shard = qe.EdgeShard.create(str(raw_shard), config)
    shard.update(
        qe.UpdateOperation.create_field_index(
            "tenant", qe.IntegerIndexParams(lookup=True, range=True, is_principal=True)
        )
    )
    started = time.perf_counter()
    for start in range(0, args.chunks, 1000):
        ids = range(start, min(start + 1000, args.chunks))
        texts = [text(i) for i in ids]
        vectors = embedder.encode(texts)
        points = []
        for i, t, v in zip(ids, texts, vectors, strict=True):
            sparse = keywords.document_vector(t)
            points.append(
                qe.Point(
                    i + 1,
                    {
                        "dense": v.tolist(),
                        "bm25": qe.SparseVector(list(sparse.indices), list(sparse.values)),
                    },
                    {"pk": str(i + 1), "tenant": tenant(i, args.tenants)},
                )
            )
        shard.update(qe.UpdateOperation.upsert_points(points))
    shard.optimize()
    ingest = time.perf_counter() - started
    times = []
    for q, t in queries(args.queries, args.tenants):
        vector = embedder.encode([q])[0].tolist()
        begun = time.perf_counter()
        shard.query(
            qe.QueryRequest(
                query=qe.Query.Nearest(vector, using="dense"),
                filter=qe.Filter(must=[qe.FieldCondition("tenant", match=qe.MatchValue(t))]),
                limit=10,
                with_payload=True,
            )
        )
        times.append((time.perf_counter() - begun) * 1000)
    shard.close()
    return {
        "raw_filtered_p50_ms": statistics.median(times),
        "raw_ingest_s": ingest,
        "rss_mb": peak_rss_mb(),
    }


def phase(name: str, args: argparse.Namespace, raw_shard: Path) -> dict[str, Any]:
    """Run one side in a fresh process (peak RSS is per process) and read its JSON line."""
    command = [
        sys.executable,
        __file__,
        "--phase",
        name,
        "--raw-shard",
        str(raw_shard),
        "--chunks",
        str(args.chunks),
        "--tenants",
        str(args.tenants),
        "--queries",
        str(args.queries),
    ]
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
    lines = done.stdout.strip().splitlines()
    for line in lines[:-1]:
        print(line)
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=200_000)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--phase", choices=["orm", "raw"], help=argparse.SUPPRESS)
    parser.add_argument("--raw-shard", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    check_dependencies()
    if args.phase == "raw":
        print(json.dumps(run_raw(args, args.raw_shard)))
        return
    if args.phase == "orm":
        tmp = Path(tempfile.mkdtemp(prefix="semantic-orm-filtered-"))
        try:
            result = run_orm(args, tmp, args.raw_shard)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(json.dumps(result))
        return
    print(f"{args.chunks:,} one-chunk documents, {args.tenants:,} tenants, WordVectors(384)")
    work = Path(tempfile.mkdtemp(prefix="semantic-orm-filtered-raw-"))
    try:  # the raw shard outlives its phase: the ORM phase queries it beside its own
        raw = phase("raw", args, work / "raw")
        ours = phase("orm", args, work / "raw")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"tenant-filtered search, limit=10: ours p50 {ours['filtered_p50_ms']:.2f} ms "
        f"(p95 {ours['filtered_p95_ms']:.2f}); raw Edge with the same filter + primary-key "
        f"SELECT {ours['raw_query_select_p50_ms']:.2f} ms (timed query by query beside ours; "
        f"the query alone, in its own process: {raw['raw_filtered_p50_ms']:.2f} ms); "
        f"unfiltered through the ORM {ours['unfiltered_p50_ms']:.2f} ms "
        f"(p95 {ours['unfiltered_p95_ms']:.2f})"
    )
    print(
        f"unfiltered p50 at 10k chunks {ours['unfiltered_p50_ms_10k']:.2f} ms; complete pages "
        f"{ours['complete_pages']:.3f}; ingest ours {ours['ingest_s']:.0f} s, raw (with "
        f"optimise) {raw['raw_ingest_s']:.0f} s; peak RSS ours {ours['rss_mb']:.0f} MB, raw "
        f"{raw['rss_mb']:.0f} MB; 200-row inline commit {ours['inline_commit_s'] * 1000:.0f} ms, "
        f"with 100k jobs pending {ours['inline_commit_backlog_s'] * 1000:.0f} ms"
    )
    report = {
        "chunks": ours["chunks"],
        "filtered_p50_ms": round(ours["filtered_p50_ms"], 3),
        "filtered_p95_ms": round(ours["filtered_p95_ms"], 3),
        "unfiltered_p50_ms": round(ours["unfiltered_p50_ms"], 3),
        "raw_filtered_p50_ms": round(ours["raw_query_select_p50_ms"], 3),
        "raw_query_only_p50_ms": round(raw["raw_filtered_p50_ms"], 3),
        "filtered_vs_unfiltered": round(ours["filtered_p50_ms"] / ours["unfiltered_p50_ms"], 3),
        "filtered_vs_raw": round(ours["filtered_p50_ms"] / ours["raw_query_select_p50_ms"], 3),
        "complete_pages": round(ours["complete_pages"], 4),
        "unfiltered_p50_ms_10k": round(ours["unfiltered_p50_ms_10k"], 3),
        "growth_10k_to_200k": round(ours["unfiltered_p50_ms"] / ours["unfiltered_p50_ms_10k"], 3),
        "rss_vs_raw": round(ours["rss_mb"] / raw["rss_mb"], 3),
        "inline_commit_backlog_100k_vs_0": round(
            ours["inline_commit_backlog_s"] / ours["inline_commit_s"], 3
        ),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
