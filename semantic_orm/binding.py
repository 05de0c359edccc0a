"""Column bindings: one ``SemanticText`` column as an index resolves it.

A :class:`ColumnBinding` is a frozen value holding everything the save path and the search path
need about one column: the column, the collection searches read, the collection writes go to
(the same, except during a rebuild), the embedder and chunker, the fingerprint of the settings
that produce its vectors, and the spec its collection must match. :class:`Bindings` resolves each
column once per index (``index.binding_for(column)``), keyed by the column's table, name and
declared settings, never by object identity; a rebuild is the same binding with another write
target (:meth:`ColumnBinding.retarget`).

Drift lives here too: :func:`drift` compares what a collection recorded when it was built with
what the column declares now, and :meth:`Bindings.check` refuses a collection whose vectors no
longer fit (:class:`~semantic_orm.exc.EmbeddingDriftError`, naming each change and the rebuild
command), or lets searches through with a warning when only the chunk settings changed. A
collection found fit is looked at again after :data:`RECHECK` seconds: another process (a new
deployment sharing the Qdrant server) may have rebuilt and switched it meanwhile.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .chunking import TYPE_KEY, TYPES_KEY, Chunker
from .embedding import Embedder, embedder_settings
from .exc import CollectionMismatchError, ConfigurationError, EmbeddingDriftError
from .filtering import FilterField, describe, filter_fields
from .forking import RenewedLock
from .keywords import KeywordAnalyzer, analyzer_for
from .mapping import SemanticColumn
from .normalizing import DEFAULT_NORMALIZE, Normalizer
from .stores.base import CollectionSpec, PayloadIndex, PointPayload, Store
from .version import __version__

__all__ = [
    "Bindings",
    "ColumnBinding",
    "drift",
    "filter_drift",
    "fingerprint",
    "keywords_drift",
]

log = logging.getLogger("semantic_orm")

RECHECK = 30.0
"""Seconds a collection found fit for a column's vectors is trusted before it is read again."""


