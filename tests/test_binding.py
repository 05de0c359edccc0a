"""Column bindings: one column as an index resolves it, cached by value, checked for drift.

The collision check (two columns on one collection) runs on SQLite and PostgreSQL and both store
adapters; the rest needs no database.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from semantic_orm import (
    ConfigurationError,
    SemanticIndex,
    SemanticText,
)
from semantic_orm.binding import drift
from semantic_orm.testing import HashEmbedder, MemoryStore


def test_two_tables_on_one_collection_are_refused(installed: Any) -> None:
    class Other(DeclarativeBase):
        pass

    class First(Other):
        __tablename__ = "first_table"
        id: Mapped[int] = mapped_column(primary_key=True)
        body: Mapped[str | None] = mapped_column(SemanticText(collection="shared"))

    class Second(Other):
        __tablename__ = "second_table"
        id: Mapped[int] = mapped_column(primary_key=True)
        body: Mapped[str | None] = mapped_column(SemanticText(collection="shared"))

    _idx, factory = installed()
    Other.metadata.create_all(factory.kw["bind"])
    with factory() as s:
        s.add(First(id=1, body="first"))
        s.commit()
        s.add(Second(id=1, body="second"))
        with pytest.raises(ConfigurationError, match="both use the vector collection 'shared'"):
            s.commit()


def _doc(chunk_size: int, model: str | None = None, **settings: Any) -> Any:
    """The same table and column, declared anew (as a new version of the app would)."""

    class B(DeclarativeBase):
        pass

    class Doc(B):
        __tablename__ = "doc"
        id: Mapped[int] = mapped_column(primary_key=True)
        body: Mapped[str | None] = mapped_column(
            SemanticText(chunk_size=chunk_size, overlap=0, model=model, **settings)
        )

    return Doc


def _column(model: Any) -> Any:
    from semantic_orm.mapping import semantic_columns

    (col,) = semantic_columns(sa.inspect(model))
    return col


def test_a_binding_is_resolved_once_per_declaration() -> None:
    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder(), collection_prefix="app_")
    first = idx.binding_for(_column(_doc(200)))
    assert idx.binding_for(_column(_doc(200))) is first  # declared alike: the same binding
    other = idx.binding_for(_column(_doc(120)))
    assert other is not first and other.fingerprint != first.fingerprint
    assert first.collection == first.target == "app_doc__body"
    assert first.spec.metadata["chunker"]["chunk_size"] == 200
    build = first.retarget("app_doc__body__rebuild")
    assert build.target == "app_doc__body__rebuild" and build.collection == first.collection
    assert build.spec.name == "app_doc__body__rebuild" and build.fingerprint == first.fingerprint


def test_columns_naming_a_model_get_its_embedder() -> None:
    named = HashEmbedder(dimension=16, name="tiny")
    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder(), embedders={"tiny": named})
    assert idx.binding_for(_column(_doc(200, model="tiny"))).embedder is named
    assert idx.binding_for(_column(_doc(200))).embedder is idx.embedder


def test_drift_names_each_change_and_search_only_passes_chunking_drift() -> None:
    from semantic_orm import EmbeddingDriftError

    store = MemoryStore()
    old = SemanticIndex(store=store, embedder=HashEmbedder())
    old.bindings.check(old.binding_for(_column(_doc(200))))
    new = SemanticIndex(store=store, embedder=HashEmbedder())
    chunking = new.binding_for(_column(_doc(120)))
    with pytest.raises(EmbeddingDriftError) as info:
        new.bindings.check(chunking)
    assert info.value.changes == {"chunker.chunk_size": (200, 120)}
    assert "--rebuild" in str(info.value)
    new.bindings.check(chunking, for_search=True)  # same model: searches still answer
    assert new.bindings.drift_of(chunking) == {"chunker.chunk_size": (200, 120)}
    other_model = SemanticIndex(store=store, embedder=HashEmbedder(dimension=32, name="h32"))
    with pytest.raises(EmbeddingDriftError, match="dimension: 64 -> 32"):
        other_model.bindings.check(other_model.binding_for(_column(_doc(200))), for_search=True)


def test_normalisation_and_keyword_language_are_recorded_and_only_normalisation_is_drift(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from semantic_orm import EmbeddingDriftError, binding
    from semantic_orm.binding import keywords_drift
    from semantic_orm.keywords import KEYWORDS_VERSION

    store = MemoryStore()
    old = SemanticIndex(store=store, embedder=HashEmbedder())
    first = old.binding_for(_column(_doc(200)))
    old.bindings.check(first)
    recorded = store.collection_info(first.collection)
    assert recorded is not None
    assert recorded["normalize"] == ["nfkc"] and recorded["keywords"] == str(KEYWORDS_VERSION)
    assert recorded["fusion"] == {"rule": "score", "dense_weight": 0.4, "coverage_power": 2.0}
    new = SemanticIndex(store=store, embedder=HashEmbedder())
    changed = new.binding_for(_column(_doc(200, normalize=("nfkc", "lower"), language="de")))
    assert changed.fingerprint != first.fingerprint  # other text reaches the model
    with pytest.raises(EmbeddingDriftError) as info:
        new.bindings.check(changed)
    assert info.value.changes == {"normalize": (["nfkc"], ["nfkc", "lower"])}
    # another language changes keyword vectors only: not drift, a refresh
    version = str(KEYWORDS_VERSION)
    assert keywords_drift(recorded, changed.spec) == (version, f"{version}:german")
    german = SemanticIndex(store=store, embedder=HashEmbedder())
    stemmed = german.binding_for(_column(_doc(200, language="de")))
    assert stemmed.fingerprint == first.fingerprint  # the same dense vectors
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="semantic_orm"):
        german.bindings.check(stemmed)  # writes go on
        monkeypatch.setattr(binding, "RECHECK", 0.0)  # looked at again: warned once
        german.bindings.check(stemmed)
    warned = [r.getMessage() for r in caplog.records if "keyword vectors" in r.getMessage()]
    assert len(warned) == 1 and "--all (embeds nothing)" in warned[0], warned
    assert german.bindings.stale_keywords(stemmed) == (version, f"{version}:german")
    assert german.bindings.drift_of(stemmed) == {}
    # a collection recorded before these settings existed is not compared on them
    legacy = {k: v for k, v in recorded.items() if k not in ("normalize", "keywords")}
    assert drift(legacy, changed.spec) == {} and keywords_drift(legacy, changed.spec) is None


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"normalize": ("nfkc", "upper")}, "unknown step"),
        ({"normalize": ("nfkc", "nfkc")}, "repeats"),
        ({"normalize": 3}, "step names"),
        ({"language": "klingon"}, "no stemmer for 'klingon'"),
        ({"language": 7}, "language name or code"),
    ],
)
def test_bad_text_settings_are_refused_at_declaration(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        SemanticText(**settings)
