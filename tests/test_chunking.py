"""Tests for semantic_orm.chunking: exact offsets, grapheme-safe cuts, separator priority.

The invariant checker and the text strategies defined here are shared by the other
``test_chunking_*`` modules, and the property tests at the top run for every strategy.
"""

from __future__ import annotations

import dataclasses
from itertools import pairwise
from typing import Any

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semantic_orm.chunking import (
    Chunk,
    Chunker,
    HybridChunker,
    RecursiveChunker,
    SentenceChunker,
    _core,
    available_chunkers,
    get_chunker,
    register_chunker,
    registry,
)

_GRAPHEME = regex.compile(r"\X")


# ------------------------------------------------------------------------------------------
# Invariant checker
# ------------------------------------------------------------------------------------------


def _clusters(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in _GRAPHEME.finditer(text)]


def assert_invariants(text: str, chunks: list[Chunk], chunk_size: int, overlap: int) -> None:
    """Check every documented guarantee of a chunk list for ``text``."""
    if not text.strip():
        assert chunks == []
        return
    assert chunks, "non-blank text must produce at least one chunk"
    total = len(chunks)
    clusters = _clusters(text)
    boundaries = {0, len(text)} | {end for _, end in clusters}
    # cut position -> length of the cluster containing it (for cuts that are not boundaries)
    cluster_len_at: dict[int, int] = {}
    for start, end in clusters:
        if end - start > 1:
            for i in range(start + 1, end):
                cluster_len_at[i] = end - start

    for i, c in enumerate(chunks):
        assert c.index == i
        assert c.total_chunks == total
        assert 0 <= c.start_offset < c.end_offset <= len(text)
        assert text[c.start_offset : c.end_offset] == c.text
        assert len(c.text) <= chunk_size
        for cut in (c.start_offset, c.end_offset):
            if cut not in boundaries:
                # Only allowed inside a single grapheme cluster longer than chunk_size.
                assert cluster_len_at[cut] > chunk_size, (cut, c)

    for prev, cur in pairwise(chunks):
        assert cur.start_offset > prev.start_offset
        assert cur.end_offset > prev.end_offset
        assert max(0, prev.end_offset - cur.start_offset) <= overlap

    # Union of chunks covers every non-whitespace character.
    covered_to = 0
    spans = iter(chunks)
    current = next(spans, None)
    for i, ch in enumerate(text):
        while current is not None and current.end_offset <= i:
            covered_to = max(covered_to, current.end_offset)
            current = next(spans, None)
        if ch.isspace():
            continue
        assert current is not None and current.start_offset <= i, (i, ch)


# ------------------------------------------------------------------------------------------
# Strategies
# ------------------------------------------------------------------------------------------

_TOKENS = [
    "word",
    "mot",
    "Été",
    "e\u0301te\u0301",  # decomposed accents
    "a\u0301\u0302\u0323",  # stacked combining marks
    "👩\u200d👩\u200d👧",  # ZWJ family
    "🇫🇷",
    "🇫🇷🇩🇪",
    "👍🏽",
    "❤\ufe0f",
    "这是一个句子。",
    "你好！",
    "对吗？",
    "是；",
    "שלום עולם",
    "مرحبا بالعالم",
    "\u0600\u0661",  # Arabic prepend mark + digit
    "\x00",
    "क्षि",  # Devanagari conjunct
    "Hello.",
    "Why?",
    "Stop!",
    "...",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    "\r\n\r\n",
    "\u3000",
    "\xa0",
    "\u2029",
    "\u2028",
    # structure and sentence-rule triggers for the sentence/hybrid strategies
    "# Title\n",
    "\n## Sub\n\n",
    "第一回　开头\n",
    "\u3000\u3000第二回 标题\n",
    "Chapter One\n",
    "CHAPTER 2\n",
    "M. ",
    "Dr. ",
    "e.g. ",
    "J. K. ",
    "p. ex. ",
    "etc. ",
    "3.14",
    "。」",
    "”",
    "！）",
    "话说",
    "…",
    "? » ",
    "「はい。」と",
    # bare joiners: they attach to whatever token precedes them (e.g. "。" + U+0301)
    "\u0301",
    "\u200d",
    "\ufe0f",
    "\U0001f3fd",
]


