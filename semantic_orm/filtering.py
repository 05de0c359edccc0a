"""Filter columns: the row values that travel with the vectors, and ``where=`` compiled to them.

A column declared ``SemanticText(filter_by=("tenant_id", "lang"))`` stores, in each of its
points' payload, the row's current value of those attributes (:func:`filter_fields` resolves
them, :meth:`FilterField.encode` turns a value into what the payload holds). A search's
``where=`` is then compiled (:func:`compile_where`) into a store
:class:`~semantic_orm.stores.base.Filter`, so that the vector store ranks only matching points;
the SQL criteria still run on the loaded rows, so a payload that lags behind SQL can hide a row
for the moment of its sync, never show one that does not match.

What compiles: ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in_``, ``not_in``, ``between``,
``is_(None)``, ``is_not(None)``, ``and_``, ``or_``, ``not_`` (``~``) on declared attributes
compared with literal values, on integers, strings, booleans, dates and datetimes (floats and
decimals too, by range). Anything else (a function, another table, two columns compared) makes
:func:`compile_where` return ``None`` and the search filters in SQL only.

SQL semantics are kept where they differ from a payload match: ``col != v`` and ``not_in`` do
not match NULL in SQL, and a ``not_`` over a comparison does not match NULL either, so both
compile with an explicit "is not null". A literal is read as SQL reads it
(:meth:`FilterField.literal`): a string compared with an enum column is the string the column
stores (a member's name, or its value under ``values_callable``); a literal the field cannot
hold (``1.5`` for an integer column), a range bound past 2**53 on an integer (the store's range
bounds are doubles) and a range bound that is NULL are left to SQL.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column
from sqlalchemy.sql import operators
from sqlalchemy.sql.elements import (
    BinaryExpression,
    BindParameter,
    BooleanClauseList,
    ColumnElement,
    False_,
    Grouping,
    Null,
    True_,
    UnaryExpression,
)
from sqlalchemy.sql.functions import FunctionElement

from .exc import ConfigurationError
from .mapping import SemanticColumn
from .stores.base import (
    Condition,
    DatetimeRange,
    Filter,
    IsNull,
    Match,
    MatchAny,
    PayloadIndex,
    PointPayload,
    Range,
)

__all__ = ["FilterField", "compile_where", "describe", "filter_fields", "row_fields"]


@dataclass(frozen=True, slots=True)
class FilterField:
    """One declared filter attribute of a semantic column: its column and payload kind.

    ``kind`` is ``keyword`` (strings, enums, UUIDs), ``integer`` (integers and booleans, stored as
    0/1), ``float`` (floats, decimals) or ``datetime`` (dates and datetimes, stored as ISO 8601
    in UTC).
    """

    name: str
    """The attribute's key on the mapped class."""
    column: Column[Any]
    kind: str
    tenant: bool = False

    @property
    def key(self) -> str:
        """The payload path of this field."""
        return PointPayload.field_key(self.name)

    def index(self) -> PayloadIndex:
        """The payload index the store builds for this field."""
        return PayloadIndex(self.key, self.kind, self.tenant)

    def encode(self, value: Any) -> Any:
        """``value`` as the payload stores it (``None`` stays ``None``)."""
        if value is None:
            return None
        if isinstance(value, enum.Enum):
            value = value.value if self.kind != "keyword" else value.name
        if self.kind == "integer":
            return int(value)
        if self.kind == "float":
            return float(value)
        if self.kind == "datetime":
            return _iso(value)
        return str(value)

    def literal(self, value: Any) -> Any:
        """A ``where=`` value as the payload holds it, read as SQL reads it (not ``None``).

        A string compared with an enum column is what SQL compares: the string the column
        stores (a member's name, or its value under ``values_callable``). A value the field
        cannot hold (a string no member stores, ``"abc"`` or ``1.5`` for an integer, an
        integer past 64 bits) is left to SQL, which decides what it means there (no row, a
        comparison of numbers, or an error).
        """
        members = _stored_members(self.column)
        if members is not None and isinstance(value, str) and not isinstance(value, enum.Enum):
            sent = _bound_enum(self.column, value)  # what SQLAlchemy sends for it
            if sent not in members:
                raise _Unsupported(f"{self.name} == {value!r} (no member of its enum stores it)")
            value = members[sent]
        if self.kind == "integer" and isinstance(value, (float, decimal.Decimal)):
            try:  # SQL compares 1.5 as it is (n < 1.5 holds for 1)
                whole = value == int(value)
            except (ValueError, OverflowError):  # NaN, infinity
                whole = False
            if not whole:
                raise _Unsupported(f"{self.name} compared with {value!r} (not an integer)")
        try:
            encoded = self.encode(value)
        except (TypeError, ValueError, OverflowError):
            raise _Unsupported(f"{self.name} compared with {value!r}") from None
        if self.kind == "integer" and not _INT64[0] <= encoded <= _INT64[1]:
            raise _Unsupported(f"{self.name} compared with {value!r} (past a 64-bit integer)")
        return encoded


