"""A FastAPI service that searches its articles by meaning (async SQLAlchemy + semantic_orm).

    uvicorn examples.fastapi_app.app:app --port 8000

    curl -X POST localhost:8000/articles -H 'content-type: application/json' \\
         -d '{"title": "Photosynthesis", "body": "Plants turn light into sugar..."}'
    curl 'localhost:8000/search?q=how+do+plants+make+food'

Configuration comes from the environment:

* ``DATABASE_URL``: an async URL, ``sqlite+aiosqlite:///./var/fastapi.sqlite3`` by default
  (``postgresql+asyncpg://user:pw@host/db`` in production);
* ``QDRANT_URL``: a Qdrant server, for several worker processes (``uvicorn --workers 4``, several
  hosts); without it the vectors live in Qdrant Edge under ``SEMANTIC_ORM_PATH``
  (``./.semantic_orm``), which one process owns: run uvicorn with one worker.

Commits sync inline, as a task on the event loop (SQL awaited, the model in a worker thread), so
a request never waits for embedding and the loop never stalls; the worker task the lifespan
starts retries whatever failed (the store was down...). Search is ``await
Article.asemantic_search(session, q)``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query
from pydantic import BaseModel
from sqlalchemy import String
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from semantic_orm import (
    AsyncWorker,
    EdgeStore,
    QdrantClientStore,
    SemanticIndex,
    SemanticSearchMixin,
    SemanticText,
)


class Base(DeclarativeBase):
    pass


class Article(SemanticSearchMixin, Base):
    __tablename__ = "article"

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(200))
    body: Mapped[str | None] = mapped_column(SemanticText())


if not os.environ.get("DATABASE_URL"):
    os.makedirs("var", exist_ok=True)  # the default database's folder (a fresh checkout has none)
engine = create_async_engine(
    os.environ.get("DATABASE_URL") or "sqlite+aiosqlite:///./var/fastapi.sqlite3"
)
Session = async_sessionmaker(engine, expire_on_commit=False)
store = (
    QdrantClientStore(url=os.environ["QDRANT_URL"])
    if os.environ.get("QDRANT_URL")
    else EdgeStore(os.environ.get("SEMANTIC_ORM_PATH", ".semantic_orm"))
)
index = SemanticIndex(store=store)  # all-MiniLM-L6-v2, loaded on first use
index.install(Session)
worker = AsyncWorker(index, engine)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Create the tables, check the index against the declared columns, run the worker."""
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    await asyncio.to_thread(index.verify)  # a drifted collection stops the start-up
    worker.start()
    yield
    await worker.stop()
    await engine.dispose()
    index.close()


app = FastAPI(title="semantic_orm on FastAPI", lifespan=lifespan)


async def session() -> AsyncIterator[AsyncSession]:
    """One session per request."""
    async with Session() as s:
        yield s


Db = Annotated[AsyncSession, Depends(session)]


class ArticleIn(BaseModel):
    title: str
    body: str | None = None


class ArticleOut(BaseModel):
    id: int
    title: str
    body: str | None


class Hit(BaseModel):
    id: int
    title: str
    score: float
    scores: dict[str, float]
    passage: str
    """The matched passage, marked with ``**`` in its context."""
    start: int
    end: int


def _out(article: Article) -> ArticleOut:
    return ArticleOut(id=article.id, title=article.title, body=article.body)


@app.get("/health")
async def health() -> dict[str, str]:
    """Liveness."""
    return {"status": "ok"}


@app.post("/articles", status_code=201)
async def create(data: ArticleIn, db: Db) -> ArticleOut:
    """Save an article; it is searchable once its sync (started by the commit) has run."""
    article = Article(title=data.title, body=data.body)
    db.add(article)
    await db.commit()
    return _out(article)


@app.put("/articles/{article_id}")
async def update(article_id: int, data: ArticleIn, db: Db) -> ArticleOut:
    """Replace an article's title and body (only changed chunks are embedded again)."""
    article = await db.get(Article, article_id)
    if article is None:
        raise HTTPException(404, "no such article")
    article.title, article.body = data.title, data.body
    await db.commit()
    return _out(article)


@app.delete("/articles/{article_id}", status_code=204)
async def delete(article_id: int, db: Db) -> None:
    """Delete an article (its vectors go with it)."""
    article = await db.get(Article, article_id)
    if article is None:
        raise HTTPException(404, "no such article")
    await db.delete(article)
    await db.commit()


@app.get("/search")
async def search(
    db: Db, q: Annotated[str, Query(min_length=1)], limit: Annotated[int, Query(ge=1, le=50)] = 5
) -> list[Hit]:
    """The articles that match ``q`` by meaning, best first, with the passage that matched."""
    hits: list[Any] = await Article.asemantic_search(db, q, limit=limit)
    return [
        Hit(
            id=h.obj.id,
            title=h.obj.title,
            score=h.score,
            scores=dict(h.scores),
            passage=h.highlight("**", "**", context=60),
            start=h.chunk.start_offset,
            end=h.chunk.end_offset,
        )
        for h in hits
    ]
