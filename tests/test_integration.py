"""End to end with the real default model (all-MiniLM-L6-v2), on both databases and stores."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session as OrmSession
from sqlalchemy.orm import sessionmaker

from semantic_orm import (
    ChunkTooLongWarning,
    CollectionMismatchError,
    ModelCoverageWarning,
    SemanticIndex,
    SentenceTransformerEmbedder,
    outbox,
)
from semantic_orm.normalizing import Normalizer
from semantic_orm.testing import HashEmbedder

from .helpers import settled
from .models import Article, Base, Wide

CORPUS = {
    "volcano": (
        "Volcanoes form where magma rises through the crust. During an eruption, lava, ash and "
        "gases escape from the vent.\n\nMount Etna in Sicily is one of the most active "
        "volcanoes in Europe, and its lava flows regularly reach nearby villages."
    ),
    "bread": (
        "To bake bread, mix flour, water, salt and yeast, then knead the dough until it is "
        "smooth.\n\nLet the dough rise for two hours before shaping the loaf and baking it in "
        "a hot oven until the crust is golden."
    ),
    "football": (
        "The World Cup final drew a record television audience. The striker scored twice in "
        "the second half, and the goalkeeper saved a penalty in extra time."
    ),
    "syscohada": (
        "Le SYSCOHADA est le système comptable des pays de l'OHADA. Il définit le plan "
        "comptable que les entreprises doivent utiliser pour tenir leur comptabilité et "
        "présenter leurs états financiers annuels."
    ),
    "python": (
        "Python lists are mutable sequences. Use append to add an item, and a list "
        "comprehension to build a new list from an iterable in a single expression."
    ),
}

QUERIES = [
    ("Which mountain in Italy erupts often?", "volcano"),
    ("how long should dough rise", "bread"),
    ("plan comptable des entreprises", "syscohada"),
    ("who won the soccer championship match", "football"),
    ("how do I add an element to a list in Python", "python"),
]


@pytest.fixture
def real_index(store: Any, minilm: SentenceTransformerEmbedder) -> SemanticIndex:
    return SemanticIndex(store=store, embedder=minilm)


@pytest.fixture
def RealSession(engine: Any, real_index: SemanticIndex) -> Any:
    Base.metadata.create_all(engine)
    factory = sessionmaker(engine, expire_on_commit=False)
    real_index.install(factory)
    yield factory
    real_index.uninstall(factory)


def test_embedder_reports_model_facts(minilm: SentenceTransformerEmbedder) -> None:
    assert minilm.name == "sentence-transformers/all-MiniLM-L6-v2"
    assert minilm.dimension == 384
    assert minilm.max_seq_length == 256
    vectors = minilm.encode(["one", "two", "three"])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    counts = minilm.count_tokens(["hello world", "word " * 400])
    assert counts is not None and counts[0] == 4 and counts[1] > 256


def test_search_by_meaning_finds_the_right_row_and_passage(
    RealSession: sessionmaker[OrmSession],
) -> None:
    with RealSession() as s:
        s.add_all(Article(title=k, content=v) for k, v in CORPUS.items())
        s.commit()
        for query, expected in QUERIES:
            hits = Article.semantic_search(s, query, limit=3)
            assert hits[0].obj.title == expected, (query, [h.obj.title for h in hits])
            text = CORPUS[expected]
            chunk = hits[0].chunk
            assert text[chunk.start_offset : chunk.end_offset] == chunk.text
            assert 0 < hits[0].score <= 1.0
        etna = Article.semantic_search(s, "Mount Etna lava flows in Sicily", limit=1)[0]
        assert "Etna" in etna.chunk.text and etna.chunk.start_offset > 0


def test_chunks_longer_than_the_model_window_warn_with_both_numbers(
    installed: Any, store: Any, minilm: SentenceTransformerEmbedder
) -> None:
    _, factory = installed(embedder=minilm)
    text = " ".join(["The committee reviewed the annual budget report."] * 50)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with factory() as s:
            s.add(Wide(body=text))
            s.commit()
            s.add(Wide(body=text))
            s.commit()
    found = [w for w in caught if issubclass(w.category, ChunkTooLongWarning)]
    assert len(found) == 1  # once per column
    message = str(found[0].message)
    assert (
        "Wide.body" in message and "chunk_size=3000" in message and "at most 256 tokens" in message
    )


def test_switching_models_on_an_existing_collection_is_refused(
    RealSession: sessionmaker[OrmSession], engine: Any, store: Any
) -> None:
    with RealSession() as s:
        s.add(Article(title="t", content=CORPUS["bread"]))
        s.commit()
    assert settled(engine) == []
    if hasattr(store, "_known"):
        store._known.clear()  # as a new process would see it
    other = SemanticIndex(store=store, embedder=HashEmbedder(dimension=64, name="hash-64"))
    factory = sessionmaker(engine)
    other.install(factory)
    with factory() as s:
        s.add(Article(title="u", content="more text"))
        s.commit()  # the commit stands; the sync is refused
    with engine.connect() as conn:
        (error,) = conn.execute(select(outbox.outbox.c.last_error)).scalars()
    assert error.startswith("EmbeddingDriftError")  # a CollectionMismatchError
    assert "model: 'sentence-transformers/all-MiniLM-L6-v2' -> 'hash-64'" in error
    assert "dimension: 384 -> 64" in error and "--rebuild" in error
    with factory() as s:
        with pytest.raises(CollectionMismatchError):
            Article.semantic_search(s, "bread")
    other.uninstall(factory)


def test_overlong_chunks_are_split_at_token_boundaries_not_truncated(
    installed: Any, store: Any, minilm: SentenceTransformerEmbedder
) -> None:
    _, factory = installed(embedder=minilm)
    text = " ".join(["The committee reviewed the annual budget report in detail."] * 60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ChunkTooLongWarning)
        with factory() as s:
            row = Wide(body=text)
            s.add(row)
            s.commit()
            pk = row.id
    payloads = sorted(
        (dict(p.payload) for p in store.points("wide__body")), key=lambda p: p["chunk_index"]
    )
    assert len(payloads) > 1  # 3,000 characters do not fit 254 tokens
    covered = 0
    for p in payloads:
        piece = text[p["start_offset"] : p["end_offset"]]
        assert len(minilm.token_spans(piece)) <= 254
        assert p["pk"] == str(pk) and p["total_chunks"] == len(payloads)
        covered = max(covered, p["end_offset"])
    assert covered == len(text)  # nothing past the window was dropped


CHINESE = {
    "长城": "长城是中国古代的军事防御工程，东起山海关，西至嘉峪关，全长两万多公里。",
    "熊猫": "大熊猫生活在四川的山林里，主要以竹子为食，是中国的国宝。",
    "茶": "中国是茶的故乡，绿茶、红茶和乌龙茶都起源于中国南方的山区。",
}


def test_the_model_coverage_of_a_query_decides_how_much_dense_counts(
    RealSession: sessionmaker[OrmSession], minilm: SentenceTransformerEmbedder
) -> None:
    assert minilm.coverage("Which mountain in Italy erupts often?") > 0.9
    assert minilm.coverage("大熊猫吃什么") < 0.1  # BERT's English vocabulary: single characters
    wide = "ｌｏｎｄｏｎ ｃａｌｌｉｎｇ"  # full-width: [UNK] until NFKC folds it (the default)
    assert minilm.coverage(wide) == 0.0 and minilm.coverage(Normalizer()(wide)) > 0.9
    with RealSession() as s:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            s.add_all(Article(title=k, content=v) for k, v in CHINESE.items())
            s.commit()
            s.add(Article(title="长城2", content="长城很长。" * 3))
            s.commit()
        coverage = [w for w in caught if issubclass(w.category, ModelCoverageWarning)]
        assert len(coverage) == 1  # once per column, naming it and the model
        assert "Article.content" in str(coverage[0].message)
        assert "all-MiniLM-L6-v2" in str(coverage[0].message)
        # a model that cannot read the query: hybrid ranks as keyword search does, and what
        # only the dense half found comes after, with a score near 0
        for query in ("大熊猫吃竹子", "绿茶起源于哪里", "长城有多长"):
            hybrid = Article.semantic_search(s, query, limit=4, group_by="chunk")
            keyword = Article.semantic_search(s, query, limit=4, group_by="chunk", mode="keyword")
            assert keyword and len(hybrid) == 4
            assert [h.obj.title for h in hybrid[: len(keyword)]] == [h.obj.title for h in keyword]
            for fused, alone in zip(hybrid, keyword, strict=False):
                assert fused.score == pytest.approx(alone.score, abs=0.01)
            assert all(h.score < 0.01 for h in hybrid[len(keyword) :])
        assert Article.semantic_search(s, "大熊猫吃竹子", limit=1)[0].obj.title == "熊猫"