_INT64 = (-(2**63), 2**63 - 1)  # what a payload's integer holds
_EXACT = 2**53  # integers a range's bound (a double) holds exactly


def _stored_members(column: Column[Any]) -> dict[str, enum.Enum] | None:
    """``{stored string: member}`` of an ``Enum(SomeEnum)`` column; ``None`` for another."""
    typ = column.type
    cls = getattr(typ, "enum_class", None)
    stored = getattr(typ, "enums", None)
    if cls is None or stored is None:
        return None
    omit = getattr(typ, "_omit_aliases", True)  # as SQLAlchemy lines them up
    members = [m for name, m in cls.__members__.items() if not omit or m.name == name]
    return dict(zip(stored, members, strict=False))


def _bound_enum(column: Column[Any], value: str) -> Any:
    """The string SQLAlchemy's ``Enum`` type sends for ``value`` (a ``StrEnum``'s member
    value is its member; another string is sent as it is, or refused)."""
    lookup = getattr(column.type, "_db_value_for_elem", None)  # SQLAlchemy's own reading
    if lookup is None:
        return value
    try:
        return lookup(value)
    except LookupError:  # validate_strings=True: SQL refuses it too
        raise _Unsupported(f"{value!r} (not a value of the enum)") from None


def _iso(value: Any) -> str:
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return str(value.isoformat(timespec="microseconds")) + "Z"
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day).isoformat() + ".000000Z"
    raise TypeError(f"not a date or datetime: {value!r}")


def _kind(column: Column[Any]) -> str | None:
    try:
        python_type = column.type.python_type
    except NotImplementedError:
        return None
    if issubclass(python_type, bool) or issubclass(python_type, int):
        return "integer"
    if issubclass(python_type, (dt.datetime, dt.date)):
        return "datetime"
    if issubclass(python_type, (float, decimal.Decimal)):
        return "float"
    if issubclass(python_type, (str, enum.Enum, uuid.UUID)):
        return "keyword"
    return None


def filter_fields(col: SemanticColumn) -> tuple[FilterField, ...]:
    """The filter attributes ``col`` declares (``SemanticText(filter_by=...)``), resolved.

    Raises:
        ConfigurationError: A name is not a column attribute of the same table, or its type
            cannot be stored in a payload (names the column and the type).
    """
    settings = col.settings
    fields = []
    for name in settings.filter_by:
        prop = col.mapper.column_attrs.get(name)
        columns = list(prop.columns) if prop is not None else []
        if len(columns) != 1 or not isinstance(columns[0], Column):
            raise ConfigurationError(
                f"{col.label}: filter_by names {name!r}, which is not a column attribute of "
                f"{col.mapped_class.__name__}"
            )
        column = columns[0]
        if column.table is not col.column.table:
            raise ConfigurationError(
                f"{col.label}: filter_by attribute {name!r} lives in another table "
                f"({column.table}); only the row's own columns can travel with its vectors"
            )
        kind = _kind(column)
        if kind is None:
            raise ConfigurationError(
                f"{col.label}: filter_by attribute {name!r} has type {column.type!r}, which a "
                "payload cannot hold; use integers, strings, booleans, dates or datetimes"
            )
        fields.append(FilterField(name, column, kind, tenant=name == settings.tenant))
    return tuple(fields)


def row_fields(fields: Sequence[FilterField], values: Sequence[Any]) -> dict[str, Any]:
    """The payload ``fields`` mapping of one row, from its values in ``fields``' order."""
    return {f.name: f.encode(v) for f, v in zip(fields, values, strict=True)}


# -- compiling where= ---------------------------------------------------------------------------


class _Unsupported(Exception):
    """A part of the expression no payload filter expresses."""


_NEGATE = {
    operators.eq: operators.ne,
    operators.ne: operators.eq,
    operators.lt: operators.ge,
    operators.ge: operators.lt,
    operators.gt: operators.le,
    operators.le: operators.gt,
    operators.in_op: operators.not_in_op,
    operators.not_in_op: operators.in_op,
    operators.is_: operators.is_not,
    operators.is_not: operators.is_,
}


