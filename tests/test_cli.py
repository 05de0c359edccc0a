"""The ``semantic-orm`` command, run in-process against a small application module.

``tests/cli_app.py`` reads its database URL and vector directory from the environment, as a real
deployment does. SQLite and PostgreSQL, the fake embedder.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from semantic_orm.cli import main as cli_main

from .helpers import WORDS, doc_text
from .models import Article, Base


@pytest.fixture
def tables(engine: Engine) -> Engine:
    Base.metadata.create_all(engine)
    return engine


def test_cli_status_reindex_and_worker(
    tables: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    import importlib

    monkeypatch.setenv("SEMANTIC_ORM_TEST_DB", tables.url.render_as_string(hide_password=False))
    monkeypatch.setenv("SEMANTIC_ORM_TEST_VECTORS", str(tmp_path / "cli-vectors"))
    sys.modules.pop("tests.cli_app", None)
    app = importlib.import_module("tests.cli_app")
    with app.Session() as s:
        s.add_all(Article(title=f"t{i}", content=f"row {i}") for i in range(4))
        s.commit()  # deferred: jobs wait for the worker
    assert cli_main(["status", "tests.cli_app:index", "--json"]) == 0
    (row,) = [r for r in json.loads(capsys.readouterr().out) if r["column"] == "Article.content"]
    assert row["column"] == "Article.content" and row["pending_jobs"] == 4
    assert row["indexed_rows"] == 0 and row["oldest_pending_age_s"] >= 0
    assert cli_main(["worker", "tests.cli_app:index", "--once", "--poll", "0.01"]) == 0
    assert "4 jobs done" in capsys.readouterr().err
    assert cli_main(["reindex", "tests.cli_app:index", "tests.models:Article", "--all"]) == 0
    assert "queued and processed 4 rows of Article" in capsys.readouterr().out
    assert cli_main(["status", "tests.cli_app:index"]) == 0
    table = capsys.readouterr().out
    assert "Article.content" in table and " 4 " in table
    assert cli_main(["status", "tests.cli_app"]) == 2  # not module:attribute
    assert "expected module:attribute" in capsys.readouterr().err
    assert cli_main(["status", "tests.cli_app:Session"]) == 2
    assert "not a SemanticIndex" in capsys.readouterr().err
    app.index.close()
    app.engine.dispose()


def test_cli_rebuild_and_gc(
    engine: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    import importlib
    import sys

    from semantic_orm.cli import main as cli_main
    from tests.models import Article, Base

    monkeypatch.setenv("SEMANTIC_ORM_TEST_DB", engine.url.render_as_string(hide_password=False))
    monkeypatch.setenv("SEMANTIC_ORM_TEST_VECTORS", str(tmp_path / "cli-vectors"))
    Base.metadata.create_all(engine)
    sys.modules.pop("tests.cli_app", None)
    app = importlib.import_module("tests.cli_app")
    try:
        with app.Session() as s:
            s.add_all(Article(id=i, title=f"t{i}", content=doc_text(i)) for i in range(5))
            s.commit()
        assert cli_main(["worker", "tests.cli_app:index", "--once", "--poll", "0.01"]) == 0
        capsys.readouterr()
        argv = ["reindex", "tests.cli_app:index", "tests.models:Article", "--rebuild"]
        assert cli_main([*argv, "--no-switch"]) == 0
        out = capsys.readouterr().out
        assert "Article.content: rebuilt 5 rows" in out and "not switched yet" in out
        assert cli_main(["gc", "tests.cli_app:index", "--dry-run"]) == 0
        assert "no orphan collections" in capsys.readouterr().out  # a resumable rebuild is kept
        assert cli_main(argv) == 0
        out = capsys.readouterr().out
        assert "0 chunks embedded" in out and "switched 'article__content'" in out
        assert cli_main(["status", "tests.cli_app:index", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        (row,) = [r for r in rows if r["column"] == "Article.content"]
        assert row["drift"] == {} and row["indexed_rows"] == 5 and row["pending_jobs"] == 0
        with app.Session() as s:
            hits = Article.semantic_search(s, WORDS[2], limit=1, mode="keyword")
            assert [h.obj.id for h in hits] == [2]
    finally:
        app.index.close()
        app.engine.dispose()
