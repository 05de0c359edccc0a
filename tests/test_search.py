"""Search: ranking, grouping, modes, SQL filters, paging, stable order, and argument errors.

Runs on SQLite and PostgreSQL and on both store adapters, with the fake word-hashing embedder,
which ranks texts by shared words (search quality with a real model: test_integration.py).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import String, inspect
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from sqlalchemy.orm import Session as OrmSession

from semantic_orm import (
    ConfigurationError,
    ReciprocalRankFusion,
    ScoredChunk,
    ScoreFusion,
    SemanticIndex,
    SemanticSearchMixin,
    SemanticText,
    index_for,
    keywords,
    semantic_search,
)
from semantic_orm.mapping import semantic_columns
from semantic_orm.stores import PointPayload, SearchRequest
from semantic_orm.testing import HashEmbedder

from .models import Article, Note, Translation

DOCS = {
    "rivers": "Rivers flow into the sea. The longest rivers carry water across continents.",
    "cooking": "Cooking pasta needs salted boiling water. Drain the pasta and add the sauce.",
    "taxes": "Company taxes are declared every year. Accounting records support the taxes.",
}


class _Base(DeclarativeBase):
    pass


class Overlapping(SemanticSearchMixin, _Base):
    """Heavily overlapping windows."""

    __tablename__ = "overlapping"

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(50))
    body: Mapped[str | None] = mapped_column(SemanticText(chunk_size=100, overlap=80))


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
        # one meaning in every mode: hits scoring below the threshold are dropped
        for mode in ("hybrid", "keyword"):
            ranked = semantic_search(s, Article, "company taxes", limit=3, mode=mode)
            top = semantic_search(
                s, Article, "company taxes", limit=3, mode=mode, score_threshold=ranked[0].score
            )
            assert [h.obj.title for h in top] == ["taxes"]
            assert all(h.score >= ranked[0].score for h in top)


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


@pytest.mark.parametrize("mode", ["dense", "keyword", "hybrid"])
def test_a_changed_rows_hits_show_where_its_chunks_are_now_or_say_they_are_stale(
    engine: Engine, installed: Any, mode: str
) -> None:
    """While a changed row's sync is pending, its old points name offsets into the new text. A
    chunk the new text still holds is shown where it is now (its digest finds it); one whose
    own text changed is shown at its old offsets, marked stale, never passed off as the
    passage that matched. (Deferred: the syncs wait for the drain, no retrier races.)"""
    idx, factory = installed(mode="deferred")
    rivers = " ".join(["rivers and lakes carry fresh water"] * 8)
    owls = " ".join(["owls hunt mice in the barn at night"] * 8)
    first = f"{rivers}\n\n{owls}"
    (col,) = semantic_columns(inspect(Article))

    def passages(s: OrmSession, query: str, text: str) -> list[ScoredChunk]:
        """Every chunk of every hit, by row and by chunk; each is ``text`` at its offsets."""
        found = []
        for group_by in ("row", "chunk"):
            for hit in Article.semantic_search(
                s,
                query,
                limit=20,
                group_by=group_by,  # type: ignore[arg-type]
                mode=mode,  # type: ignore[arg-type]
            ):
                assert hit.stale == hit.chunks[0].stale
                for scored in hit.chunks:
                    c = scored.chunk
                    assert text[c.start_offset : c.end_offset] == c.text
                    found.append(scored)
        assert found, query
        return found

    with factory() as s:
        art = Article(title="t", content=first)
        s.add(art)
        s.commit()
        idx.drain(engine, timeout=10)
        assert not any(p.stale for p in passages(s, "rivers lakes", first))
        # a paragraph put first: every chunk moved, none changed
        moved = f"mistral winds blow\n\n{first}"
        art.content = moved
        s.commit()
        now = {c.text: c for c in idx.binding_for(col).chunker.chunk(moved)}
        for query in ("rivers lakes", "owls hunt mice"):
            for scored in passages(s, query, moved):
                assert not scored.stale and now[scored.chunk.text] == scored.chunk
        # the first paragraph rewritten at the same length: its old offsets still fit
        rewritten = f"{'x' * len(rivers)}\n\n{owls}"
        art.content = rewritten
        s.commit()
        found = passages(s, "rivers lakes", rewritten) + passages(s, "owls", rewritten)
        assert any(p.stale for p in found)
        assert all(p.stale == ("xxx" in p.chunk.text) for p in found)
        s.rollback()  # end the read transaction: on SQLite it would block the drain's writes
        idx.drain(engine, timeout=10)
        assert not any(p.stale for p in passages(s, "owls hunt mice", rewritten))
        assert not any(
            "rivers" in hit.chunk.text or hit.stale
            for hit in Article.semantic_search(s, "rivers lakes", limit=20, mode=mode)
        )


class _WindowWatcher(HashEmbedder):
    """Counts reads of the model's window (a real embedder loads its model to answer)."""

    read = 0

    @property
    def max_seq_length(self) -> int | None:
        type(self).read += 1
        return None


