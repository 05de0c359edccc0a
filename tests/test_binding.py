"""Column bindings: one column as an index resolves it, cached by value, checked for drift.

The collision check (two columns on one collection) runs on SQLite and PostgreSQL and both store
adapters; the rest needs no database.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from semantic_orm import (
    ConfigurationError,
    SemanticIndex,
    SemanticText,
)
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


def _doc(chunk_size: int, model: str | None = None) -> Any:
    """The same table and column, declared anew (as a new version of the app would)."""

    class B(DeclarativeBase):
        pass

    class Doc(B):
        __tablename__ = "doc"
        id: Mapped[int] = mapped_column(primary_key=True)
        body: Mapped[str | None] = mapped_column(
            SemanticText(chunk_size=chunk_size, overlap=0, model=model)
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
