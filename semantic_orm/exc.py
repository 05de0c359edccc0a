"""Exceptions raised by semantic_orm.

Every error the library raises derives from :class:`SemanticORMError`, and each one also derives
from the built-in exception a caller would naturally catch, so ``except ValueError`` keeps working.
Errors about a value or a setting also carry SQLAlchemy's ``DontWrapMixin``: raised while a
statement executes (a bad value in ``session.execute(insert(...))``), they reach the caller as
themselves, not wrapped in ``StatementError``::

    SemanticORMError
    ├── ConfigurationError (ValueError)        a setting is invalid or inconsistent
    │   └── CollectionMismatchError            a collection was built by another model/dimension
    │       └── EmbeddingDriftError            a column's model or chunking changed since
    ├── SemanticValueError (ValueError)        a column value cannot be indexed (NUL, surrogate)
    ├── SemanticTypeError (TypeError)          a column value is not a string
    ├── MissingDependencyError (ImportError)   an optional extra is not installed
    ├── EmbeddingError (RuntimeError)          the embedder failed
    ├── VectorStoreError (RuntimeError)        the vector store failed (.transient says if a
    │                                          retry can help)
    └── SyncError (RuntimeError)               syncing committed rows to the index failed

Warnings: :class:`ChunkTooLongWarning` (UserWarning) when chunks overflow the model window.
"""

from __future__ import annotations

import importlib
from typing import Any

from sqlalchemy.exc import DBAPIError, DontWrapMixin, OperationalError

__all__ = [
    "ChunkTooLongWarning",
    "CollectionMismatchError",
    "ConfigurationError",
    "EmbeddingDriftError",
    "EmbeddingError",
    "FilterFallbackWarning",
    "MissingDependencyError",
    "SemanticORMError",
    "SemanticTypeError",
    "SemanticValueError",
    "SyncError",
    "VectorStoreError",
    "first_line",
    "import_optional",
    "is_transient",
]


class SemanticORMError(Exception):
    """Root of every exception raised by semantic_orm."""


class ConfigurationError(DontWrapMixin, SemanticORMError, ValueError):
    """A setting is invalid, unknown or inconsistent with another one."""


class CollectionMismatchError(ConfigurationError):
    """An existing vector collection was produced by another model or dimension."""


class EmbeddingDriftError(CollectionMismatchError):
    """A column's declared model, dimension or chunking differs from what built its collection.

    Attributes:
        column: ``Model.attribute`` of the drifted column.
        collection: The collection's name.
        changes: ``{setting: (recorded, declared)}`` for each setting that differs.
    """

    def __init__(
        self, message: str, *, column: str, collection: str, changes: dict[str, tuple[Any, Any]]
    ) -> None:
        super().__init__(message)
        self.column = column
        self.collection = collection
        self.changes = changes


class SemanticValueError(DontWrapMixin, SemanticORMError, ValueError):
    """A ``SemanticText`` value is a string that cannot be indexed as it is."""


class SemanticTypeError(DontWrapMixin, SemanticORMError, TypeError):
    """A ``SemanticText`` value is not a string (or ``None``)."""


class MissingDependencyError(SemanticORMError, ImportError):
    """An optional dependency is missing; the message carries the install hint."""


class EmbeddingError(SemanticORMError, RuntimeError):
    """The embedder failed to load or to encode."""


class VectorStoreError(SemanticORMError, RuntimeError):
    """The vector store refused or failed an operation.

    Attributes:
        transient: Whether retrying later may succeed (the store is unreachable, overloaded or
            held by another process) rather than the request being refused (a vector of the
            wrong dimension, a bad request): jobs failing transiently are retried until they
            succeed, permanent failures count towards dead-lettering.
    """

    def __init__(self, message: str, *, transient: bool = True) -> None:
        super().__init__(message)
        self.transient = transient


class SyncError(SemanticORMError, RuntimeError):
    """Committed rows could not be synced to the vector store."""


class ChunkTooLongWarning(UserWarning):
    """Chunks are longer than the embedding model's window, so their ends are not embedded."""


class ModelCoverageWarning(UserWarning):
    """A column's text is mostly in a script its embedding model cannot read."""


class FilterFallbackWarning(UserWarning):
    """A search's ``where=`` ran in SQL only and read far more rows than it returned."""


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (a driver's error runs on with the SQL), or its
    type's name when it has none: for one-line reports."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def is_transient(error: BaseException) -> bool:
    """Whether retrying later may succeed (store unreachable, database busy, drift pending).

    Values that cannot be embedded, a request the store refuses and unexpected errors are
    permanent: they count towards dead-lettering. Transient errors are retried with capped
    backoff and never dead-lettered, so an outage does not bury the whole queue.
    """
    if isinstance(error, VectorStoreError):
        return error.transient
    if isinstance(error, (SemanticValueError, SemanticTypeError, EmbeddingError)):
        return False
    return isinstance(error, (ConfigurationError, ConnectionError, TimeoutError, OperationalError))


_OUTAGE_SQLSTATES = (
    "08",  # connection exceptions
    "53",  # insufficient resources: too many connections, out of memory, disk full
    "40001",  # serialization failure
    "40P01",  # deadlock detected
    "40003",  # statement completion unknown
    "55P03",  # lock not available (lock_timeout)
    "57014",  # query cancelled (statement_timeout)
    "57P01",  # admin shutdown
    "57P02",  # crash shutdown
    "57P03",  # cannot connect now (starting up, recovering)
    "57P05",  # idle session timeout
    "58000",  # system error
    "58030",  # I/O error
)
"""SQLSTATEs (and classes) of a PostgreSQL database failing for a while."""
_SETTING_WORDS = (
    "does not exist",
    "authentication failed",
    "password",
    "not permitted to log in",
    "no pg_hba.conf entry",
    "permission denied",
    "unable to open database file",
    "no such table",
    "invalid dsn",
    "invalid connection option",
)
"""What drivers that give no error code say when a setting is at fault (a wrong database,
role, password or path); any other such error is taken for an outage."""


def is_database_outage(error: DBAPIError) -> bool:
    """Whether ``error`` says the database fails for a while (unreachable, restarting, busy,
    locked, out of connections) rather than a setting at fault (a wrong path, database name,
    role or password, a missing table), which no wait mends. An error with no code (a driver
    failing to connect: psycopg gives none) is an outage unless its text names such a
    setting."""
    if error.connection_invalidated:  # the dialect saw the connection lost
        return True
    orig = error.orig
    sqlite = getattr(orig, "sqlite_errorname", None)
    if sqlite:
        return str(sqlite).startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if code:
        return str(code).startswith(_OUTAGE_SQLSTATES)
    text = str(orig).lower()
    return not any(word in text for word in _SETTING_WORDS)


def import_optional(module: str, hint: str) -> Any:
    """Import an optional dependency, or fail with :class:`MissingDependencyError` and ``hint``.

    Args:
        module: The module to import, e.g. ``"qdrant_edge"``.
        hint: What needs it and how to install it, e.g. ``"EdgeStore needs Qdrant Edge: pip
            install 'semantic-orm[edge]'"``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(hint) from exc
