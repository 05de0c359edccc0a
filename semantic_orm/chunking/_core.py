"""Shared building blocks of every chunker: the :class:`Chunk` type, the protocols, and the
grapheme/whitespace helpers that make cuts safe.

Every helper here is *local*: it inspects at most one grapheme cluster or one run of
whitespace around the position it is given, never the whole document. That is what keeps the
chunkers linear in the size of the input. The separator :class:`_Level` objects search only a
bounded window (``chunk_size`` plus a small look-ahead) and first check with ``str.find``
whether a match is possible at all, because a regex scan of a window that cannot match is the
most common wasted work on real text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import regex

# Exactly the characters for which ``str.isspace()`` is true (checked by the test-suite).
WS_CHARS = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004"
    "\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# Whitespace where a line may be broken between words: all but the no-break spaces.
_BREAKABLE_WS_CHARS = "".join(ch for ch in WS_CHARS if ch not in "\xa0\u2007\u202f")
_CJK_TERMINATORS = "\u3002\uff61\uff01\uff1f\uff1b"  # 。｡！？； (｡: the half-width 。)
_LATIN_TERMINATORS = ".!?\u2026"


def char_class(chars: str) -> str:
    """Return the body of a regex character class matching exactly ``chars``."""
    return "".join(f"\\U{ord(ch):08x}" for ch in chars)


WS = char_class(WS_CHARS)

_GRAPHEME = regex.compile(r"\X")
NON_WS = regex.compile(f"[^{WS}]")
LAST_NON_WS = regex.compile(f"[^{WS}]", flags=regex.REVERSE)

_PARAGRAPH = r"\r?\n[^\S\r\n]*\r?\n|\u2029"
_LINE = r"[\n\r\x0b\x0c\x85\u2028]"
_SENTENCE = (
    # Latin terminators, optional closing quotes/brackets, then whitespace (not consumed).
    f"[{char_class(_LATIN_TERMINATORS)}][\"'\\u201d\\u2019)\\]\\u00bb]{{0,3}}(?=[{WS}])"
    # CJK terminators need no following space; closing brackets/quotes stay with the sentence.
    f"|[{char_class(_CJK_TERMINATORS)}]"
    "[\\u300d\\u300f\\uff09\\u201d\\u2019\\u3009\\u300b\\u3011]{0,3}"
)
_WORD = f"[{char_class(_BREAKABLE_WS_CHARS)}]"

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


def first_boundary_after(text: str, anchor: int, j: int, endpos: int) -> int:
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


# Characters that may join the *following* character into one cluster (CR, Prepend, ZWJ,
# regional indicators, Hangul jamo/syllables, and Extend for the Indic conjunct rule) and
# characters that may join the *preceding* one (Extend, ZWJ, SpacingMark, regional
# indicators, Hangul). Between two characters in neither class a boundary is certain (CR x LF
# is caught by CR being in the first class).
_JOINS_NEXT = regex.compile(
    r"[\r\p{GCB=Prepend}\p{GCB=ZWJ}\p{GCB=Regional_Indicator}\p{GCB=L}\p{GCB=V}\p{GCB=T}"
    r"\p{GCB=LV}\p{GCB=LVT}\p{GCB=Extend}]"
)
_JOINS_PREV = regex.compile(
    r"[\p{GCB=Extend}\p{GCB=ZWJ}\p{GCB=SpacingMark}\p{GCB=Regional_Indicator}\p{GCB=L}"
    r"\p{GCB=V}\p{GCB=T}\p{GCB=LV}\p{GCB=LVT}]"
)
_JOINS_NEXT_CACHE: dict[str, bool] = {}
_JOINS_PREV_CACHE: dict[str, bool] = {}


def _joins(ch: str, pattern: regex.Pattern[str], cache: dict[str, bool]) -> bool:
    hit = cache.get(ch)
    if hit is None:
        hit = cache[ch] = pattern.match(ch) is not None
    return hit


def is_boundary(text: str, i: int, anchor: int) -> bool:
    """Return whether index ``i`` is a grapheme boundary (``anchor <= i`` is a known one)."""
    if i <= anchor or i >= len(text):
        return True
    a, b = text[i - 1], text[i]
    if a < "\x80" and b < "\x80":
        # Between two ASCII characters the only rule that forbids a break is CR x LF.
        return not (a == "\r" and b == "\n")
    if not _joins(a, _JOINS_NEXT, _JOINS_NEXT_CACHE) and not _joins(
        b, _JOINS_PREV, _JOINS_PREV_CACHE
    ):
        return True  # e.g. between two ideographs: no rule can join them
    return first_boundary_after(text, anchor, i - 1, i + 1) == i


def snap_back(text: str, i: int, lo: int) -> int:
    """Return the largest grapheme boundary in ``[lo, i]``, treating ``lo`` as a boundary."""
    if i <= lo:
        return lo
    if is_boundary(text, i, lo):
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


def snap_forward(text: str, i: int, anchor: int, hi: int) -> int:
    """Return the smallest grapheme boundary in ``[i, hi]``, or ``hi`` if there is none.

    ``anchor <= i`` must be a known boundary.
    """
    if i >= hi or is_boundary(text, i, anchor):
        return i
    return first_boundary_after(text, anchor, i, hi)


def skip_ws(text: str, i: int, hi: int) -> int:
    """Return the first non-whitespace index in ``[i, hi)``, or ``hi`` if there is none."""
    if i < hi and not text[i].isspace():
        return i
    m = NON_WS.search(text, i, hi)
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

DEFAULT_LEVELS: tuple[_Level, ...] = (
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
            tuple(WS_CHARS + _CJK_TERMINATORS),
        ],
    ),
    _Level.from_pattern(
        "word", _WORD, cut_before=True, max_len=1, probes=[tuple(_BREAKABLE_WS_CHARS)]
    ),
    _CHAR_LEVEL,
)


def levels_from_separators(separators: Sequence[str]) -> tuple[_Level, ...]:
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


def chunks_from_spans(text: str, spans: Sequence[tuple[Any, ...]]) -> list[Chunk]:
    """Chunks for ``(start, end)`` or ``(start, end, metadata)`` spans of ``text``, numbered."""
    total = len(spans)
    out: list[Chunk] = []
    for i, span in enumerate(spans):
        start, end = int(span[0]), int(span[1])
        meta: Mapping[str, Any] = span[2] if len(span) > 2 else {}
        out.append(
            Chunk(
                text=text[start:end],
                index=i,
                start_offset=start,
                end_offset=end,
                total_chunks=total,
                metadata=dict(meta),
            )
        )
    return out


class SizedChunker:
    """Validated ``chunk_size``/``overlap`` shared by the built-in chunkers."""

    def __init__(self, chunk_size: int, overlap: int) -> None:
        _check_sizes(chunk_size, overlap)
        self._chunk_size = chunk_size
        self._overlap = overlap

    @property
    def chunk_size(self) -> int:
        """Maximum chunk length, in code points."""
        return self._chunk_size

    @property
    def overlap(self) -> int:
        """Maximum number of code points shared by two consecutive chunks."""
        return self._overlap


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
