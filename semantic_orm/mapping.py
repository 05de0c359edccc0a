"""Finding ``SemanticText`` columns on mapped classes, and naming rows in the vector store.

:func:`semantic_columns` inspects a mapper once and caches what it finds; handled columns are
marked in ``Column.info["semantic_orm"]``. A row is named in vector payloads by :func:`row_key`,
the JSON text of its primary key (``"42"``, ``'"a-slug"'``, ``'[1, "en"]'`` for a composite
key), which :func:`key_values` turns back into values for a SQL ``IN``.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column
from sqlalchemy.orm import Mapper
from sqlalchemy.sql.elements import ColumnElement

from .column import SemanticText

__all__ = ["SemanticColumn", "key_values", "row_key", "semantic_columns"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True, eq=False)
class SemanticColumn:
    """One ``SemanticText`` attribute of a mapped class."""

    mapper: Mapper[Any]
    key: str
    column: Column[Any]
    settings: SemanticText

    @property
    def model(self) -> type[Any]:
        """The mapped class."""
        return self.mapper.class_

    @property
    def table(self) -> str:
        """The table's name (with its schema, if any)."""
        table = self.column.table
        schema = getattr(table, "schema", None)
        return f"{schema}.{table.name}" if schema else str(table.name)

    @property
    def label(self) -> str:
        """``Model.attribute``, for messages."""
        return f"{self.model.__name__}.{self.key}"

    def collection(self, prefix: str = "") -> str:
        """The vector collection: ``SemanticText(collection=...)`` or ``<table>__<column>``."""
        name = self.settings.collection or f"{self.table}__{self.column.name}"
        return prefix + _UNSAFE.sub("_", name)


_cache: dict[Mapper[Any], tuple[SemanticColumn, ...]] = {}
_cache_lock = threading.Lock()


def semantic_columns(mapper: Mapper[Any]) -> tuple[SemanticColumn, ...]:
    """The ``SemanticText`` attributes of ``mapper``'s class, in declaration order (cached)."""
    found = _cache.get(mapper)
    if found is not None:
        return found
    columns: list[SemanticColumn] = []
    for prop in mapper.column_attrs:
        for col in prop.columns:
            if isinstance(col, Column) and isinstance(col.type, SemanticText):
                col.info["semantic_orm"] = True
                columns.append(SemanticColumn(mapper, prop.key, col, col.type))
    result = tuple(columns)
    if mapper.configured:
        with _cache_lock:
            _cache[mapper] = result
    return result


def row_key(identity: Sequence[Any]) -> str:
    """Stable text naming a row by its primary key values."""
    values = list(identity)
    return json.dumps(values[0] if len(values) == 1 else values, default=str, ensure_ascii=False)


def key_values(mapper: Mapper[Any], key: str) -> tuple[Any, ...]:
    """Primary key values for a :func:`row_key`, coerced to the columns' Python types."""
    raw = json.loads(key)
    values = raw if len(mapper.primary_key) > 1 else [raw]
    out = []
    for col, value in zip(mapper.primary_key, values, strict=True):
        try:
            python_type = col.type.python_type
        except NotImplementedError:
            python_type = None
        if python_type is not None and value is not None and not isinstance(value, python_type):
            try:
                value = python_type(value)
            except (TypeError, ValueError):
                pass
        out.append(value)
    return tuple(out)


def pk_in(mapper: Mapper[Any], keys: Sequence[str]) -> ColumnElement[bool]:
    """A SQL criterion selecting the rows named by ``keys``."""
    from sqlalchemy import tuple_

    pk = mapper.primary_key
    values = [key_values(mapper, k) for k in keys]
    if len(pk) == 1:
        return pk[0].in_([v[0] for v in values])
    return tuple_(*pk).in_(values)
