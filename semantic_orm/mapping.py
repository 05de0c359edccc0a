"""Finding ``SemanticText`` columns on mapped classes, and naming rows in the vector store.

:func:`semantic_columns` inspects a mapper once and caches what it finds; handled columns are
marked in ``Column.info["semantic_orm"]``. A row is named in vector payloads and outbox jobs by
:func:`row_key`, the JSON text of its primary key (``"42"``, ``'"a-slug"'``, ``'[1, "en"]'`` for
a composite key; :func:`instance_key` for a loaded instance), which :func:`key_values` turns back
into values for a SQL ``IN``.
:func:`iter_keys` pages through every key of a table in primary-key order (keyset pagination,
so memory stays bounded on any table size).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Select,
    Table,
    and_,
    bindparam,
    inspect,
    or_,
    select,
    tuple_,
)
from sqlalchemy.orm import Mapper
from sqlalchemy.orm.attributes import instance_state
from sqlalchemy.sql.elements import ColumnElement

from .column import SemanticText
from .forking import RenewedLock

__all__ = [
    "SemanticColumn",
    "all_mappers",
    "instance_key",
    "iter_keys",
    "iter_rows",
    "key_values",
    "pk_in",
    "row_key",
    "rows_page",
    "select_rows",
    "semantic_columns",
    "table_name",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def table_name(table: Any) -> str:
    """A table's name as jobs and collections record it: ``schema.table`` when it has one."""
    schema = getattr(table, "schema", None)
    return f"{schema}.{table.name}" if schema else str(table.name)


@dataclass(frozen=True, slots=True, eq=False)
class SemanticColumn:
    """One ``SemanticText`` attribute of a mapped class."""

    mapper: Mapper[Any]
    key: str
    column: Column[Any]
    settings: SemanticText

    @property
    def mapped_class(self) -> type[Any]:
        """The mapped class."""
        return self.mapper.class_

    @property
    def table(self) -> str:
        """The table's name (with its schema, if any)."""
        return table_name(self.column.table)

    @property
    def name(self) -> str:
        """The column's name in the database."""
        return str(self.column.name)

    @property
    def label(self) -> str:
        """``Model.attribute``, for messages."""
        return f"{self.mapped_class.__name__}.{self.key}"

    def collection(self, prefix: str = "") -> str:
        """The vector collection: ``SemanticText(collection=...)`` or ``<table>__<column>``."""
        name = self.settings.collection or f"{self.table}__{self.name}"
        return prefix + _UNSAFE.sub("_", name)


_cache: dict[Mapper[Any], tuple[SemanticColumn, ...]] = {}
_cache_lock = RenewedLock()


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


def all_mappers() -> list[Mapper[Any]]:
    """Every mapper of every ORM registry in this process (declarative bases, registries).

    This is how a worker or a command finds the application's models once the module that
    defines them is imported, without being told which base to look at.
    """
    from sqlalchemy.orm import mapperlib

    registries = getattr(mapperlib, "_all_registries", None)  # SQLAlchemy keeps no public list
    if registries is None:  # pragma: no cover - a future SQLAlchemy
        return []
    return [m for reg in list(registries()) for m in list(reg.mappers)]


def row_key(identity: Sequence[Any]) -> str:
    """Stable text naming a row by its primary key values."""
    values = list(identity)
    if len(values) == 1 and type(values[0]) is int:
        return str(values[0])  # what json.dumps writes, without it: the common case
    return json.dumps(values[0] if len(values) == 1 else values, default=str, ensure_ascii=False)


_pk_attrs_cache: dict[Mapper[Any], tuple[str, ...]] = {}


def instance_key(mapper: Mapper[Any], obj: Any) -> str:
    """The :func:`row_key` of ``obj``, an instance of ``mapper``'s class.

    Reads the primary key attributes it holds (what ``mapper.primary_key_from_instance``
    returns, without its per-attribute machinery); an expired one goes through the mapper.
    """
    names = _pk_attrs_cache.get(mapper)
    if names is None:
        names = tuple(mapper.get_property_by_column(c).key for c in mapper.primary_key)
        _pk_attrs_cache[mapper] = names
    loaded = instance_state(obj).dict
    if all(name in loaded for name in names):
        return row_key([loaded[name] for name in names])
    return row_key(mapper.primary_key_from_instance(obj))


