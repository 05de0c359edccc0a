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
