"""Applying: make the vector store hold each row's current text (chunk, fit, diff, embed, write).

:class:`Applier` takes :class:`SyncOp` values (a column binding, a row key and the row's text,
``None`` when the row is gone) and, per target collection:

1. **chunk** each text with the column's chunker, then **fit** chunks that overflow the model's
   window by splitting them at token boundaries (for a
   :class:`~semantic_orm.embedding.TokenAwareEmbedder`), so no text is silently truncated;
2. **diff** against the points the store already holds for those rows: an unchanged chunk is
   left alone, a chunk that only moved keeps its vector and gets a new payload;
3. **embed** only the chunks whose text is new, in one batch;
4. **write**: upsert the points (deterministic ids), then delete what an update left past a
   row's new last chunk, and every point of a row that is gone.

A batch that fails with a permanent error is bisected, so one poison row fails alone and the
rest of its batch still syncs; a transient failure fails the batch as a whole (retrying later
is the answer). Failures are returned, never raised.

An unreachable store (:class:`Outage`): once a write failed that way, the inline syncs of
commits (``apply(..., inline=True)``) do not wait on it again, each for a timeout, while
the background retrier and the workers keep trying: they fail at once with the store's last
error, leaving their jobs to those, until an attempt gets through (or, after a quiet spell, an
inline sync tries again itself).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from . import signals
from .binding import ColumnBinding
from .chunking import Chunk, fit_to_window
from .embedding import TokenAwareEmbedder
from .exc import (
    ChunkTooLongWarning,
    ModelCoverageWarning,
    SemanticValueError,
    VectorStoreError,
    is_transient,
)
from .forking import RenewedLock
from .outbox import JobKey
from .stores.base import PointPayload, SparseVector, Store, VectorPoint, point_id

__all__ = ["Applier", "ApplyReport", "Outage", "RowValue", "SyncOp", "text_hash"]

log = logging.getLogger("semantic_orm")

COVERAGE_SAMPLE = 32
"""Chunks of a column's first embedding batch checked for what its model can read."""
COVERAGE_WARNING = 0.5
"""Below this share of known word pieces, :class:`ModelCoverageWarning` says so (once)."""


_YIELD_EVERY = 0.004
"""Seconds of chunking and analysis between two offers of the GIL to other threads (under
the interpreter's own 5 ms switch interval)."""
_last_yield = 0.0
_MAIN = threading.main_thread()


def _yield() -> None:
    """Let other threads run: off the main thread this work usually runs beside an event loop
    (a task's worker thread, a sync session inside a running loop), whose every tick needs the
    GIL. Offered every few milliseconds, not every row: each offer is a trip through the
    scheduler, which on a busy machine can hand the core to another process for a whole time
    slice. The main thread does not offer: there the interpreter's switch interval is enough."""
    global _last_yield
    now = time.perf_counter()
    if now - _last_yield >= _YIELD_EVERY and threading.current_thread() is not _MAIN:
        _last_yield = now
        time.sleep(0)


def text_hash(text: str) -> str:
    """Digest of a text, as stored in point payloads."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=10).hexdigest()


class RowValue(NamedTuple):
    """A row's current semantic text and the payload values of its filter fields."""

    text: str | None
    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SyncOp:
    """Make the index hold ``text`` for one row's column; ``text=None`` removes the row.

    ``fields`` are the row's filter values (``SemanticText(filter_by=...)``), stored in every
    point's payload; when only they changed, the points get a new payload and keep their
    vectors.
    """

    binding: ColumnBinding
    pk: str
    text: str | None
    fields: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, binding: ColumnBinding, pk: str, row: RowValue | None) -> SyncOp:
        """The op for a row as read (``None``: the row is gone)."""
        if row is None:
            return cls(binding, pk, None)
        return cls(binding, pk, row.text, row.fields)

    @property
    def key(self) -> JobKey:
        """The outbox key this op syncs."""
        return JobKey(self.binding.column.table, self.binding.column.name, self.pk)


