"""The framework examples in their real servers, driven over HTTP; and a SQLModel model.

``examples/fastapi_app`` runs under uvicorn (async SQLAlchemy: aiosqlite, asyncpg) and
``examples/flask_app`` under gunicorn (Flask-SQLAlchemy: pysqlite, psycopg), each on a free
loopback port, with the real model and Qdrant Edge. Each test creates, searches, updates,
deletes and searches again, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Column, create_engine
from sqlalchemy.engine import URL
from sqlalchemy.orm import sessionmaker

from semantic_orm import SemanticIndex, SemanticText, semantic_search
from semantic_orm.testing import HashEmbedder, MemoryStore

from .helpers import async_url

ROOT = Path(__file__).resolve().parents[1]
ARTICLES = {
    "Photosynthesis": "Green plants turn sunlight, water and carbon dioxide into sugar and oxygen.",
    "Sourdough": "A sourdough starter is wild yeast; the dough rises slowly overnight.",
    "World Cup 1998": "France beat Brazil three goals to nil in the final at the Stade de France.",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _database(url: URL, driver: str, tmp: Path) -> str:
    if url.get_backend_name() == "sqlite":
        return f"{driver.split('+')[0]}+{driver.split('+')[1]}:///{tmp / 'app.sqlite3'}"
    return url.set(drivername=driver).render_as_string(hide_password=False)


@pytest.fixture
def server(request: pytest.FixtureRequest, db_url: URL, tmp_path: Path) -> Iterator[httpx.Client]:
    """The example named by the test's parameter, served on a free port until the test ends."""
    kind: str = request.param
    port = _free_port()
    env = {
        **os.environ,
        "SEMANTIC_ORM_PATH": str(tmp_path / "vectors"),
        "PYTHONPATH": str(ROOT),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    if kind == "fastapi":
        env["DATABASE_URL"] = _database(db_url, async_url(db_url).drivername, tmp_path)
        command = [sys.executable, "-m", "uvicorn", "examples.fastapi_app.app:app", "--host",
                   "127.0.0.1", "--port", str(port)]  # fmt: skip
    else:
        driver = (
            "sqlite+pysqlite" if db_url.get_backend_name() == "sqlite" else "postgresql+psycopg"
        )
        env["DATABASE_URL"] = _database(db_url, driver, tmp_path)
        command = [sys.executable, "-m", "gunicorn", "-w", "1", "--threads", "4", "-b",
                   f"127.0.0.1:{port}", "examples.flask_app.app:app"]  # fmt: skip
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError((tmp_path / "server.log").read_text())
            time.sleep(0.2)
        yield client
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _search_until(client: httpx.Client, query: str, check: Any, timeout: float = 90) -> list[Any]:
    """Search until ``check(hits)`` holds: the sync runs after the commit, off the request."""
    deadline = time.monotonic() + timeout
    while True:
        hits = client.get("/search", params={"q": query, "limit": 3}).json()
        if check(hits) or time.monotonic() > deadline:
            return hits
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("server", ["fastapi", "flask"], indirect=True)
def test_create_search_update_delete_over_http(server: httpx.Client) -> None:
    ids = {}
    for title, body in ARTICLES.items():
        made = server.post("/articles", json={"title": title, "body": body})
        assert made.status_code == 201
        ids[title] = made.json()["id"]
    # All three searchable (the sync may land one article at a time), then rank.
    hits = _search_until(server, "how do plants make sugar", lambda h: len(h) == len(ARTICLES))
    assert hits[0]["title"] == "Photosynthesis"
    assert "**" in hits[0]["passage"] and hits[0]["end"] > hits[0]["start"]
    assert "dense" in hits[0]["scores"]

    changed = "Teams of eleven play football; Zidane scored twice with his head in the final."
    updated = server.put(
        f"/articles/{ids['World Cup 1998']}", json={"title": "World Cup 1998", "body": changed}
    )
    assert updated.status_code == 200 and updated.json()["body"] == changed
    hits = _search_until(
        server, "Zidane headers", lambda h: bool(h) and "Zidane" in h[0]["passage"]
    )
    assert hits[0]["id"] == ids["World Cup 1998"] and "Zidane" in hits[0]["passage"]

    assert server.delete(f"/articles/{ids['Sourdough']}").status_code == 204
    hits = _search_until(
        server,
        "wild yeast dough rises overnight",
        lambda h: ids["Sourdough"] not in [x["id"] for x in h],
    )
    assert ids["Sourdough"] not in [h["id"] for h in hits]
    assert server.put("/articles/999999", json={"title": "x"}).status_code == 404


def test_sqlmodel_models_are_synced_and_searched(tmp_path: Path) -> None:
    from sqlmodel import Field, Session, SQLModel

    class Hero(SQLModel, table=True):
        id: int | None = Field(default=None, primary_key=True)
        name: str
        bio: str | None = Field(
            default=None, sa_column=Column(SemanticText(chunk_size=200, overlap=0))
        )

    engine = create_engine(f"sqlite:///{tmp_path / 'heroes.sqlite3'}")
    SQLModel.metadata.create_all(engine)
    idx = SemanticIndex(store=MemoryStore(), embedder=HashEmbedder())
    factory = sessionmaker(engine, class_=Session, expire_on_commit=False)
    idx.install(factory)
    try:
        with factory() as s:
            s.add(Hero(name="Deadpond", bio="Dives into the pond with a red suit and many jokes."))
            s.add(Hero(name="Rusty-Man", bio="Builds armor from rusty iron in a cave."))
            s.commit()
            hits = semantic_search(s, Hero, "iron armor cave", limit=1)
            assert hits[0].obj.name == "Rusty-Man" and "armor" in hits[0].chunk.text
            hero = hits[0].obj
            hero.bio = "Retired; now grows tomatoes."
            s.add(hero)
            s.commit()
            assert (
                semantic_search(s, Hero, "tomatoes", limit=1, mode="keyword")[0].obj.id == hero.id
            )
    finally:
        idx.uninstall(factory)
        engine.dispose()
