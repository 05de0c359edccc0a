"""Structure tags: what kind of passage each chunk is (``SemanticText(tags=True)``).

Why tag chunks
--------------
A novel, a manual or a report is not uniform text. Chapter headings, quoted verse and the
storyteller's stock formulas are real parts of the document, but a search for what happens in a
chapter usually wants the narration, and a search for a poem wants the verse. :func:`structure`
splits a document into *blocks* and gives each one a type; :func:`tag_chunks` (and the
:class:`TaggingChunker` wrapper a column gets with ``SemanticText(tags=True)``) stores in each
chunk's ``metadata``:

``type``
    One of :data:`CHUNK_TYPES`: the type of the blocks that make up most of the chunk's
    non-whitespace characters (ties go to ``"text"``, then ``"verse"``, ``"title"``,
    ``"boilerplate"``). A heading merged with the paragraph below it is therefore ``"text"``;
    only a chunk that is (mostly) the heading itself is ``"title"``.
``types``
    Every type with visible characters in the chunk, the most present first (``type`` is the
    first): a couplet quoted inside a 900-character stretch of narration makes that chunk
    ``["text", "verse"]``. ``semantic_search(chunk_types=...)`` keeps the chunks that *contain*
    one of the types asked for (``types``); ``exclude_chunk_types=`` drops those that are
    *mostly* of them (``type``), so excluding ``"boilerplate"`` never drops the last page of
    story that ends with a closing formula.
``section``, ``section_index``, ``paragraph``
    Where the chunk starts: the heading line of its section (``None`` before the first heading),
    the section's number and the paragraph's number inside it (the heading line is paragraph 0).
    They are the same keys, computed the same way, as :class:`~.hybrid.HybridChunker`'s; a
    chunker that already sets them keeps its own values. Search uses them to de-duplicate
    passages (``semantic_search(..., dedupe="paragraph")``).

The block types
---------------
Sections and paragraphs are those of the ``"hybrid"`` chunker (headings matching
:data:`~.hybrid.DEFAULT_HEADING_PATTERN`; blank lines, or single line breaks in CJK text without
blank lines). Then, per paragraph:

``"title"``
    The heading line of a section (``第十三回 …``, ``# Usage``, ``Chapter 3``), and short
    stand-alone lines that look like headings: numbered (``1.2 Results``, ``IV. Scope``,
    ``一、``, ``（二）``), ``第N卷/部/篇``, ``Part …``, ``Appendix …``, ``楔子``, ``序``, and no
    sentence punctuation at the end.
``"verse"``
    Verse introduced by a formula of Chinese fiction and ending with a colon: ``诗曰：``,
    ``有诗为证：``, ``后人有诗叹曰：``, ``赞曰：``, ``词曰：``, ``偈云：``, ``一绝云：``,
    ``正是：``, ``念道：`` … The verse is the rest of the paragraph after the formula, or, when the
    formula ends a paragraph, the paragraphs after it, as long as they are *shaped like verse*:
    CJK clauses of 3 to 11 characters with no quotation marks (commentary in ``【】`` and
    ``（）`` is ignored). A paragraph that is only the formula (``正是：``) is verse too. Later
    paragraphs continue the verse while their clause lengths are ones the verse already used
    (a poem printed one line per paragraph). Without a formula nothing is verse: classical prose
    has short clauses too.
``"boilerplate"``
    The storyteller's closing formula, cut out of its paragraph as one sentence: ``且听下回分解``,
    ``且看下文分解``, ``下回便见``, ``未完待续`` …, and stand-alone ``To be continued`` /
    ``The end`` lines. Openers such as ``话说`` / ``却说`` are *not* tagged: ``却说`` also starts
    ordinary narration, and the rest of such a paragraph is story (strip openers from chunk
    starts with ``HybridChunker(clean=...)`` instead).
``"text"``
    Everything else.

Tagging only reads the text (it never moves a chunk's offsets) and runs in time linear in the
document. It is a recorded chunker setting: :class:`TaggingChunker` adds ``"tags"`` to the
wrapped chunker's ``config()``, so turning it on or off is reported as drift like any other
chunking change.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import regex

from ._core import Chunk, Chunker
from .hybrid import HybridChunker
from .sentence import CJK_CHAR

__all__ = [
    "CHUNK_TYPES",
    "TAGS_VERSION",
    "TYPES_KEY",
    "TYPE_KEY",
    "Block",
    "TaggingChunker",
    "structure",
    "tag_chunks",
]

CHUNK_TYPES: Final = ("title", "verse", "boilerplate", "text")
"""Every value of a tagged chunk's ``metadata["type"]``."""
TYPE_KEY: Final = "type"
"""The metadata key holding a chunk's type (the type of most of its characters)."""
TYPES_KEY: Final = "types"
"""The metadata key listing every type present in a chunk, the most present first."""
TAGS_VERSION: Final = 1
"""Bumped whenever the rules change; recorded in the chunker config as ``"structure/N"``."""