@dataclass(slots=True)
class ApplyReport:
    """What one :meth:`Applier.apply` call did."""

    upserted: int = 0
    deleted: int = 0
    points: int = 0
    embedded: int = 0
    reused: int = 0
    failed: list[tuple[list[SyncOp], BaseException]] = field(default_factory=list)


def _unreachable(error: BaseException) -> bool:
    """Whether ``error`` says the store (or a remote embedder) could not be reached, as
    opposed to a refused request or a collection that drifted."""
    if isinstance(error, VectorStoreError):
        return error.transient
    return isinstance(error, (ConnectionError, TimeoutError))


class Outage:
    """Whether the store is reachable, as the latest attempts found it.

    After a write or a search failed as unreachable, an inline sync is refused (it fails at
    once with that error, its jobs left to retry) for ``first`` seconds, doubling with each
    failed attempt up to ``cap``, and while any other attempt is on its way; past that an
    inline sync tries again itself. Searches (:meth:`admit_search`) go one at a time during an
    outage, the others failing at once, and none for the window after one failed: a search
    that finds the store back ends the outage for all, a sync's failure alone holds no search
    back. Any attempt that reaches the store ends the outage.

    Args:
        first: Seconds inline syncs (and searches, after a search's failure) skip the store
            after the first failure.
        cap: Longest such wait, in seconds.
    """

    def __init__(self, first: float = 1.0, cap: float = 30.0) -> None:
        self.first, self.cap = first, max(first, cap)
        self.since: float | None = None
        """When (``time.time()``) the outage began; ``None``: the store is reachable."""
        self.error: BaseException | None = None
        """The latest failure."""
        self._wait = first
        self._until = 0.0
        self._search_until = 0.0
        self._trying = 0  # attempts on their way
        self._searching = 0  # searches on their way
        self._lock = RenewedLock()

    def admit(self, inline: bool) -> VectorStoreError | None:
        """Start an attempt; for an inline sync during an outage, the error to fail it with
        instead (no attempt started). Each started attempt ends with :meth:`record`."""
        with self._lock:
            if (
                inline
                and self.since is not None
                and (self._trying or time.monotonic() < self._until)
            ):
                return self._refusal("the rows sync once it answers")
            self._trying += 1
            return None

    def admit_search(self) -> VectorStoreError | None:
        """Start a search's call to the store; during an outage, while another search is on
        its way or in the window after one failed, the error to fail it with instead (no
        call started). Each started call ends with :meth:`ended` (``search=True``)."""
        with self._lock:
            if self.since is not None and (
                self._searching or time.monotonic() < self._search_until
            ):
                return self._refusal("search again once it answers")
            self._trying += 1
            self._searching += 1
            return None

    def _refusal(self, then: str) -> VectorStoreError:
        since = time.strftime("%H:%M:%S", time.localtime(self.since))
        return VectorStoreError(
            f"not tried: the vector store (or the embedder) has been unreachable since {since} "
            f"(latest error: {self.error}); {then}"
        )

    def record(self, report: ApplyReport) -> None:
        """End an attempt that :meth:`admit` started, with what it found."""
        self.ended(next((exc for _, exc in report.failed if _unreachable(exc)), None))

    def ended(self, error: BaseException | None, search: bool = False) -> None:
        """End an attempt that :meth:`admit` (or, ``search``, :meth:`admit_search`) started:
        ``error`` is what it failed with (``None``, or an error that does not say the store is
        unreachable: it reached it)."""
        down = error if error is not None and _unreachable(error) else None
        with self._lock:
            self._trying -= 1
            self._searching -= search
            if down is not None:
                if self.since is None:
                    self.since, self._wait = time.time(), self.first
                    log.warning(
                        "semantic_orm: the vector store is unreachable (%s): commits leave their "
                        "rows to the background retrier, and searches fail fast, until it "
                        "answers again",
                        down,
                    )
                else:
                    self._wait = min(self._wait * 2, self.cap)
                self.error = down
                self._until = time.monotonic() + self._wait
                if search:
                    self._search_until = self._until
            elif self.since is not None:
                log.warning(
                    "semantic_orm: the vector store answers again after %.0f s",
                    time.time() - self.since,
                )
                self.since = self.error = None


