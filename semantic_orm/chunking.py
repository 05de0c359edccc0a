"""Split text into overlapping, offset-exact chunks ready for embedding.

What a chunk is
---------------
Embedding models accept a bounded amount of text, and retrieval works best when each vector
describes one coherent passage. A :class:`Chunk` is such a passage: a contiguous slice of the
original document plus its position (``index`` out of ``total_chunks``) and its character
offsets.

The offset guarantee
--------------------
Offsets count Unicode code points, i.e. they are ordinary Python ``str`` indices into the
*original*, unmodified text, and for every chunk::

    original[chunk.start_offset:chunk.end_offset] == chunk.text

Chunkers never edit text: trimming whitespace, snapping to character boundaries and adding
overlap are all done by moving offsets. This lets callers highlight a hit in the source
document, or re-derive a chunk's text from the stored document, with no fuzzy searching.

Every offset also falls on an *extended grapheme cluster* boundary (what a reader perceives as
one character): a chunk never separates ``e`` from a following combining accent, never cuts a
ZWJ emoji sequence such as ``👩\u200d👩\u200d👧``, a flag (regional-indicator pair), an emoji
with its skin-tone modifier or variation selector, or a ``\\r\\n`` pair. The one exception is a
single grapheme cluster longer than ``chunk_size`` (for example a base letter followed by
thousands of combining marks): since no boundary exists inside it, it is hard-cut so that the
size limit still holds.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import regex

__all__ = [
    "Chunk",
    "Chunker",
    "ChunkerFactory",
    "RecursiveChunker",
    "available_chunkers",
    "get_chunker",
    "register_chunker",
]

# Exactly the characters for which ``str.isspace()`` is true (checked by the test-suite).
_WS_CHARS = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004"
    "\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# Whitespace where a line may be broken between words: all but the no-break spaces.
_BREAKABLE_WS_CHARS = "".join(ch for ch in _WS_CHARS if ch not in "\xa0\u2007\u202f")
_CJK_TERMINATORS = "\u3002\uff01\uff1f\uff1b"  # 。！？；
_LATIN_TERMINATORS = ".!?\u2026"


def _char_class(chars: str) -> str:
    """Return the body of a regex character class matching exactly ``chars``."""
    return "".join(f"\\U{ord(ch):08x}" for ch in chars)


_WS = _char_class(_WS_CHARS)

_GRAPHEME = regex.compile(r"\X")
_NON_WS = regex.compile(f"[^{_WS}]")
_LAST_NON_WS = regex.compile(f"[^{_WS}]", flags=regex.REVERSE)

_PARAGRAPH = r"\r?\n[^\S\r\n]*\r?\n|\u2029"
_LINE = r"[\n\r\x0b\x0c\x85\u2028]"
_SENTENCE = (
    # Latin terminators, optional closing quotes/brackets, then whitespace (not consumed).
    f"[{_char_class(_LATIN_TERMINATORS)}][\"'\\u201d\\u2019)\\]\\u00bb]{{0,3}}(?=[{_WS}])"
    # CJK terminators need no following space; closing brackets/quotes stay with the sentence.
    f"|[{_char_class(_CJK_TERMINATORS)}]"
    "[\\u300d\\u300f\\uff09\\u201d\\u2019\\u3009\\u300b\\u3011]{0,3}"
)
_WORD = f"[{_char_class(_BREAKABLE_WS_CHARS)}]"

# How far past the window a separator match may need to look (e.g. for ``(?=\s)``).
_MAX_SEPARATOR_LOOK = 64


# --------------------------------------------------------------------------------------------
# Public data types
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chunk:
    """One contiguous, offset-exact slice of a document.

    Attributes:
        text: The chunk's text, exactly ``original[start_offset:end_offset]``.
        index: Zero-based position of this chunk in the document's chunk list.
        start_offset: Code-point index in the original text where the chunk starts.
        end_offset: Code-point index in the original text just past the chunk's end.
        total_chunks: Number of chunks the document was split into.
        metadata: Free-form extra information. Excluded from equality and hashing.

    Raises:
        ValueError: If the offsets, index or text length are inconsistent.
    """

    text: str
    index: int
    start_offset: int
    end_offset: int
    total_chunks: int
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.index < 0 or self.index >= self.total_chunks:
            raise ValueError(
                f"index must be in [0, total_chunks), got index={self.index}, "
                f"total_chunks={self.total_chunks}"
            )
        if self.start_offset < 0 or self.end_offset < self.start_offset:
            raise ValueError(
                "offsets must satisfy 0 <= start_offset <= end_offset, got "
                f"start_offset={self.start_offset}, end_offset={self.end_offset}"
            )
        if self.end_offset - self.start_offset != len(self.text):
            raise ValueError(
                f"end_offset - start_offset ({self.end_offset - self.start_offset}) must equal "
                f"len(text) ({len(self.text)})"
            )


@runtime_checkable
class Chunker(Protocol):
    """Anything that can split a document into :class:`Chunk` objects.

    Implementations must return chunks whose offsets satisfy
    ``text[c.start_offset:c.end_offset] == c.text`` and must be deterministic, because the
    chunk list is stored alongside the vectors.
    """

    @property
    def chunk_size(self) -> int:
        """Maximum chunk length, in code points."""
        ...

    @property
    def overlap(self) -> int:
        """Maximum number of code points shared by two consecutive chunks."""
        ...

    def chunk(self, text: str) -> list[Chunk]:
        """Split ``text`` into chunks.

        Args:
            text: The document to split.

        Returns:
            The chunks, in document order. Empty or whitespace-only text gives ``[]``.
        """
        ...

    def config(self) -> dict[str, Any]:
        """Describe this chunker's settings as a JSON-serialisable dict.

        Returns:
            A dict containing at least ``"strategy"``, ``"chunk_size"`` and ``"overlap"``.
        """
        ...


class ChunkerFactory(Protocol):
    """A callable that builds a :class:`Chunker` from size settings (see ``register_chunker``)."""

    def __call__(self, *, chunk_size: int, overlap: int) -> Chunker:
        """Build a chunker.

        Args:
            chunk_size: Maximum chunk length in code points.
            overlap: Maximum overlap between consecutive chunks in code points.

        Returns:
            A new chunker.
        """
        ...


# --------------------------------------------------------------------------------------------
# Grapheme and whitespace helpers (all local: they never scan more than a cluster or a run)
# --------------------------------------------------------------------------------------------


def _first_boundary_after(text: str, anchor: int, j: int, endpos: int) -> int:
    """Return the first grapheme boundary after index ``j``, looking no further than ``endpos``.

    ``anchor <= j`` must be a known boundary. Rules such as regional-indicator pairing look
    back an unbounded distance, so the search runs on ``text[anchor:endpos]``: no rule needs
    context from before a boundary, and bounding the slice keeps a run of a million flags or
    combining marks from being rescanned for every chunk. Within the slice, ``regex``'s
    ``\\X`` inspects context on both sides of its start, so even when ``j`` lies inside a
    cluster the match ends at that cluster's true end. The result is exact when it is smaller
    than ``endpos``; a result equal to ``endpos`` only means "no boundary before ``endpos``".
    """
    m = _GRAPHEME.match(text[anchor:endpos], j - anchor)
    assert m is not None  # \X always matches at least one character when j < endpos
    return anchor + int(m.end())


def _is_boundary(text: str, i: int, anchor: int) -> bool:
    """Return whether index ``i`` is a grapheme boundary (``anchor <= i`` is a known one)."""
    if i <= anchor or i >= len(text):
        return True
    a, b = text[i - 1], text[i]
    if a < "\x80" and b < "\x80":
        # Between two ASCII characters the only rule that forbids a break is CR x LF.
        return not (a == "\r" and b == "\n")
    return _first_boundary_after(text, anchor, i - 1, i + 1) == i


def _snap_back(text: str, i: int, lo: int) -> int:
    """Return the largest grapheme boundary in ``[lo, i]``, treating ``lo`` as a boundary."""
    if i <= lo:
        return lo
    if _is_boundary(text, i, lo):
        return i
    # "there is a boundary in (j, i]" is monotone in j: find the largest such j in
    # [lo - 1, i - 1] by galloping backwards, then bisecting. Only reached when i lies inside
    # a cluster; the common case returns above.
    window = text[lo : i + 1]
    limit = i - lo

    def has_boundary_after(j: int) -> bool:  # j relative to lo
        m = _GRAPHEME.match(window, j)
        assert m is not None
        return int(m.end()) <= limit

    bad = limit - 1
    step = 1
    while True:
        j = bad - step
        if j < 0:
            good = -1
            break
        if has_boundary_after(j):
            good = j
            break
        bad = j
        step *= 2
    while bad - good > 1:
        mid = (good + bad) // 2
        if has_boundary_after(mid):
            good = mid
        else:
            bad = mid
    return lo + good + 1


def _snap_forward(text: str, i: int, anchor: int, hi: int) -> int:
    """Return the smallest grapheme boundary in ``[i, hi]``, or ``hi`` if there is none.

    ``anchor <= i`` must be a known boundary.
    """
    if i >= hi or _is_boundary(text, i, anchor):
        return i
    return _first_boundary_after(text, anchor, i, hi)


def _skip_ws(text: str, i: int, hi: int) -> int:
    """Return the first non-whitespace index in ``[i, hi)``, or ``hi`` if there is none."""
    if i < hi and not text[i].isspace():
        return i
    m = _NON_WS.search(text, i, hi)
    return hi if m is None else int(m.start())


# --------------------------------------------------------------------------------------------
# Separator levels
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Level:
    """One separator level of the hierarchy (``forward is None`` means hard character cut)."""

    name: str
    forward: regex.Pattern[str] | None
    backward: regex.Pattern[str] | None
    cut_before: bool  # cut before the separator (whitespace) or after it (punctuation)
    max_len: int  # how far a match may extend beyond the position we care about
    # Every match contains, for each group, one of the group's strings: a cheap ``str.find``
    # pre-check that skips the (much slower) regex scan of windows that cannot match, e.g.
    # paragraph breaks in a text without newlines.
    probes: tuple[tuple[str, ...], ...] = ()

    def _may_match(self, text: str, pos: int, endpos: int) -> bool:
        find = text.find
        for group in self.probes:  # plain loops: this runs several times per chunk
            for probe in group:
                if find(probe, pos, endpos) >= 0:
                    break
            else:
                return False
        return True

    @classmethod
    def from_pattern(
        cls,
        name: str,
        pattern: str,
        *,
        cut_before: bool,
        max_len: int,
        probes: Sequence[Sequence[str]] = (),
    ) -> _Level:
        return cls(
            name=name,
            forward=regex.compile(pattern),
            backward=regex.compile(pattern, flags=regex.REVERSE),
            cut_before=cut_before,
            max_len=max_len,
            probes=tuple(tuple(group) for group in probes),
        )

    def last_cut(self, text: str, lo: int, hi: int, floor: int) -> int | None:
        """Return the largest cut position in ``[lo, hi]`` for this level, or ``None``.

        Only separators starting at or after ``floor`` (the chunk start) are considered.
        """
        assert self.backward is not None
        pos = lo if self.cut_before else max(floor, lo - self.max_len)
        endpos = min(len(text), hi + self.max_len)
        if not self._may_match(text, pos, endpos):
            return None
        for m in self.backward.finditer(text, pos, endpos):
            cut = m.start() if self.cut_before else m.end()
            if cut > hi:
                continue
            return cut if cut >= lo else None
        return None

    def first_start(self, text: str, lo: int, hi: int, floor: int) -> int | None:
        """Return the smallest piece start (just after a separator) in ``[lo, hi)``."""
        assert self.forward is not None
        pos = max(floor, lo - self.max_len)
        if not self._may_match(text, pos, hi):
            return None
        for m in self.forward.finditer(text, pos, hi):
            start = m.end()
            if start < lo:
                continue
            return start if start < hi else None
        return None


_CHAR_LEVEL = _Level(name="char", forward=None, backward=None, cut_before=True, max_len=0)

_DEFAULT_LEVELS: tuple[_Level, ...] = (
    _Level.from_pattern(
        "paragraph",
        _PARAGRAPH,
        cut_before=True,
        max_len=_MAX_SEPARATOR_LOOK,
        probes=[("\n", "\u2029")],
    ),
    _Level.from_pattern(
        "line", _LINE, cut_before=True, max_len=1, probes=[tuple("\n\r\x0b\x0c\x85\u2028")]
    ),
    _Level.from_pattern(
        "sentence",
        _SENTENCE,
        cut_before=False,
        max_len=_MAX_SEPARATOR_LOOK,
        probes=[
            tuple(_LATIN_TERMINATORS + _CJK_TERMINATORS),
            tuple(_WS_CHARS + _CJK_TERMINATORS),
        ],
    ),
    _Level.from_pattern(
        "word", _WORD, cut_before=True, max_len=1, probes=[tuple(_BREAKABLE_WS_CHARS)]
    ),
    _CHAR_LEVEL,
)


def _levels_from_separators(separators: Sequence[str]) -> tuple[_Level, ...]:
    levels: list[_Level] = []
    seen: set[str] = set()
    for sep in separators:
        if not isinstance(sep, str):
            raise TypeError(f"separators must be strings, got {type(sep).__name__}")
        if sep in seen:
            continue
        seen.add(sep)
        if sep == "":
            break  # "" means "split anywhere": the hard-cut level, which ends the hierarchy
        levels.append(
            _Level.from_pattern(
                repr(sep),
                regex.escape(sep),
                cut_before=sep.isspace(),
                max_len=len(sep),
                probes=[(sep,)],
            )
        )
    levels.append(_CHAR_LEVEL)
    return tuple(levels)


# --------------------------------------------------------------------------------------------
# RecursiveChunker
# --------------------------------------------------------------------------------------------


def _check_sizes(chunk_size: int, overlap: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
        raise TypeError(f"chunk_size must be an int, got {type(chunk_size).__name__}")
    if isinstance(overlap, bool) or not isinstance(overlap, int):
        raise TypeError(f"overlap must be an int, got {type(overlap).__name__}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be > 0, got {chunk_size}")
    if overlap < 0:
        raise ValueError(f"overlap must be >= 0, got {overlap}")
    if overlap >= chunk_size:
        raise ValueError(f"overlap ({overlap}) must be smaller than chunk_size ({chunk_size})")


class RecursiveChunker:
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
        _check_sizes(chunk_size, overlap)
        if isinstance(separators, str):
            raise TypeError("separators must be a sequence of strings, not a single string")
        self._chunk_size = chunk_size
        self._overlap = overlap
        self._separators: tuple[str, ...] | None = None if separators is None else tuple(separators)
        self._levels = (
            _DEFAULT_LEVELS
            if self._separators is None
            else _levels_from_separators(self._separators)
        )

    @property
    def chunk_size(self) -> int:
        """Maximum chunk length, in code points."""
        return self._chunk_size

    @property
    def overlap(self) -> int:
        """Maximum number of code points shared by two consecutive chunks."""
        return self._overlap

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
        spans = self._spans(text)
        total = len(spans)
        return [
            Chunk(text=text[s:e], index=i, start_offset=s, end_offset=e, total_chunks=total)
            for i, (s, e) in enumerate(spans)
        ]

    # -- internals ------------------------------------------------------------------------

    def _spans(self, text: str) -> list[tuple[int, int]]:
        n = len(text)
        size = self._chunk_size
        spans: list[tuple[int, int]] = []
        prev_start, prev_end, prev_hard = -1, 0, False
        while True:
            # First character the next chunk must cover, and the smallest end that covers it.
            first = _skip_ws(text, prev_end, n)
            if first >= n:
                break
            # (bounded: anything past first + size cannot fit in a chunk anyway)
            min_end = _first_boundary_after(text, prev_end, first, min(n, first + size + 1))
            start = -1
            if spans and self._overlap:
                start = self._overlap_start(text, prev_start, prev_end, prev_hard)
                if start >= 0 and min_end - start > size:
                    start = -1  # overlapping would leave no room for new text
            if start < 0:
                start = _snap_back(text, first, prev_end)
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
                return self._trim_end(text, _snap_back(text, limit, min_end), min_end), True
            cut = level.last_cut(text, min_end, limit, start)
            if cut is not None:
                return self._trim_end(text, cut, min_end), False
        raise AssertionError("unreachable: the hierarchy always ends with the char level")

    @staticmethod
    def _trim_end(text: str, cut: int, min_end: int) -> int:
        """Move ``cut`` back over trailing whitespace, then onto a grapheme boundary."""
        end = cut
        if end > min_end and text[end - 1].isspace():
            m = _LAST_NON_WS.search(text, min_end, end)
            end = min_end if m is None else max(min_end, int(m.end()))
        return _snap_back(text, end, min_end)

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
                pos = _skip_ws(text, pos, prev_end)
                if pos >= prev_end:
                    break
                snapped = _snap_forward(text, pos, prev_start, prev_end)
                if snapped == pos:
                    return pos
                pos = snapped
        return -1


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

_REGISTRY: dict[str, ChunkerFactory] = {}


def register_chunker(name: str, factory: ChunkerFactory, *, replace: bool = False) -> None:
    """Make a chunking strategy available to :func:`get_chunker` under ``name``.

    Args:
        name: Strategy name, as stored in ``config()["strategy"]``.
        factory: Callable accepting ``chunk_size=`` and ``overlap=`` keyword arguments and
            returning a :class:`Chunker` (a chunker class usually qualifies).
        replace: Allow replacing an existing registration.

    Raises:
        ValueError: If ``name`` is empty or already registered and ``replace`` is false.
        TypeError: If ``factory`` is not callable.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"chunker name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory for chunker {name!r} must be callable")
    if name in _REGISTRY and not replace:
        raise ValueError(
            f"chunker strategy {name!r} is already registered; pass replace=True to override"
        )
    _REGISTRY[name] = factory


