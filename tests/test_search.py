"""Model.semantic_search: ranking, grouping, SQL filters and rows gone from SQL.

Runs on SQLite and PostgreSQL and on both store adapters, with the fake word-hashing embedder,
which ranks texts by shared words (search quality with a real model: test_integration.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import sessionmaker

from semantic_orm import ConfigurationError, SemanticIndex, semantic_search

from .models import Article, Note

DOCS = {
    "rivers": "Rivers flow into the sea. The longest rivers carry water across continents.",
    "cooking": "Cooking pasta needs salted boiling water. Drain the pasta and add the sauce.",
    "taxes": "Company taxes are declared every year. Accounting records support the taxes.",
}


def seed(s: OrmSession) -> dict[str, Article]:
    arts = {k: Article(title=k, content=v) for k, v in DOCS.items()}
    s.add_all(arts.values())
    s.commit()
    return arts


def test_ranks_rows_and_reports_the_matching_chunk(Session: sessionmaker[OrmSession]) -> None:
    with Session() as s:
        arts = seed(s)
        hits = Article.semantic_search(s, "pasta sauce", limit=3)
        assert hits[0].obj is arts["cooking"]
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        chunk = hits[0].chunk
        assert DOCS["cooking"][chunk.start_offset : chunk.end_offset] == chunk.text
        assert "pasta" in chunk.text
        assert hits[0].text == DOCS["cooking"]
        assert "**" + chunk.text + "**" in hits[0].highlight()


def test_rows_are_grouped_so_one_long_document_does_not_fill_the_top_k(
    Session: sessionmaker[OrmSession],
) -> None:
    long_doc = "\n\n".join(f"Pasta recipe number {i}: boil pasta in water." for i in range(30))
    with Session() as s:
        seed(s)
        s.add(Article(title="long", content=long_doc))
        s.commit()
        rows = Article.semantic_search(s, "pasta water", limit=3)
        assert len(rows) == 3
        assert len({h.obj.id for h in rows}) == 3
        assert rows[0].obj.title == "long" and 1 < len(rows[0].chunks) <= 3
        passages = Article.semantic_search(s, "pasta water", limit=3, group_by="chunk")
        assert len(passages) == 3 and {h.obj.title for h in passages} == {"long"}
        assert len({h.chunk.index for h in passages}) == 3


def test_where_filter_is_applied_and_limit_still_honoured(
    Session: sessionmaker[OrmSession],
) -> None:
    with Session() as s:
        # 40 English rows that match the query better than the 3 French ones
        s.add_all(
            Article(title=f"en{i}", lang="en", content=f"water rivers sea {i}") for i in range(40)
        )
        s.add_all(Article(title=f"fr{i}", lang="fr", content=f"water {i} eau") for i in range(3))
        s.commit()
        hits = Article.semantic_search(s, "water rivers sea", limit=3, where=Article.lang == "fr")
        assert sorted(h.obj.title for h in hits) == ["fr0", "fr1", "fr2"]
        assert Article.semantic_search(s, "water", limit=5, where=Article.lang == "de") == []


def test_rows_gone_from_sql_never_appear(
    Session: sessionmaker[OrmSession], index: SemanticIndex, engine: Any
) -> None:
    with Session() as s:
        arts = seed(s)
    plain = sessionmaker(engine)  # not installed: its delete never reaches the index
    with plain() as s:
        s.delete(s.get(Article, arts["cooking"].id))
        s.commit()
    with Session() as s:
        hits = Article.semantic_search(s, "pasta sauce", limit=3)
        assert "cooking" not in {h.obj.title for h in hits}
        assert len(hits) == 2


def test_score_threshold_and_module_function(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    with Session() as s:
        seed(s)
        all_hits = semantic_search(s, Article, "company taxes", limit=3, mode="dense")
        best = all_hits[0].score
        strict = semantic_search(
            s, Article, "company taxes", limit=3, mode="dense", score_threshold=best - 1e-4
        )
        assert [h.obj.title for h in strict] == ["taxes"]
        # hybrid: the threshold bounds the cosine of dense candidates; keyword matches still fuse
        fused = semantic_search(s, Article, "company taxes", limit=3, score_threshold=0.999)
        assert [h.obj.title for h in fused] == ["taxes"]


def test_choosing_among_several_semantic_columns(Session: sessionmaker[OrmSession]) -> None:
    with Session() as s:
        s.add(Note(slug="a", summary="about birds", body="Owls hunt mice at night."))
        s.add(Note(slug="b", summary="about owls", body="Sparrows eat seeds."))
        s.commit()
        with pytest.raises(ConfigurationError, match="several SemanticText columns"):
            Note.semantic_search(s, "owls")
        assert Note.semantic_search(s, "owls", column="summary", limit=1)[0].obj.slug == "b"
        assert Note.semantic_search(s, "owls hunt", column="body", limit=1)[0].obj.slug == "a"
        with pytest.raises(ConfigurationError, match="slug is not a SemanticText column"):
            Note.semantic_search(s, "owls", column="slug")


def test_clear_errors_for_bad_calls(Session: sessionmaker[OrmSession], engine: Any) -> None:
    with Session() as s:
        with pytest.raises(ConfigurationError, match="limit must be > 0"):
            Article.semantic_search(s, "x", limit=0)
        with pytest.raises(ConfigurationError, match="non-empty"):
            Article.semantic_search(s, "  ")
    with OrmSession(engine) as s:
        with pytest.raises(ConfigurationError, match="no SemanticIndex is installed"):
            Article.semantic_search(s, "anything")


def test_a_precomputed_query_vector_gives_the_same_ranking(
    Session: sessionmaker[OrmSession], index: SemanticIndex
) -> None:
    with Session() as s:
        seed(s)
        embedder = index.embedder
        vector = embedder.encode(["salted water for pasta"])[0]
        for mode in ("dense", "hybrid"):
            plain = Article.semantic_search(s, "salted water for pasta", limit=3, mode=mode)
            given = Article.semantic_search(
                s, "salted water for pasta", limit=3, mode=mode, query_vector=vector
            )
            assert [(h.obj.id, h.score) for h in given] == [(h.obj.id, h.score) for h in plain]
        calls = getattr(embedder, "calls", None)
        Article.semantic_search(s, "pasta", query_vector=list(vector))  # a plain list works too
        assert getattr(embedder, "calls", None) == calls  # the query was not encoded again
        with pytest.raises(ConfigurationError, match=r"query_vector for Article.content .*\(64,\)"):
            Article.semantic_search(s, "pasta", query_vector=vector[:10])


def test_search_before_anything_was_saved_is_empty(Session: sessionmaker[OrmSession]) -> None:
    with Session() as s:
        assert Article.semantic_search(s, "nothing yet") == []


def test_stale_points_of_a_changed_row_are_skipped_not_crashed_on(
    engine: Any, installed: Any
) -> None:
    """A row whose re-sync failed keeps old points; their offsets may overrun its new text."""
    idx, factory = installed(flaky=True, retry_base=0.01)
    flaky = idx.store
    long_text = " ".join(["rivers and lakes carry fresh water"] * 20)
    with factory() as s:
        art = Article(title="t", content=long_text)
        s.add(art)
        s.commit()
        flaky.down = True
        art.content = "rivers"
        s.commit()
        flaky.down = False
        # every old chunk ends past the new 6-character text: skipped, not a crash
        assert Article.semantic_search(s, "rivers lakes water", limit=3) == []
        s.rollback()  # end the read transaction: on SQLite it would block the worker's writes
        idx.drain(engine, timeout=10)
        (hit,) = Article.semantic_search(s, "rivers lakes water", limit=3)
        assert hit.chunk.text == "rivers" and hit.chunk.total_chunks == 1