@st.composite
def mixed_text(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.sampled_from(_TOKENS) | st.text(max_size=5), max_size=80))
    return "".join(parts)


@st.composite
def sizes(draw: st.DrawFn) -> tuple[int, int]:
    chunk_size = draw(st.integers(min_value=1, max_value=300))
    overlap = draw(st.integers(min_value=0, max_value=chunk_size - 1))
    return chunk_size, overlap


@st.composite
def small_sizes(draw: st.DrawFn) -> tuple[int, int]:
    """Sizes small enough that short texts are split into many chunks."""
    chunk_size = draw(st.integers(min_value=1, max_value=40))
    overlap = draw(st.integers(min_value=0, max_value=chunk_size - 1))
    return chunk_size, overlap


_PROPERTY_SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
# Per strategy (x5 strategies).
_PROPERTY_SETTINGS_ALL = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
)


# ------------------------------------------------------------------------------------------
# Property tests
# ------------------------------------------------------------------------------------------


def _heading_predicate(line: str) -> bool:
    return line.lstrip().startswith(("#", "第", "Chapter"))


#: Every strategy and setting variant; each must satisfy the same invariants.
STRATEGIES: dict[str, Any] = {
    "recursive": RecursiveChunker,
    "sentence": SentenceChunker,
    "hybrid": HybridChunker,
    "hybrid-no-merge": lambda size, overlap: HybridChunker(size, overlap, merge_short=False),
    "hybrid-callable-heading": lambda size, overlap: HybridChunker(
        size, overlap, heading=_heading_predicate
    ),
}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@_PROPERTY_SETTINGS_ALL
@given(text=st.text(max_size=300) | mixed_text(), cfg=sizes() | small_sizes())
def test_every_strategy_invariants(strategy: str, text: str, cfg: tuple[int, int]) -> None:
    chunker = STRATEGIES[strategy](*cfg)
    chunks = chunker.chunk(text)
    assert_invariants(text, chunks, *cfg)
    assert chunker.chunk(text) == chunks  # deterministic
    assert [c.metadata for c in chunker.chunk(text)] == [c.metadata for c in chunks]


_EMOJI = ["👩\u200d👧", "🇫🇷"]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@_PROPERTY_SETTINGS_ALL
@given(
    text=st.lists(
        st.sampled_from(
            ["Mot.", "mot", "是。", "好！」", " ", "\n", "\n\n", "\r\n", "e\u0301", *_EMOJI]
        ),
        max_size=150,
    ).map("".join),
    cfg=small_sizes(),
)
def test_every_strategy_many_chunks(strategy: str, text: str, cfg: tuple[int, int]) -> None:
    """Small sizes over sentence-rich text: many cuts, many overlaps."""
    chunks = STRATEGIES[strategy](*cfg).chunk(text)
    assert_invariants(text, chunks, *cfg)


@_PROPERTY_SETTINGS
@given(text=st.text(max_size=400), cfg=sizes() | small_sizes())
def test_invariants_arbitrary_unicode(text: str, cfg: tuple[int, int]) -> None:
    chunker = RecursiveChunker(*cfg)
    chunks = chunker.chunk(text)
    assert_invariants(text, chunks, *cfg)
    assert chunker.chunk(text) == chunks  # deterministic


@_PROPERTY_SETTINGS
@given(text=mixed_text(), cfg=sizes() | small_sizes())
def test_invariants_mixed_scripts(text: str, cfg: tuple[int, int]) -> None:
    chunker = RecursiveChunker(*cfg)
    chunks = chunker.chunk(text)
    assert_invariants(text, chunks, *cfg)
    assert chunker.chunk(text) == chunks