def _as_read(
    token_spans: Callable[[str], Sequence[tuple[int, int]]], normalize: Callable[[str], str]
) -> Callable[[str], list[tuple[int, int]]]:
    """``token_spans`` counting the tokens of a piece as the model reads it (``normalize``d),
    at positions in the piece itself: NFKC makes "……" six tokens of two and "ﷺ" four words of
    one, so a piece fitted on its own tokens overflowed the window and the model cut its end
    off, unseen. Where the piece reads as more tokens, its own positions are spread over that
    many (a cut falls earlier; fitting measures each piece again until it fits)."""

    def spans(piece: str) -> list[tuple[int, int]]:
        own = list(token_spans(piece))
        read = normalize(piece)
        if read == piece or not own:
            return own
        n = len(token_spans(read))
        if n <= len(own):
            return own
        return [own[i * len(own) // n] for i in range(n)]

    return spans


class Applier:
    """Applies :class:`SyncOp` batches to a store (see the module docstring).

    Args:
        store: The vector store.
        check: Checks a binding's target collection before it is written (creates it, or
            raises on drift); a failure fails the binding's ops like any other.
        outage: What the latest attempts found of the store's reachability.
    """

    def __init__(
        self,
        store: Store,
        check: Callable[[ColumnBinding], None],
        outage: Outage | None = None,
    ) -> None:
        self.store = store
        self.check = check
        self.outage = outage or Outage()
        self._warned: set[str] = set()
        self._read: set[str] = set()  # columns whose model coverage was checked

    def apply(self, ops: Sequence[SyncOp], *, inline: bool = False) -> ApplyReport:
        """Sync ``ops``; failures are reported in ``failed`` and the rest still syncs.

        ``inline``: a commit's own sync, which fails at once while the store is unreachable
        (:class:`Outage`) instead of waiting on it.
        """
        report = ApplyReport()
        groups: dict[str, list[SyncOp]] = {}
        for op in ops:
            groups.setdefault(op.binding.target, []).append(op)
        if not groups:
            return report
        refused = self.outage.admit(inline)
        if refused is not None:
            for group in groups.values():
                self._failed(group, refused, report, quiet=True)
            return report
        try:
            for group in groups.values():
                try:
                    self.check(group[0].binding)
                except Exception as exc:  # the collection itself: no bisection can help
                    self._failed(group, exc, report)
                    continue
                self._isolating(group, report)
        finally:
            self.outage.record(report)
        return report

    def _isolating(self, ops: list[SyncOp], report: ApplyReport) -> None:
        try:
            self._apply(ops, report)
        except Exception as exc:
            if len(ops) > 1 and not is_transient(exc):
                half = len(ops) // 2
                self._isolating(ops[:half], report)
                self._isolating(ops[half:], report)
                return
            self._failed(ops, exc, report)

    @staticmethod
    def _failed(
        ops: list[SyncOp], exc: BaseException, report: ApplyReport, quiet: bool = False
    ) -> None:
        binding = ops[0].binding
        log.log(
            logging.DEBUG if quiet else logging.WARNING,
            "semantic_orm: syncing %s failed: %s",
            binding.label,
            exc,
        )
        if signals.sync_failed.receivers:
            signals.sync_failed.send(
                binding.column.mapped_class,
                column=binding.column.key,
                pks=[op.pk for op in ops],
                error=exc,
            )
        report.failed.append((ops, exc))

    def _chunks(self, binding: ColumnBinding, text: str | None) -> list[Chunk]:
        """The chunks of ``text``, fitted to the model's window.

        Raises:
            SemanticValueError: A chunk is not the text at its offsets (a custom chunker's
                mistake, for this text): its passages would not be the text that was
                embedded. Permanent, as when fitting finds it: the row is dead-lettered, not
                the batch retried.
        """
        if not text:
            return []
        chunker = binding.chunker
        chunks = chunker.chunk(text)
        for c in chunks:
            if text[c.start_offset : c.end_offset] != c.text:
                raise SemanticValueError(
                    f"{binding.label}: chunker {type(chunker).__name__} returned chunk "
                    f"{c.index} whose text is not the text at its offsets "
                    f"[{c.start_offset}:{c.end_offset}] (a chunker returns exact slices of the "
                    "text: see semantic_orm.chunking.Chunker)"
                )
        embedder = binding.embedder
        window = embedder.max_seq_length
        if chunks and window and isinstance(embedder, TokenAwareEmbedder):
            budget = window - embedder.special_token_count()
            spans: Callable[[str], Sequence[tuple[int, int]]] = embedder.token_spans
            if binding.normalizer.steps:
                spans = _as_read(spans, binding.normalizer)
            fitted = fit_to_window(chunks, text, spans, budget)
            if len(fitted) > len(chunks):
                self._warn_split(binding, chunks, budget, len(fitted) - len(chunks))
            chunks = fitted
        return chunks

    def _apply(self, ops: list[SyncOp], report: ApplyReport) -> None:
        binding = ops[0].binding
        cls = binding.column.mapped_class
        store = self.store
        target = binding.target
        config = binding.fingerprint
        normalize = binding.normalizer
        analyzer = binding.analyzer

        rows: list[tuple[str, str | None, list[Chunk]]] = []
        fields = {op.pk: op.fields for op in ops}
        for op in ops:
            _yield()
            chunks = self._chunks(binding, op.text)
            rows.append((op.pk, op.text, chunks))
            if chunks and signals.chunked.receivers:
                signals.chunked.send(cls, column=binding.column.key, pk=op.pk, chunks=chunks)

        # what the store already holds for these rows: vectors to reuse, payloads to compare
        live = [pk for pk, _, chunks in rows if chunks]
        reusable: dict[tuple[str, str], Any] = {}
        current: dict[tuple[str, int], dict[str, Any]] = {}
        stored_counts: dict[str, int] = {}
        for point in store.existing(target, live) if live else []:
            # (its metadata is compared as stored, in current)
            stored = PointPayload.from_dict(point.payload, meta=False)
            stored_counts[stored.pk] = max(stored_counts.get(stored.pk, 0), stored.chunk_index + 1)
            if stored.config != config:
                continue  # produced by another model or chunking: not comparable
            reusable[(stored.pk, stored.chunk_hash)] = point.vector
            current[(stored.pk, stored.chunk_index)] = dict(point.payload)

        column = binding.column
        collection, analysed_by = binding.collection, analyzer.id
        new_payload, digests = PointPayload.stored, PointPayload.pack
        # (id, vector or None, payload, keyword vector): dense vectors are reused when a chunk's
        # text is unchanged; keyword vectors are cheap, so every written point recomputes its own
        slots: list[tuple[str, Any, dict[str, Any], SparseVector]] = []
        to_embed: list[tuple[int, str]] = []
        for pk, text, chunks in rows:
            _yield()
            whole = text_hash(text) if text else ""
            for chunk in chunks:
                digest = text_hash(chunk.text)
                payload = new_payload(
                    pk,
                    chunk.index,
                    chunk.start_offset,
                    chunk.end_offset,
                    chunk.total_chunks,
                    digests(digest, whole, config, analysed_by),
                    chunk.metadata,
                    fields[pk],
                )
                if current.get((pk, chunk.index)) == payload:
                    report.reused += 1
                    continue  # unchanged: nothing to write
                read = normalize(chunk.text)  # what the model and the analyser see
                vector = reusable.get((pk, digest))
                if vector is not None:
                    report.reused += 1
                else:
                    to_embed.append((len(slots), read))
                pid = point_id(collection, pk, chunk.index)
                analysed = analyzer.document_vector(read)
                slots.append((pid, vector, payload, analysed))

        if to_embed:
            texts = [text for _, text in to_embed]
            self._check_window(binding, texts)
            self._check_coverage(binding, texts)
            started = time.perf_counter()
            vectors = binding.embedder.encode(texts)
            if signals.embedded.receivers:
                signals.embedded.send(
                    cls,
                    column=column.key,
                    count=len(texts),
                    model=binding.embedder.name,
                    seconds=time.perf_counter() - started,
                )
            for (slot, _), vector in zip(to_embed, vectors, strict=True):
                pid, _, payload, sparse = slots[slot]
                slots[slot] = (pid, vector, payload, sparse)
            report.embedded += len(texts)
        ready = [VectorPoint(pid, vec, payload, sparse) for pid, vec, payload, sparse in slots]
        if ready:
            store.upsert(target, ready)
            report.points += len(ready)
        # prune what an update left past a row's new last chunk; drop the rows that are gone
        prune = [
            (pk, len(chunks))
            for pk, _, chunks in rows
            if not chunks or stored_counts.get(pk, 0) > len(chunks)
        ]
        if prune:
            store.delete_rows(target, prune)
        upserted = [pk for pk, _, chunks in rows if chunks]
        deleted = [pk for pk, _, chunks in rows if not chunks]
        report.upserted += len(upserted)
        report.deleted += len(deleted)
        if signals.synced.receivers:
            signals.synced.send(
                cls, column=column.key, upserted=upserted, deleted=deleted, points=len(ready)
            )

    def _warn_split(
        self, binding: ColumnBinding, chunks: Sequence[Chunk], budget: int, extra: int
    ) -> None:
        """Warn once per column that its chunks overflow the model window (and were split)."""
        label = binding.label
        embedder = binding.embedder
        if label in self._warned or not isinstance(embedder, TokenAwareEmbedder):
            return
        self._warned.add(label)
        longest = max(len(embedder.token_spans(c.text)) for c in chunks)
        size = binding.column.settings.chunk_size
        warnings.warn(
            ChunkTooLongWarning(
                f"{label}: chunk_size={size} characters gives chunks of up to {longest} "
                f"tokens, but model {embedder.name!r} reads at most {embedder.max_seq_length} "
                f"tokens per chunk (max_seq_length). Those chunks are split further at token "
                f"boundaries ({extra} more chunks here) so that no text is silently truncated; "
                f"a chunk_size of about {max(1, size * budget // longest)} characters would "
                "avoid the second split."
            ),
            stacklevel=3,
        )

    def _check_coverage(self, binding: ColumnBinding, texts: Sequence[str]) -> None:
        """Warn once per column when its model cannot read most of the text (``[UNK]``)."""
        measure = getattr(binding.embedder, "coverage", None)
        if measure is None or binding.label in self._read:
            return
        self._read.add(binding.label)
        sample = [t for t in texts[:COVERAGE_SAMPLE] if t.strip()]
        if not sample:
            return
        share = sum(float(measure(t)) for t in sample) / len(sample)
        if share >= COVERAGE_WARNING:
            return
        warnings.warn(
            ModelCoverageWarning(
                f"{binding.label}: model {binding.embedder.name!r} reads only {share:.0%} of "
                f"this column's text as word pieces it knows (the rest is [UNK] or single "
                "characters): its dense vectors carry little meaning here. Hybrid search leans "
                "on keywords for such queries; for meaning, use a model trained on this "
                "language (README, 'Languages and models')."
            ),
            stacklevel=3,
        )

    def _check_window(self, binding: ColumnBinding, texts: Sequence[str]) -> None:
        """Warn once per column when chunks exceed the model's window (silent truncation).

        Only for embedders that cannot report token offsets; the others split such chunks.
        """
        embedder = binding.embedder
        label = binding.label
        if label in self._warned or isinstance(embedder, TokenAwareEmbedder):
            return
        limit = embedder.max_seq_length
        if not limit:
            return
        counts = embedder.count_tokens(texts)
        if not counts or max(counts) <= limit:
            return
        self._warned.add(label)
        over = sum(1 for c in counts if c > limit)
        longest, size = max(counts), binding.column.settings.chunk_size
        warnings.warn(
            ChunkTooLongWarning(
                f"{label}: chunk_size={size} characters gives chunks of up to {longest} "
                f"tokens ({over} of {len(counts)} over the limit), but model {embedder.name!r} "
                f"reads at most {limit} tokens per chunk (max_seq_length); the rest of those "
                f"chunks is ignored when embedding. Lower chunk_size (about "
                f"{size * limit // longest} characters would fit)."
            ),
            stacklevel=2,
        )
