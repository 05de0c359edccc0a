"""One search over several models: one ranking, each hit telling its model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from semantic_orm import ConfigurationError, semantic_search

from .models import Article, Note, Translation

ARTICLES = {
    1: "Rivers carve canyons over millions of years of slow erosion.",
    2: "Bread rises because yeast turns sugar into carbon dioxide.",
    3: "A violin has four strings tuned in fifths.",
}
NOTES = {
    "glacier": "Glaciers grind valleys into a U shape as they move.",
    "oven": "Bake the bread in a hot oven until the crust is brown.",
}


@pytest.fixture
def both(installed: Callable[..., Any]) -> Any:
    _, factory = installed()
    with factory() as s:
        s.add_all(Article(id=k, title=f"a{k}", content=v) for k, v in ARTICLES.items())
        s.add_all(Note(slug=k, body=v) for k, v in NOTES.items())
        s.commit()
    return factory


@pytest.mark.parametrize("mode", ["dense", "keyword"])
def test_scores_merge_across_models_exactly(both: Any, mode: Any) -> None:
    with both() as s:
        alone = [
            (h.score, h.obj)
            for model, col in ((Article, None), (Note, "body"))
            for h in semantic_search(s, model, "bread oven yeast", limit=10, mode=mode, column=col)
        ]
        hits = semantic_search(
            s, [Article, Note], "bread oven yeast", limit=10, mode=mode, column={Note: "body"}
        )
        # local mode's cosines differ in the last digits between two queries: approx
        assert [h.score for h in hits] == pytest.approx(
            sorted((sc for sc, _ in alone), reverse=True)
        )
        assert {id(h.obj) for h in hits} == {id(o) for _, o in alone}
        assert {h.model for h in hits} == {Article, Note}
        page = semantic_search(
            s, [Article, Note], "bread oven yeast", limit=2, offset=1, mode=mode,
            column={Note: "body"},
        )  # fmt: skip
        assert [h.obj for h in page] == [h.obj for h in hits[1:3]]


def test_hybrid_fuses_the_merged_rankings(both: Any) -> None:
    with both() as s:
        hits = semantic_search(
            s, [Article, Note], "bread in the oven", limit=5, column={Note: "body"},
            where={Article: Article.id != 3},
        )  # fmt: skip
        assert hits[0].model is Note and hits[0].obj.slug == "oven"
        assert all(not (h.model is Article and h.obj.id == 3) for h in hits)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert set(hits[0].scores) == {"dense", "keyword", "keyword_share", "fused"}
        alone = Note.semantic_search(s, "bread in the oven", column="body", limit=1)
        assert hits[0].score == alone[0].score  # the same ranking as the model's own search


def test_several_models_refuse_what_they_cannot_mean(both: Any) -> None:
    with both() as s:
        with pytest.raises(ConfigurationError, match="where="):
            semantic_search(s, [Article, Note], "x", where=Article.id == 1, column={Note: "body"})
        with pytest.raises(ConfigurationError, match="same model"):
            semantic_search(s, [Article, Article], "x")
        # criteria for a model not searched would be dropped unseen (a tenant filter on the
        # wrong class filters nothing): refused, naming it
        with pytest.raises(ConfigurationError, match=r"where= names Translation, not among"):
            semantic_search(
                s,
                [Article, Note],
                "x",
                where={Translation: Translation.lang == "fr"},
                column={Note: "body"},
            )
        with pytest.raises(ConfigurationError, match=r"column= names Translation"):
            semantic_search(s, [Article, Note], "x", column={Note: "body", Translation: "text"})
        with pytest.raises(ConfigurationError, match="several SemanticText"):
            semantic_search(s, [Article, Note], "x")  # Note has two: which one
