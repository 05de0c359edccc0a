"""Models shared by the ORM tests."""

from __future__ import annotations

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from semantic_orm import SemanticSearchMixin, SemanticText


class Base(DeclarativeBase):
    pass


class Article(SemanticSearchMixin, Base):
    __tablename__ = "article"

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(200))
    lang: Mapped[str] = mapped_column(String(8), default="en")
    content: Mapped[str | None] = mapped_column(SemanticText(chunk_size=200, overlap=40))


class Note(SemanticSearchMixin, Base):
    """Two semantic columns and a string primary key."""

    __tablename__ = "note"

    slug: Mapped[str] = mapped_column(String(50), primary_key=True)
    summary: Mapped[str | None] = mapped_column(SemanticText(chunk_size=100, overlap=0))
    body: Mapped[str | None] = mapped_column(SemanticText(chunk_size=300, overlap=50))


class Translation(SemanticSearchMixin, Base):
    """A composite primary key."""

    __tablename__ = "translation"

    article_id: Mapped[int] = mapped_column(ForeignKey("article.id"), primary_key=True)
    lang: Mapped[str] = mapped_column(String(8), primary_key=True)
    text: Mapped[str | None] = mapped_column(SemanticText(chunk_size=150, overlap=30))


class Plain(Base):
    """No semantic column: saves must not touch the index."""

    __tablename__ = "plain"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(50))


class Wide(Base):
    """Chunks far larger than all-MiniLM-L6-v2's 256-token window."""

    __tablename__ = "wide"

    id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[str | None] = mapped_column(SemanticText(chunk_size=3000, overlap=0))


class Comment(SemanticSearchMixin, Base):
    """A child row whose database-level cascades no flush event sees."""

    __tablename__ = "comment"

    id: Mapped[int] = mapped_column(primary_key=True)
    article_id: Mapped[int] = mapped_column(
        ForeignKey("article.id", ondelete="CASCADE", onupdate="CASCADE")
    )
    body: Mapped[str | None] = mapped_column(SemanticText(chunk_size=120, overlap=20))