_pk_types_cache: dict[Mapper[Any], tuple[type | None, ...]] = {}


def _pk_types(mapper: Mapper[Any]) -> tuple[type | None, ...]:
    """The Python type of each primary key column (``None`` where the type cannot say)."""
    found = _pk_types_cache.get(mapper)
    if found is None:
        types: list[type | None] = []
        for col in mapper.primary_key:
            try:
                types.append(col.type.python_type)
            except NotImplementedError:
                types.append(None)
        found = _pk_types_cache[mapper] = tuple(types)
    return found


def typed_key_values(mapper: Mapper[Any], key: str) -> tuple[Any, ...] | None:
    """:func:`key_values`, or ``None`` where ``key`` is no primary key of ``mapper``'s table (a
    value its column's type cannot hold, or another number of values): a key from outside, such
    as a gold set's, that a query would send to the database only to fail there."""
    try:
        values = key_values(mapper, key)
    except (TypeError, ValueError):  # not JSON, or another number of values
        return None
    for python_type, value in zip(_pk_types(mapper), values, strict=True):
        if python_type is not None and value is not None and not isinstance(value, python_type):
            return None
    return values


def key_values(mapper: Mapper[Any], key: str) -> tuple[Any, ...]:
    """Primary key values for a :func:`row_key`, coerced to the columns' Python types."""
    types = _pk_types(mapper)
    if len(types) == 1 and types[0] is int and key.isascii() and key.isdigit():
        return (int(key),)  # the common case, without a JSON parse
    raw = json.loads(key)
    values = raw if len(types) > 1 else [raw]
    out = []
    for python_type, value in zip(types, values, strict=True):
        if python_type is not None and value is not None and not isinstance(value, python_type):
            try:
                value = python_type(value)
            except (TypeError, ValueError):
                pass
        out.append(value)
    return tuple(out)


def rewrites_keys(mapper: Mapper[Any]) -> bool:
    """Whether :func:`canonical_key` may rewrite a key of ``mapper``'s rows (not when every
    primary key column is an integer or a string: such keys read back as they were written)."""
    return not all(t is int or t is str for t in _pk_types(mapper))


def canonical_key(mapper: Mapper[Any], key: str) -> str:
    """``key`` as :func:`row_key` writes it for ``mapper``'s row: a key written from values
    read without the mapper's types (a migration reflects a ``Uuid`` key of SQLite as its
    32 hex digits) is read with them and written again; ``key`` itself when it is that
    already, or cannot be read. Only the keys of a mapper :func:`rewrites_keys` says of need
    it."""
    try:
        return row_key(key_values(mapper, key))
    except (TypeError, ValueError):
        return key


def pk_in(
    mapper: Mapper[Any], keys: Sequence[str], columns: Sequence[Any] | None = None
) -> ColumnElement[bool]:
    """A SQL criterion selecting the rows named by ``keys``, on ``columns`` (the primary key's
    table columns; in an ORM statement, its attributes: :func:`_key_attributes`)."""
    pk = mapper.primary_key if columns is None else columns
    values = [key_values(mapper, k) for k in keys]
    if len(pk) == 1:
        return pk[0].in_([v[0] for v in values])
    return tuple_(*pk).in_(values)


_KEYS = "semantic_orm_keys"
_by_key: dict[type[Any], Select[Any]] = {}


def _key_attributes(model: type[Any]) -> list[Any]:
    """The mapped attributes of ``model``'s primary key, for an ORM statement on ``model``.

    Not the table's columns: a concrete-inheritance base selects from the UNION of its tables,
    and SQLAlchemy 2.0 adapts a criterion on its own table's column to that union only through
    the attribute (the column added the table beside the union, a cross join: every row of the
    union, the subclasses' included, for each key)."""
    mapper = inspect(model)
    return [getattr(model, mapper.get_property_by_column(c).key) for c in mapper.primary_key]


