"""Exceptions raised by semantic_orm.

Every error the library raises derives from :class:`SemanticORMError`, and each one also derives
from the built-in exception a caller would naturally catch, so ``except ValueError`` keeps working::

    SemanticORMError
    ├── ConfigurationError (ValueError)        a setting is invalid or inconsistent
    │   └── CollectionMismatchError            a collection was built by another model/dimension
    │       └── EmbeddingDriftError            a column's model or chunking changed since
    ├── SemanticValueError (ValueError)        a column value cannot be indexed (NUL, surrogate)
    ├── SemanticTypeError (TypeError)          a column value is not a string
    ├── MissingDependencyError (ImportError)   an optional extra is not installed
    ├── EmbeddingError (RuntimeError)          the embedder failed
    ├── VectorStoreError (RuntimeError)        the vector store failed
    └── SyncError (RuntimeError)               syncing committed rows to the index failed

Warnings: :class:`ChunkTooLongWarning` (UserWarning) when chunks overflow the model window.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ChunkTooLongWarning",
    "CollectionMismatchError",
    "ConfigurationError",
    "EmbeddingDriftError",
    "EmbeddingError",
    "MissingDependencyError",
    "SemanticORMError",
    "SemanticTypeError",
    "SemanticValueError",
    "SyncError",
    "VectorStoreError",
]


class SemanticORMError(Exception):
    """Root of every exception raised by semantic_orm."""


class ConfigurationError(SemanticORMError, ValueError):
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


class SemanticValueError(SemanticORMError, ValueError):
    """A ``SemanticText`` value is a string that cannot be indexed as it is."""


class SemanticTypeError(SemanticORMError, TypeError):
    """A ``SemanticText`` value is not a string (or ``None``)."""


class MissingDependencyError(SemanticORMError, ImportError):
    """An optional dependency is missing; the message carries the install hint."""


class EmbeddingError(SemanticORMError, RuntimeError):
    """The embedder failed to load or to encode."""


class VectorStoreError(SemanticORMError, RuntimeError):
    """The vector store refused or failed an operation."""


class SyncError(SemanticORMError, RuntimeError):
    """Committed rows could not be synced to the vector store."""


class ChunkTooLongWarning(UserWarning):
    """Chunks are longer than the embedding model's window, so their ends are not embedded."""
