"""Search modes, pagination, stable ordering and passage diversity (plumbing, fake embedder).

Runs on SQLite and PostgreSQL and on both store adapters. Keyword and hybrid *quality* with the
real model is tested in test_retrieval_quality.py.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from sqlalchemy.orm import Session as OrmSession

from semantic_orm import ConfigurationError, SemanticIndex, SemanticSearchMixin, SemanticText

from .models import Article


class _Base(DeclarativeBase):
    pass


class Overlapping(SemanticSearchMixin, _Base):
    """Heavily overlapping windows."""

    __tablename__ = "overlapping"

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(50))
    body: Mapped[str | None] = mapped_column(SemanticText(chunk_size=100, overlap=80))


@pytest.mark.parametrize("mode", ["dense", "keyword"])
def test_ties_are_ordered_by_primary_key_and_pages_do_not_overlap(
    Session: sessionmaker[OrmSession], mode: str
) -> None:
    with Session() as s:
        s.add_all(Article(id=i, title=f"t{i}", content="water rivers sea") for i in range(1, 13))
        s.add(Article(id=99, title="other", content="cooking pasta"))
        s.commit()
        everything = [
            h.obj.id
            for h in Article.semantic_search(s, "water rivers", limit=20, mode=mode)  # type: ignore[arg-type]
        ]
        assert everything[:12] == list(range(1, 13))  # numeric order, not "1", "10", "2"
        assert everything[12:] == ([] if mode == "keyword" else [99])  # no shared word
        pages = [
            Article.semantic_search(s, "water rivers", limit=5, offset=o, mode=mode)  # type: ignore[arg-type]
            for o in (0, 5, 10)
        ]
        assert [h.obj.id for p in pages for h in p] == everything
        assert Article.semantic_search(s, "water", limit=5, offset=50, mode=mode) == []  # type: ignore[arg-type]


def test_keyword_mode_matches_words_only_and_hybrid_is_the_default(
    Session: sessionmaker[OrmSession],
) -> None:
    with Session() as s:
        s.add_all(
            [
                Article(title="code", content="Replace filter cartridge ZK-9041 every spring."),
                Article(title="water", content="Fresh water flows from the spring."),
                Article(title="none", content="Nothing related at all here."),
            ]
        )
        s.commit()
        found = Article.semantic_search(s, "zk-9041", limit=5, mode="keyword")
        assert [h.obj.title for h in found] == ["code"]  # rows without the term are not returned
        assert Article.semantic_search(s, "the of and", limit=5, mode="keyword") == []  # stopwords
        hybrid = Article.semantic_search(s, "spring ZK-9041", limit=3)
        assert hybrid[0].obj.title == "code"
        assert hybrid[0].score == pytest.approx(2 / 60, rel=1e-4)  # first in both rankings


def test_chunk_mode_skips_near_duplicate_windows_of_the_same_row(
    engine: Engine, index: SemanticIndex
) -> None:
    _Base.metadata.create_all(engine)
    factory = sessionmaker(engine, expire_on_commit=False)
    index.install(factory)
    try:
        filler = "Gardens grow flowers in warm months. " * 8
        body = filler + "The lighthouse keeper logged a storm. " + filler  # one passage matches
        with factory() as s:
            s.add(Overlapping(id=1, title="log", body=body))
            s.add(Overlapping(id=2, title="short", body="the lighthouse keeper"))
            s.commit()
            hits = Overlapping.semantic_search(
                s, "lighthouse keeper storm", limit=6, group_by="chunk", mode="dense"
            )
            assert len(hits) == 6
            assert "lighthouse" in hits[0].chunk.text
            by_row: dict[int, list[tuple[int, int]]] = {}
            for h in hits:
                by_row.setdefault(h.obj.id, []).append((h.chunk.start_offset, h.chunk.end_offset))
            for spans in by_row.values():
                for i, (a0, a1) in enumerate(spans):
                    for b0, b1 in spans[i + 1 :]:
                        overlap = min(a1, b1) - max(a0, b0)
                        assert 2 * overlap <= min(a1 - a0, b1 - b0), (spans, overlap)
            # row mode still keeps a row's best (overlapping) chunks together
            rows = Overlapping.semantic_search(
                s, "lighthouse keeper storm", limit=2, mode="dense", chunks_per_row=3
            )
            (row,) = [h for h in rows if h.obj.id == 1]
            assert len(row.chunks) == 3 and "lighthouse" in row.chunk.text

    finally:
        index.uninstall(factory)


def test_bad_mode_and_offset_are_refused(Session: sessionmaker[OrmSession]) -> None:
    with Session() as s:
        with pytest.raises(ConfigurationError, match="mode must be one of"):
            Article.semantic_search(s, "x", mode="fuzzy")  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="offset must be >= 0"):
            Article.semantic_search(s, "x", offset=-1)