def _select_by_key(model: type[Any]) -> Select[Any]:
    """``SELECT model WHERE pk IN (:semantic_orm_keys)``, built once per model."""
    stmt = _by_key.get(model)
    if stmt is None:
        criterion = keys_in(inspect(model), _key_attributes(model)[0])
        stmt = _by_key[model] = select(model).where(criterion)
    return stmt


def select_rows(
    model: type[Any], mapper: Mapper[Any], keys: Sequence[str]
) -> tuple[Select[Any], dict[str, Any]]:
    """A statement loading ``model``'s rows named by ``keys``, and its parameters.

    With a one-column primary key the statement is built once per model (an expanding
    parameter takes the keys), so loading rows costs no statement construction.
    """
    if len(mapper.primary_key) == 1:
        return _select_by_key(model), key_params(mapper, keys)
    return select(model).where(pk_in(mapper, keys, _key_attributes(model))), {}


def keys_in(mapper: Mapper[Any], column: Any = None) -> ColumnElement[bool]:
    """``pk IN (:semantic_orm_keys)`` for a one-column primary key (see :func:`key_params`):
    a criterion to build a statement once with, whatever the keys. ``column``: the primary key
    as the statement names it (its table column by default)."""
    key = mapper.primary_key[0] if column is None else column
    return key.in_(bindparam(_KEYS, expanding=True))


def key_params(mapper: Mapper[Any], keys: Sequence[str]) -> dict[str, Any]:
    """The parameters of :func:`keys_in` naming ``keys``."""
    return {_KEYS: [key_values(mapper, k)[0] for k in keys]}


def rows_page(
    conn: Connection,
    table: Table | Any,
    extra: Sequence[Any] = (),
    *,
    after: Sequence[Any] | None = None,
    limit: int = 1000,
) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """One page of ``table``'s rows in primary-key order, after primary key ``after``.

    Each row comes as ``(primary key values, extra column values)``: keyset pagination, so a
    caller can read page after page with a fresh connection each time and memory stays bounded
    whatever the table's size.

    Raises:
        ValueError: The table has no primary key.
    """
    pk = list(table.primary_key.columns)
    if not pk:
        raise ValueError(f"table {table_name(table)!r} has no primary key")
    stmt = select(*pk, *extra).order_by(*pk).limit(limit)
    if after is not None:
        stmt = stmt.where(_after(pk, tuple(after)))
    n = len(pk)
    return [(tuple(row)[:n], tuple(row)[n:]) for row in conn.execute(stmt)]


def iter_rows(
    conn: Connection, table: Table | Any, extra: Sequence[Any] = (), *, batch_size: int = 1000
) -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """Every row of ``table`` as ``(row key, extra column values)``, a page at a time.

    Each page is read in full before it is yielded, so no cursor stays open while the caller
    writes on the same connection (SQLite would not allow it).
    """
    after: tuple[Any, ...] | None = None
    while True:
        page = rows_page(conn, table, extra, after=after, limit=batch_size)
        if not page:
            return
        yield [(row_key(pk), values) for pk, values in page]
        if len(page) < batch_size:
            return
        after = page[-1][0]


def iter_keys(
    conn: Connection, table: Table | Any, *, batch_size: int = 1000
) -> Iterator[list[str]]:
    """Every row key of ``table``, ``batch_size`` at a time, in primary-key order
    (see :func:`iter_rows`)."""
    for page in iter_rows(conn, table, batch_size=batch_size):
        yield [key for key, _ in page]


def _after(pk: list[Column[Any]], values: tuple[Any, ...]) -> ColumnElement[bool]:
    """Rows whose key sorts after ``values``, without row-value syntax (any dialect)."""
    return or_(
        *(and_(*(pk[j] == values[j] for j in range(i)), pk[i] > values[i]) for i in range(len(pk)))
    )
