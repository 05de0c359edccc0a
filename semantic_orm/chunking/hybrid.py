"""Structure-aware chunking: sections, then paragraphs, then windows (strategy ``"hybrid"``).

Why a hybrid strategy
---------------------
Books, manuals and Markdown documents already say where their topics begin and end: headings
separate sections and blank lines separate paragraphs. A chunk that spans the end of one
chapter and the start of the next mixes two topics in one vector, and a chunk that starts in
the middle of a paragraph lacks its context. :class:`HybridChunker` therefore cuts along the
document's own structure first and uses a size-driven window only where it has to:

1. **Sections.** A line matching the heading rule starts a section (default
   :data:`DEFAULT_HEADING_PATTERN`: Markdown ``#`` … ``######`` headings, Chinese and Japanese
   ``第N回`` / ``第N章`` / ``第N节`` (``節``) / ``第N话`` (``話``) with Chinese or Arabic
   numerals, and ``Chapter …`` in any case, each
   at the start of a line after optional indentation). Text before the first heading is a
   section with no heading. **No chunk ever crosses a section boundary.**
2. **Paragraphs.** Inside a section, blank lines (or U+2029) separate paragraphs. Chinese and
   Japanese texts often put one paragraph per line with no blank lines; for a section that is
   mostly CJK and has no blank line, every line break is a paragraph break. The heading line is
   always a paragraph of its own.
3. **Packing.** A paragraph that fits in ``chunk_size`` is never split. With ``merge_short``
   (the default), consecutive paragraphs of one section are packed greedily into one chunk
   while they fit, so a heading travels with the text below it and one-line paragraphs do not
   become one-line vectors.
4. **Windows.** A paragraph longer than ``chunk_size`` is cut into windows of whole sentences
   (same rules as :class:`~semantic_orm.chunking.SentenceChunker`). Consecutive windows
   overlap by whole trailing sentences that fit within ``overlap`` characters, or, if none
   fits, from the earliest line/sentence/word start in the last ``overlap`` characters. This
   is the *only* place where chunks overlap: paragraphs already have natural edges.

Each chunk's ``metadata`` says where it came from: ``section`` (the heading line, stripped, or
``None``), ``section_index`` (0-based, counting non-blank sections), ``paragraph`` (index,
within the section, of the chunk's first paragraph; the heading line is paragraph 0) and
``segment`` (window number inside an over-long paragraph, 0 otherwise).

Boilerplate
-----------
``clean=`` takes one or more regular expressions of boilerplate that may open a chunk, such as
the storyteller formulas ``话说`` / ``且说`` / ``却说`` of Chinese novels or a ``Chapter 12``
banner. Each pattern is matched at the start of the chunk text (as if it were a separate
string, so ``^`` means the chunk start); on a match the chunk's *start offset* moves past the
match and any whitespace after it, and the patterns are tried again; a match that ends inside a
grapheme (``话说`` followed by a combining accent, which belongs to ``说``) is not taken. Text is
never edited, so ``original[start:end] == chunk.text`` still holds; the boilerplate is simply
outside the chunk. A chunk that is nothing but boilerplate is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import regex

from ._core import (
    LAST_NON_WS,
    Chunk,
    SizedChunker,
    chunks_from_spans,
    skip_ws,
    snap_back,
)
from .recursive import RecursiveChunker
from .sentence import CJK_CHAR, pack_spans, sentence_spans, trimmed_spans

__all__ = ["DEFAULT_HEADING_PATTERN", "HeadingRule", "HybridChunker", "Pattern"]

#: Heading lines recognised by default (compiled with ``MULTILINE``).
DEFAULT_HEADING_PATTERN = (
    r"^[^\S\r\n]*(?:"
    r"#{1,6}[^\S\r\n]"
    r"|第[0-9０-９零〇一二三四五六七八九十百千两兩]+[回章节節话話]"
    r"|(?i:chapter)[^\S\r\n]+\w+"
    r")"
)

Pattern: TypeAlias = "re.Pattern[str] | regex.Pattern[str]"
#: A heading rule: a regex (string or compiled; strings are compiled with ``MULTILINE``) whose
#: matches mark heading lines, or a predicate called with each line's text.
HeadingRule: TypeAlias = "str | Pattern | Callable[[str], bool]"

_LINE_END_CHARS = "\n\r\x0b\x0c\x85\u2028\u2029"
_LINE_END = regex.compile(r"\r\n|[\n\r\x0b\x0c\x85\u2028\u2029]")
_PARA_BREAK = regex.compile(r"\r?\n[^\S\r\n]*\r?\n|\u2029")
_CJK_SAMPLE = 400  # characters inspected to decide whether a section is CJK text
_SPACE = re.compile(r"\s")
"""A character ``str.isspace()`` accepts (the same set: checked by the tests), found in C."""
_MAX_CLEAN_ROUNDS = 32
_PENDING: dict[str, Any] = {}  # marker: a heading-only record that may join the next window


def _compile(pattern: str | Pattern, flags: int = 0) -> Pattern:
    if isinstance(pattern, str):
        try:
            return regex.compile(pattern, flags=flags)
        except regex.error as exc:
            raise ValueError(f"invalid regular expression {pattern!r}: {exc}") from exc
    if isinstance(pattern, re.Pattern | regex.Pattern):
        return pattern
    raise TypeError(f"expected a regex string or compiled pattern, got {type(pattern).__name__}")


class HybridChunker(SizedChunker):
    """Chunker that follows document structure: sections, paragraphs, then sentence windows.

    See the module docstring for the algorithm and the metadata each chunk carries.

    Args:
        chunk_size: Maximum chunk length in code points.
        overlap: Maximum overlap, in code points, between consecutive windows of one
            over-long paragraph. Chunks of different paragraphs never overlap.
        heading: Heading rule: a regex (string, compiled with ``MULTILINE``, or a compiled
            pattern) matched anywhere in a line, or a callable taking a line's text (without
            its line break) and returning whether it is a heading. ``None`` uses
            :data:`DEFAULT_HEADING_PATTERN`.
        clean: A regex, or a sequence of regexes, of boilerplate to move chunk starts past
            (matched at the start of each chunk). ``None`` disables cleaning.
        merge_short: Pack consecutive paragraphs of a section into one chunk while they fit.

    Raises:
        ValueError: If the sizes are invalid or a pattern does not compile.
        TypeError: If a setting has the wrong type.

    Example:
        >>> text = "# Intro\\n\\nShort.\\n\\n# Usage\\n\\nRun it."
        >>> [(c.text, c.metadata["section"]) for c in HybridChunker(100, 10).chunk(text)]
        [('# Intro\\n\\nShort.', '# Intro'), ('# Usage\\n\\nRun it.', '# Usage')]
    """

    __slots__ = (
        "_chunk_size",
        "_clean",
        "_fallback",
        "_heading",
        "_heading_rule",
        "_merge_short",
        "_overlap",
    )

    def __init__(
        self,
        chunk_size: int = 1000,
        overlap: int = 200,
        heading: HeadingRule | None = None,
        clean: str | Pattern | Sequence[str | Pattern] | None = None,
        merge_short: bool = True,
    ) -> None:
        super().__init__(chunk_size, overlap)
        if not isinstance(merge_short, bool):
            raise TypeError(f"merge_short must be a bool, got {type(merge_short).__name__}")
        self._merge_short = merge_short
        self._fallback = RecursiveChunker(chunk_size, overlap)
        self._heading_rule: HeadingRule = DEFAULT_HEADING_PATTERN if heading is None else heading
        self._heading: Pattern | Callable[[str], bool]
        if isinstance(self._heading_rule, str | re.Pattern | regex.Pattern):
            self._heading = _compile(self._heading_rule, regex.MULTILINE)
        elif callable(self._heading_rule):
            self._heading = self._heading_rule
        else:
            raise TypeError(f"heading must be a regex or a callable, got {type(heading).__name__}")
        if clean is None:
            patterns: Sequence[str | Pattern] = ()
        elif isinstance(clean, str | re.Pattern | regex.Pattern):
            patterns = (clean,)
        else:
            patterns = tuple(clean)
        self._clean: tuple[Pattern, ...] = tuple(_compile(p) for p in patterns)

    def __repr__(self) -> str:
        return (
            f"HybridChunker(chunk_size={self._chunk_size}, overlap={self._overlap}, "
            f"merge_short={self._merge_short})"
        )

    def config(self) -> dict[str, Any]:
        """Describe the settings as a JSON-serialisable dict.

        Returns:
            ``{"strategy": "hybrid", "chunk_size", "overlap", "heading", "clean",
            "merge_short"}``; ``heading`` is the pattern string (or ``"<callable NAME>"``) and
            ``clean`` a list of pattern strings, or ``None``.
        """
        rule = self._heading_rule
        if isinstance(rule, str):
            heading: str = rule
        elif isinstance(rule, re.Pattern | regex.Pattern):
            heading = str(rule.pattern)
        else:
            heading = f"<callable {getattr(rule, '__qualname__', type(rule).__name__)}>"
        return {
            "strategy": "hybrid",
            "chunk_size": self._chunk_size,
            "overlap": self._overlap,
            "heading": heading,
            "clean": [str(p.pattern) for p in self._clean] if self._clean else None,
            "merge_short": self._merge_short,
        }

    def chunk(self, text: str) -> list[Chunk]:
        """Split ``text`` along its sections and paragraphs.

        Args:
            text: The document to split.

        Returns:
            Chunks in document order with exact offsets and ``section``, ``section_index``,
            ``paragraph`` and ``segment`` metadata; ``[]`` for blank text.

        Raises:
            TypeError: If ``text`` is not a ``str``.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        records: list[tuple[int, int, dict[str, Any]]] = []
        size = self._chunk_size
        section_index = 0
        for a, b, heading_end, heading in self._sections(text):
            paragraphs = self._paragraphs(text, a, b, heading_end)
            if not paragraphs:
                continue
            p = 0
            while p < len(paragraphs):
                s, e = paragraphs[p]
                if e - s > size:
                    sentences = sentence_spans(text, s, e)
                    first = p
                    if records and records[-1][2] is _PENDING:
                        # The heading alone is pending: open the first window with it (as
                        # one more "sentence") instead of leaving a heading-only chunk.
                        if sentences and sentences[0][1] - paragraphs[0][0] <= size:
                            records.pop()
                            sentences.insert(0, paragraphs[0])
                            first = 0
                        else:
                            _settle(records, heading, section_index)
                    windows = pack_spans(
                        text, sentences, size, self._overlap, self._fallback, word_overlap=True
                    )
                    for w, (ws, we) in enumerate(windows):
                        para = first if ws < s else p
                        records.append((ws, we, _meta(heading, section_index, para, w)))
                    p += 1
                    continue
                _settle(records, heading, section_index)
                q = p
                if self._merge_short:
                    while q + 1 < len(paragraphs) and paragraphs[q + 1][1] - s <= size:
                        q += 1
                if p == 0 and q == 0 and heading_end >= 0 and len(paragraphs) > 1:
                    records.append((s, e, _PENDING))  # heading only; may join the next window
                else:
                    records.append((s, paragraphs[q][1], _meta(heading, section_index, p, 0)))
                p = q + 1
            _settle(records, heading, section_index)
            section_index += 1
        if self._clean:
            records = self._apply_clean(text, records)
        return chunks_from_spans(text, records)

    # -- internals ------------------------------------------------------------------------

    def _heading_lines(self, text: str) -> list[tuple[int, int]]:
        """Return ``(line_start, line_end)`` of every heading line, in order."""
        lines: list[tuple[int, int]] = []
        rule = self._heading
        if isinstance(rule, re.Pattern | regex.Pattern) and _anchored(rule):
            # "^..." can only match at a line start: try just those (much faster than a scan).
            pos = 0
            while pos <= len(text):
                newline = text.find("\n", pos)
                end = len(text) if newline < 0 else newline
                if rule.match(text, pos, end) is not None and text[pos:end].strip():
                    stop = _LINE_END.search(text, pos, end + 1)
                    lines.append((pos, end if stop is None else stop.start()))
                if newline < 0:
                    break
                pos = newline + 1
        elif isinstance(rule, re.Pattern | regex.Pattern):
            line_end = 0
            for m in rule.finditer(text):
                pos = m.start()
                if pos < line_end:
                    continue  # another match on a heading line already found
                start = 1 + max(text.rfind(ch, line_end, pos) for ch in _LINE_END_CHARS)
                start = max(start, line_end)
                nl = _LINE_END.search(text, pos)
                line_end = len(text) if nl is None else nl.start()
                if not text[start:line_end].strip():
                    line_end = max(line_end, pos + 1)
                    continue
                lines.append((start, line_end))
                if nl is not None:
                    line_end = nl.end()
        else:
            pos = 0
            for nl in (*_LINE_END.finditer(text), None):
                end = len(text) if nl is None else nl.start()
                if text[pos:end].strip() and rule(text[pos:end]):
                    lines.append((pos, end))
                if nl is not None:
                    pos = nl.end()
        return lines

    def _sections(self, text: str) -> list[tuple[int, int, int, str | None]]:
        """Return ``(start, end, heading_line_end, heading)`` per section (``-1``: no heading)."""
        heads = self._heading_lines(text)
        sections: list[tuple[int, int, int, str | None]] = []
        first = heads[0][0] if heads else len(text)
        if first > 0:
            sections.append((0, first, -1, None))
        for k, (start, line_end) in enumerate(heads):
            end = heads[k + 1][0] if k + 1 < len(heads) else len(text)
            sections.append((start, end, line_end, text[start:line_end].strip()))
        return sections

    def _paragraphs(self, text: str, a: int, b: int, heading_end: int) -> list[tuple[int, int]]:
        """Return trimmed paragraph spans of the section ``text[a:b]``."""
        body = a if heading_end < 0 else heading_end
        cuts: list[int] = [] if heading_end < 0 else [heading_end]
        breaks = _blank_line_breaks(text, body, b)
        first = skip_ws(text, body, b)
        last = LAST_NON_WS.search(text, first, b)
        inner_lo, inner_hi = first, (first if last is None else last.end())
        if not any(inner_lo <= pos < inner_hi for pos in breaks) and self._is_cjk(text, body, b):
            # CJK text without blank lines (inside the section): one paragraph per line.
            breaks = [m.start() for m in _LINE_END.finditer(text, body, b)]
        cuts.extend(breaks)
        return trimmed_spans(text, cuts, a, b)

    @staticmethod
    def _is_cjk(text: str, lo: int, hi: int) -> bool:
        sample = text[lo : min(hi, lo + _CJK_SAMPLE)]
        if sample.isascii():  # not one CJK character
            return False
        non_ws = len(sample) - len(_SPACE.findall(sample))
        return non_ws > 0 and 10 * len(CJK_CHAR.findall(sample)) >= 3 * non_ws

    def _apply_clean(
        self, text: str, records: list[tuple[int, int, dict[str, Any]]]
    ) -> list[tuple[int, int, dict[str, Any]]]:
        """Move chunk starts past leading boilerplate; drop chunks that become empty."""
        cleaned: list[tuple[int, int, dict[str, Any]]] = []
        for s, e, meta in records:
            start = s
            for _ in range(_MAX_CLEAN_ROUNDS):
                moved = False
                for pattern in self._clean:
                    m = pattern.match(text[start:e])
                    if m is None or m.end() == 0:
                        continue
                    end = start + m.end()
                    new = skip_ws(text, end, e)
                    new = snap_back(text, new, start) if new < e else e
                    if new < end:  # the match ends inside a grapheme: not all boilerplate
                        continue
                    if new > start:
                        start, moved = new, True
                        break
                if not moved or start >= e:
                    break
            cleaned.append((start, e, meta))
        # Keep starts strictly increasing: a chunk whose cleaned start reaches the next kept
        # chunk's start lies entirely inside that chunk (ends increase), so it can go.
        kept: list[tuple[int, int, dict[str, Any]]] = []
        next_start = len(text) + 1
        for s, e, meta in reversed(cleaned):
            if s < e and s < next_start:
                kept.append((s, e, meta))
                next_start = s
        kept.reverse()
        return kept