def compile_where(
    where: ColumnElement[bool] | None,
    fields: Sequence[FilterField],
    trusted: Callable[[FilterField], bool] = lambda f: True,
) -> tuple[Filter | None, str]:
    """``where`` as a store filter over ``fields``, or ``None`` and the reason it cannot be.

    Args:
        where: The search's SQL criteria.
        fields: The column's filter attributes.
        trusted: Whether every point carries a field (a field declared after the collection
            was built is not trusted until its payloads are refreshed).

    Returns:
        ``(filter, "")``, or ``(None, reason)`` naming what stopped it (e.g. the columns to
        declare in ``filter_by``).
    """
    if where is None:
        return None, "no where="
    by_column = {f.column: f for f in fields}
    missing: list[str] = []
    try:
        cond = _compile(where, by_column, missing, trusted)
    except _Unsupported as exc:
        if missing:
            return None, f"where= uses {', '.join(sorted(set(missing)))}, not in filter_by"
        return None, f"where= uses {exc}, which no payload filter expresses"
    if missing:
        return None, f"where= uses {', '.join(sorted(set(missing)))}, not in filter_by"
    return (cond if isinstance(cond, Filter) else Filter(must=(cond,))), ""


def _compile(
    expr: Any,
    by_column: Mapping[Any, FilterField],
    missing: list[str],
    trusted: Callable[[FilterField], bool],
    negated: bool = False,
) -> Condition:
    while isinstance(expr, Grouping):
        expr = expr.element
    if isinstance(expr, BooleanClauseList):
        parts = [_compile(c, by_column, missing, trusted, negated) for c in expr.clauses]
        conj = expr.operator is operators.and_
        if negated:
            conj = not conj
        if not parts:
            raise _Unsupported("an empty and_/or_")
        return Filter(must=tuple(parts)) if conj else Filter(should=tuple(parts))
    if isinstance(expr, UnaryExpression) and expr.operator is operators.inv:
        return _compile(expr.element, by_column, missing, trusted, not negated)
    if isinstance(expr, BinaryExpression):
        return _binary(expr, by_column, missing, trusted, negated)
    if isinstance(expr, Column) or (
        isinstance(expr, ColumnElement) and getattr(expr, "table", None) is not None
    ):  # a boolean column used as a criterion: ``where=Doc.published``
        field = _field(expr, by_column, missing, trusted)
        return _compare(field, operators.ne if negated else operators.eq, True)
    raise _Unsupported(type(expr).__name__)


def _field(
    expr: Any,
    by_column: Mapping[Any, FilterField],
    missing: list[str],
    trusted: Callable[[FilterField], bool],
) -> FilterField:
    base = expr._deannotate() if isinstance(expr, ColumnElement) else expr
    field = next((f for c, f in by_column.items() if c is base), None)
    if field is not None:
        if not trusted(field):
            missing.append(f"{field.name} (declared after the collection was built)")
            raise _Unsupported(field.name)
        return field
    if isinstance(base, Column):
        missing.append(str(base.key))
        raise _Unsupported(str(base.key))
    raise _Unsupported(_shown(expr))


def _shown(expr: Any) -> str:
    """What a message calls an expression no payload filter expresses."""
    name = getattr(expr, "name", None) if isinstance(expr, FunctionElement) else None
    return f"the SQL function {name}()" if name else type(expr).__name__


def _literal(expr: Any) -> Any:
    while isinstance(expr, Grouping):
        expr = expr.element
    if isinstance(expr, Null):
        return None
    if isinstance(expr, (True_, False_)):
        return isinstance(expr, True_)
    if isinstance(expr, BindParameter):
        if expr.callable is not None:
            return expr.callable()
        return expr.value
    raise _Unsupported(_shown(expr))


