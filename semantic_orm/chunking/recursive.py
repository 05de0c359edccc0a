"""The recursive, separator-aware splitter (strategy ``"recursive"``).

How the recursive splitter works
--------------------------------
:class:`RecursiveChunker` behaves like LangChain's ``RecursiveCharacterTextSplitter``: it
prefers to cut at paragraph breaks, then line breaks, then sentence ends (``. ``, ``! ``,
``? `` and the CJK terminators ``。！？；``, which need no following space), then whitespace
between words, and only as a last resort at an arbitrary grapheme boundary. Instead of
recursively splitting strings and re-finding the pieces afterwards, it walks the document once
with a cursor:

1. The chunk starts at ``start`` and may extend to ``limit = start + chunk_size``.
2. For each separator level, most preferred first, it searches *backwards* from ``limit`` for
   the last occurrence inside the window. The first level with a hit decides the cut, so a
   chunk packs as many whole pieces of that level as fit (greedy packing).
3. Trailing whitespace is excluded by moving the end offset back, and the end is snapped back
   to a grapheme boundary.
4. The next chunk starts at most ``overlap`` characters before that end, at the earliest
   paragraph, line, sentence or word start found in that region (leading whitespace skipped),
   or exactly at the end when no such boundary exists. A chunk that had to be hard-cut may get
   a hard-cut overlap start too.

Each step only looks at a window of about ``chunk_size`` characters around the cursor, so
chunking is linear in the length of the document, even for megabytes of text without a single
newline or space.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._core import (
    DEFAULT_LEVELS,
    LAST_NON_WS,
    Chunk,
    SizedChunker,
    chunks_from_spans,
    first_boundary_after,
    levels_from_separators,
    skip_ws,
    snap_back,
    snap_forward,
)

__all__ = ["RecursiveChunker"]


class RecursiveChunker(SizedChunker):
    """Separator-aware chunker with exact offsets, grapheme-safe cuts and linear running time.

    Cuts prefer paragraph breaks, then line breaks, then sentence ends, then whitespace, and
    fall back to a grapheme-boundary hard cut. See the module docstring for the algorithm.

    Args:
        chunk_size: Maximum chunk length in code points (``len`` of the chunk text).
        overlap: Maximum number of code points shared by consecutive chunks.
        separators: Literal separators to try, most preferred first, replacing the default
            paragraph/line/sentence/word hierarchy. Whitespace-only separators cut before
            themselves; other separators stay at the end of the chunk they terminate. An
            empty string (or the end of the list) means "hard cut at a grapheme boundary".

    Raises:
        ValueError: If ``chunk_size <= 0``, ``overlap < 0`` or ``overlap >= chunk_size``.
        TypeError: If a setting has the wrong type.

    Example:
        >>> chunker = RecursiveChunker(chunk_size=12, overlap=0)
        >>> [c.text for c in chunker.chunk("One two.\\n\\nThree four five.")]
        ['One two.', 'Three four', 'five.']
    """

    __slots__ = ("_chunk_size", "_levels", "_overlap", "_separators")

    def __init__(
        self,
        chunk_size: int = 1000,
        overlap: int = 200,
        separators: Sequence[str] | None = None,
    ) -> None:
        super().__init__(chunk_size, overlap)
        if isinstance(separators, str):
            raise TypeError("separators must be a sequence of strings, not a single string")
        self._separators: tuple[str, ...] | None = None if separators is None else tuple(separators)
        self._levels = (
            DEFAULT_LEVELS if self._separators is None else levels_from_separators(self._separators)
        )

    @property
    def separators(self) -> tuple[str, ...] | None:
        """Custom separators, or ``None`` for the default hierarchy."""
        return self._separators

    def __repr__(self) -> str:
        extra = "" if self._separators is None else f", separators={list(self._separators)!r}"
        return f"RecursiveChunker(chunk_size={self._chunk_size}, overlap={self._overlap}{extra})"

    def config(self) -> dict[str, Any]:
        """Describe the settings, e.g. to record what produced stored vectors.

        Returns:
            ``{"strategy": "recursive", "chunk_size": ..., "overlap": ...}``, plus
            ``"separators"`` (a list) when custom separators were given.
        """
        cfg: dict[str, Any] = {
            "strategy": "recursive",
            "chunk_size": self._chunk_size,
            "overlap": self._overlap,
        }
        if self._separators is not None:
            cfg["separators"] = list(self._separators)
        return cfg

    def chunk(self, text: str) -> list[Chunk]:
        """Split ``text`` into chunks of at most ``chunk_size`` code points.

        Args:
            text: The document to split.

        Returns:
            Chunks in document order with exact offsets; ``[]`` for empty or
            whitespace-only text. Starts and ends are strictly increasing, every
            non-whitespace character is in at least one chunk, and consecutive chunks share
            at most ``overlap`` code points.

        Raises:
            TypeError: If ``text`` is not a ``str``.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        spans = self.spans(text)
        return chunks_from_spans(text, spans)

    # -- internals ------------------------------------------------------------------------

    def spans(self, text: str, lo: int = 0, hi: int | None = None) -> list[tuple[int, int]]:
        """Return the chunk spans of ``text[lo:hi]``, in offsets of ``text``.

        ``lo`` and ``hi`` must be grapheme boundaries; the other chunkers use this to split an
        over-long sentence or paragraph in place, without copying it.
        """
        n = len(text) if hi is None else hi
        size = self._chunk_size
        spans: list[tuple[int, int]] = []
        prev_start, prev_end, prev_hard = -1, lo, False
        while True:
            # First character the next chunk must cover, and the smallest end that covers it.
            first = skip_ws(text, prev_end, n)
            if first >= n:
                break
            # (bounded: anything past first + size cannot fit in a chunk anyway)
            min_end = first_boundary_after(text, prev_end, first, min(n, first + size + 1))
            start = -1
            if spans and self._overlap:
                start = self._overlap_start(text, prev_start, prev_end, prev_hard)
                if start >= 0 and min_end - start > size:
                    start = -1  # overlapping would leave no room for new text
            if start < 0:
                start = snap_back(text, first, prev_end)
            limit = min(start + size, n)
            hard = False
            if min_end > limit:
                # A single grapheme cluster longer than chunk_size: cut inside it.
                end, hard = limit, True
            elif limit == n:
                end = self._trim_end(text, n, min_end)
            else:
                end, hard = self._find_cut(text, start, min_end, limit)
            spans.append((start, end))
            prev_start, prev_end, prev_hard = start, end, hard
        return spans

    def _find_cut(self, text: str, start: int, min_end: int, limit: int) -> tuple[int, bool]:
        """Return ``(end, hard)`` for a chunk starting at ``start``; end in [min_end, limit]."""
        for level in self._levels:
            if level.forward is None:
                return self._trim_end(text, snap_back(text, limit, min_end), min_end), True
            cut = level.last_cut(text, min_end, limit, start)
            if cut is not None:
                return self._trim_end(text, cut, min_end), False
        raise AssertionError("unreachable: the hierarchy always ends with the char level")

    @staticmethod
    def _trim_end(text: str, cut: int, min_end: int) -> int:
        """Move ``cut`` back over trailing whitespace, then onto a grapheme boundary."""
        end = cut
        if end > min_end and text[end - 1].isspace():
            m = LAST_NON_WS.search(text, min_end, end)
            end = min_end if m is None else max(min_end, int(m.end()))
        return snap_back(text, end, min_end)

    def _overlap_start(self, text: str, prev_start: int, prev_end: int, prev_hard: bool) -> int:
        """Return where the next chunk starts inside the previous one, or -1 for no overlap."""
        lo = max(prev_end - self._overlap, prev_start + 1)
        if lo >= prev_end:
            return -1
        for level in self._levels:
            if level.forward is None:
                if not prev_hard:
                    return -1
                candidate: int | None = lo
            else:
                candidate = level.first_start(text, lo, prev_end, prev_start)
            if candidate is None:
                continue
            pos = candidate
            while pos < prev_end:
                pos = skip_ws(text, pos, prev_end)
                if pos >= prev_end:
                    break
                snapped = snap_forward(text, pos, prev_start, prev_end)
                if snapped == pos:
                    return pos
                pos = snapped
        return -1
