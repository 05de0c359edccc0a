"""The SemanticText type: settings, validation at declaration, repr, and value checks."""

from __future__ import annotations

import pytest
from sqlalchemy import Text

from semantic_orm import ConfigurationError, SemanticText, SemanticTypeError, SemanticValueError
from semantic_orm.column import check_semantic_value


def test_is_text_in_sql_and_cacheable() -> None:
    t = SemanticText()
    assert isinstance(t.impl, Text)
    assert SemanticText.cache_ok is True
    assert t.chunker == "hybrid" and t.chunk_size == 900 and t.overlap == 180


def test_repr_keeps_non_default_settings() -> None:
    assert repr(SemanticText()) == "SemanticText()"
    t = SemanticText(chunk_size=500, overlap=50, model="BAAI/bge-m3", collection="kb")
    assert repr(t) == (
        "SemanticText(chunk_size=500, overlap=50, model='BAAI/bge-m3', collection='kb')"
    )
    assert repr(eval(repr(t), {"SemanticText": SemanticText})) == repr(t)
    assert repr(t.copy()) == repr(t)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"chunk_size": 0}, "chunk_size"),
        ({"chunk_size": 100, "overlap": 100}, "overlap"),
        ({"overlap": -1}, "overlap"),
        ({"chunker": "nope"}, "nope"),
    ],
)
def test_invalid_settings_fail_at_declaration(kwargs: dict[str, object], pattern: str) -> None:
    with pytest.raises(ConfigurationError, match=pattern):
        SemanticText(**kwargs)  # type: ignore[arg-type]


def test_chunker_objects_are_named_not_passed() -> None:
    from semantic_orm import RecursiveChunker

    with pytest.raises(ConfigurationError, match="register_chunker"):
        SemanticText(chunker=RecursiveChunker())  # type: ignore[arg-type]


def test_value_checks() -> None:
    assert check_semantic_value("ok é 👍", where="M.c") == "ok é 👍"
    with pytest.raises(SemanticTypeError, match=r"M\.c must be a str or None, got bytes"):
        check_semantic_value(b"x", where="M.c")
    with pytest.raises(SemanticValueError, match="NUL character at index 1"):
        check_semantic_value("a\x00", where="M.c")
    with pytest.raises(SemanticValueError, match="lone surrogate"):
        check_semantic_value("a\udc80", where="M.c")
    assert isinstance(SemanticValueError("x"), ValueError)
    assert isinstance(SemanticTypeError("x"), TypeError)


def test_bind_param_refuses_non_strings_outside_the_orm() -> None:
    t = SemanticText()
    assert t.process_bind_param("text", None) == "text"  # type: ignore[arg-type]
    assert t.process_bind_param(None, None) is None  # type: ignore[arg-type]
    with pytest.raises(SemanticTypeError):
        t.process_bind_param(3, None)  # type: ignore[arg-type]