@_PROPERTY_SETTINGS
@given(
    text=st.lists(
        st.sampled_from(["alpha", "beta", "gamma.", "delta!", " ", "\n", "\n\n", "  ", "\r\n"]),
        max_size=120,
    ).map("".join),
    cfg=small_sizes(),
)
def test_chunks_are_trimmed_when_possible(text: str, cfg: tuple[int, int]) -> None:
    # Longest word is 6 chars: with chunk_size >= 6 whitespace can always be avoided.
    chunk_size, overlap = cfg
    chunks = RecursiveChunker(chunk_size, overlap).chunk(text)
    assert_invariants(text, chunks, chunk_size, overlap)
    if chunk_size >= 6:
        for c in chunks:
            assert c.text == c.text.strip()


@_PROPERTY_SETTINGS
@given(
    text=mixed_text(),
    cfg=small_sizes(),
    seps=st.lists(st.sampled_from(["\n\n", "\n", " ", ".", "。", "|", "ab", ""]), max_size=4),
)
def test_invariants_custom_separators(text: str, cfg: tuple[int, int], seps: list[str]) -> None:
    chunks = RecursiveChunker(*cfg, separators=seps).chunk(text)
    assert_invariants(text, chunks, *cfg)


# ------------------------------------------------------------------------------------------
# Settings and protocol
# ------------------------------------------------------------------------------------------


def test_default_settings() -> None:
    chunker = RecursiveChunker()
    assert chunker.chunk_size == 1000
    assert chunker.overlap == 200
    assert chunker.config() == {"strategy": "recursive", "chunk_size": 1000, "overlap": 200}
    assert isinstance(chunker, Chunker)


def test_config_with_custom_separators_is_json_able() -> None:
    import json

    cfg = RecursiveChunker(50, 5, separators=("\n", " ")).config()
    assert json.loads(json.dumps(cfg)) == {
        "strategy": "recursive",
        "chunk_size": 50,
        "overlap": 5,
        "separators": ["\n", " "],
    }


@pytest.mark.parametrize(
    ("chunk_size", "overlap", "message"),
    [
        (0, 0, "chunk_size must be > 0, got 0"),
        (-5, 0, "chunk_size must be > 0, got -5"),
        (10, -1, "overlap must be >= 0, got -1"),
        (100, 200, "overlap (200) must be smaller than chunk_size (100)"),
        (100, 100, "overlap (100) must be smaller than chunk_size (100)"),
    ],
)
def test_invalid_settings(chunk_size: int, overlap: int, message: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        RecursiveChunker(chunk_size, overlap)
    assert str(excinfo.value) == message


def test_invalid_types() -> None:
    with pytest.raises(TypeError, match="chunk_size"):
        RecursiveChunker(10.5, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="overlap"):
        RecursiveChunker(10, True)
    with pytest.raises(TypeError, match="separators"):
        RecursiveChunker(10, 0, separators="\n")
    with pytest.raises(TypeError, match="text"):
        RecursiveChunker(10, 0).chunk(b"bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", " ", "\n\n", " \t\r\n \u3000\xa0\u2029 "])
def test_blank_text_gives_no_chunks(text: str) -> None:
    assert RecursiveChunker(10, 2).chunk(text) == []


def test_whitespace_class_matches_str_isspace() -> None:
    expected = {ch for ch in map(chr, range(0x110000)) if ch.isspace()}
    assert set(_core.WS_CHARS) == expected
    assert _core.NON_WS.search(_core.WS_CHARS) is None
    everything = "".join(map(chr, range(0x110000)))
    assert len(_core.NON_WS.findall(everything)) == 0x110000 - len(expected)


# ------------------------------------------------------------------------------------------
# Chunk dataclass
# ------------------------------------------------------------------------------------------


