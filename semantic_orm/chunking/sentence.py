"""Multilingual sentence segmentation and the sentence-packing chunker (strategy ``"sentence"``).

Finding sentence ends without a model
-------------------------------------
A full sentence tokenizer (spaCy, punkt, ICU) is a heavy dependency and still needs network
downloads for its models. For chunking we only need *good cut points*, so the rules here are
deliberately small, run in one forward regex scan, and never look more than a few dozen
characters around a candidate:

* **Latin scripts**: a run of ``. ! ? …`` followed by whitespace (or the end of the text) ends
  a sentence. Closing quotes and brackets right after the terminator (``"`` ``'`` ``”``
  ``’`` ``)`` ``]`` ``»``, and ``» `` after a French space as in ``Où ? »``) stay with their
  sentence. A single ``.`` is *not* an end after a known abbreviation (French ``M.``,
  ``Mme.``, ``p. ex.``; English ``Dr.``, ``Mr.``, ``e.g.``, ``i.e.``, see
  :data:`ABBREVIATIONS`) or a single capital initial (``J. K. Rowling``, ``U.S.``).
  ``etc.`` and ``al.`` (see :data:`FINAL_ABBREVIATIONS`) end a sentence only when the next
  word is capitalised. A decimal such as ``3.14`` never qualifies, because no space follows
  the dot. Finally, a Latin candidate followed by a lower-case letter is rejected: that is
  how ``« Où ? » demanda-t-il`` and ``He said "hi!" and left`` stay in one piece.
* **CJK**: ``。！？；`` and the full-width ``．`` (and the half-width ``｡``) end a sentence
  with no following space, because Chinese and Japanese put none. Closing brackets and quotes
  (``」』）”’》〉】``) right after the terminator stay with it, so ``“……。”`` ends *after*
  the quote.
* **Breaks**: a blank line (or U+2029) always ends a sentence, so headings and list items do
  not glue onto the next paragraph. A single line break ends one unless it sits inside
  flowing non-CJK text (a letter, digit or ``,;:-`` before it and a letter or digit after it):
  hard-wrapped English prose keeps its sentences whole, while Chinese text with one
  paragraph per line, or a heading line such as ``第一回 …``, is split at its newlines.

Each sentence is then trimmed of surrounding whitespace *by moving offsets*, with both ends
kept on grapheme-cluster boundaries (a terminator followed by a combining mark keeps the mark).

Packing
-------
:class:`SentenceChunker` packs whole sentences greedily: a chunk takes sentences while the
span from its first character to the end of the next sentence fits in ``chunk_size``. The
next chunk starts with as many *whole* trailing sentences of the previous chunk as fit within
``overlap`` characters (possibly none), so overlap never starts mid-sentence. A single sentence
longer than ``chunk_size`` is handed to :class:`~semantic_orm.chunking.RecursiveChunker`,
which splits it in place (offsets of the original text, no copying) at lines, words or
grapheme boundaries; overlap inside it follows the recursive rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import regex

from ._core import (
    LAST_NON_WS,
    NON_WS,
    WS,
    Chunk,
    SizedChunker,
    char_class,
    chunks_from_spans,
    is_boundary,
    skip_ws,
    snap_back,
    snap_forward,
)
from .recursive import RecursiveChunker

__all__ = ["ABBREVIATIONS", "FINAL_ABBREVIATIONS", "SentenceChunker", "sentence_spans"]

#: Words that, followed by a single ``.``, never end a sentence (matched case-sensitively,
#: after a non-letter). Multi-word forms may contain a dot and one optional space.
ABBREVIATIONS: tuple[str, ...] = (
    # French
    "M", "MM", "Mme", "Mmes", "Mlle", "Mlles", "Mgr", "Me", "Pr", "Dr", "St", "Ste",
    "p. ex", "p.ex", "cf", "Cf", "env", "av", "apr", "J.-C", "chap", "vol", "éd", "ibid",
    "n°", "art", "fig", "p", "pp", "op. cit",
    # English
    "Mr", "Mrs", "Ms", "Mx", "Prof", "Sr", "Jr", "Gen", "Col", "Capt", "Lt", "Sgt", "Rev",
    "Hon", "Mt", "Ft", "No", "Nos", "Vol", "Fig", "Eq", "e.g", "i.e", "E.g", "I.e", "vs", "viz",
    "approx", "ca", "Inc", "Ltd", "Co", "Corp", "Jan", "Feb", "Mar", "Apr", "Jun", "Jul",
    "Aug", "Sep", "Sept", "Oct", "Nov", "Dec",
)  # fmt: skip
#: Abbreviations that often end a sentence: a boundary only if the next word is capitalised.
FINAL_ABBREVIATIONS: tuple[str, ...] = ("etc", "al", "cie", "Cie")

# Characters that close a quotation or bracket and stay with the sentence they end.
_CLOSERS = "\"'\u201d\u2019)\\]\u00bb\u300d\u300f\uff09\u3009\u300b\u3011\uff3d\uff63\u3015\u3017"
_LATIN_TERMS = ".!?\u2026\u203c\u2047\u2048\u2049"
_CJK_TERMS = "\u3002\uff01\uff1f\uff1b\uff0e\uff61"  # 。！？；．｡
# Japanese quotative particles: after 「…。」 they continue the sentence.
_QUOTATIVES = ("と", "って", "とか")
_LINE_BREAKS = "\n\r\x0b\x0c\x85\u2028"
# A CJK character: ideographs, kana, hangul, CJK punctuation and full-width forms.
_CJK = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\u3000-\u303f\uff00-\uffef"

_SCAN = regex.compile(
    # Blank line or paragraph separator: the sentence ends where the break starts.
    r"(?P<para>\r?\n[^\S\r\n]*\r?\n|\u2029)"
    # Latin terminator run, closing quotes/brackets (French "» " after a space), then space/end.
    f"|(?P<lat>(?P<term>[{char_class(_LATIN_TERMS)}]+)"
    f"(?:[{_CLOSERS}]|[ \\u00a0\\u202f\\u2009]\\u00bb)*)(?=[{WS}]|\\Z)"
    # CJK terminators need no following space ("．" between digits is a decimal point).
    f"|(?P<cjk>(?:\\uff0e(?![0-9\\uff10-\\uff19])|[{char_class(_CJK_TERMS[:-2])}\\uff61])+"
    f"[{_CLOSERS}]*)"
    # A single line break (CRLF as one): a boundary unless inside flowing non-CJK text.
    f"|(?P<line>\\r\\n|[{char_class(_LINE_BREAKS)}])"
)


def _alternation(words: Sequence[str]) -> str:
    parts = sorted(words, key=len, reverse=True)  # longest first: "Mme" before "M"
    return "|".join(regex.escape(w, literal_spaces=True).replace(" ", " ?") for w in parts)


# Matched against the text just before a single "." (a slice, so "^" is its start).
_NEVER_END = regex.compile(
    rf"(?:^|[^\p{{L}}\p{{M}}\p{{N}}])(?:{_alternation(ABBREVIATIONS)}|\p{{Lu}})\Z"
)
_END_IF_CAPITAL = regex.compile(
    rf"(?:^|[^\p{{L}}\p{{M}}\p{{N}}])(?:{_alternation(FINAL_ABBREVIATIONS)})\Z"
)
# Longest run of letters that ends an abbreviation ("approx"); a longer word is no abbreviation.
_LONGEST_WORD_ABBREV = 1 + max(
    len(regex.split(r"[^\p{L}]", w)[-1]) for w in (*ABBREVIATIONS, *FINAL_ABBREVIATIONS)
)
_ABBREV_LOOKBACK = 24  # longer than any abbreviation plus its leading separator
_LOOKAHEAD = 64  # how far to look for the next word after a candidate
# "Flowing text" on both sides of a single line break means no sentence boundary there.
_FLOW_BEFORE = regex.compile(r"[\p{L}\p{M}\p{N},;:\-\u2013\u2014]")
_FLOW_AFTER = regex.compile(r"[\p{L}\p{N}]")
CJK_CHAR = regex.compile(f"[{_CJK}]")
_LOWER = regex.compile(r"\p{Ll}")
_UPPER = regex.compile(r"\p{Lu}|\p{Lt}")


def _next_non_ws(text: str, i: int, hi: int) -> str:
    """Return the first non-whitespace character in ``text[i:hi]`` (bounded look), or ``""``."""
    m = NON_WS.search(text, i, min(hi, i + _LOOKAHEAD))
    return "" if m is None else text[m.start()]


def _latin_end(text: str, m: regex.Match[str], lo: int, hi: int) -> bool:
    """Decide whether a Latin terminator candidate really ends a sentence."""
    end = m.end()
    # Usually one space and then the next word: look there before searching.
    nxt = text[end + 1] if end + 1 < hi else ""
    if not nxt or nxt.isspace():
        nxt = _next_non_ws(text, end, hi)
    if nxt and _LOWER.match(nxt):
        return False
    dot = m.start()
    if m.group("term") != ".":
        return True
    # Abbreviations are short: skip the look-behind after digits or a long word.
    k = dot
    while k > lo and dot - k < _LONGEST_WORD_ABBREV and text[k - 1].isalpha():
        k -= 1
    if k == dot or (dot - k == _LONGEST_WORD_ABBREV and k > lo and text[k - 1].isalpha()):
        return True
    before = text[max(lo, dot - _ABBREV_LOOKBACK) : dot]
    if _NEVER_END.search(before):
        return False
    if _END_IF_CAPITAL.search(before):
        return bool(nxt) and _UPPER.match(nxt) is not None
    return True


def _line_end(text: str, pos: int, end: int, lo: int, hi: int) -> bool:
    """Decide whether the single line break ``text[pos:end]`` ends a sentence."""
    prev_m = LAST_NON_WS.search(text, max(lo, pos - _LOOKAHEAD), pos)
    nxt = _next_non_ws(text, end, hi)
    if prev_m is None or not nxt:
        return True
    prev = text[prev_m.start()]
    flowing = (
        _FLOW_BEFORE.match(prev) is not None
        and _FLOW_AFTER.match(nxt) is not None
        and CJK_CHAR.match(prev) is None
        and CJK_CHAR.match(nxt) is None
    )
    return not flowing


def trimmed_spans(text: str, cuts: Sequence[int], lo: int, hi: int) -> list[tuple[int, int]]:
    """Turn raw cut positions into trimmed, grapheme-safe spans covering ``text[lo:hi]``.

    ``lo`` and ``hi`` must be grapheme boundaries and ``cuts`` sorted positions in
    ``[lo, hi]``. Each cut is moved forward to a grapheme boundary; each piece between two cuts
    loses its leading and trailing whitespace, but an end is moved *forward* (and a start
    *back*) when a cluster straddles the trimmed position, so no non-whitespace character is
    ever dropped. Whitespace-only pieces are skipped.
    """
    spans: list[tuple[int, int]] = []
    prev = lo
    for raw in (*cuts, hi):
        if raw <= prev:
            continue
        cut = raw if is_boundary(text, raw, prev) else snap_forward(text, raw, prev, hi)
        s = prev if not text[prev].isspace() else skip_ws(text, prev, cut)
        if s < cut:
            if s > prev:
                s = snap_back(text, s, prev)
            if not text[cut - 1].isspace():
                e = cut
            else:
                last = LAST_NON_WS.search(text, s, cut)
                e = cut if last is None else int(last.end())
                if not is_boundary(text, e, s):
                    e = snap_forward(text, e, s, cut)
            spans.append((s, e))
        prev = cut
    return spans


def sentence_spans(text: str, lo: int = 0, hi: int | None = None) -> list[tuple[int, int]]:
    """Split ``text[lo:hi]`` into sentences, returned as trimmed ``(start, end)`` offsets.

    The rules are described in the module docstring. The scan is a single forward regex pass,
    so the running time is linear in ``hi - lo``.

    Args:
        text: The document.
        lo: Where to start; must be a grapheme boundary (0 by default).
        hi: Where to stop; must be a grapheme boundary (``len(text)`` by default).

    Returns:
        Sentence spans in order, each without leading or trailing whitespace (unless a
        grapheme cluster straddles the edge), covering every non-whitespace character of
        ``text[lo:hi]``, with every offset on a grapheme boundary.

    Example:
        >>> t = "M. Dupont est là. Il pleut！　好。"
        >>> [t[s:e] for s, e in sentence_spans(t)]
        ['M. Dupont est là.', 'Il pleut！', '好。']
    """
    hi = len(text) if hi is None else hi
    cuts: list[int] = []
    for m in _SCAN.finditer(text, lo, hi):
        kind = m.lastgroup
        if kind == "para":
            cuts.append(m.start())
        elif kind == "lat":
            if _latin_end(text, m, lo, hi):
                cuts.append(m.end())
        elif kind == "cjk":
            # A quoted sentence followed by a quotative particle (「はい。」と言った) goes on.
            if m.end() - m.start("cjk") > 1 and text[m.end() - 1] in _CLOSERS:
                if text.startswith(_QUOTATIVES, m.end(), hi):
                    continue
            cuts.append(m.end())
        elif _line_end(text, m.start(), m.end(), lo, hi):
            cuts.append(m.start())
    return trimmed_spans(text, cuts, lo, hi)


def pack_spans(
    text: str,
    sentences: Sequence[tuple[int, int]],
    chunk_size: int,
    overlap: int,
    fallback: RecursiveChunker,
    *,
    word_overlap: bool = False,
) -> list[tuple[int, int]]:
    """Pack sentence spans greedily into chunk spans of at most ``chunk_size``.

    Consecutive chunks overlap by the longest run of whole trailing sentences of the previous
    chunk that fits in ``overlap`` characters and still leaves room for the next sentence.
    With ``word_overlap``, when no whole sentence fits, the overlap falls back to the
    recursive chunker's rule (earliest line/sentence/word start within ``overlap``
    characters). Sentences longer than ``chunk_size`` are split by ``fallback`` in place, with
    no overlap into or out of them.
    """
    out: list[tuple[int, int]] = []
    n = len(sentences)
    i = 0
    carry = -1  # start offset carried over from the previous chunk (overlap), or -1
    while i < n:
        s_i, e_i = sentences[i]
        if e_i - s_i > chunk_size:
            out.extend(fallback.spans(text, s_i, e_i))
            i += 1
            carry = -1
            continue
        start = carry if carry >= 0 and e_i - carry <= chunk_size else s_i
        j = i
        while j + 1 < n and sentences[j + 1][1] - start <= chunk_size:
            j += 1
        end = sentences[j][1]
        out.append((start, end))
        i = j + 1
        carry = -1
        if not overlap or i >= n or sentences[i][1] - sentences[i][0] > chunk_size:
            continue
        nxt_end = sentences[i][1]
        # Whole trailing sentences: walk back while they fit in ``overlap`` (bounded by it).
        k = j
        while (
            k > 0
            and sentences[k - 1][0] > start
            and end - sentences[k - 1][0] <= overlap
            and nxt_end - sentences[k - 1][0] <= chunk_size
        ):
            k -= 1
        if sentences[k][0] > start and end - sentences[k][0] <= overlap:
            if nxt_end - sentences[k][0] <= chunk_size:
                carry = sentences[k][0]
        if carry < 0 and word_overlap:
            pos = fallback._overlap_start(text, start, end, False)
            if pos > start and nxt_end - pos <= chunk_size:
                carry = pos
    return out


class SentenceChunker(SizedChunker):
    """Chunker that packs whole sentences, with whole-sentence overlap.

    Sentence ends follow multilingual rules (Latin punctuation with an abbreviation list, CJK
    terminators without spaces, closing quotes kept); see the module docstring. Sentences are
    packed greedily up to ``chunk_size``; a sentence longer than that is split by the
    recursive chunker.

    Args:
        chunk_size: Maximum chunk length in code points.
        overlap: Cap, in code points, on the whole trailing sentences of a chunk that the next
            chunk repeats. A trailing sentence longer than this is not repeated at all.

    Raises:
        ValueError: If ``chunk_size <= 0``, ``overlap < 0`` or ``overlap >= chunk_size``.
        TypeError: If a setting has the wrong type.

    Example:
        >>> chunker = SentenceChunker(chunk_size=40, overlap=0)
        >>> [c.text for c in chunker.chunk("Dr. Who arrived. He left. 她走了。好！")]
        ['Dr. Who arrived. He left. 她走了。好！']
        >>> [c.text for c in SentenceChunker(20, 0).chunk("Dr. Who arrived. He left.")]
        ['Dr. Who arrived.', 'He left.']
    """

    __slots__ = ("_chunk_size", "_fallback", "_overlap")

    def __init__(self, chunk_size: int = 1000, overlap: int = 200) -> None:
        super().__init__(chunk_size, overlap)
        self._fallback = RecursiveChunker(chunk_size, overlap)

    def __repr__(self) -> str:
        return f"SentenceChunker(chunk_size={self._chunk_size}, overlap={self._overlap})"

    def config(self) -> dict[str, Any]:
        """Describe the settings.

        Returns:
            ``{"strategy": "sentence", "chunk_size": ..., "overlap": ...}``.
        """
        return {"strategy": "sentence", "chunk_size": self._chunk_size, "overlap": self._overlap}

    def chunk(self, text: str) -> list[Chunk]:
        """Split ``text`` into chunks of whole sentences.

        Args:
            text: The document to split.

        Returns:
            Chunks in document order with exact offsets (``[]`` for blank text); starts and
            ends strictly increase, every non-whitespace character is covered, and
            consecutive chunks share at most ``overlap`` code points.

        Raises:
            TypeError: If ``text`` is not a ``str``.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        spans = pack_spans(
            text, sentence_spans(text), self._chunk_size, self._overlap, self._fallback
        )
        return chunks_from_spans(text, spans)
