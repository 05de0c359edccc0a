"""A Flask application whose Flask-SQLAlchemy models are searchable by meaning.

    flask --app examples.flask_app.app run       # or: gunicorn examples.flask_app.app:app

    curl -X POST localhost:5000/articles -H 'content-type: application/json' \\
         -d '{"title": "Sourdough", "body": "A starter is a culture of wild yeast..."}'
    curl 'localhost:5000/search?q=bread+that+rises+overnight'

The model is an ordinary ``db.Model`` with a ``SemanticText`` column; the index is installed on
``db.session`` (a ``scoped_session``), so every commit of the application syncs, in the request
that commits (inline). Configuration from the environment: ``DATABASE_URL`` (default
``sqlite:///<instance>/flask.sqlite3``), ``QDRANT_URL`` for a Qdrant server (several processes,
``gunicorn -w 4``), else Qdrant Edge under ``SEMANTIC_ORM_PATH`` (one process: ``gunicorn -w 1
--threads 8``).
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, abort, jsonify, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from semantic_orm import (
    EdgeStore,
    QdrantClientStore,
    SemanticIndex,
    SemanticSearchMixin,
    SemanticText,
)


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Article(SemanticSearchMixin, db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "article"

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(200))
    body: Mapped[str | None] = mapped_column(SemanticText())


store = (
    QdrantClientStore(url=os.environ["QDRANT_URL"])
    if os.environ.get("QDRANT_URL")
    else EdgeStore(os.environ.get("SEMANTIC_ORM_PATH", ".semantic_orm"))
)
index = SemanticIndex(store=store)  # all-MiniLM-L6-v2, loaded on first use
index.install(db.session)


def _out(article: Article) -> dict[str, Any]:
    return {"id": article.id, "title": article.title, "body": article.body}


def create_app() -> Flask:
    """The application: tables created, routes for articles and search."""
    app = Flask(__name__)
    default = f"sqlite:///{os.path.join(app.instance_path, 'flask.sqlite3')}"
    app.config["SQLALCHEMY_DATABASE_URI"] = os.environ.get("DATABASE_URL", default)
    os.makedirs(app.instance_path, exist_ok=True)
    db.init_app(app)
    with app.app_context():
        db.create_all()
        index.verify()

    @app.get("/health")
    def health() -> Any:
        return {"status": "ok"}

    @app.post("/articles")
    def create() -> Any:
        data = request.get_json()
        article = Article(title=data["title"], body=data.get("body"))
        db.session.add(article)
        db.session.commit()  # chunk, embed and sync, right after the commit
        return jsonify(_out(article)), 201

    @app.put("/articles/<int:article_id>")
    def update(article_id: int) -> Any:
        article = db.session.get(Article, article_id) or abort(404)
        data = request.get_json()
        article.title, article.body = data["title"], data.get("body")
        db.session.commit()
        return jsonify(_out(article))

    @app.delete("/articles/<int:article_id>")
    def delete(article_id: int) -> Any:
        article = db.session.get(Article, article_id) or abort(404)
        db.session.delete(article)
        db.session.commit()
        return "", 204

    @app.get("/search")
    def search() -> Any:
        query = request.args.get("q", "")
        if not query.strip():
            abort(400, "q is required")
        limit = min(int(request.args.get("limit", 5)), 50)
        hits = Article.semantic_search(db.session, query, limit=limit)
        return jsonify(
            [
                {
                    "id": h.obj.id,
                    "title": h.obj.title,
                    "score": h.score,
                    "scores": dict(h.scores),
                    "passage": h.highlight("**", "**", context=60),
                    "start": h.chunk.start_offset,
                    "end": h.chunk.end_offset,
                }
                for h in hits
            ]
        )

    return app


app = create_app()