_TIE_ORDER = ("text", "verse", "title", "boilerplate")
# Only the section/paragraph walk of the hybrid chunker is used (default heading rule).
_SPLITTER = HybridChunker(chunk_size=1_000_000, overlap=0)

_INTRO = regex.compile(  # (Simplified and Traditional characters alike)
    r"(?:有[诗詩词詞赞讚贊偈][为為][证證]|[诗詩词詞赞讚贊偈][曰云]|歌曰|[颂頌]曰|[叹嘆歎]曰"
    r"|一[绝絕律][云曰]|念道|吟道|[诵誦]道|正是|怎[见見]得|但[见見])[^\S\r\n]*[:：]"
)
_CLOSING = regex.compile(
    r"下[回文](?:分解|便[见見]|便知|分[晓曉]|再[说說]|[细細][说說])|[且再请請][听聽看]下文"
    r"|未完待[续續]|全[书書]完|全文完|本回完|本章完"
)
_ENDING_LINE = regex.compile(
    r"(?i)^\W*(?:to be continued|the end|end of (?:the )?(?:chapter|part|book|volume)\b.*)\W*$"
)
_TITLE_LINE = regex.compile(
    r"[^\S\r\n]*(?:"
    r"\d{1,3}(?:\.\d{1,3})*\.?[^\S\r\n]+\S"
    r"|[IVXLC]{1,7}\.[^\S\r\n]+\S"
    r"|[一二三四五六七八九十百]{1,4}[、．]"
    r"|[（(][一二三四五六七八九十百0-9]{1,3}[）)]"
    r"|第[0-9０-９零〇一二三四五六七八九十百千两兩]+[卷部篇编編集幕]"
    r"|(?i:part|book|appendix|prologue|epilogue)\b"
    r"|楔子|引子|尾[声聲]|[后後][记記]|序[言章]?[^\S\r\n]*$"
    r")"
)
_TITLE_MAX = 60
_SENTENCE_END = "。！？!?；;.:：,，"
_TERMINATORS = "。！？!?；;\n\r"
_CLOSERS = "。！？!?”」』）)"
_NOTES = regex.compile(r"【[^】\r\n]*】|（[^）\r\n]*）|\([^)\r\n]*\)")
_BRACKETS = str.maketrans("", "", "【】《》〈〉")
_CLAUSE = regex.compile(r"[，,。！？!?；;、：:…—]+")
_QUOTES = frozenset('“”「」『』"')
_VERSE_MAX = 400  # characters of one verse paragraph, commentary removed
_CLAUSE_MIN, _CLAUSE_MAX = 3, 11
_PREFIX_MAX = 10  # a shorter lead-in before an inline formula joins the verse (e.g. "【庚辰：")
_LOOK_BACK = 200  # how far back a closing formula's sentence start is searched
_LEAD_MAX = 6  # characters before a formula that belong to it ("后人有诗" + "赞曰：")
_CLAUSE_ENDS = frozenset("，,。！？!?；;：:、」”】）) \t\r\n\u3000")


@dataclass(frozen=True, slots=True)
class Block:
    """One typed piece of a document: ``text[start:end]`` (trimmed), its type and position."""

    start: int
    end: int
    type: str
    """One of :data:`CHUNK_TYPES`."""
    section: str | None
    """The heading line of the section it is in (stripped), ``None`` before the first one."""
    section_index: int
    paragraph: int
    """Index of its paragraph inside the section (the heading line is paragraph 0)."""


@dataclass(slots=True)
class _Verse:
    """Verse state while walking a section's paragraphs."""

    pending: bool = False  # the previous piece ended with an introducing formula
    lengths: frozenset[int] = frozenset()  # clause lengths of the verse being read