def test_chunk_is_frozen_hashable_and_ignores_metadata_in_equality() -> None:
    a = Chunk("abc", 0, 5, 8, 1, {"k": [1, 2]})
    b = Chunk("abc", 0, 5, 8, 1)
    assert a == b
    assert hash(a) == hash(b)
    assert b.metadata == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.text = "x"  # type: ignore[misc]


def test_chunk_rejects_inconsistent_values() -> None:
    with pytest.raises(ValueError, match="len"):
        Chunk("abc", 0, 0, 2, 1)
    with pytest.raises(ValueError, match="index"):
        Chunk("abc", 1, 0, 3, 1)
    with pytest.raises(ValueError, match="offsets"):
        Chunk("", 0, 5, 4, 1)


# ------------------------------------------------------------------------------------------
# Separator priority (exact boundaries)
# ------------------------------------------------------------------------------------------


def spans(text: str, chunk_size: int, overlap: int = 0, **kwargs: Any) -> list[tuple[int, int]]:
    chunks = RecursiveChunker(chunk_size, overlap, **kwargs).chunk(text)
    assert_invariants(text, chunks, chunk_size, overlap)
    return [(c.start_offset, c.end_offset) for c in chunks]


def texts(text: str, chunk_size: int, overlap: int = 0, **kwargs: Any) -> list[str]:
    return [text[s:e] for s, e in spans(text, chunk_size, overlap, **kwargs)]


def test_paragraph_preferred_over_line() -> None:
    text = "aaa bbb\n\nccc ddd\neee fff ggg hhh iii"
    # A line cut at 16 would make a longer first chunk; the paragraph break wins.
    assert spans(text, 20) == [(0, 7), (9, 16), (17, 36)]


def test_paragraph_break_with_crlf_and_blank_line_spaces() -> None:
    text = "aaa bbb\r\n  \r\nccc ddd\r\neee"
    assert texts(text, 20) == ["aaa bbb", "ccc ddd\r\neee"]


def test_line_preferred_over_sentence() -> None:
    text = "Aa bb. Cc dd\nEe ff. Gg hh"
    assert spans(text, 20) == [(0, 12), (13, 25)]


def test_sentence_preferred_over_word() -> None:
    text = "Aa bb. Cc dd ee ff gg"
    assert texts(text, 15) == ["Aa bb.", "Cc dd ee ff gg"]


def test_sentence_end_needs_following_space() -> None:
    text = "v1.2.3 is out now"
    assert texts(text, 10) == ["v1.2.3 is", "out now"]


def test_word_preferred_over_hard_cut() -> None:
    assert texts("alpha beta gamma", 12) == ["alpha beta", "gamma"]


def test_hard_cut_when_no_separator() -> None:
    assert spans("abcdefghij", 4) == [(0, 4), (4, 8), (8, 10)]


def test_greedy_packing_of_paragraphs() -> None:
    text = "p1 p1\n\np2 p2\n\np3 p3\n\np4 p4"
    assert texts(text, 14) == ["p1 p1\n\np2 p2", "p3 p3\n\np4 p4"]


def test_cjk_sentences_cut_at_terminator() -> None:
    text = "这是第一句。这是第二句。这是第三句。"
    assert spans(text, 14) == [(0, 12), (12, 18)]
    assert texts(text, 8) == ["这是第一句。", "这是第二句。", "这是第三句。"]


def test_cjk_other_terminators_need_no_space() -> None:
    text = "你好吗？我很好！谢谢；再见。"
    assert texts(text, 9) == ["你好吗？我很好！", "谢谢；再见。"]


def test_overlap_starts_at_word_boundaries() -> None:
    text = "one two three four five six seven eight"
    assert texts(text, 15, 6) == [
        "one two three",
        "three four five",
        "five six seven",
        "seven eight",
    ]


