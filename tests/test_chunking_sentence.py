"""Sentence segmentation and SentenceChunker: golden tests on real French, Chinese, Japanese."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
import regex
from hypothesis import given
from hypothesis import strategies as st

from semantic_orm.chunking import SentenceChunker, get_chunker, sentence, sentence_spans
from tests.test_chunking import _PROPERTY_SETTINGS, assert_invariants, mixed_text

DATA = Path(__file__).parent / "data"


def sentences(text: str) -> list[str]:
    return [text[s:e] for s, e in sentence_spans(text)]


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------
# Segmentation rules
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("M. Dupont est là. Il pleut.", ["M. Dupont est là.", "Il pleut."]),
        ("Mme. Martin arrive. Bien.", ["Mme. Martin arrive.", "Bien."]),
        ("Des fruits, p. ex. des pommes. Oui.", ["Des fruits, p. ex. des pommes.", "Oui."]),
        ("Use tools, e.g. Python. Fine.", ["Use tools, e.g. Python.", "Fine."]),
        ("I met Dr. Who and Mr. Smith. Bye.", ["I met Dr. Who and Mr. Smith.", "Bye."]),
        ("J. K. Rowling wrote it. Yes.", ["J. K. Rowling wrote it.", "Yes."]),
        ("Pi is 3.14 exactly. Next.", ["Pi is 3.14 exactly.", "Next."]),
        ("Pommes, poires, etc. et le reste. Fin.", ["Pommes, poires, etc. et le reste.", "Fin."]),
        ("Pommes, poires, etc. Puis rien.", ["Pommes, poires, etc.", "Puis rien."]),
        ("Wait... Really?! Yes!", ["Wait...", "Really?!", "Yes!"]),
        ('He said "stop." Then he left.', ['He said "stop."', "Then he left."]),
        ("(See above.) Next one.", ["(See above.)", "Next one."]),
        ("« Où ? » demanda-t-il. Rien.", ["« Où ? » demanda-t-il.", "Rien."]),
        ("« Viens ici. » Il vint.", ["« Viens ici. »", "Il vint."]),
        ("这是第一句。这是第二句！第三句？", ["这是第一句。", "这是第二句！", "第三句？"]),
        ("他说：“你好。”然后走了。", ["他说：“你好。”", "然后走了。"]),
        ("「行くぞ！」彼は叫んだ。", ["「行くぞ！」", "彼は叫んだ。"]),
        ("「はい。」と言った。次。", ["「はい。」と言った。", "次。"]),
        ("全角句点．次の文", ["全角句点．", "次の文"]),
        ("数値は３．１４です。", ["数値は３．１４です。"]),
        ("第一句；第二句（注）。完", ["第一句；", "第二句（注）。", "完"]),
        ("Title\n\nBody text here.", ["Title", "Body text here."]),
        ("第一回　标题\n正文开始。", ["第一回　标题", "正文开始。"]),
        ("a hard-wrapped\nline of prose.", ["a hard-wrapped\nline of prose."]),
        ("- item one\n- item two", ["- item one", "- item two"]),
        ("no terminator at all", ["no terminator at all"]),
        ("  padded.  \r\n  ", ["padded."]),
    ],
)
def test_sentence_rules(text: str, expected: list[str]) -> None:
    assert sentences(text) == expected


def test_sentence_spans_sub_range_and_grapheme_safety() -> None:
    text = "xx。\u0301Next one. Tail"
    # The combining mark after 。 belongs to the terminator's cluster: the end moves past it.
    assert sentences(text) == ["xx。\u0301", "Next one.", "Tail"]
    assert [text[s:e] for s, e in sentence_spans(text, 4, 13)] == ["Next one."]


@_PROPERTY_SETTINGS
@given(text=mixed_text() | st.text(max_size=200))
def test_sentence_spans_properties(text: str) -> None:
    """Every sentence edge is a grapheme boundary; sentences are ordered, disjoint, trimmed
    (unless a cluster straddles the edge) and cover every non-whitespace character."""
    boundaries = {0, len(text)} | {m.end() for m in regex.finditer(r"\X", text)}
    spans = sentence_spans(text)
    covered = [False] * len(text)
    prev_end = 0
    for s, e in spans:
        assert prev_end <= s < e
        assert s in boundaries and e in boundaries, (s, e)
        assert text[s:e].strip()
        assert not text[s].isspace() or (s + 1 < len(text) and not _is_cluster_start(text, s + 1))
        for i in range(s, e):
            covered[i] = True
        prev_end = e
    assert all(covered[i] for i, ch in enumerate(text) if not ch.isspace())


def _is_cluster_start(text: str, i: int) -> bool:
    return any(m.start() == i for m in regex.finditer(r"\X", text))


# ------------------------------------------------------------------------------------------
# Golden tests on real text
# ------------------------------------------------------------------------------------------


def test_french_golden_boundaries() -> None:
    text = read("fr.txt")
    got = sentences(text)
    assert "En 1815, M. Charles-François-Bienvenu Myriel était évêque de Digne." in got
    assert "M. Myriel était fils d'un conseiller au parlement d'Aix ; noblesse de robe." in got
    assert any(s.startswith("M. Dupont, le notaire, affirma") for s in got)
    assert any(s.startswith("Le Dr. Martin, qui connaissait J. K. Rowling") for s in got)
    assert "« Vous êtes le nouveau domestique ? demanda-t-il. »" in got
    assert any(
        s.startswith("Passepartout avait, p. ex., exercé") and s.endswith("le repos.") for s in got
    )
    assert "Qui l'eût cru ?" in got and "Personne !" in got
    for s in got:  # no sentence ends on an abbreviation or initial
        assert not s.endswith((" M.", " Dr.", " Mme.", " J.", " K.", " p.", " ex."))
        assert not s[:1].islower()


def test_chinese_golden_boundaries() -> None:
    text = read("zh.txt")
    got = sentences(text)
    assert got[:4] == [
        "红楼梦（节选，公有领域）",
        "第一回　甄士隐梦幻识通灵　贾雨村风尘怀闺秀",
        "此开卷第一回也。",
        "作者自云：因曾历过一番梦幻之后，故将真事隐去，而借“通灵”之说，撰此《石头记》一书也。",
    ]
    # The closing quote stays with the sentence it ends.
    assert "石道：“自然，自然。”" in got
    assert "那些人只嚷：“快请出甄爷来！”" in got
    for s in got:
        if not s.startswith(("红楼梦", "第")):
            assert s[-1] in "。！？；”’」』）", s
        assert not s.startswith(("”", "’", "」", "）"))


def test_japanese_golden_boundaries() -> None:
    text = read("ja.txt")
    got = sentences(text)
    assert got[1:3] == ["吾輩は猫である。", "名前はまだ無い。"]
    assert "「王様は、人を殺します。」" in got
    assert "「なぜ殺すのだ。」と老爺は答えた。" in got
    assert "メロスは激怒した。" in got
    for s in got[1:]:
        assert s[-1] in "。！？」", s


# ------------------------------------------------------------------------------------------
# SentenceChunker
# ------------------------------------------------------------------------------------------


def test_packs_whole_sentences_greedily() -> None:
    text = "One two. Three four. Five six. Seven."
    chunks = SentenceChunker(20, 0).chunk(text)
    assert_invariants(text, chunks, 20, 0)
    assert [c.text for c in chunks] == ["One two. Three four.", "Five six. Seven."]


def test_overlap_is_whole_trailing_sentences_within_cap() -> None:
    text = "Aaaa aa. Bb. Cc. Dddd ddd. Ee."
    # Chunk 1 = "Aaaa aa. Bb. Cc." (16); the next repeats "Bb. Cc." (7 <= 8), not "Cc." alone;
    # "Dddd ddd." (9 > 8) is too long to be repeated, so the last chunk has no overlap.
    chunks = SentenceChunker(20, 8).chunk(text)
    assert_invariants(text, chunks, 20, 8)
    assert [c.text for c in chunks] == ["Aaaa aa. Bb. Cc.", "Bb. Cc. Dddd ddd.", "Ee."]
    chunks = SentenceChunker(20, 9).chunk(text)
    assert [c.text for c in chunks] == ["Aaaa aa. Bb. Cc.", "Bb. Cc. Dddd ddd.", "Dddd ddd. Ee."]
    # A cap smaller than any trailing sentence means no overlap at all.
    chunks = SentenceChunker(20, 2).chunk(text)
    assert all(b.start_offset >= a.end_offset for a, b in pairwise(chunks))


def test_cjk_sentence_chunks_end_at_terminators() -> None:
    text = read("zh.txt")
    for size, overlap in ((120, 30), (300, 60), (1000, 200)):
        chunks = SentenceChunker(size, overlap).chunk(text)
        assert_invariants(text, chunks, size, overlap)
        for c in chunks:
            if len(c.text) < size and not c.text.endswith(("）", "秀", "府", "女")):
                assert c.text[-1] in "。！？；”」", c.text[-10:]
            assert c.text[0] not in "”」）。"


def test_long_sentence_falls_back_to_recursive_with_shifted_offsets() -> None:
    long = " ".join(f"Word{i}" for i in range(60))  # ~ 400 chars, no terminator
    text = f"Short one. {long}. After it. 最后。"
    chunks = SentenceChunker(50, 10).chunk(text)
    assert_invariants(text, chunks, 50, 10)
    assert chunks[0].text == "Short one."
    assert chunks[-1].text.endswith("After it. 最后。")
    middle = chunks[1:-1]
    assert len(middle) >= 8
    assert all(c.text.startswith("Word") for c in middle)


def test_config_and_registry() -> None:
    chunker = get_chunker("sentence", chunk_size=300, overlap=30)
    assert isinstance(chunker, SentenceChunker)
    assert chunker.config() == {"strategy": "sentence", "chunk_size": 300, "overlap": 30}
    with pytest.raises(ValueError, match="overlap"):
        get_chunker("sentence", chunk_size=30, overlap=30)
    with pytest.raises(ValueError, match="chunk_size"):
        SentenceChunker(0, 0)
    with pytest.raises(TypeError, match="text"):
        SentenceChunker(10, 0).chunk(None)  # type: ignore[arg-type]


def test_abbreviation_lists_are_exposed() -> None:
    assert "Mme" in sentence.ABBREVIATIONS and "etc" in sentence.FINAL_ABBREVIATIONS


# ------------------------------------------------------------------------------------------
# Linear time (operation counts, no clocks)
# ------------------------------------------------------------------------------------------


def test_sentence_chunker_scales_linearly(monkeypatch: pytest.MonkeyPatch) -> None:
    """4x the text must mean ~4x the chunks and ~4x the characters the regexes scan."""
    from tests.test_chunking_hybrid import count_scanned

    unit = read("fr.txt") + read("zh.txt") + ("x" * 3000) + " " + read("ja.txt")
    results = []
    for copies in (4, 16):
        text = unit * copies
        with count_scanned(monkeypatch) as scanned:
            chunks = SentenceChunker(500, 100).chunk(text)
        results.append((len(chunks), scanned[0]))
    (n_small, scan_small), (n_big, scan_big) = results
    assert 3.9 <= n_big / n_small <= 4.1
    assert scan_big <= 4.2 * scan_small