def _binary(
    expr: BinaryExpression[Any],
    by_column: Mapping[Any, FilterField],
    missing: list[str],
    trusted: Callable[[FilterField], bool],
    negated: bool,
) -> Condition:
    op = expr.operator
    left, right = expr.left, expr.right
    if op is operators.between_op or op is operators.not_between_op:
        field = _field(left, by_column, missing, trusted)
        low, high = (_literal(c) for c in right.clauses)
        inside = Filter(
            must=(_compare(field, operators.ge, low), _compare(field, operators.le, high))
        )
        if (op is operators.not_between_op) != negated:
            return Filter(must=(_not_null(field),), must_not=(inside,))
        return inside
    if op not in _NEGATE:
        raise _Unsupported(getattr(op, "__name__", str(op)))
    try:
        field = _field(left, by_column, missing, trusted)
        value_expr = right
    except _Unsupported as on_the_left:
        if missing:
            raise
        try:
            field = _field(right, by_column, missing, trusted)  # ``5 < Doc.n``
        except _Unsupported:
            if missing:
                raise
            raise on_the_left from None  # (what the left side is: ``func.length(...) > 3``)
        value_expr = left
        op = {
            operators.lt: operators.gt,
            operators.gt: operators.lt,
            operators.le: operators.ge,
            operators.ge: operators.le,
        }.get(op, op)
    if op in (operators.in_op, operators.not_in_op):
        value: Any = _in_values(value_expr)
    else:
        value = _literal(value_expr)
    if negated:
        op = _NEGATE[op]
        if op not in (operators.is_, operators.is_not):
            # SQL's NOT (x op v) is unknown, not true, when x is NULL
            return Filter(must=(_not_null(field), _compare(field, op, value)))
    return _compare(field, op, value)


def _in_values(expr: Any) -> list[Any]:
    while isinstance(expr, Grouping):
        expr = expr.element
    if isinstance(expr, BindParameter):
        value = expr.callable() if expr.callable is not None else expr.value
        if not isinstance(value, (list, tuple, set, frozenset)):
            raise _Unsupported("IN")
        return list(value)
    clauses = getattr(expr, "clauses", None)
    if clauses is None:
        raise _Unsupported("IN")
    return [_literal(c) for c in clauses]


def _not_null(field: FilterField) -> Condition:
    return Filter(must_not=(IsNull(field.key),))


def _compare(field: FilterField, op: Any, value: Any) -> Condition:
    key = field.key
    if op in (operators.is_, operators.is_not) and isinstance(value, bool):
        if op is operators.is_:  # IS TRUE: false for NULL, like ==
            return _compare(field, operators.eq, value)
        return Filter(must_not=(_match_any(field, [field.literal(value)]),))  # true for NULL
    if op is operators.is_ or (op is operators.eq and value is None):
        if value is not None:
            raise _Unsupported("IS")
        return IsNull(key)
    if op is operators.is_not or (op is operators.ne and value is None):
        if value is not None:
            raise _Unsupported("IS NOT")
        return _not_null(field)
    if op is operators.in_op or op is operators.not_in_op:
        values = [field.literal(v) for v in value if v is not None]
        if not values:
            raise _Unsupported("an empty IN")
        if op is operators.in_op:
            return _match_any(field, values)
        # SQL: x NOT IN (...) is not true for NULL x
        return Filter(must=(_not_null(field),), must_not=(_match_any(field, values),))
    if value is None:  # a range with NULL: unknown in SQL (true under NOT), SQL decides
        raise _Unsupported(f"{field.name} compared with NULL")
    encoded = field.literal(value)
    if op is operators.eq:
        return _match_any(field, [encoded])
    if op is operators.ne:
        return Filter(must=(_not_null(field),), must_not=(_match_any(field, [encoded]),))
    bound = {operators.lt: "lt", operators.le: "lte", operators.gt: "gt", operators.ge: "gte"}[op]
    if field.kind == "keyword":
        raise _Unsupported(f"{field.name} {bound} (a string range)")
    if field.kind == "datetime":
        return DatetimeRange(key, **{bound: _parse(encoded)})
    if field.kind == "integer" and abs(encoded) > _EXACT:
        raise _Unsupported(f"{field.name} {bound} {encoded} (past what a range's bound holds)")
    return Range(key, **{bound: float(encoded)})


def _match_any(field: FilterField, values: list[Any]) -> Condition:
    if field.kind in ("keyword", "integer"):
        if len(values) == 1:
            return Match(field.key, values[0])
        return MatchAny(field.key, tuple(values))
    # floats and datetimes: equality as a closed range
    ranges: list[Condition] = []
    for v in values:
        if field.kind == "datetime":
            at = _parse(v)
            ranges.append(DatetimeRange(field.key, gte=at, lte=at))
        else:
            ranges.append(Range(field.key, gte=float(v), lte=float(v)))
    return Filter(should=tuple(ranges))


def _parse(iso: str) -> dt.datetime:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))


def describe(fields: Sequence[FilterField]) -> dict[str, str]:
    """``{name: kind}``: what a collection records of its filter fields."""
    return {f.name: f.kind for f in fields}
