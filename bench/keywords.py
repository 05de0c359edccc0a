"""Keyword analysis speed: the BM25 sparse vectors of chunks, against the word-by-word analyser.

Every chunk a sync writes gets a sparse vector from :class:`KeywordAnalyzer` beside its dense
one; with a fast embedder (a GPU, or the trivial embedder of ``bench/ingest.py``) it is the
largest part of a commit after the model. Baseline: the analyser as it was before it counted
distinct words (``word_by_word`` below: every word of a chunk matched and counted one at a
time by the ``regex`` engine, each word's terms remembered), measured in the same run on the
same chunks. Both must give the very same vectors: the bench counts the chunks where they
differ (``mismatches``, which must be 0).

Chunks: SciFact abstracts (English, nearly all ASCII) and the XQuAD contexts of several
languages (``--langs``), cut by the column's default chunker and normalised as a sync
normalises them. Each set runs ``--rounds`` rounds, the two analysers in alternating order;
a set's speedup is the median of its rounds' ratios.

    python bench/keywords.py [--datasets ../shared/datasets] [--docs 2000] [--rounds 5]
      [--langs zh,ru,ar,th,de,vi]

Needs only the package itself (``pip install -e .``) and the datasets. The last line is one
JSON object: {"baseline_chunks_per_s", "chunks_per_s", "speedup" (SciFact), "speedups" (each
set), "chunks" (each set), "mismatches"}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import regex

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
from semantic_orm import keywords  # noqa: E402
from semantic_orm.column import SemanticText  # noqa: E402
from semantic_orm.keywords import KeywordAnalyzer  # noqa: E402
from semantic_orm.normalizing import Normalizer  # noqa: E402
from semantic_orm.stores.base import SparseVector  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATASETS = REPO.parent / "shared" / "datasets"

_remembered: dict[str, tuple[tuple[int, float], ...]] = {}


def bigrams_one_by_one(run: str) -> Iterator[str]:
    """The baseline's character bigrams (graphemes found by ``regex.findall``)."""
    chars = regex.findall(r"\X", run)
    if len(chars) == 1:
        yield chars[0]
        return
    for i in range(len(chars) - 1):
        yield chars[i] + chars[i + 1]


def word_by_word(text: str) -> SparseVector:
    """The baseline: the built-in analyser's document vector as it was computed before, every
    word matched and counted on its own (its terms remembered, as then)."""
    words = keywords._prepare(text)
    counts: Counter[int] = Counter()
    length = 0.0
    if keywords._RUN_RE.search(words):
        for run in keywords._RUN_RE.finditer(words):
            for term in bigrams_one_by_one(run.group()):
                counts[keywords._index(term)] += 1
                length += keywords.BIGRAM_LENGTH
        for run in keywords._RUN_RE.finditer(words):  # and a longer run's Chinese, Japanese
            chars = regex.findall(r"\X", run.group())  # and Korean characters (no length)
            for char in chars if len(chars) > 1 else ():
                if keywords._IDEOGRAPHIC_RE.match(char):
                    counts[keywords._index(char)] += 1
        words = keywords._RUN_RE.sub(" ", words)
    for match in keywords._WORD_RE.finditer(words):
        word = match.group()
        found = _remembered.get(word)
        if found is None:
            found = tuple(
                (keywords._index(t), keywords.BIGRAM_LENGTH if keywords._RUN_RE.match(t) else 1.0)
                for t in keywords._word_terms(word)
            )
            _remembered[word] = found
        for index, weight in found:
            counts[index] += 1
            length += weight
    norm = keywords.K1 * (1 - keywords.B + keywords.B * length / keywords.AVG_LEN)
    indices = sorted(counts)
    values = [counts[i] * (keywords.K1 + 1) / (counts[i] + norm) for i in indices]
    return SparseVector(tuple(indices), tuple(values))


def scifact_texts(datasets: Path, docs: int) -> list[str]:
    """The first ``docs`` SciFact abstracts (title and text)."""
    out = []
    with open(datasets / "scifact" / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            out.append(f"{row.get('title', '')}\n\n{row['text']}")
            if len(out) >= docs:
                break
    return out


def xquad_texts(datasets: Path, lang: str) -> list[str]:
    """The 240 XQuAD contexts in ``lang``."""
    data = json.loads((datasets / "xquad" / f"xquad.{lang}.json").read_text("utf-8"))["data"]
    return [p["context"] for article in data for p in article["paragraphs"]]


def chunk_texts(texts: list[str]) -> list[str]:
    """What the analyser reads in a sync: each chunk of the default column, normalised."""
    column = SemanticText()
    chunker = column.make_chunker()
    normalize = Normalizer(column.normalize)
    return [normalize(c.text) for text in texts for c in chunker.chunk(text)]


def timed(analyse: Callable[[str], Any], chunks: list[str]) -> float:
    t0 = time.perf_counter()
    for chunk in chunks:
        analyse(chunk)
    return time.perf_counter() - t0


def measure(chunks: list[str], rounds: int) -> tuple[float, float, float, int]:
    """(baseline chunks/s, analyser chunks/s, median speedup, chunks whose vectors differ)."""
    analyser = KeywordAnalyzer()
    mismatches = sum(word_by_word(c) != analyser.document_vector(c) for c in chunks)  # warms
    base: list[float] = []
    ours: list[float] = []
    for r in range(rounds):
        if r % 2:
            ours.append(timed(analyser.document_vector, chunks))
            base.append(timed(word_by_word, chunks))
        else:
            base.append(timed(word_by_word, chunks))
            ours.append(timed(analyser.document_vector, chunks))
    speedup = statistics.median(b / o for b, o in zip(base, ours, strict=True))
    n = len(chunks)
    return n / statistics.median(base), n / statistics.median(ours), speedup, mismatches


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", type=Path, default=DEFAULT_DATASETS)
    parser.add_argument("--docs", type=int, default=2000, help="SciFact abstracts")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--langs", default="zh,ru,ar,th,de,vi", help="XQuAD languages")
    args = parser.parse_args()
    langs = [lang for lang in args.langs.split(",") if lang]
    needed = [args.datasets / "scifact" / "corpus.jsonl"]
    needed += [args.datasets / "xquad" / f"xquad.{lang}.json" for lang in langs]
    missing = [str(path) for path in needed if not path.is_file()]
    if missing:
        print(f"missing datasets: {', '.join(missing)} (see --datasets)", file=sys.stderr)
        return 2
    sets = {"scifact": chunk_texts(scifact_texts(args.datasets, args.docs))}
    for lang in langs:
        sets[f"xquad_{lang}"] = chunk_texts(xquad_texts(args.datasets, lang))
    print(f"{'set':12s} {'chunks':>7s} {'baseline/s':>11s} {'analyser/s':>11s} {'speedup':>8s}")
    results = {}
    for name, chunks in sets.items():
        results[name] = measure(chunks, args.rounds)
        base, ours, speedup, bad = results[name]
        print(f"{name:12s} {len(chunks):7d} {base:11.0f} {ours:11.0f} {speedup:8.2f}", end="")
        print(f"   ({bad} chunks differ)" if bad else "")
    base, ours, speedup, _ = results["scifact"]
    print(
        json.dumps(
            {
                "baseline_chunks_per_s": round(base),
                "chunks_per_s": round(ours),
                "speedup": round(speedup, 3),
                "speedups": {name: round(r[2], 3) for name, r in results.items()},
                "chunks": {name: len(chunks) for name, chunks in sets.items()},
                "mismatches": sum(r[3] for r in results.values()),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
