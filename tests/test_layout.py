"""The shape of the package: no private name crosses a module boundary.

(The import layers and the absence of cycles are checked by import-linter, from the contracts in
pyproject.toml, when ``make test`` runs ``lint-imports``.)
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "semantic_orm"


def _imports(path: Path) -> list[tuple[int, str, str]]:
    tree = ast.parse(path.read_text("utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            node.level or (node.module or "").startswith("semantic_orm")
        ):
            for alias in node.names:
                found.append((node.lineno, node.module or "", alias.name))
    return found


def test_no_private_name_is_imported_across_modules() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {name} from {module or '.'}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, module, name in _imports(path)
        if name.startswith("_") and not name.startswith("__")
    ]
    assert offenders == []


def test_every_module_says_what_it_is_for() -> None:
    missing = [
        str(path.relative_to(PACKAGE.parent))
        for path in sorted(PACKAGE.rglob("*.py"))
        if ast.get_docstring(ast.parse(path.read_text("utf-8"))) is None
    ]
    assert missing == []