def test_finding_a_changed_rows_chunks_again_loads_no_model_and_cuts_each_text_once(
    engine: Engine, installed: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunks of a changed row's text are found again with its chunker alone (fitting
    them to the model's window would load the model for a keyword search), and once for that
    text, not at every search while its sync waits."""
    idx, factory = installed(mode="deferred", embedder=_WindowWatcher())
    text = " ".join(["rivers and lakes carry fresh water"] * 8) + "\n\n" + "owls hunt at night"
    with factory() as s:
        art = Article(title="t", content=text)
        s.add(art)
        s.commit()
        idx.drain(engine, timeout=10)
        art.content = f"a paragraph put first\n\n{text}"
        s.commit()
        (col,) = semantic_columns(inspect(Article))
        chunker = type(idx.binding_for(col).chunker)
        cut: list[str] = []
        original = chunker.chunk

        def counted(self: Any, value: str) -> Any:
            cut.append(value)
            return original(self, value)

        monkeypatch.setattr(chunker, "chunk", counted)
        _WindowWatcher.read = 0
        for _ in range(3):
            hits = Article.semantic_search(s, "rivers lakes", limit=5, mode="keyword")
            assert hits and not hits[0].stale
            c = hits[0].chunk
            assert art.content[c.start_offset : c.end_offset] == c.text and "rivers" in c.text
        assert _WindowWatcher.read == 0
        assert cut == [art.content]


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
        # the keyword share: BM25 over (k1 + 1) * sum(idf) of the query's distinct terms
        terms = set(keywords.tokenize("spring ZK-9041"))
        assert terms == {"zk-9041", "zk", "9041", "spring"}
        n = {"zk-9041": 1, "zk": 1, "9041": 1, "spring": 2}  # chunks holding each term, of 3
        idf = sum(math.log(1 + (3 - n[t] + 0.5) / (n[t] + 0.5)) for t in terms)
        top = hybrid[0].scores
        assert top["keyword_share"] == pytest.approx(top["keyword"] / (2.2 * idf), rel=1e-4)
        assert 0.5 < top["keyword_share"] < 1
        # HashEmbedder cannot say what it reads (coverage 1): 0.4 * cosine + 0.6 * share
        fused = 0.4 * top["dense"] + 0.6 * top["keyword_share"]
        assert hybrid[0].score == top["fused"] == pytest.approx(fused, rel=1e-5)
        # a hybrid query without keyword terms is fused all the same (no keyword evidence):
        # its scores are on the scale of every other hybrid query's, not bare cosines
        (none, *_) = Article.semantic_search(s, "the of and", limit=3)
        assert none.score == none.scores["fused"] == pytest.approx(0.4 * none.scores["dense"])
        assert "keyword" not in none.scores
        # keyword mode scores on the same scale; a threshold means the same in every mode
        alone = Article.semantic_search(s, "spring ZK-9041", mode="keyword")
        assert alone[0].score == pytest.approx(top["keyword_share"], rel=1e-5)
        half = Article.semantic_search(s, "spring ZK-9041", mode="keyword", score_threshold=0.5)
        assert [h.obj.title for h in half] == ["code"] and len(alone) == 2
        # reciprocal rank fusion on request (first in both rankings: 2 / 60), per search or index
        rrf = Article.semantic_search(s, "spring ZK-9041", fusion=ReciprocalRankFusion())
        assert rrf[0].obj.title == "code" and rrf[0].score == pytest.approx(2 / 60, rel=1e-4)
        index = index_for(s)
        assert index is not None
        index.fusion = ScoreFusion(dense_weight=0.0)  # keyword evidence only
        try:
            only = Article.semantic_search(s, "spring ZK-9041")
            assert only[0].score == pytest.approx(top["keyword_share"], rel=1e-5)
        finally:
            index.fusion = ScoreFusion()
        with pytest.raises(ConfigurationError, match="fusion must be a Fusion"):
            Article.semantic_search(s, "spring", fusion="rrf")  # type: ignore[arg-type]


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
        with pytest.raises(ConfigurationError, match="index must be a SemanticIndex, got str"):
            Article.semantic_search(s, "x", index="default")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["hybrid", "dense", "keyword"])
@pytest.mark.parametrize("group_by", ["row", "chunk"])
def test_pages_concatenate_to_one_search(installed: Any, mode: str, group_by: str) -> None:
    _idx, factory = installed()
    with factory() as s:
        s.add_all(
            Article(
                id=i, title="t", lang="fr" if i % 3 else "en", content="identical text about rivers"
            )
            for i in range(1, 61)
        )
        s.commit()
        for where in (None, Article.lang == "fr"):
            whole = Article.semantic_search(
                s, "rivers", limit=30, mode=mode, group_by=group_by, where=where
            )
            pages = [
                hit
                for page in range(6)
                for hit in Article.semantic_search(
                    s, "rivers", limit=5, offset=5 * page, mode=mode, group_by=group_by, where=where
                )
            ]
            assert [h.obj.id for h in pages] == [h.obj.id for h in whole]
            assert len({h.obj.id for h in whole}) == 30 if group_by == "row" else len(whole) == 30


def test_bad_arguments_name_the_argument(installed: Any) -> None:
    _idx, factory = installed()
    with factory() as s:
        s.add(Article(id=1, title="t", content="some text"))
        s.commit()
        for bad, name in [
            ({"limit": 2.5}, "limit"),
            ({"limit": "5"}, "limit"),
            ({"limit": None}, "limit"),
            ({"limit": True}, "limit"),
            ({"offset": -1}, "offset"),
            ({"limit": 2**62}, "limit"),
            ({"chunks_per_row": 0}, "chunks_per_row"),
            ({"score_threshold": float("nan")}, "score_threshold"),
            ({"query_vector": [float("nan")] * 64}, "query_vector"),
            ({"mode": "fuzzy"}, "mode"),
            ({"limt": 5}, "limt"),
        ]:
            with pytest.raises(ConfigurationError, match=name):
                Article.semantic_search(s, "text", **bad)


@pytest.mark.parametrize("group_by", ["row", "chunk"])
def test_a_one_list_search_reads_about_a_page_of_points_and_only_the_payload_it_uses(
    installed: Any, group_by: str
) -> None:
    idx, factory = installed()
    asked: list[SearchRequest] = []
    query = idx.store.query

    def recording(collection: str, request: SearchRequest) -> Any:
        asked.append(request)
        return query(collection, request)

    with factory() as s:
        s.add_all(
            # one more filler word each: no two rows tie (a tie is read to its end)
            Article(id=i, title="t", content="rivers " + "filler " * i)
            for i in range(1, 200)
        )
        s.commit()
        idx.store.query = recording  # type: ignore[method-assign]
        hits = Article.semantic_search(s, "rivers", limit=5, mode="dense", group_by=group_by)
    assert [h.obj.id for h in hits] == [1, 2, 3, 4, 5]
    (request,) = asked  # one round trip: the first read held a full page
    assert request.payload == PointPayload.SEARCH_KEYS
    assert all(r.limit <= 2 * 5 + 3 for r in request.rankings)


def _summary(hits: list[Any]) -> tuple[list[Any], list[float]]:
    """Everything a hit says, comparable: exact parts, and scores (a store computes them again
    for each read, qdrant-client's local mode to the last float32 digit)."""
    exact = [
        (
            h.obj.id,
            [
                (
                    c.chunk.index,
                    c.chunk.start_offset,
                    c.chunk.end_offset,
                    c.chunk.total_chunks,
                    c.chunk.text,
                    dict(c.chunk.metadata),
                    sorted(c.scores),
                )
                for c in h.chunks
            ],
        )
        for h in hits
    ]
    scores = [x for h in hits for x in (h.score, *(v for c in h.chunks for v in c.scores.values()))]
    return exact, scores


@pytest.mark.parametrize("mode", ["dense", "keyword"])
def test_a_shallow_first_read_returns_what_reading_the_whole_tier_returns(
    installed: Any, mode: str
) -> None:
    """A one-list search by row reads the page's depth first; it must change nothing."""
    from sqlalchemy import func, select

    from semantic_orm import search as search_module

    idx, factory = installed()
    hints = search_module._hints_for(idx.store)
    collection = idx.binding_for(search_module.pick_column(inspect(Article), None)).collection
    asked: list[SearchRequest] = []
    query = idx.store.query

    def recording(collection: str, request: SearchRequest) -> Any:
        asked.append(request)
        return query(collection, request)

    words = "rivers sea water boats fish rain lakes ships".split()
    with factory() as s:
        for i in range(1, 91):
            if i % 4 == 0:  # several chunks, the query's words spread over them
                content = " ".join(f"{words[(i + k) % 8]} filler{k} " * 9 for k in range(4))
            elif i % 4 == 1:  # one chunk, ties among them
                content = "rivers and the sea"
            else:  # one chunk
                content = " ".join(words[(i * k) % 8] for k in range(1, 2 + i % 5))
            s.add(Article(id=i, title="t" * (i % 3), lang="fr" if i % 3 else "en", content=content))
        s.commit()
        idx.store.query = recording  # type: ignore[method-assign]
        for where in (None, Article.lang == "fr", func.length(Article.title) > 0):
            for limit, offset in ((1, 0), (5, 0), (5, 5), (10, 3), (30, 0)):
                for per_row in (1, 3):
                    options: dict[str, Any] = {
                        "limit": limit,
                        "offset": offset,
                        "mode": mode,
                        "where": where,
                        "chunks_per_row": per_row,
                    }
                    hints[collection] = 10**9  # the whole tier at once
                    whole = Article.semantic_search(s, "rivers sea water", **options)
                    hints[collection] = 0  # the page's depth first
                    shallow = Article.semantic_search(s, "rivers sea water", **options)
                    (got, got_scores), (want, want_scores) = _summary(shallow), _summary(whole)
                    assert got == want, options
                    assert got_scores == pytest.approx(want_scores, rel=1e-6), options
        # rows of one chunk only: the page's depth (and its ties) settles the page
        idx.store.query = query  # type: ignore[method-assign]
        for art in s.scalars(select(Article).where(Article.id % 4 == 0)):
            s.delete(art)
        s.commit()
        idx.store.query = recording  # type: ignore[method-assign]
        asked.clear()
        hints[collection] = 0
        hits = Article.semantic_search(s, "boats fish", limit=3, mode=mode)
        assert len(hits) == 3 and all(h.chunk.total_chunks == 1 for h in hits)
        reads = [r for r in asked if r.payload == PointPayload.SEARCH_KEYS]
        assert reads[0].rankings[0].limit == 3 + 1 and hints[collection] == 0


def test_rows_of_a_composite_primary_key_are_found_filtered_and_paged(
    Session: sessionmaker[OrmSession], engine: Any
) -> None:
    """Each hit is the row its points name (keys of two parts, one of them text), never a row
    that shares a part of its key; a row gone from SQL is skipped."""
    with Session() as s:
        arts = [Article(title=f"a{i}", content=None) for i in range(3)]
        s.add_all(arts)
        s.flush()
        a, b, c = (x.id for x in arts)
        texts = {
            (a, "en"): "Rivers flow into the sea across the plains.",
            (a, "fr"): "Les rivières coulent vers la mer.",
            (b, "en"): "Cooking pasta needs salted boiling water.",
            (b, "de"): "Rivers and water: Flüsse fließen ins Meer, rivers rivers.",
            (c, "en"): "Company taxes are declared every year.",
        }
        s.add_all(Translation(article_id=k, lang=g, text=t) for (k, g), t in texts.items())
        s.commit()
    plain = sessionmaker(engine)  # not installed: its delete never reaches the index
    with plain() as s:
        s.delete(s.get(Translation, (c, "en")))
        s.commit()
    with Session() as s:
        hits = Translation.semantic_search(s, "rivers water sea", limit=10, mode="keyword")
        found = [(h.obj.article_id, h.obj.lang) for h in hits]
        assert set(found) == {(a, "en"), (b, "de"), (b, "en")}  # (words shared; not taxes)
        for h in hits:
            key = (h.obj.article_id, h.obj.lang)
            assert h.text == texts[key] and h.obj.text == texts[key]
            assert texts[key][h.chunk.start_offset : h.chunk.end_offset] == h.chunk.text
        assert Translation.semantic_search(s, "taxes", limit=5, mode="keyword") == []
        only = Translation.semantic_search(
            s, "rivers water sea", limit=10, mode="keyword", where=Translation.lang == "en"
        )
        assert {(h.obj.article_id, h.obj.lang) for h in only} == {(a, "en"), (b, "en")}
        dense = Translation.semantic_search(s, "rivers water sea", limit=10, mode="dense")
        assert len({(h.obj.article_id, h.obj.lang) for h in dense}) == len(dense) == 4
        pages = [
            Translation.semantic_search(s, "rivers water sea", limit=2, offset=o, mode="dense")
            for o in (0, 2)
        ]
        assert [h.obj for p in pages for h in p] == [h.obj for h in dense]


@pytest.mark.parametrize("context", range(12))
def test_highlight_context_never_cuts_a_grapheme(context: int) -> None:
    """The context around a highlighted passage was cut by code point: half a flag, or an
    emoji family's joiner alone, at its edges."""
    import regex

    from semantic_orm.chunking import Chunk
    from semantic_orm.search import ScoredChunk, SearchHit

    before, passage, after = "ab🇯🇵\n\n", "キャンプ", "XX👨\u200d👩\u200d👧 é end"
    text = before + passage + after
    start = len(before)
    chunk = Chunk(passage, 0, start, start + len(passage), 1)
    shown = SearchHit(Article(id=1), 1.0, (ScoredChunk(chunk, 1.0),), text).highlight(
        context=context
    )
    lead, _, rest = shown.partition("**" + passage + "**")
    lead, tail = lead.removeprefix("…"), rest.removesuffix("…")
    assert before.endswith(lead) and after.startswith(tail)
    # each edge falls between two graphemes of the whole text
    edges = {0}
    for g in regex.findall(r"\X", text):
        edges.add(max(edges) + len(g))
    assert start - len(lead) in edges and start + len(passage) + len(tail) in edges
    assert len(lead) <= context and len(tail) <= context
