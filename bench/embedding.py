"""Embedding speed and quality of the default backend against raw sentence-transformers fp32.

Baseline: raw ``SentenceTransformer(all-MiniLM-L6-v2).encode`` in fp32 PyTorch on the CPU,
called as a user calls it (its default batch size).
Candidate: ``SentenceTransformerEmbedder()`` with its defaults (``backend="auto"``: ONNX Runtime
int8 when onnxruntime is installed, else torch fp32), on the same chunks, in the same run.

* Speed: chunks per second on SciFact chunks cut by the column's default chunker (hybrid,
  900/180), in ``--rounds`` interleaved rounds (each round its own slice, the two
  configurations in alternating order); the speedup is the median of the per-round ratios.
* Quality: SciFact test nDCG@10 (a document scores as its best chunk; ``--docs N`` keeps the
  judged abstracts of the first ``--scifact-queries`` queries plus N others) and SQuAD v1.1 dev
  span Recall@5 / MRR@5 (``--squad-articles`` articles, ``--questions`` questions; a hit is a
  chunk of the answering article that contains the whole answer span). Queries go through
  ``encode_query`` for the candidate, ``encode`` for the baseline.
* GPU: when ``torch.cuda.is_available()``, ``device="cuda"`` (fp16) against raw
  sentence-transformers fp32 on the same GPU is measured too (``cuda_*`` keys).
* Other configurations: ``--also openvino-bf16 onnx-fp32 ...`` (``BACKEND-PRECISION``) measures
  each the same way against the same baseline, reported under ``others`` (speed and the three
  quality deltas each). Each is loaded before any long work (a name, runtime or precision the
  CPU lacks stops the run at once; openvino: ``pip install -e '.[openvino]'``).

    python bench/embedding.py [--datasets ../shared/datasets] [--docs 300] [--rounds 3]
      [--speed-chunks 128] [--scifact-queries 300] [--squad-articles 8] [--questions 500]
      [--also openvino-fp32 openvino-bf16]

The last line is one JSON object: {"baseline_chunks_per_s", "chunks_per_s", "speedup",
"scifact_ndcg_at_10_delta", "squad_mrr_at_5_delta", "squad_recall_at_5_delta", "backend",
..., "others": {"openvino-bf16": {"chunks_per_s", "speedup", ...}}}.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from retrieval import load_scifact, load_squad, ndcg_at_10  # noqa: E402

from semantic_orm import (  # noqa: E402
    ConfigurationError,
    MissingDependencyError,
    SentenceTransformerEmbedder,
)
from semantic_orm.chunking import get_chunker  # noqa: E402
from semantic_orm.column import DEFAULT_CHUNK_SIZE, DEFAULT_CHUNKER, DEFAULT_OVERLAP  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PAUSE = 1.5
"""Seconds between two timed runs (see :func:`speed`)."""
Encode = Callable[[Sequence[str]], Any]


def raw_st(device: str) -> tuple[Encode, Encode]:
    """Raw sentence-transformers fp32: (documents, queries) encoders."""
    from sentence_transformers import SentenceTransformer

    from semantic_orm.embedding import _resolve_model_path

    model = SentenceTransformer(_resolve_model_path("all-MiniLM-L6-v2"), device=device)

    def enc(texts: Sequence[str]) -> Any:  # as a user calls it: its default batch size (32)
        return model.encode(list(texts), normalize_embeddings=True, show_progress_bar=False)

    return enc, enc


def ours(**kwargs: Any) -> tuple[Encode, Encode, SentenceTransformerEmbedder]:
    embedder = SentenceTransformerEmbedder(**kwargs)
    embedder.encode(["warm up"])  # load (and on first use export) outside the timings
    return embedder.encode, embedder.encode_query, embedder


def speed(
    base: Encode, cand: Encode, chunks: list[str], rounds: int, per_round: int
) -> tuple[float, float, float, list[float]]:
    base(chunks[:8])
    cand(chunks[:8])
    tb = tc = 0.0
    ratios: list[float] = []
    for r in range(rounds):
        part = chunks[r * per_round : (r + 1) * per_round]
        times: dict[str, float] = {}
        order = [("b", base), ("c", cand)] if r % 2 == 0 else [("c", cand), ("b", base)]
        for key, fn in order:
            # both runtimes keep their worker threads spinning for a moment after a call: a
            # pause lets them settle, so one side never runs against the other's spinning
            time.sleep(PAUSE)
            start = time.perf_counter()
            fn(part)
            times[key] = time.perf_counter() - start
        tb += times["b"]
        tc += times["c"]
        ratios.append(times["b"] / times["c"])
        print(
            f"  round {r + 1}: baseline {times['b']:.2f}s, candidate {times['c']:.2f}s, "
            f"ratio {ratios[-1]:.2f}",
            flush=True,
        )
    n = rounds * per_round
    return n / tb, n / tc, statistics.median(ratios), ratios


def scifact_ndcg(
    docs: Encode,
    queries: Encode,
    chunks: list[tuple[str, str]],
    qs: dict[str, str],
    qrels: dict[str, dict[str, int]],
) -> float:
    vectors = np.asarray(docs([t for _, t in chunks]))
    owners = np.array([d for d, _ in chunks])
    ids = list(qs)
    qv = np.asarray(queries([qs[i] for i in ids]))
    scores = qv @ vectors.T
    total = 0.0
    for row, qid in zip(scores, ids, strict=True):
        best: dict[str, float] = {}
        for idx in np.argsort(-row)[:200]:
            best.setdefault(str(owners[idx]), float(row[idx]))
        ranked = sorted(best, key=lambda d: -best[d])
        total += ndcg_at_10(ranked, qrels[qid])
    return total / len(ids)


def squad_metrics(
    docs: Encode,
    queries: Encode,
    chunks: list[tuple[int, int, int, str]],
    gold: list[dict[str, Any]],
) -> tuple[float, float]:
    vectors = np.asarray(docs([c[3] for c in chunks]))
    qv = np.asarray(queries([g["question"] for g in gold]))
    scores = qv @ vectors.T
    hits = mrr = 0.0
    for row, g in zip(scores, gold, strict=True):
        a, b = g["span"]
        for rank, idx in enumerate(np.argsort(-row)[:5], 1):
            pk, start, end, _ = chunks[idx]
            if pk == g["pk"] and start <= a and b <= end:
                hits += 1
                mrr += 1 / rank
                break
    return hits / len(gold), mrr / len(gold)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", type=Path, default=REPO / ".." / "shared" / "datasets")
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--scifact-queries", type=int, default=300)
    parser.add_argument("--squad-articles", type=int, default=8)
    parser.add_argument("--questions", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--speed-chunks", type=int, default=128, help="per round")
    parser.add_argument(
        "--also",
        nargs="*",
        default=[],
        metavar="BACKEND-PRECISION",
        help="more configurations to measure against the same baseline (e.g. openvino-bf16)",
    )
    args = parser.parse_args()
    also = [tuple(c.split("-", 1)) for c in args.also]
    for config, name in zip(also, args.also, strict=True):
        if len(config) != 2:
            sys.exit(f"--also takes BACKEND-PRECISION (e.g. openvino-bf16), got {name!r}")

    # optional dependencies first, before any long work
    if importlib.util.find_spec("sentence_transformers") is None:
        sys.exit("needs sentence-transformers: pip install 'semantic-orm[embed]'")
    extra: dict[str, SentenceTransformerEmbedder] = {}
    for (other, other_precision), name in zip(also, args.also, strict=True):
        try:  # names, runtimes and CPU support checked now: loads (or exports) the model
            extra[name] = SentenceTransformerEmbedder(
                device="cpu", backend=other, precision=other_precision
            )
            _ = extra[name].model
        except (ConfigurationError, MissingDependencyError) as exc:
            sys.exit(f"--also {name}: {exc}")
    if importlib.util.find_spec("onnxruntime") is None:
        print(
            "onnxruntime is not installed: the default resolves to torch fp32 "
            "(pip install 'semantic-orm[onnx]')",
            flush=True,
        )
    import torch

    cuda = torch.cuda.is_available()
    chunker = get_chunker(DEFAULT_CHUNKER, chunk_size=DEFAULT_CHUNK_SIZE, overlap=DEFAULT_OVERLAP)

    corpus, qs, qrels, _ = load_scifact(args.datasets / "scifact", None, None)
    qs = dict(list(qs.items())[: args.scifact_queries])
    qrels = {q: qrels[q] for q in qs}
    needed = {d for rel in qrels.values() for d in rel}
    picked = [d for d in corpus if d[0] in needed]
    picked += [d for d in corpus if d[0] not in needed][: args.docs]
    sci_chunks = [(doc_id, c.text) for doc_id, _, text in picked for c in chunker.chunk(text)]
    articles, gold, _ = load_squad(
        args.datasets / "squad-v1.1-dev" / "dev-v1.1.json", args.questions, args.squad_articles
    )
    squad_chunks = [
        (pk, c.start_offset, c.end_offset, c.text)
        for pk, (_, text) in enumerate(articles, 1)
        for c in chunker.chunk(text)
    ]
    rng = np.random.default_rng(0)
    all_texts = [t for _, t in sci_chunks]
    speed_set = [all_texts[i] for i in rng.permutation(len(all_texts))]
    need = args.rounds * args.speed_chunks
    speed_set = (speed_set * (need // max(len(speed_set), 1) + 1))[:need]
    print(
        f"SciFact: {len(picked)} docs / {len(sci_chunks)} chunks / {len(qs)} queries; "
        f"SQuAD: {len(articles)} articles / {len(squad_chunks)} chunks / {len(gold)} questions; "
        f"speed: {args.rounds} x {args.speed_chunks} chunks "
        f"(mean {np.mean([len(t) for t in speed_set]):.0f} chars)",
        flush=True,
    )

    base_docs, base_queries = raw_st("cpu")
    cand_docs, cand_queries, embedder = ours(device="cpu")
    backend, precision = embedder.backend
    print(f"candidate: SentenceTransformerEmbedder() -> backend={backend} precision={precision}")

    base_cps, cand_cps, ratio, ratios = speed(
        base_docs, cand_docs, speed_set, args.rounds, args.speed_chunks
    )
    out: dict[str, Any] = {
        "baseline_chunks_per_s": round(base_cps, 2),
        "chunks_per_s": round(cand_cps, 2),
        "speedup": round(ratio, 3),
        "speedup_rounds": [round(r, 3) for r in ratios],
        "backend": f"{backend}-{precision}",
    }
    t = time.perf_counter()

    def quality(docs: Encode, queries: Encode) -> tuple[float, float, float]:
        """SciFact nDCG@10, SQuAD Recall@5 and MRR@5."""
        recall, mrr = squad_metrics(docs, queries, squad_chunks, gold)
        return scifact_ndcg(docs, queries, sci_chunks, qs, qrels), recall, mrr

    nb, rb, mb = quality(base_docs, base_queries)
    nc, rc, mc = quality(cand_docs, cand_queries)
    print(
        f"quality ({time.perf_counter() - t:.0f}s): SciFact nDCG@10 {nb:.4f} -> {nc:.4f}; "
        f"SQuAD R@5 {rb:.4f} -> {rc:.4f}, MRR@5 {mb:.4f} -> {mc:.4f}",
        flush=True,
    )
    out.update(
        scifact_ndcg_at_10=round(nc, 4),
        baseline_scifact_ndcg_at_10=round(nb, 4),
        scifact_ndcg_at_10_delta=round(nc - nb, 4),
        squad_recall_at_5_delta=round(rc - rb, 4),
        squad_mrr_at_5=round(mc, 4),
        baseline_squad_mrr_at_5=round(mb, 4),
        squad_mrr_at_5_delta=round(mc - mb, 4),
    )
    if cuda:
        gpu_base, _ = raw_st("cuda")
        gpu_docs, gpu_queries, gpu = ours(device="cuda")
        print(f"cuda: {gpu.backend}", flush=True)
        gb, gc, gr, _ = speed(gpu_base, gpu_docs, speed_set, args.rounds, args.speed_chunks)
        gn = scifact_ndcg(gpu_docs, gpu_queries, sci_chunks, qs, qrels)
        _, gm = squad_metrics(gpu_docs, gpu_queries, squad_chunks, gold)
        out.update(
            cuda_baseline_chunks_per_s=round(gb, 2),
            cuda_chunks_per_s=round(gc, 2),
            cuda_speedup=round(gr, 3),
            cuda_scifact_ndcg_at_10_delta=round(gn - nb, 4),
            cuda_squad_mrr_at_5_delta=round(gm - mb, 4),
            cuda_backend="-".join(gpu.backend),
        )
    else:
        out["cuda"] = None
    others: dict[str, Any] = {}
    for name, other_embedder in extra.items():
        docs, queries = other_embedder.encode, other_embedder.encode_query
        print(f"{name}:", flush=True)
        _, cps, ratio, _ = speed(base_docs, docs, speed_set, args.rounds, args.speed_chunks)
        n, r, m = quality(docs, queries)
        others[name] = {
            "chunks_per_s": round(cps, 2),
            "speedup": round(ratio, 3),
            "scifact_ndcg_at_10_delta": round(n - nb, 4),
            "squad_recall_at_5_delta": round(r - rb, 4),
            "squad_mrr_at_5_delta": round(m - mb, 4),
        }
        print(f"  {others[name]}", flush=True)
    if others:
        out["others"] = others
    out["target_met"] = bool(
        out["speedup"] >= 2.0
        and out["scifact_ndcg_at_10_delta"] >= -0.01
        and out["squad_mrr_at_5_delta"] >= -0.01
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