def available_chunkers() -> list[str]:
    """Return the registered strategy names, sorted.

    Returns:
        The names accepted by :func:`get_chunker`.
    """
    return sorted(_REGISTRY)


def get_chunker(
    strategy: str | Chunker = "recursive",
    *,
    chunk_size: int = 1000,
    overlap: int = 200,
) -> Chunker:
    """Resolve a strategy name (or pass through a chunker instance).

    Args:
        strategy: A registered strategy name, or an object implementing :class:`Chunker`,
            which is returned unchanged (``chunk_size`` and ``overlap`` are then ignored).
        chunk_size: Maximum chunk length in code points, for named strategies.
        overlap: Maximum overlap between consecutive chunks, for named strategies.

    Returns:
        A chunker.

    Raises:
        ValueError: If the strategy name is unknown (the message lists the known ones), or
            the sizes are invalid.
        TypeError: If ``strategy`` is neither a string nor a chunker, or a factory returns
            something that is not a chunker.
    """
    if isinstance(strategy, str):
        factory = _REGISTRY.get(strategy)
        if factory is None:
            known = ", ".join(repr(name) for name in available_chunkers()) or "none"
            raise ValueError(f"unknown chunking strategy {strategy!r}; known strategies: {known}")
        chunker = factory(chunk_size=chunk_size, overlap=overlap)
        if not isinstance(chunker, Chunker):
            raise TypeError(f"factory for chunking strategy {strategy!r} did not return a Chunker")
        return chunker
    if isinstance(strategy, Chunker):
        return strategy
    raise TypeError(f"strategy must be a strategy name or a Chunker, got {type(strategy).__name__}")


register_chunker("recursive", RecursiveChunker)
