"""The demo that `make demo` runs: real model, SQLite, Qdrant Edge."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_knowledge_base_demo_prints_ranked_highlighted_hits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    sys.modules.pop("examples.knowledge_base", None)
    from examples.knowledge_base import main

    assert (
        main(
            [
                "--data",
                str(tmp_path / "demo"),
                "plan comptable des entreprises",
                "who scored in the football final",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert re.search(r"Saved 5 articles, \d+ chunks indexed", out)
    blocks = out.split("? ")[1:]
    assert len(blocks) == 2
    first_hits = [re.search(r"1\. [0-9.]+  (.+?)  \[", b).group(1) for b in blocks]  # type: ignore[union-attr]
    assert first_hits == ["Introduction au SYSCOHADA", "The 1998 World Cup"]
    assert "[[" in blocks[0] and "]]" in blocks[0]  # the matched passage is marked
    assert "plan comptable" in blocks[0].split("[[", 1)[1].split("]]", 1)[0]


def test_readme_in_your_app_snippet_runs_as_printed(tmp_path: Path) -> None:
    """The README's first Python block, run verbatim in a fresh directory and interpreter."""
    import os
    import subprocess

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## In your app", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "Introduction au SYSCOHADA" in lines[0]
    assert "**" in run.stdout and "plan comptable des entreprises" in run.stdout
    assert (tmp_path / "app.sqlite3").exists() and (tmp_path / "vectors").is_dir()