def _meta(heading: str | None, section_index: int, paragraph: int, segment: int) -> dict[str, Any]:
    return {
        "section": heading,
        "section_index": section_index,
        "paragraph": paragraph,
        "segment": segment,
    }


def _settle(
    records: list[tuple[int, int, dict[str, Any]]], heading: str | None, index: int
) -> None:
    """Turn a pending heading-only record into an ordinary chunk record."""
    if records and records[-1][2] is _PENDING:
        s, e, _ = records.pop()
        records.append((s, e, _meta(heading, index, 0, 0)))


def _anchored(pattern: Pattern) -> bool:
    """Return whether every match of ``pattern`` must start at a line start."""
    source = str(pattern.pattern)
    return (
        bool(pattern.flags & re.MULTILINE)
        and source.startswith("^")
        and "|" not in source.split("(", 1)[0]
    )


def _blank_line_breaks(text: str, lo: int, hi: int) -> list[int]:
    """Return the starts of blank-line paragraph breaks (and U+2029) in ``text[lo:hi]``.

    Equivalent to ``_PARA_BREAK.finditer`` but driven by ``str.find``, which skips long runs
    without a newline at memory speed.
    """
    breaks: list[int] = []
    pos = lo
    while True:
        nl = text.find("\n", pos, hi)
        if nl < 0:
            break
        start = nl - 1 if nl > lo and text[nl - 1] == "\r" else nl
        m = _PARA_BREAK.match(text, start, hi)
        if m is not None and start >= pos:
            breaks.append(start)
            pos = m.end()
        else:
            pos = nl + 1
    if "\u2029" in text[lo:hi]:
        breaks.extend(m.start() for m in regex.finditer("\u2029", text, pos=lo, endpos=hi))
        breaks.sort()
    return breaks
