"""Retrieval quality through the public ORM API, against a hand-built peer pipeline.

Datasets (``/work/shared/datasets/`` by default, see its README):

* **SQuAD v1.1 dev as long documents**: each of the 48 articles' paragraphs joined by blank
  lines is one row; each question's answer becomes a character span in that row. Metrics:
  span Recall@5 (a top-5 passage contains the whole answer span), MRR@5 on the same passage
  ranking, computed by :func:`semantic_orm.evaluate`.
* **BEIR SciFact test split**: 5,183 abstracts (``title`` + blank line + ``text``) as rows, 300
  queries; nDCG@10 and Recall@10 over the row ranking with BEIR's definitions (graded qrels).

Configurations: semantic_orm's default, ``SemanticText()`` with no argument (hybrid chunker,
900/180; Qdrant Edge, SQLite, inline sync), searched in each mode (``hybrid``, ``dense``,
``keyword``); other chunkers (``--alt``, default ``recursive:900:180,sentence:900:180``;
``--alt-scifact``, default ``recursive:900:180``) in the default search mode; and the peer
baseline: LangChain
``RecursiveCharacterTextSplitter(chunk_size=1000, chunk_overlap=200, add_start_index=True)`` +
raw sentence-transformers (the same all-MiniLM-L6-v2) + numpy cosine over all chunks (SciFact: a
document scores as its best chunk). The peer encodes its queries in one batch, as ``evaluate``
does for ours.

Ingest time is wall time to get the corpus searchable (ORM: ``add_all`` + ``commit`` in batches,
which chunks, embeds and upserts; peer: split + encode). On 2 shared CPU cores embedding SciFact
takes about 10 minutes per pipeline; ``--questions N`` and ``--docs N`` make quick runs
(``--docs N`` keeps every abstract some selected query needs, plus the first N others).

    python bench/retrieval.py [--questions 1000] [--docs N] [--skip-scifact] [--alt ""]
      [--alt-scifact ""]

The last line is one JSON object: {"squad_recall_at_5", "squad_mrr_at_5",
"squad_mean_chunk_chars", "peer_squad_recall_at_5", "peer_squad_mean_chunk_chars",
"scifact_ndcg_at_10", "peer_scifact_ndcg_at_10"} (ours in the default search mode).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from semantic_orm import (
    EdgeStore,
    SemanticIndex,
    SemanticSearchMixin,
    SemanticText,
    SentenceTransformerEmbedder,
    evaluate,
)
from semantic_orm.search import DEFAULT_MODE, SEARCH_MODES

DATASETS = Path(os.environ.get("SEMANTIC_ORM_DATASETS", "/work/shared/datasets"))
PEER_CHUNK, PEER_OVERLAP = 1000, 200


def make_model(name: str, settings: dict[str, Any] | None = None) -> Any:
    """A model whose body is ``SemanticText(**settings)`` (no settings: the library default)."""

    class Base(DeclarativeBase):
        pass

    class Doc(SemanticSearchMixin, Base):
        __tablename__ = name
        id: Mapped[int] = mapped_column(primary_key=True)
        title: Mapped[str] = mapped_column(String(500))
        body: Mapped[str | None] = mapped_column(SemanticText(**(settings or {})))

    return Doc


def describe(settings: dict[str, Any] | None) -> str:
    """``recursive 900/180``: the chunker a model's column uses."""
    column = SemanticText(**(settings or {}))
    return f"{column.chunker} {column.chunk_size}/{column.overlap}"


def parse_alt(spec: str) -> list[dict[str, Any]]:
    """``sentence:900:180,hybrid:900:180`` -> SemanticText settings."""
    out = []
    for part in filter(None, spec.split(",")):
        name, size, overlap = part.split(":")
        out.append({"chunker": name, "chunk_size": int(size), "overlap": int(overlap)})
    return out


# ------------------------------------------------------------------------------------ data


