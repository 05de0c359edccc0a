"""semantic_orm.evaluation and ``semantic-orm eval``; keyword and hybrid retrieval quality.

* Metric arithmetic on rankings fixed by hand (search replaced by a stub), so every expected
  number can be checked on paper.
* The real model (all-MiniLM-L6-v2) on a small catalogue of look-alike part numbers: dense
  search confuses the codes, keyword and hybrid search find them. Both store adapters, both
  databases.
* The CLI on the tests' application module (fake embedder: plumbing only).
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import sessionmaker

from semantic_orm import (
    ConfigurationError,
    SemanticIndex,
    SentenceTransformerEmbedder,
    evaluation,
)
from semantic_orm.chunking import Chunk
from semantic_orm.cli import main as cli_main
from semantic_orm.evaluation import GoldItem, evaluate, load_gold
from semantic_orm.search import ScoredChunk, SearchHit
from semantic_orm.stores import VectorStore

from .helpers import unload_cli_app
from .models import Article, Base

# ---------------------------------------------------------------- metrics on fixed rankings

TEXT = "x" * 200


def hit(pk: int, start: int = 0, end: int = 200) -> SearchHit[Article]:
    chunk = Chunk(TEXT[start:end], 0, start, end, 1)
    return SearchHit(Article(id=pk, title=str(pk)), 1.0, (ScoredChunk(chunk, 1.0),), TEXT)


RANKINGS: dict[tuple[str, str], list[SearchHit[Article]]] = {
    # q1: answer row 1 ranks first; the passage holding [10, 20] ranks third
    ("q1", "row"): [hit(1), hit(2), hit(3)],
    ("q1", "chunk"): [hit(2, 0, 50), hit(1, 0, 15), hit(1, 5, 30)],
    # q2 (no span): answer row 2 ranks third
    ("q2", "row"): [hit(1), hit(3), hit(2)],
    # q3: first everywhere
    ("q3", "row"): [hit(3)],
    ("q3", "chunk"): [hit(3, 0, 100)],
    # q4: never found
    ("q4", "row"): [hit(1)],
    ("q4", "chunk"): [hit(1, 0, 100)],
}
GOLD = [
    {"question": "q1", "pk": 1, "span": [10, 20]},
    {"question": "q2", "pk": 2},
    {"question": "q3", "pk": 3, "span": [0, 5]},
    {"question": "q4", "pk": 4, "span": [0, 5]},
]


@pytest.fixture
def fixed_rankings(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int]]:
    calls: list[tuple[str, str, int]] = []

    def fake(session: Any, model: Any, query: str, **kw: Any) -> list[SearchHit[Article]]:
        calls.append((query, kw.get("group_by", "row"), kw["limit"]))
        return RANKINGS[(query, kw.get("group_by", "row"))][: kw["limit"]]

    monkeypatch.setattr(evaluation, "semantic_search", fake)
    monkeypatch.setattr(evaluation, "_check_gold", lambda *args: {})  # (no session, no rows)
    return calls


def test_metrics_match_hand_computation(fixed_rankings: list[tuple[str, str, int]]) -> None:
    report = evaluate(None, Article, GOLD, k=2)  # type: ignore[arg-type]
    assert report.questions == 4 and report.span_questions == 3
    assert report.recall_row == pytest.approx(2 / 4)  # q1, q3 in the top 2 rows
    assert report.recall_span == pytest.approx(1 / 3)  # only q3's passage: q1's is third
    assert report.mrr == pytest.approx((0 + 0 + 1 + 0) / 4)  # spans for q1/q3/q4, row for q2
    # nDCG@10 looks deeper than k: q1's passage at 3, q2's row at 3, q3 at 1
    assert report.ndcg_at_10 == pytest.approx((0.5 + 0.5 + 1) / 4)
    assert [r.question for r in report.failures] == ["q1", "q2", "q4"]
    q1 = report.failures[0]
    assert [(g.pk, g.start, g.end) for g in q1.retrieved] == [("2", 0, 50), ("1", 0, 15)]
    # every search asked for at least 10 results, for nDCG@10
    assert {limit for _, _, limit in fixed_rankings} == {10}


def test_lenient_counts_overlapping_passages(fixed_rankings: list[tuple[str, str, int]]) -> None:
    report = evaluate(None, Article, GOLD, k=2, lenient=True)  # type: ignore[arg-type]
    assert report.recall_span == pytest.approx(2 / 3)  # q1's [0, 15] overlaps [10, 20]
    assert report.mrr == pytest.approx((1 / 2 + 0 + 1 + 0) / 4)
    assert report.ndcg_at_10 == pytest.approx((1 / math.log2(3) + 0.5 + 1) / 4)
    adjacent = evaluate(  # type: ignore[arg-type]
        None, Article, [{"question": "q1", "pk": 1, "span": [15, 18]}], k=2, lenient=True
    )
    assert adjacent.recall_span == 1.0  # [0, 15] touches [15, 18]


def test_report_renders_table_and_json(fixed_rankings: list[tuple[str, str, int]]) -> None:
    report = evaluate(None, Article, GOLD, k=2)  # type: ignore[arg-type]
    table = report.table()
    assert "Recall@2 (row)" in table and "0.500" in table and "nDCG@10" in table
    assert "3 failed questions" in table and "'q4'  expected 4 [0:5]" in table
    data = json.loads(json.dumps(report.as_dict()))
    assert data["recall_row_at_2"] == 0.5 and data["mrr_at_2"] == 0.25
    assert [f["question"] for f in data["failures"]] == ["q1", "q2", "q4"]


def test_bad_gold_is_refused(tmp_path: Path) -> None:
    for bad, message in [
        ({"pk": 1}, "question"),
        ({"question": "q"}, "'pk'"),
        ({"question": "q", "pk": 1, "span": [5, 2]}, "span"),
        ({"question": "q", "pk": 1, "span": "0-5"}, "span"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            GoldItem.from_dict(bad)
    path = tmp_path / "gold.jsonl"
    path.write_text('{"question": "q", "pk": [1, "fr"]}\n\nnot json\n', "utf-8")
    with pytest.raises(ConfigurationError, match=r"gold.jsonl:3: not JSON"):
        load_gold(path)
    path.write_text('{"question": "q", "pk": [1, "fr"]}\n', "utf-8")
    assert load_gold(path)[0].key == '[1, "fr"]'
    with pytest.raises(ConfigurationError, match="k must be > 0"):
        evaluate(None, Article, GOLD, k=0)  # type: ignore[arg-type]


# ---------------------------------------------------------------- real model: part numbers

CODES = ["KV-8812", "KV-8821", "KX-8812", "VK-1288", "KV-8813", "KV-2881"]
ITEMS = ["coffee grinder", "espresso machine", "milk frother", "water kettle", "toaster", "blender"]
CATALOGUE = [
    f"Part {code}: replacement gasket for the {item}, fits most household models."
    for code, item in zip(CODES, ITEMS, strict=True)
] + [
    "Ask customer service about part KV-88 numbers and the warranty.",
    "Spare parts catalogue: gaskets, seals and filters for all machines.",
]


def test_part_numbers_dense_misses_keyword_and_hybrid_find(
    engine: Engine, store: VectorStore, minilm: SentenceTransformerEmbedder
) -> None:
    Base.metadata.create_all(engine)
    index = SemanticIndex(store=store, embedder=minilm)
    factory = sessionmaker(engine, expire_on_commit=False)
    index.install(factory)
    gold = [
        {"question": code, "pk": i + 1, "span": [5, 5 + len(code)]} for i, code in enumerate(CODES)
    ]
    try:
        with factory() as s:
            s.add_all(Article(id=i + 1, title=f"p{i}", content=t) for i, t in enumerate(CATALOGUE))
            s.commit()
            dense = evaluate(s, Article, gold, k=1, mode="dense")
            keyword = evaluate(s, Article, gold, k=1, mode="keyword")
            hybrid = evaluate(s, Article, gold, k=1, mode="hybrid")
            default = evaluate(s, Article, gold, k=1)
        # all-MiniLM-L6-v2 ranks "KV-88" (row 7) above most exact codes
        assert dense.recall_row <= 0.5
        assert keyword.recall_row == 1.0 and keyword.recall_span == 1.0
        assert hybrid.recall_row == 1.0 and hybrid.mrr == 1.0
        assert default.mode == "hybrid" and default.recall_row == 1.0
        assert {f.question for f in dense.failures} >= {"KV-8812", "KV-8821"}
        assert dense.failures[0].retrieved[0].pk == "7"
    finally:
        index.uninstall(factory)


# ---------------------------------------------------------------- CLI (fake embedder)


def test_cli_eval_prints_table_and_json(
    sqlite_url: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.setenv("SEMANTIC_ORM_TEST_DB", sqlite_url.render_as_string(hide_password=False))
    monkeypatch.setenv("SEMANTIC_ORM_TEST_VECTORS", str(tmp_path / "cli-vectors"))
    sys.modules.pop("tests.cli_app", None)
    app = importlib.import_module("tests.cli_app")
    Base.metadata.create_all(app.engine)
    with app.Session() as s:
        s.add_all(Article(id=i + 1, title=f"p{i}", content=t) for i, t in enumerate(CATALOGUE))
        s.commit()
    app.index.drain(app.engine)
    gold = tmp_path / "gold.jsonl"
    lines = [{"question": "VK-1288 water kettle", "pk": 4, "span": [5, 12]}]
    lines.append({"question": "zebra", "pk": 8})  # shares no word with any row
    gold.write_text("\n".join(json.dumps(x) for x in lines), "utf-8")
    args = ["eval", "tests.cli_app:index", "tests.models:Article", str(gold)]
    assert cli_main([*args, "--k", "3", "--mode", "keyword"]) == 0
    out = capsys.readouterr().out
    assert "Recall@3 (row)" in out and "0.500" in out
    assert "1 failed questions" in out and "'zebra'  expected 8" in out
    assert cli_main([*args, "--json", "--lenient"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["k"] == 5 and data["lenient"] is True and data["mode"] == "hybrid"
    assert data["recall_span_at_5"] == 1.0 and data["questions"] == 2
    assert cli_main([*args[:3], str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read gold file" in capsys.readouterr().err
    unload_cli_app(app)


def test_evaluate_on_the_session_index(
    Session: sessionmaker[OrmSession], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Session() as s:
        s.add_all(Article(id=i + 1, title=f"p{i}", content=t) for i, t in enumerate(CATALOGUE))
        s.commit()
        report = evaluate(s, Article, [GoldItem("KV-2881 blender", 6, (0, 12))], k=3)
        assert report.recall_row == 1.0 and report.recall_span == 1.0
        # the README's call with a gold file's path (it failed on a str's missing .get())
        gold = tmp_path / "gold.jsonl"
        gold.write_text('{"question": "KV-2881 blender", "pk": 6, "span": [0, 12]}\n')
        assert evaluate(s, Article, str(gold), k=3).recall_span == 1.0
        assert evaluate(s, Article, gold, k=3).recall_span == 1.0
        # questions no ranking can get right are counted as misses, with a warning each
        caplog.clear()
        with caplog.at_level("WARNING", logger="semantic_orm"):
            broken = [
                {"question": "KV-2881 blender", "pk": 999},
                {"question": "KV-2881 blender", "pk": 6, "span": [0, 10_000]},
                # no integer: never sent to the database (PostgreSQL refused it, and the
                # session's transaction with it)
                {"question": "KV-2881 blender", "pk": "row-17"},
            ]
            report = evaluate(s, Article, broken, k=3)
        assert report.recall_row == pytest.approx(1 / 3) and report.recall_span == 0.0
        said = [r.getMessage() for r in caplog.records]
        assert any("2 row(s) name rows Article does not have (e.g. pk 999)" in m for m in said)
        assert any("a span past the end of their row's text (e.g. pk 6)" in m for m in said)
        # a key written as a string names the row all the same
        assert evaluate(s, Article, [{"question": "KV-2881 blender", "pk": "6"}]).recall_row == 1