def test_overlap_prefers_line_starts() -> None:
    text = "\n".join(["line one here", "line two here", "line three", "line four"])
    chunks = texts(text, 30, 14)
    assert chunks[0] == "line one here\nline two here"
    assert chunks[1].startswith("line two here")


def test_no_overlap_when_zero() -> None:
    text = " ".join(f"w{i}" for i in range(200))
    chunks = RecursiveChunker(50, 0).chunk(text)
    for prev, cur in pairwise(chunks):
        assert cur.start_offset >= prev.end_offset


def test_custom_separators_order_and_keep_separator() -> None:
    text = "a|b c|d e f"
    assert texts(text, 6, separators=["|", " "]) == ["a|b c|", "d e f"]
    # "" is the hard-cut level: separators after it are never used.
    assert texts("ab cd ef", 4, separators=["", " "]) == ["ab c", "d ef"]


# ------------------------------------------------------------------------------------------
# Graphemes
# ------------------------------------------------------------------------------------------


def test_french_accents_never_split() -> None:
    precomposed = "Été à la crème brûlée, déjà vu. " * 20
    decomposed = precomposed.replace("é", "e\u0301").replace("É", "E\u0301")
    decomposed = decomposed.replace("è", "e\u0300").replace("à", "a\u0300").replace("û", "u\u0302")
    for text in (precomposed, decomposed):
        for chunk_size in (2, 3, 5, 7, 40):
            chunks = RecursiveChunker(chunk_size, chunk_size // 2).chunk(text)
            assert_invariants(text, chunks, chunk_size, chunk_size // 2)
            for c in chunks:
                assert not c.text.startswith(("\u0300", "\u0301", "\u0302"))


def test_decomposed_hard_cut_keeps_pairs() -> None:
    text = "e\u0301" * 50
    chunks = RecursiveChunker(7, 0).chunk(text)
    assert [len(c.text) for c in chunks] == [6] * 16 + [4]
    assert "".join(c.text for c in chunks) == text


@pytest.mark.parametrize(
    "cluster", ["👩\u200d👩\u200d👧", "🇫🇷", "👍🏽", "❤\ufe0f", "\r\n", "क्षि", "e\u0301\u0323"]
)
def test_clusters_never_split(cluster: str) -> None:
    text = cluster * 30
    for chunk_size in range(len(cluster), len(cluster) * 3 + 2):
        for overlap in (0, chunk_size // 2, chunk_size - 1):
            chunks = RecursiveChunker(chunk_size, overlap).chunk(text)
            assert_invariants(text, chunks, chunk_size, overlap)
            for c in chunks:
                if cluster.strip():
                    assert len(c.text) % len(cluster) == 0


def test_flag_sequence_parity() -> None:
    text = "🇫🇷🇩🇪🇮🇹🇪🇸"  # boundaries only at even offsets
    for chunk_size in range(2, 9):
        for c in RecursiveChunker(chunk_size, 0).chunk(text):
            assert c.start_offset % 2 == 0 and c.end_offset % 2 == 0


def test_cluster_longer_than_chunk_size_is_hard_cut() -> None:
    text = "x a" + "\u0301" * 50 + " y"
    chunks = RecursiveChunker(10, 3).chunk(text)
    assert_invariants(text, chunks, 10, 3)
    assert all(len(c.text) <= 10 for c in chunks)


# ------------------------------------------------------------------------------------------
# Scale (no wall-clock assertions)
# ------------------------------------------------------------------------------------------


def _hard_wrapped(n_chars: int) -> str:
    line = "The quick brown fox jumps over the lazy dog. Pack my box with five dozen jugs.\n"
    para = line * 7 + "\n"
    return (para * (n_chars // len(para) + 1))[:n_chars]


def test_large_document_invariants() -> None:
    text = _hard_wrapped(200_000)
    chunks = RecursiveChunker().chunk(text)
    assert_invariants(text, chunks, 1000, 200)
    assert all(len(c.text) > 500 for c in chunks[:-1])


@pytest.mark.parametrize(
    "make",
    [
        _hard_wrapped,
        lambda n: ("lorem ipsum dolor sit amet. " * (n // 28 + 1))[:n],
        lambda n: ("这是一个句子包含一些中文字符。" * (n // 15 + 1))[:n],
        lambda n: "x" * n,
    ],
    ids=["hard-wrapped", "single-line", "cjk", "no-separators"],
)
def test_work_scales_linearly(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """4x the input must cost ~4x the chunks and ~4x the separator searches."""
    calls = 0
    original = _core._Level.last_cut

    def counting(self: Any, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        return original(self, *args)

    monkeypatch.setattr(_core._Level, "last_cut", counting)
    results = []
    for size in (250_000, 1_000_000):
        calls = 0
        chunks = RecursiveChunker().chunk(make(size))
        results.append((len(chunks), calls))
    (n_small, calls_small), (n_big, calls_big) = results
    assert 3.9 <= n_big / n_small <= 4.1
    assert calls_big <= 4.1 * calls_small


# ------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------


def test_get_chunker_default_and_sizes() -> None:
    chunker = get_chunker()
    assert isinstance(chunker, RecursiveChunker)
    assert (chunker.chunk_size, chunker.overlap) == (1000, 200)
    small = get_chunker("recursive", chunk_size=50, overlap=10)
    assert small.config() == {"strategy": "recursive", "chunk_size": 50, "overlap": 10}
    with pytest.raises(ValueError, match="overlap"):
        get_chunker("recursive", chunk_size=10, overlap=10)


def test_get_chunker_passes_instances_through() -> None:
    chunker = RecursiveChunker(30, 3)
    assert get_chunker(chunker) is chunker


def test_get_chunker_unknown_strategy_lists_known() -> None:
    with pytest.raises(ValueError) as excinfo:
        get_chunker("semantic-magic")
    message = str(excinfo.value)
    assert "'semantic-magic'" in message
    assert "'recursive'" in message


def test_get_chunker_rejects_other_types() -> None:
    with pytest.raises(TypeError):
        get_chunker(42)  # type: ignore[arg-type]


class _SentenceChunker:
    """Toy chunker: one chunk per whole text (for registry tests)."""

    def __init__(self, *, chunk_size: int, overlap: int) -> None:
        self.chunk_size = chunk_size
        self.overlap = overlap

    def chunk(self, text: str) -> list[Chunk]:
        return [Chunk(text, 0, 0, len(text), 1)] if text else []

    def config(self) -> dict[str, Any]:
        return {"strategy": "whole", "chunk_size": self.chunk_size, "overlap": self.overlap}


def test_register_chunker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    register_chunker("whole", _SentenceChunker)
    assert "whole" in available_chunkers()
    chunker = get_chunker("whole", chunk_size=7, overlap=1)
    assert isinstance(chunker, _SentenceChunker)
    assert isinstance(chunker, Chunker)
    assert chunker.config()["chunk_size"] == 7

    with pytest.raises(ValueError, match="already registered"):
        register_chunker("whole", _SentenceChunker)
    register_chunker("whole", RecursiveChunker, replace=True)
    assert isinstance(get_chunker("whole"), RecursiveChunker)

    with pytest.raises(ValueError):
        register_chunker("", RecursiveChunker)

    register_chunker("broken", lambda **_: object(), replace=True)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="broken"):
        get_chunker("broken")


def test_the_half_width_ideographic_full_stop_ends_a_sentence() -> None:
    """｡ (U+FF61, half-width Japanese text) was no sentence end for the recursive chunker and
    the model-window split: a chunk ended inside 本です."""
    text = "これはペンです｡あれは本です｡それは机です｡"
    chunks = RecursiveChunker(12, 0).chunk(text)
    assert [c.text for c in chunks] == ["これはペンです｡", "あれは本です｡", "それは机です｡"]
    assert_invariants(text, chunks, 12, 0)
