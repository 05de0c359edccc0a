"""HybridChunker: sections, paragraphs, windows, metadata and boilerplate cleaning."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import regex
from hypothesis import example, given
from hypothesis import strategies as st

from semantic_orm.chunking import (
    DEFAULT_HEADING_PATTERN,
    Chunk,
    HybridChunker,
    _core,
    get_chunker,
    hybrid,
    sentence,
)
from tests.test_chunking import (
    _PROPERTY_SETTINGS,
    assert_invariants,
    mixed_text,
    sizes,
    small_sizes,
)

DATA = Path(__file__).parent / "data"
ZH = (DATA / "zh.txt").read_text(encoding="utf-8")
FR = (DATA / "fr.txt").read_text(encoding="utf-8")
HEADING_1 = "第一回　甄士隐梦幻识通灵　贾雨村风尘怀闺秀"


def meta(c: Chunk) -> tuple[Any, ...]:
    m = c.metadata
    return (m["section"], m["section_index"], m["paragraph"], m["segment"])


def section_spans(text: str) -> list[int]:
    """Line starts of default headings, computed independently of the chunker."""
    pat = regex.compile(DEFAULT_HEADING_PATTERN, flags=regex.MULTILINE)
    return [m.start() for m in pat.finditer(text)]


# ------------------------------------------------------------------------------------------
# Sections and metadata (golden, Chinese)
# ------------------------------------------------------------------------------------------


def test_chinese_sections_at_hui_headings() -> None:
    chunks = HybridChunker(300, 60).chunk(ZH)
    assert_invariants(ZH, chunks, 300, 60)
    headings = [
        "第一回　甄士隐梦幻识通灵　贾雨村风尘怀闺秀",
        "第二回　贾夫人仙逝扬州城　冷子兴演说荣国府",
        "第三回　托内兄如海荐西宾　接外孙贾母惜孤女",
    ]
    assert [c.metadata["section"] for c in chunks] == [None] + [headings[0]] * 4 + [
        headings[1]
    ] * 2 + [headings[2]]
    assert [meta(c)[1:] for c in chunks] == [
        (0, 0, 0),  # preamble "红楼梦（节选，公有领域）"
        (1, 0, 0),  # heading + two lines (CJK: one paragraph per line), merged
        (1, 3, 0),
        (1, 5, 0),
        (1, 6, 0),
        (2, 0, 0),
        (2, 2, 0),
        (3, 0, 0),
    ]
    # Sections start exactly at the heading lines and no chunk crosses one.
    starts = section_spans(ZH)
    assert [c.start_offset for c in chunks if c.metadata["paragraph"] == 0][1:] == starts
    for c in chunks:
        assert not any(c.start_offset < s < c.end_offset for s in starts)
    # Every chunk ends at a sentence end (or is the title line).
    for c in chunks[1:]:
        assert c.text[-1] in "。！？”", c.text[-10:]
    assert chunks[1].text.startswith(HEADING_1 + "\n　　此开卷第一回也。")


def test_over_long_paragraph_gets_overlapping_sentence_windows() -> None:
    chunks = HybridChunker(120, 40).chunk(ZH)
    assert_invariants(ZH, chunks, 120, 40)
    windows = [c for c in chunks if c.metadata["segment"] > 0]
    assert windows
    for prev, cur in pairwise(chunks):
        if cur.start_offset < prev.end_offset:  # overlap only between windows of a paragraph
            assert cur.metadata["segment"] == prev.metadata["segment"] + 1
            assert cur.metadata["section_index"] == prev.metadata["section_index"]
        if cur.metadata["segment"] > 0:
            assert cur.text[0] not in "，。！？”’"  # windows start at a sentence (or word)
        if cur.metadata["segment"] > 0:  # windows are numbered 0, 1, 2, ... per paragraph
            assert cur.metadata["segment"] == prev.metadata["segment"] + 1
            assert cur.metadata["paragraph"] in (prev.metadata["paragraph"], 1)
    assert max(c.metadata["segment"] for c in chunks) >= 2
    # The first line of 第一回 (paragraph 1) is windowed; window 0 also holds the heading line
    # (paragraph 0), window 1 starts inside paragraph 1 with a whole-sentence overlap.
    assert [meta(c)[1:] for c in chunks[1:3]] == [(1, 0, 0), (1, 1, 1)]
    assert chunks[2].text.startswith("故曰“甄士隐”云云。")
    assert chunks[1].text.endswith("故曰“甄士隐”云云。但书中所记何事何人？")


def test_heading_alone_joins_first_window_of_long_paragraph() -> None:
    text = "# Title\n\n" + " ".join(f"Sentence number {i} is here." for i in range(30))
    chunks = HybridChunker(200, 50).chunk(text)
    assert_invariants(text, chunks, 200, 50)
    assert chunks[0].text.startswith("# Title\n\nSentence number 0 is here.")
    assert meta(chunks[0]) == ("# Title", 0, 0, 0)
    assert meta(chunks[1])[2:] == (1, 1)


def test_markdown_and_chapter_headings() -> None:
    text = (
        "Intro line.\n\n# One\n\nPara a.\n\nPara b.\n\n## Two\nText two.\n\n"
        "Chapter Three\n\nText three.\n\nCHAPTER IV\n\nText four.\n\nchapter v\nText five."
    )
    chunks = HybridChunker(1000, 0).chunk(text)
    assert_invariants(text, chunks, 1000, 0)
    assert [(c.text, c.metadata["section"], c.metadata["section_index"]) for c in chunks] == [
        ("Intro line.", None, 0),
        ("# One\n\nPara a.\n\nPara b.", "# One", 1),
        ("## Two\nText two.", "## Two", 2),
        ("Chapter Three\n\nText three.", "Chapter Three", 3),
        ("CHAPTER IV\n\nText four.", "CHAPTER IV", 4),
        ("chapter v\nText five.", "chapter v", 5),
    ]


def test_merge_short_false_keeps_paragraphs_apart() -> None:
    text = "# H\n\nPara a.\n\nPara b.\nstill b.\n\nPara c."
    chunks = HybridChunker(100, 10, merge_short=False).chunk(text)
    assert [c.text for c in chunks] == ["# H", "Para a.", "Para b.\nstill b.", "Para c."]
    assert [c.metadata["paragraph"] for c in chunks] == [0, 1, 2, 3]
    merged = HybridChunker(20, 10).chunk(text)
    assert [c.text for c in merged] == ["# H\n\nPara a.", "Para b.\nstill b.", "Para c."]
    assert [c.metadata["paragraph"] for c in merged] == [0, 2, 3]


def test_cjk_single_newlines_are_paragraphs_only_without_blank_lines() -> None:
    cjk = "第一段。\n第二段。\n第三段。"
    assert [c.text for c in HybridChunker(5, 0).chunk(cjk)] == ["第一段。", "第二段。", "第三段。"]
    assert [c.metadata["paragraph"] for c in HybridChunker(5, 0, merge_short=False).chunk(cjk)] == [
        0,
        1,
        2,
    ]
    latin = "line one\nline two\nline three"
    assert [c.metadata["paragraph"] for c in HybridChunker(1000, 0).chunk(latin)] == [0]


def test_cjk_detection_counts_every_space_str_isspace_knows() -> None:
    """Whether a section is CJK text (one paragraph per line) is decided on a sample whose
    spaces are counted by a regular expression: the very characters ``str.isspace`` accepts
    (a CJK sample with ideographic or no-break spaces decides as before)."""
    from semantic_orm.chunking import hybrid

    chars = [chr(code) for code in range(0x110000)]
    assert [c for c in chars if hybrid._SPACE.match(c)] == [c for c in chars if c.isspace()]
    spaced = "第一段。\u3000\u3000\u00a0\n第二段。\u2003\n第三段。"
    chunks = HybridChunker(5, 0, merge_short=False).chunk(spaced)
    assert [c.metadata["paragraph"] for c in chunks] == [0, 1, 2]  # one paragraph a line


def test_custom_heading_regex_and_callable() -> None:
    text = "== A ==\nalpha.\n== B ==\nbeta."
    by_regex = HybridChunker(100, 0, heading=r"^== .* ==$").chunk(text)
    by_call = HybridChunker(100, 0, heading=lambda line: line.startswith("==")).chunk(text)
    for chunks in (by_regex, by_call):
        assert [(c.text, c.metadata["section"]) for c in chunks] == [
            ("== A ==\nalpha.", "== A =="),
            ("== B ==\nbeta.", "== B =="),
        ]
    assert HybridChunker(100, 0, heading=regex.compile(r"(?m)^== ")).chunk(text) == by_regex


def test_section_boundaries_never_crossed_even_when_tiny() -> None:
    text = "# a\nx\n# b\ny\n# c\nz"
    chunks = HybridChunker(1000, 0).chunk(text)
    assert [c.text for c in chunks] == ["# a\nx", "# b\ny", "# c\nz"]


# ------------------------------------------------------------------------------------------
# Properties
# ------------------------------------------------------------------------------------------


@_PROPERTY_SETTINGS
@given(text=mixed_text(), cfg=sizes() | small_sizes())
def test_hybrid_overlap_only_inside_over_long_paragraphs(text: str, cfg: tuple[int, int]) -> None:
    chunks = HybridChunker(*cfg).chunk(text)
    assert_invariants(text, chunks, *cfg)
    starts = [m.start() for m in regex.finditer(DEFAULT_HEADING_PATTERN, text, flags=regex.M)]
    for c in chunks:
        assert not any(c.start_offset < s < c.end_offset for s in starts)
        assert set(c.metadata) == {"section", "section_index", "paragraph", "segment"}
    for prev, cur in pairwise(chunks):
        assert cur.metadata["section_index"] >= prev.metadata["section_index"]
        if cur.start_offset < prev.end_offset:
            assert cur.metadata["segment"] == prev.metadata["segment"] + 1


_CLEAN = [r"(?:话说|且说|却说)", r"Chapter \d+\s*(?:\n|$)", r"第[一二三]回[^\n]*\n?"]


@_PROPERTY_SETTINGS
@given(
    text=st.lists(
        st.sampled_from(
            ["话说", "且说", "却说", "Chapter 12\n", "第一回 标题\n", "正文。", "text.", " ", "\n",
             "\n\n", "e\u0301", "👩\u200d👧"]
        ),
        max_size=60,
    ).map("".join)
    | mixed_text(),
    cfg=sizes() | small_sizes(),
)  # fmt: skip
# a match that ends inside a grapheme (the accent joins 说) is not boilerplate: nothing is cut
@example(text="话说\u0301", cfg=(3, 0))
def test_clean_only_removes_matched_boilerplate(text: str, cfg: tuple[int, int]) -> None:
    plain = HybridChunker(*cfg).chunk(text)
    cleaned = HybridChunker(*cfg, clean=_CLEAN).chunk(text)
    # Offsets, order, sizes, graphemes: all invariants except coverage.
    check_without_coverage(text, cleaned, *cfg)
    by_end = {c.end_offset: c for c in plain}
    compiled = [regex.compile(p) for p in _CLEAN]
    for c in cleaned:
        original = by_end[c.end_offset]  # cleaning only ever moves starts
        assert c.start_offset >= original.start_offset
        assert c.metadata == original.metadata
        removed = text[original.start_offset : c.start_offset]
        # The removed prefix is a sequence of boilerplate matches and whitespace.
        rest = removed
        while rest.strip():
            rest = rest.lstrip()
            m = next((m for p in compiled if (m := p.match(rest)) and m.end()), None)
            assert m is not None, (removed, rest)
            rest = rest[m.end() :]
    # Whatever is not covered any more was boilerplate at the start of a plain chunk.
    covered = set()
    for c in cleaned:
        covered.update(range(c.start_offset, c.end_offset))
    starts = [c.start_offset for c in plain]
    for i, ch in enumerate(text):
        if not ch.isspace() and i not in covered:
            assert any(s <= i for s in starts)


def check_without_coverage(text: str, chunks: list[Chunk], chunk_size: int, overlap: int) -> None:
    for i, c in enumerate(chunks):
        assert c.index == i and c.total_chunks == len(chunks)
        assert text[c.start_offset : c.end_offset] == c.text
        assert 0 < len(c.text) <= chunk_size
        # starts moved past space: the text's grapheme there is not whitespace (one may begin
        # with a space that a combining mark belongs to, " \u0301" or "\xa0\u0301", even where
        # a chunk too small for it splits it)
        assert not regex.match(r"\X", text[c.start_offset :]).group().isspace()
    for prev, cur in pairwise(chunks):
        assert cur.start_offset > prev.start_offset
        assert cur.end_offset > prev.end_offset
        assert prev.end_offset - cur.start_offset <= overlap


def test_clean_golden_chinese() -> None:
    clean = [r"第.{1,4}回[^\n]*(?:\n|$)", "(?:话说|且说|却说)"]
    chunks = HybridChunker(300, 60, clean=clean).chunk(ZH)
    texts = [c.text for c in chunks]
    assert texts[1].startswith("此开卷第一回也。")  # the 第一回 banner is outside the chunk
    assert texts[5].startswith("封肃因听见公差传唤")  # "却说" skipped by offsets
    assert texts[-1].startswith("黛玉自那日弃舟登岸时")  # "且说" skipped
    assert ZH[chunks[5].start_offset - 2 : chunks[5].start_offset] == "却说"
    assert chunks[5].metadata["section"] == "第二回　贾夫人仙逝扬州城　冷子兴演说荣国府"
    for c in chunks:
        assert ZH[c.start_offset : c.end_offset] == c.text
    # A chunk made only of boilerplate disappears.
    assert HybridChunker(100, 0, clean="话说").chunk("话说\n\n正文。") == [
        Chunk("话说\n\n正文。"[4:], 0, 4, 7, 1)
    ]


# ------------------------------------------------------------------------------------------
# Settings
# ------------------------------------------------------------------------------------------


def test_config_is_json_and_complete() -> None:
    chunker = HybridChunker(500, 50, clean=["话说"], merge_short=False)
    cfg = chunker.config()
    assert json.loads(json.dumps(cfg)) == cfg
    assert cfg == {
        "strategy": "hybrid",
        "chunk_size": 500,
        "overlap": 50,
        "heading": DEFAULT_HEADING_PATTERN,
        "clean": ["话说"],
        "merge_short": False,
    }
    assert HybridChunker(heading=_is_heading).config()["heading"] == "<callable _is_heading>"
    via_registry = get_chunker("hybrid", chunk_size=300, overlap=20)
    assert isinstance(via_registry, HybridChunker)
    assert via_registry.config()["strategy"] == "hybrid"
    assert via_registry.config()["clean"] is None


def _is_heading(line: str) -> bool:
    return line.startswith("#")


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"chunk_size": 0}, ValueError, "chunk_size"),
        ({"chunk_size": 10, "overlap": 10}, ValueError, "overlap"),
        ({"chunk_size": 10, "overlap": -1}, ValueError, "overlap"),
        ({"heading": "("}, ValueError, "invalid regular expression"),
        ({"clean": ["[unclosed"]}, ValueError, "invalid regular expression"),
        ({"heading": 42}, TypeError, "heading"),
        ({"merge_short": "yes"}, TypeError, "merge_short"),
    ],
)
def test_invalid_settings(kwargs: dict[str, Any], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        HybridChunker(**kwargs)


def test_unknown_strategy_names_the_setting() -> None:
    with pytest.raises(ValueError, match=r"unknown chunking strategy 'nope'.*'hybrid'"):
        get_chunker("nope")


# ------------------------------------------------------------------------------------------
# Linear time (operation counts, no clocks)
# ------------------------------------------------------------------------------------------


class _CountingPattern:
    """Wraps a compiled regex and adds up how many characters each call is handed."""

    def __init__(self, pattern: Any, counter: list[int]) -> None:
        self._pattern = pattern
        self._counter = counter

    def _count(self, args: tuple[Any, ...]) -> None:
        string = args[0]
        pos = args[1] if len(args) > 1 else 0
        endpos = args[2] if len(args) > 2 else len(string)
        self._counter[0] += max(0, min(endpos, len(string)) - pos) + 1

    def finditer(self, *args: Any) -> Any:
        self._count(args)
        return self._pattern.finditer(*args)

    def search(self, *args: Any) -> Any:
        m = self._pattern.search(*args)
        if m is None:
            self._count(args)
        else:  # a forward search stops at its match; a REVERSE one at its start
            reverse = bool(self._pattern.flags & regex.REVERSE)
            pos = args[1] if len(args) > 1 else 0
            endpos = args[2] if len(args) > 2 else len(args[0])
            self._counter[0] += (endpos - m.start() if reverse else m.end() - pos) + 1
        return m

    def match(self, *args: Any) -> Any:
        m = self._pattern.match(*args)
        if len(args) <= 2:  # called on a slice (the chunkers' convention): the copy counts
            self._counter[0] += len(args[0]) + 1
        else:  # anchored at pos inside the document: it reads what it matches
            self._counter[0] += (m.end() - args[1] if m else 0) + 1
        return m

    def findall(self, *args: Any) -> Any:
        self._count(args)
        return self._pattern.findall(*args)


@contextmanager
def count_scanned(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Count characters handed to every module-level regex the chunkers use."""
    counter = [0]
    targets = {
        _core: ["NON_WS", "LAST_NON_WS", "_GRAPHEME"],
        sentence: ["_SCAN", "NON_WS", "LAST_NON_WS", "_NEVER_END", "_END_IF_CAPITAL"],
        hybrid: ["_PARA_BREAK", "_LINE_END", "LAST_NON_WS", "CJK_CHAR"],
    }
    with monkeypatch.context() as m:
        for module, names in targets.items():
            for name in names:
                m.setattr(module, name, _CountingPattern(getattr(module, name), counter))
        original = _core._Level.last_cut

        def last_cut(self: Any, text: str, lo: int, hi: int, floor: int) -> Any:
            counter[0] += hi - lo + 1
            return original(self, text, lo, hi, floor)

        m.setattr(_core._Level, "last_cut", last_cut)
        yield counter


@pytest.mark.parametrize(
    "unit",
    [
        ZH,
        FR,
        "\n\n".join([ZH.replace("\n", ""), "y" * 2500, FR.replace("\n", " ")]),
    ],
    ids=["zh", "fr", "no-breaks"],
)
def test_hybrid_scales_linearly(unit: str, monkeypatch: pytest.MonkeyPatch) -> None:
    results = []
    for copies in (10, 40):
        text = unit * copies
        with count_scanned(monkeypatch) as scanned:
            chunks = HybridChunker(400, 80).chunk(text)
        results.append((len(chunks), scanned[0]))
    (n_small, scan_small), (n_big, scan_big) = results
    assert 3.9 <= n_big / n_small <= 4.1
    assert scan_big <= 4.2 * scan_small