def load_squad(
    path: Path, questions: int | None, articles: int | None = None
) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    data = json.loads(path.read_text("utf-8"))["data"][:articles]
    docs: list[tuple[str, str]] = []
    gold: list[dict[str, Any]] = []
    for pk, article in enumerate(data, 1):
        parts: list[str] = []
        offset = 0
        for para in article["paragraphs"]:
            context = para["context"]
            for qa in para["qas"]:
                answer = qa["answers"][0]
                start = offset + answer["answer_start"]
                gold.append(
                    {
                        "question": qa["question"],
                        "pk": pk,
                        "span": [start, start + len(answer["text"])],
                    }
                )
            parts.append(context)
            offset += len(context) + 2
        docs.append((article["title"], "\n\n".join(parts)))
    if questions is not None and questions < len(gold):
        step = len(gold) / questions  # spread over all articles, deterministic
        gold = [gold[int(i * step)] for i in range(questions)]
    return docs, gold


def load_scifact(
    path: Path, docs_limit: int | None
) -> tuple[list[tuple[str, str, str]], dict[str, str], dict[str, dict[str, int]]]:
    corpus = []
    with open(path / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            corpus.append((row["_id"], row["title"], f"{row['title']}\n\n{row['text']}"))
    qrels: dict[str, dict[str, int]] = {}
    with open(path / "qrels" / "test.tsv", encoding="utf-8") as fh:
        for line in fh:
            parts = line.strip().split("\t")
            if len(parts) != 3 or not parts[2].isdigit():
                continue  # header
            qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    queries = {}
    with open(path / "queries.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["_id"] in qrels:
                queries[row["_id"]] = row["text"]
    if docs_limit is not None:
        needed = {d for rel in qrels.values() for d in rel}
        kept, others = [], 0
        for doc in corpus:
            if doc[0] in needed:
                kept.append(doc)
            elif others < docs_limit:
                kept.append(doc)
                others += 1
        corpus = kept
    return corpus, queries, qrels


# ---------------------------------------------------------------------------------- metrics


def ndcg_at_10(ranked: Sequence[str], rel: dict[str, int]) -> float:
    dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted(rel.values(), reverse=True)[:10]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at_10(ranked: Sequence[str], rel: dict[str, int]) -> float:
    relevant = {d for d, r in rel.items() if r > 0}
    return len(relevant & set(ranked[:10])) / len(relevant) if relevant else 0.0


# ------------------------------------------------------------------------------- pipelines


class Ours:
    """semantic_orm through its public API: model, index, sessions, semantic_search."""

    def __init__(
        self,
        name: str,
        embedder: SentenceTransformerEmbedder,
        workdir: Path,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.model = make_model(name, settings)
        self.engine = create_engine(f"sqlite:///{workdir / (name + '.sqlite3')}")
        self.model.metadata.create_all(self.engine)
        self.index = SemanticIndex(store=EdgeStore(workdir / "vectors"), embedder=embedder)
        self.factory = sessionmaker(self.engine, expire_on_commit=False)
        self.index.install(self.factory)

    def ingest(self, docs: Sequence[tuple[int, str, str]], batch: int = 20) -> float:
        started = time.perf_counter()
        with self.factory() as s:
            for i in range(0, len(docs), batch):
                s.add_all(
                    self.model(id=pk, title=t[:500], body=b) for pk, t, b in docs[i : i + batch]
                )
                s.commit()
        return time.perf_counter() - started

    def chunk_stats(self) -> tuple[int, float]:
        points = self.index.store.points(self.model.__tablename__ + "__body")
        sizes = [p.payload["end_offset"] - p.payload["start_offset"] for p in points]
        return len(sizes), sum(sizes) / max(1, len(sizes))

    def close(self) -> None:
        self.index.close()
        self.engine.dispose()


class Peer:
    """LangChain splitter + raw sentence-transformers + numpy cosine."""

    def __init__(self, model: Any) -> None:
        from langchain_text_splitters import RecursiveCharacterTextSplitter

        self.splitter = RecursiveCharacterTextSplitter(
            chunk_size=PEER_CHUNK, chunk_overlap=PEER_OVERLAP, add_start_index=True
        )
        self.st = model
        self.owner: list[Any] = []
        self.spans: list[tuple[int, int]] = []
        self.matrix = np.zeros((0, 1), dtype=np.float32)

    def ingest(self, docs: Sequence[tuple[Any, str]]) -> float:
        started = time.perf_counter()
        texts = []
        for owner, text in docs:
            for d in self.splitter.create_documents([text]):
                start = int(d.metadata["start_index"])
                self.owner.append(owner)
                self.spans.append((start, start + len(d.page_content)))
                texts.append(d.page_content)
        self.matrix = self.st.encode(
            texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True
        )
        return time.perf_counter() - started

    def mean_chunk(self) -> float:
        return sum(e - s for s, e in self.spans) / max(1, len(self.spans))

    def encode_queries(self, queries: Sequence[str]) -> Any:
        return self.st.encode(
            list(queries), batch_size=256, normalize_embeddings=True, convert_to_numpy=True
        )

    def rank(self, q: Any) -> list[int]:
        scores = self.matrix @ q
        return list(np.argsort(-scores, kind="stable"))


# ------------------------------------------------------------------------------------- runs


def run_squad(
    args: argparse.Namespace, embedder: SentenceTransformerEmbedder, work: Path
) -> dict[str, Any]:
    docs, gold = load_squad(args.squad, args.questions, args.articles)
    print(f"SQuAD: {len(docs)} documents, {len(gold)} questions", file=sys.stderr)
    out: dict[str, Any] = {"rows": []}
    rows = [(pk, t, b) for pk, (t, b) in enumerate(docs, 1)]
    for n, settings in enumerate([None, *parse_alt(args.alt)]):
        ours = Ours(f"squad_doc{n}", embedder, work, settings)
        ingest = ours.ingest(rows, batch=4)
        chunks, mean = ours.chunk_stats()
        label = "default " if settings is None else ""
        with ours.factory() as s:
            for mode in SEARCH_MODES if settings is None else (DEFAULT_MODE,):
                started = time.perf_counter()
                report = evaluate(s, ours.model, gold, k=5, mode=mode)
                took = time.perf_counter() - started
                out["rows"].append(
                    (
                        "squad",
                        f"{label}{describe(settings)} {mode}",
                        report.recall_span,
                        report.mrr,
                        chunks,
                        mean,
                        ingest,
                        took,
                    )
                )
                if settings is None and mode == DEFAULT_MODE:
                    out.update(
                        squad_recall_at_5=report.recall_span,
                        squad_mrr_at_5=report.mrr,
                        squad_mean_chunk_chars=mean,
                    )
        ours.close()
    peer = Peer(embedder.model)
    ingest = peer.ingest([(pk, body) for pk, (_, body) in enumerate(docs, 1)])
    hits = 0
    rr = 0.0
    started = time.perf_counter()
    vectors = peer.encode_queries([g["question"] for g in gold])
    for g, q in zip(gold, vectors, strict=True):
        s0, e0 = g["span"]
        for rank, i in enumerate(peer.rank(q)[:5], 1):
            start, end = peer.spans[i]
            if peer.owner[i] == g["pk"] and start <= s0 and e0 <= end:
                hits += 1
                rr += 1 / rank
                break
    took = time.perf_counter() - started
    n = len(gold)
    out["rows"].append(
        (
            "squad",
            "peer (LangChain+ST+numpy)",
            hits / n,
            rr / n,
            len(peer.spans),
            peer.mean_chunk(),
            ingest,
            took,
        )
    )
    out.update(peer_squad_recall_at_5=hits / n, peer_squad_mean_chunk_chars=peer.mean_chunk())
    return out


def run_scifact(
    args: argparse.Namespace, embedder: SentenceTransformerEmbedder, work: Path
) -> dict[str, Any]:
    corpus, queries, qrels = load_scifact(args.scifact, args.docs)
    print(f"SciFact: {len(corpus)} abstracts, {len(queries)} queries", file=sys.stderr)
    out: dict[str, Any] = {"rows": []}
    ids = {doc_id: pk for pk, (doc_id, _, _) in enumerate(corpus, 1)}
    back = {pk: doc_id for doc_id, pk in ids.items()}
    vectors = dict(zip(queries, embedder.encode(list(queries.values())), strict=True))
    configs = [None, *parse_alt(args.alt_scifact)]
    for n, settings in enumerate(configs):
        ours = Ours(f"scifact_doc{n}", embedder, work, settings)
        ingest = ours.ingest([(ids[d], t, b) for d, t, b in corpus], batch=50)
        chunks, mean = ours.chunk_stats()
        label = "default " if settings is None else ""
        with ours.factory() as s:
            for mode in SEARCH_MODES if settings is None else (DEFAULT_MODE,):
                started = time.perf_counter()
                nd, rc = [], []
                for qid, text in queries.items():
                    hits = ours.model.semantic_search(
                        s, text, limit=10, mode=mode, query_vector=vectors[qid]
                    )
                    ranked = [back[h.obj.id] for h in hits]
                    nd.append(ndcg_at_10(ranked, qrels[qid]))
                    rc.append(recall_at_10(ranked, qrels[qid]))
                took = time.perf_counter() - started
                ndcg, recall = sum(nd) / len(nd), sum(rc) / len(rc)
                out["rows"].append(
                    (
                        "scifact",
                        f"{label}{describe(settings)} {mode}",
                        ndcg,
                        recall,
                        chunks,
                        mean,
                        ingest,
                        took,
                    )
                )
                if settings is None and mode == DEFAULT_MODE:
                    out["scifact_ndcg_at_10"] = ndcg
        ours.close()
    peer = Peer(embedder.model)
    ingest = peer.ingest([(d, b) for d, _, b in corpus])
    started = time.perf_counter()
    nd, rc = [], []
    peer_vectors = peer.encode_queries(list(queries.values()))
    for (qid, _), q in zip(queries.items(), peer_vectors, strict=True):
        docs_ranked: list[str] = []
        for i in peer.rank(q):
            if peer.owner[i] not in docs_ranked:
                docs_ranked.append(peer.owner[i])
            if len(docs_ranked) == 10:
                break
        nd.append(ndcg_at_10(docs_ranked, qrels[qid]))
        rc.append(recall_at_10(docs_ranked, qrels[qid]))
    took = time.perf_counter() - started
    ndcg = sum(nd) / len(nd)
    out["rows"].append(
        (
            "scifact",
            "peer (LangChain+ST+numpy)",
            ndcg,
            sum(rc) / len(rc),
            len(peer.spans),
            peer.mean_chunk(),
            ingest,
            took,
        )
    )
    out["peer_scifact_ndcg_at_10"] = ndcg
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--squad", type=Path, default=DATASETS / "squad-v1.1-dev" / "dev-v1.1.json")
    parser.add_argument("--scifact", type=Path, default=DATASETS / "scifact")
    parser.add_argument("--questions", type=int, default=None, help="SQuAD questions (all: 10,570)")
    parser.add_argument(
        "--docs", type=int, default=None, help="SciFact abstracts beyond the judged"
    )
    parser.add_argument("--articles", type=int, default=None, help="SQuAD articles (all: 48)")
    parser.add_argument("--skip-scifact", action="store_true")
    parser.add_argument(
        "--alt",
        default="recursive:900:180,sentence:900:180",
        help="other chunkers to compare, chunker:size:overlap,... ('' for none)",
    )
    parser.add_argument(
        "--alt-scifact",
        default="recursive:900:180",
        help="other chunkers to compare on SciFact ('' for none)",
    )
    args = parser.parse_args()
    embedder = SentenceTransformerEmbedder()
    summary: dict[str, Any] = {}
    rows: list[tuple[Any, ...]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        squad = run_squad(args, embedder, work)
        rows += squad.pop("rows")
        summary.update(squad)
        if not args.skip_scifact:
            scifact = run_scifact(args, embedder, work)
            rows += scifact.pop("rows")
            summary.update(scifact)
    print(
        f"{'dataset':8} {'configuration':34} {'metric 1':>9} {'metric 2':>9} {'chunks':>7} "
        f"{'mean ch':>8} {'ingest s':>9} {'query s':>8}"
    )
    print("  (squad: span Recall@5, MRR@5; scifact: nDCG@10, Recall@10)")
    for dataset, config, m1, m2, chunks, mean, ingest, took in rows:
        print(
            f"{dataset:8} {config:34} {m1:>9.3f} {m2:>9.3f} {chunks:>7} {mean:>8.0f} "
            f"{ingest:>9.1f} {took:>8.1f}"
        )
    keys = [
        "squad_recall_at_5",
        "squad_mrr_at_5",
        "squad_mean_chunk_chars",
        "peer_squad_recall_at_5",
        "peer_squad_mean_chunk_chars",
        "scifact_ndcg_at_10",
        "peer_scifact_ndcg_at_10",
    ]
    print(json.dumps({k: (round(summary[k], 4) if k in summary else None) for k in keys}))


if __name__ == "__main__":
    main()