def structure(text: str) -> list[Block]:
    """Split ``text`` into typed blocks, in document order (see the module docstring).

    Args:
        text: The document.

    Returns:
        Non-overlapping, whitespace-trimmed blocks covering every non-whitespace character.

    Raises:
        TypeError: If ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    blocks: list[Block] = []
    section_index = 0
    for a, b, heading_end, heading in _SPLITTER._sections(text):
        paragraphs = _SPLITTER._paragraphs(text, a, b, heading_end)
        if not paragraphs:
            continue
        verse = _Verse()
        for p, (s, e) in enumerate(paragraphs):
            if p == 0 and heading_end >= 0:
                pieces = [(s, e, "title")]
                verse = _Verse()
            else:
                pieces = _paragraph(text, s, e, verse)
            blocks.extend(Block(ps, pe, kind, heading, section_index, p) for ps, pe, kind in pieces)
        section_index += 1
    return blocks


def tag_chunks(chunks: Sequence[Chunk], text: str) -> list[Chunk]:
    """Return ``chunks`` with ``type``/``types``/``section``/``section_index``/``paragraph``
    metadata.

    Offsets, text and numbering are unchanged; metadata the chunks already have wins over the
    computed ``section``/``section_index``/``paragraph`` (``type`` and ``types`` are always
    set).

    Args:
        chunks: Chunks of ``text``, from any chunker.
        text: The document they were cut from.

    Returns:
        New chunks, one per input chunk, in the same order.
    """
    blocks = structure(text)
    starts = [blk.start for blk in blocks]
    out: list[Chunk] = []
    for chunk in chunks:
        weights: dict[str, int] = {}
        first: Block | None = None
        j = max(0, bisect.bisect_right(starts, chunk.start_offset) - 1)
        while j < len(blocks) and blocks[j].start < chunk.end_offset:
            blk = blocks[j]
            lo, hi = max(blk.start, chunk.start_offset), min(blk.end, chunk.end_offset)
            if hi > lo:
                visible = len("".join(text[lo:hi].split()))
                if visible:
                    weights[blk.type] = weights.get(blk.type, 0) + visible
                    first = first or blk
            j += 1
        if first is None and blocks:  # nothing visible in common: the block before it
            first = blocks[max(0, bisect.bisect_right(starts, chunk.start_offset) - 1)]
        ranked = sorted(_TIE_ORDER, key=lambda t: (-weights.get(t, 0), _TIE_ORDER.index(t)))
        meta: dict[str, Any] = dict(chunk.metadata)
        meta[TYPE_KEY] = ranked[0]
        meta[TYPES_KEY] = [t for t in ranked if weights.get(t)] or ranked[:1]
        if first is not None:
            meta.setdefault("section", first.section)
            meta.setdefault("section_index", first.section_index)
            meta.setdefault("paragraph", first.paragraph)
        out.append(dataclasses.replace(chunk, metadata=meta))
    return out


class TaggingChunker:
    """A chunker that tags the chunks of another one (what ``SemanticText(tags=True)`` uses).

    Args:
        inner: The chunker whose chunks are tagged; its chunks, offsets and sizes are kept.

    Raises:
        TypeError: If ``inner`` is not a :class:`~semantic_orm.chunking.Chunker`.

    Example:
        >>> tagged = TaggingChunker(HybridChunker(60, 0, merge_short=False))
        >>> text = "第一回　桃园结义\\n\\n话说天下大势，分久必合，合久必分。\\n\\n且听下回分解。"
        >>> [c.metadata["type"] for c in tagged.chunk(text)]
        ['title', 'text', 'boilerplate']
    """

    __slots__ = ("_inner",)

    def __init__(self, inner: Chunker) -> None:
        if not isinstance(inner, Chunker):
            raise TypeError(f"TaggingChunker wraps a Chunker, got {type(inner).__name__}")
        self._inner = inner

    @property
    def inner(self) -> Chunker:
        """The wrapped chunker."""
        return self._inner

    @property
    def chunk_size(self) -> int:
        """Maximum chunk length, in code points (the wrapped chunker's)."""
        return self._inner.chunk_size

    @property
    def overlap(self) -> int:
        """Maximum overlap of consecutive chunks, in code points (the wrapped chunker's)."""
        return self._inner.overlap

    def chunk(self, text: str) -> list[Chunk]:
        """The wrapped chunker's chunks of ``text``, tagged (see :func:`tag_chunks`)."""
        return tag_chunks(self._inner.chunk(text), text)

    def config(self) -> dict[str, Any]:
        """The wrapped chunker's config plus ``"tags": "structure/N"``."""
        return {**self._inner.config(), "tags": f"structure/{TAGS_VERSION}"}

    def __repr__(self) -> str:
        return f"TaggingChunker({self._inner!r})"


# -- one paragraph -----------------------------------------------------------------------------


def _paragraph(text: str, s: int, e: int, verse: _Verse) -> list[tuple[int, int, str]]:
    """Typed pieces of the paragraph ``text[s:e]`` (``verse`` carries over between them)."""
    if _is_title_line(text, s, e):
        verse.pending, verse.lengths = False, frozenset()
        return [(s, e, "title")]
    if _ENDING_LINE.match(text[s:e]):
        verse.pending, verse.lengths = False, frozenset()
        return [(s, e, "boilerplate")]
    out: list[tuple[int, int, str]] = []
    pos = s
    while pos < e:
        m = _CLOSING.search(text, pos, e)
        if m is None:
            out.extend(_prose(text, pos, e, verse))
            break
        bs, be = _sentence(text, pos, m.start(), m.end(), e)
        out.extend(_prose(text, pos, bs, verse))
        out.append((bs, be, "boilerplate"))
        verse.pending, verse.lengths = False, frozenset()
        pos = be
    return [(a, b, kind) for a, b, kind in (_trim(text, *piece) for piece in out) if a < b]


def _prose(text: str, s: int, e: int, verse: _Verse) -> list[tuple[int, int, str]]:
    """Pieces of a stretch without closing formulas: verse where a formula introduces it."""
    a, b, _ = _trim(text, s, e, "text")
    if a >= b:
        return []
    shape = _verse_shape(text, a, b)
    if shape is not None and (verse.pending or (verse.lengths and shape <= verse.lengths)):
        verse.pending = False
        verse.lengths = verse.lengths | shape if verse.lengths else shape
        return [(a, b, "verse")]
    verse.pending, verse.lengths = False, frozenset()
    for m in _INTRO.finditer(text, a, b):
        rest = _trim(text, m.end(), b, "verse")
        if rest[0] >= rest[1]:  # the formula ends the stretch: the verse follows
            verse.pending = True
            if _visible(text, a, m.start()) <= _PREFIX_MAX:
                return [(a, b, "verse")]  # a line that is only the formula, e.g. "正是："
            return [(a, b, "text")]
        shape = _verse_shape(text, rest[0], rest[1])
        if shape is None:
            continue
        verse.lengths = shape
        cut = _clause_start(text, a, m.start())  # "后人有诗赞曰：" starts at "后人"
        if _visible(text, a, cut) <= _PREFIX_MAX:
            return [(a, b, "verse")]
        return [(a, cut, "text"), (cut, b, "verse")]
    return [(a, b, "text")]


def _sentence(text: str, lo: int, start: int, end: int, hi: int) -> tuple[int, int]:
    """The sentence around a closing formula at ``text[start:end]``, within ``[lo, hi)``."""
    bs = start
    floor = max(lo, start - _LOOK_BACK)
    while bs > floor and text[bs - 1] not in _TERMINATORS:
        bs -= 1
    if bs == floor and floor > lo and text[bs - 1] not in _TERMINATORS:
        bs = start  # no sentence start nearby: the formula alone
    be = end
    while be < hi and text[be] not in _TERMINATORS and be - end < 20:
        be += 1  # the rest of the clause, e.g. "分解" + "矣"
    while be < hi and text[be] in _CLOSERS:
        be += 1
    return bs, be


def _clause_start(text: str, lo: int, pos: int) -> int:
    """Where the clause holding ``text[pos]`` starts, looking back at most a few characters."""
    start = pos
    while start > lo and pos - start < _LEAD_MAX and text[start - 1] not in _CLAUSE_ENDS:
        start -= 1
    return start if start == lo or text[start - 1] in _CLAUSE_ENDS else pos


def _verse_shape(text: str, s: int, e: int) -> frozenset[int] | None:
    """The clause lengths of ``text[s:e]`` if it is shaped like CJK verse, else ``None``."""
    if e - s > 4 * _VERSE_MAX:
        return None
    body = "".join(_NOTES.sub("", text[s:e]).translate(_BRACKETS).split())
    if not body or len(body) > _VERSE_MAX or any(ch in _QUOTES for ch in body):
        return None
    if 10 * len(CJK_CHAR.findall(body)) < 8 * len(body):
        return None
    lengths = frozenset(len(c) for c in _CLAUSE.split(body) if c)
    if not lengths or min(lengths) < _CLAUSE_MIN or max(lengths) > _CLAUSE_MAX:
        return None
    return lengths


def _is_title_line(text: str, s: int, e: int) -> bool:
    if e - s > _TITLE_MAX or "\n" in text[s:e] or "\r" in text[s:e]:
        return False
    return text[e - 1] not in _SENTENCE_END and _TITLE_LINE.match(text, s, e) is not None


def _visible(text: str, s: int, e: int) -> int:
    return len("".join(text[s:e].split()))


def _trim(text: str, s: int, e: int, kind: str) -> tuple[int, int, str]:
    while s < e and text[s].isspace():
        s += 1
    while e > s and text[e - 1].isspace():
        e -= 1
    return s, e, kind