def fingerprint(
    model: str,
    dimension: int,
    chunker: Mapping[str, Any],
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Short digest of what makes vectors comparable: model, dimension, chunking settings, and
    any ``extra`` setting that changes them (left out when empty, so that digests made before
    such settings existed stay valid)."""
    parts: list[Any] = [model, dimension, dict(chunker)]
    if extra:
        parts.append(dict(extra))
    blob = json.dumps(parts, sort_keys=True)
    return hashlib.blake2b(blob.encode("utf-8"), digest_size=6).hexdigest()


@dataclass(frozen=True)
class ColumnBinding:
    """One semantic column as an index resolved it (see the module docstring).

    The embedder's dimension (which may load a model) is read only when :attr:`spec` or
    :attr:`fingerprint` is first used.
    """

    column: SemanticColumn
    collection: str
    """The collection searches read."""
    target: str
    """The collection writes go to: :attr:`collection`, or a rebuild's new collection."""
    embedder: Embedder
    chunker: Chunker
    fusion: tuple[tuple[str, Any], ...] = ()
    """The hybrid rule searches use by default (recorded with the collection, not compared)."""

    @property
    def label(self) -> str:
        """``Model.attribute``, for messages."""
        return self.column.label

    @functools.cached_property
    def fields(self) -> tuple[FilterField, ...]:
        """The filter attributes whose values travel in the payload (``filter_by=``)."""
        return filter_fields(self.column)

    @functools.cached_property
    def normalizer(self) -> Normalizer:
        """What chunks and queries go through before the embedder and the keyword analyser."""
        return Normalizer(self.column.settings.normalize)

    @functools.cached_property
    def analyzer(self) -> KeywordAnalyzer:
        """The keyword analyser of this column's language."""
        return analyzer_for(self.column.settings.language)

    @functools.cached_property
    def spec(self) -> CollectionSpec:
        """What the target collection must hold."""
        column = self.column
        return CollectionSpec(
            name=self.target,
            dimension=self.embedder.dimension,
            model=self.embedder.name,
            metadata={
                "chunker": self.chunker.config(),
                "embedder": embedder_settings(self.embedder),
                "table": column.table,
                "column": column.name,
                "semantic_orm": __version__,
                "filter_by": describe(self.fields),
                "normalize": list(self.column.settings.normalize),
                "keywords": self.analyzer.id,
                "fusion": dict(self.fusion),
            },
            indexes=(*(f.index() for f in self.fields), *self._tag_indexes()),
        )

    def _tag_indexes(self) -> tuple[PayloadIndex, ...]:
        """The chunk-type indexes of a tagged column (``SemanticText(tags=True)``)."""
        if "tags" not in self.chunker.config():
            return ()
        return tuple(
            PayloadIndex(PointPayload.meta_key(key), "keyword") for key in (TYPE_KEY, TYPES_KEY)
        )

    @functools.cached_property
    def fingerprint(self) -> str:
        """Digest of the model, embedder settings and chunking that produce this column's
        vectors."""
        spec = self.spec
        meta = spec.metadata
        extra: dict[str, Any] = {}
        if meta.get("embedder"):  # prompts, backend: other vectors
            extra.update(meta["embedder"])
        if tuple(meta["normalize"]) != DEFAULT_NORMALIZE:  # other text reaches the model
            extra["normalize"] = meta["normalize"]
        return fingerprint(spec.model, spec.dimension, meta["chunker"], extra)

    def retarget(self, name: str) -> ColumnBinding:
        """The same binding, writing into collection ``name`` (a rebuild)."""
        return dataclasses.replace(self, target=name)


def drift(recorded: Mapping[str, Any] | None, spec: CollectionSpec) -> dict[str, tuple[Any, Any]]:
    """What differs between a collection's recorded metadata and what ``spec`` would record.

    Compares the model, the dimension, the text normalisation, each chunker setting and each
    embedder setting (``embedder.<key>``: prompts, backend...); the library version, the fusion
    rule (query time only), the filter fields (:func:`filter_drift`: payload only) and the
    keyword analyser (:func:`keywords_drift`: keyword vectors only, rewritten without
    embedding) are not differences. Settings a collection did not record (older servers or
    versions) are not compared.

    Returns:
        ``{setting: (recorded, declared)}``, empty when nothing changed.
    """
    if not recorded:
        return {}
    changes: dict[str, tuple[Any, Any]] = {}
    for key, declared in (("model", spec.model), ("dimension", spec.dimension)):
        if key in recorded and recorded[key] != declared:
            changes[key] = (recorded[key], declared)
    if "normalize" in recorded and recorded["normalize"] != spec.metadata.get("normalize"):
        changes["normalize"] = (recorded["normalize"], spec.metadata.get("normalize"))
    for group in ("chunker", "embedder"):
        old = recorded.get(group)
        new = spec.metadata.get(group)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            for key in sorted(set(old) | set(new)):
                if old.get(key) != new.get(key):
                    changes[f"{group}.{key}"] = (old.get(key), new.get(key))
    return changes


def filter_drift(recorded: Mapping[str, Any] | None, spec: CollectionSpec) -> dict[str, Any]:
    """The filter fields declared now that the collection's points may not all carry yet
    (declared after it was built, or with another kind): ``{name: kind}``."""
    declared = spec.metadata.get("filter_by") or {}
    if not recorded:
        return {}
    have = recorded.get("filter_by") or {}
    return {name: kind for name, kind in declared.items() if have.get(name) != kind}


def keywords_drift(
    recorded: Mapping[str, Any] | None, spec: CollectionSpec
) -> tuple[str, str] | None:
    """The keyword analyser a collection recorded and the one ``spec`` declares, when they
    differ (another version of the analysis, or another ``language=``): points written before
    keep the older keyword vectors until ``reindex --all`` rewrites them (their dense vectors
    stay); ``None`` when they are the same or the collection did not record one."""
    if not recorded or "keywords" not in recorded:
        return None
    old, new = str(recorded["keywords"]), str(spec.metadata.get("keywords"))
    return None if old == new else (old, new)


def drift_error(
    binding: ColumnBinding, collection: str, changes: dict[str, tuple[Any, Any]]
) -> EmbeddingDriftError:
    """The error naming each change of ``binding``'s column and the command that rebuilds it."""
    listed = "; ".join(f"{key}: {old!r} -> {new!r}" for key, (old, new) in changes.items())
    cls = binding.column.mapped_class
    if {"model", "dimension"} & set(changes):
        meanwhile = (
            "Searching it with the new model would compare unrelated vectors, so searches and "
            "writes are refused. Rebuild it (a deployment still on the old settings can serve "
            "searches meanwhile)"
        )
    else:
        meanwhile = (
            "Searches still use it (same model); writes wait in the outbox. Rebuild it "
            "(searches keep using the current collection until the switch)"
        )
    return EmbeddingDriftError(
        f"{binding.label} has changed since its collection {collection!r} was built ({listed}). "
        f"{meanwhile}: semantic-orm reindex MODULE:index "
        f"{cls.__module__}:{cls.__qualname__} --rebuild (or "
        f"semantic_orm.maintenance.rebuild(index, {cls.__qualname__})). To keep the old "
        "vectors instead, restore the previous settings.",
        column=binding.label,
        collection=collection,
        changes=changes,
    )


class Bindings:
    """Resolves and checks the column bindings of one index.

    Args:
        store: Where the collections live.
        prefix: Prepended to every collection name.
        embedder_for: Returns the embedder for a column's declared model name (``None``: the
            index's default).
        fusion: The index's hybrid rule (``Fusion.describe()``), recorded with collections.
    """

    def __init__(
        self,
        store: Store,
        prefix: str,
        embedder_for: Callable[[str | None], Embedder],
        fusion: Mapping[str, Any] | None = None,
    ) -> None:
        self.store = store
        self._fusion = tuple(sorted((fusion or {}).items()))
        self.prefix = prefix
        self._embedder_for = embedder_for
        self._bindings: dict[tuple[str, str, tuple[Any, ...]], ColumnBinding] = {}
        self._columns: dict[tuple[str, str], SemanticColumn] = {}
        self._owners: dict[str, tuple[str, str, str]] = {}  # collection -> table, column, label
        # collection -> (fingerprint checked for writing, or searchable only: drifted in its
        # chunking; time.monotonic() when it was)
        self._checked: dict[str, tuple[str, float]] = {}
        self._searchable: dict[str, tuple[str, float]] = {}
        self._untrusted: dict[str, frozenset[str]] = {}  # collection -> filter fields not filled
        # collection -> (recorded, declared) keyword analysers, when they differ
        self._stale: dict[str, tuple[str, str] | None] = {}
        self._lock = RenewedLock(reentrant=True)

    # -- columns -------------------------------------------------------------------------------

    def register(self, column: SemanticColumn) -> None:
        """Remember ``column`` so that jobs naming its table and column can be processed.

        Raises:
            ConfigurationError: Another table or column already uses the same collection (its
                vectors and this column's would overwrite each other).
        """
        where = (column.table, column.name)
        name = column.collection(self.prefix)
        with self._lock:
            owner = self._owners.get(name)
            if owner is not None and owner[:2] != where:
                raise ConfigurationError(
                    f"{column.label} and {owner[2]} both use the vector collection {name!r}; "
                    "their vectors would overwrite each other and one's search would return the "
                    "other's rows. Give one of them its own SemanticText(collection=...)"
                )
            self._owners[name] = (*where, column.label)
            self._columns.setdefault(where, column)

    def column(self, table: str, column: str) -> SemanticColumn | None:
        """The registered column for a job's ``table`` and ``column``."""
        return self._columns.get((table, column))

    def columns(self) -> list[SemanticColumn]:
        """Every registered column."""
        return list(self._columns.values())

    # -- bindings ------------------------------------------------------------------------------

    def binding_for(self, column: SemanticColumn) -> ColumnBinding:
        """``column`` resolved: its collections, embedder, chunker and fingerprint (cached)."""
        key = (column.table, column.name, column.settings.settings_key())
        found = self._bindings.get(key)
        if found is not None:
            return found
        self.register(column)
        name = column.collection(self.prefix)
        made = ColumnBinding(
            column=column,
            collection=name,
            target=name,
            embedder=self._embedder_for(column.settings.model),
            chunker=column.settings.make_chunker(),
            fusion=self._fusion,
        )
        with self._lock:
            return self._bindings.setdefault(key, made)

    # -- drift ---------------------------------------------------------------------------------

    def check(self, binding: ColumnBinding, *, for_search: bool = False) -> None:
        """Create ``binding``'s target collection if needed; refuse one its vectors do not fit.

        Args:
            binding: The column binding.
            for_search: Only searching: a collection chunked with other settings still answers
                (its vectors come from the same model), with a warning; writing to it does not.

        Raises:
            EmbeddingDriftError: The collection was built by another model or dimension (or,
                when writing, other chunk settings). The message names each change and the
                command that rebuilds the collection.
        """
        name = binding.target
        now = time.monotonic()
        for seen in (self._checked, self._searchable) if for_search else (self._checked,):
            done = seen.get(name)
            if done is not None and done[0] == binding.fingerprint and now - done[1] < RECHECK:
                return
        spec = binding.spec
        try:
            self.store.ensure_collection(spec)
        except CollectionMismatchError as exc:
            changes = drift(self.store.collection_info(name), spec)
            if not changes:
                raise  # not a setting that changed (e.g. a collection of an older layout)
            raise drift_error(binding, name, changes) from exc
        recorded = self.store.collection_info(name)
        self._note_filters(binding, recorded)
        self._note_keywords(binding, recorded)
        changes = drift(recorded, spec)
        if not changes:
            self._checked[name] = (binding.fingerprint, now)
            self._searchable.pop(name, None)  # (a later drift warns again)
            return
        self._checked.pop(name, None)
        if for_search and not {"model", "dimension"} & set(changes):
            if name not in self._searchable:
                log.warning("semantic_orm: %s", drift_error(binding, name, changes))
            self._searchable[name] = (binding.fingerprint, now)
            return
        raise drift_error(binding, name, changes)

    def _note_filters(self, binding: ColumnBinding, recorded: Mapping[str, Any] | None) -> None:
        pending = frozenset(filter_drift(recorded, binding.spec))
        known = self._untrusted.get(binding.target)
        self._untrusted[binding.target] = pending
        if pending and pending != known:  # (once, not at each look again)
            cls = binding.column.mapped_class
            log.warning(
                "semantic_orm: %s declares filter_by field(s) %s that the points of %r do not "
                "all carry yet; where= on them filters in SQL until the payloads are "
                "refreshed: semantic-orm reindex MODULE:index %s:%s --all (embeds nothing "
                "that did not change)",
                binding.label,
                ", ".join(sorted(pending)),
                binding.target,
                cls.__module__,
                cls.__qualname__,
            )

    def _note_keywords(self, binding: ColumnBinding, recorded: Mapping[str, Any] | None) -> None:
        stale = keywords_drift(recorded, binding.spec)
        known = self._stale.get(binding.target)
        self._stale[binding.target] = stale
        if stale is not None and stale != known:  # (once, not at each look again)
            cls = binding.column.mapped_class
            log.warning(
                "semantic_orm: the points of %r hold keyword vectors of analyser %r; %s now "
                "writes %r (new and changed rows get it; searches and writes go on). Keyword "
                "search matches the older points by their older terms until they are "
                "rewritten: semantic-orm reindex MODULE:index %s:%s --all (embeds nothing)",
                binding.target,
                stale[0],
                binding.label,
                stale[1],
                cls.__module__,
                cls.__qualname__,
            )

    def stale_keywords(self, binding: ColumnBinding) -> tuple[str, str] | None:
        """The keyword analyser ``binding``'s collection recorded and the one it declares, when
        they differ (see :func:`keywords_drift`)."""
        return keywords_drift(self.store.collection_info(binding.collection), binding.spec)

    def untrusted(self, binding: ColumnBinding) -> frozenset[str]:
        """The filter fields of ``binding`` not every point of its collection carries yet."""
        found = self._untrusted.get(binding.collection)
        if found is None:
            found = frozenset(
                filter_drift(self.store.collection_info(binding.collection), binding.spec)
            )
            self._untrusted[binding.collection] = found
        return found

    def drift_of(self, binding: ColumnBinding) -> dict[str, tuple[Any, Any]]:
        """What changed since ``binding``'s collection was built (empty if nothing or new)."""
        return drift(self.store.collection_info(binding.collection), binding.spec)

    def forget(self, binding: ColumnBinding) -> None:
        """Check ``binding``'s collections again on next use (after a rebuild switched them)."""
        for name in (binding.collection, binding.target):
            self._checked.pop(name, None)
            self._searchable.pop(name, None)
            self._untrusted.pop(name, None)
            self._stale.pop(name, None)
