"""The BM25 keyword vectors: tokenization (English, French, CJK) and term weights."""

from __future__ import annotations

import random
import string
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semantic_orm import keywords
from semantic_orm.keywords import document_vector, query_vector, tokenize


def test_english_words_are_folded_stemmed_and_stopwords_dropped() -> None:
    assert list(tokenize("The Rivers of the WORLD")) == ["river", "world"]
    tokens = list(tokenize("Part XR-7734, isn't it?"))
    assert tokens == ["part", "xr-7734", "xr", "7734", "isn't", "isn"]


def test_french_accents_and_elisions() -> None:
    assert list(tokenize("L'évaluation des impôts")) == ["l'evaluation", "evaluation", "impot"]
    assert list(tokenize("bateaux")) == list(tokenize("bateau"))
    # a query without accents matches an accented document
    assert set(query_vector("evaluation").indices) <= set(document_vector("Évaluation").indices)


def test_cjk_runs_become_character_bigrams() -> None:
    bigrams = ["東京", "京都", "都に", "に行", "行く"]
    assert list(tokenize("東京都に行く", query=True)) == bigrams
    # a document's runs also yield their characters, after the bigrams
    assert list(tokenize("東京都に行く")) == [*bigrams, "東", "京", "都", "に", "行", "く"]
    assert list(tokenize("東")) == list(tokenize("東", query=True)) == ["東"]
    assert list(tokenize("서울 Seoul", query=True)) == ["서울", "seoul"]
    shared = set(query_vector("京都").indices) & set(document_vector("東京都の天気").indices)
    assert shared  # 京都 is a bigram of 東京都


@pytest.mark.parametrize(
    ("query", "document"),
    [("猫", "我喜欢猫和狗"), ("물", "맑은물이 흐른다"), ("犬", "犬が好きです"), ("京", "東京都")],
)
def test_a_one_character_query_finds_the_character_inside_a_run(query: str, document: str) -> None:
    assert set(query_vector(query).indices) <= set(document_vector(document).indices)
    # the characters count for nothing in the length: a longer query's weights do not change
    analyser = keywords.KeywordAnalyzer()
    assert analyser.counts(document)[1] == analyser.counts(document, query=True)[1]
    assert not set(query_vector("狗猫").indices) & set(document_vector("猫狗").indices)


def test_the_long_vowel_mark_belongs_to_its_kana_word() -> None:
    # ー (and the half-width ｰ NFKC turns into it) is in no script: it used to cut the word into
    # one-letter terms that matched any katakana text holding コ and ヒ
    assert list(tokenize("コーヒー", query=True)) == ["コー", "ーヒ", "ヒー"]
    assert list(tokenize("ｺｰﾋｰ", query=True)) == ["コー", "ーヒ", "ヒー"]
    assert list(tokenize("ラーメン屋", query=True)) == ["ラー", "ーメ", "メン", "ン屋"]
    coffee = set(query_vector("コーヒー").indices)
    assert coffee <= set(document_vector("朝はコーヒーを飲む").indices)
    assert not coffee & set(document_vector("コピーとヒント").indices)


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ("ex\u00adample", "example"),  # a soft hyphen (hyphenated HTML)
        ("ഞാൻ\u200dമലയാളം", "ഞാൻമലയാളം"),  # a zero-width joiner
        ("\ufeffpump", "pump"),  # a byte-order mark
        ("word\u2060joined", "wordjoined"),  # the word joiner
        ("\u200fשלום\u200f", "שלום"),  # bidirectional marks
        ("辻\U000e0100さん", "辻さん"),  # an ideographic variation selector (a name's glyph)
        ("葛\ufe00飾区", "葛飾区"),  # a standardized variation selector
    ],
)
def test_invisible_format_characters_do_not_split_words(text: str, plain: str) -> None:
    assert list(tokenize(text)) == list(tokenize(plain))
    assert document_vector(text) == document_vector(plain)


def test_a_zero_width_space_and_a_non_joiner_are_boundaries() -> None:
    assert list(tokenize("foo\u200bbar")) == ["foo", "bar"]
    # in Persian the non-joiner parts a word from its suffix: books (کتاب‌ها) hold a book
    books = "کتاب\u200cهای فارسی"
    assert set(query_vector("کتاب").indices) <= set(document_vector(books).indices)


def test_only_chinese_japanese_and_korean_letters_are_terms_on_their_own() -> None:
    """A Thai run yields no single letters (an alphabet's letters are not words); a run that
    mixes Thai and Han (neither is written with spaces) yields the Han characters, whichever
    script comes first."""
    assert list(tokenize("นักเรียน")) == list(tokenize("นักเรียน", query=True))
    for text in ("ร้านอาหาร北京", "北京ร้านอาหาร"):
        singles = [t for t in tokenize(text) if len(t) == 1]
        assert singles == ["北", "京"], (text, singles)
        assert set(query_vector("京").indices) <= set(document_vector(text).indices)


def test_a_huge_letter_of_a_run_is_analysed_but_not_kept() -> None:
    """A Han letter carrying thousands of combining marks is one character, and one term: a
    query of such letters per search must not grow the run terms' cache by their size."""
    huge = "猫" + "\u0301" * 5000
    text = f"{huge}狗"
    first = keywords.analyzer_for(None).counts(text)
    assert all(len(term) <= keywords._WORD_CACHED for term in keywords._runs)
    assert keywords.analyzer_for(None).counts(text) == first
    assert set(query_vector(huge).indices) <= set(document_vector(text).indices)


def test_document_weights_saturate_and_normalise_by_length() -> None:
    once = document_vector("pump")
    twice = document_vector("pump pump")
    (w1,), (w2,) = once.values, twice.values
    assert w1 < w2 < (keywords.K1 + 1)  # more occurrences weigh more, up to k1 + 1
    long = document_vector("pump " + "valve " * 200)
    index = once.indices[0]
    assert dict(zip(long.indices, long.values, strict=True))[index] < w1  # long chunks weigh less
    assert list(once.indices) == sorted(set(once.indices))


def test_query_vectors_weigh_each_distinct_term_once() -> None:
    q = query_vector("pump pump valve")
    assert len(q.indices) == 2 and q.values == (1.0, 1.0)
    assert not query_vector("the of and")  # only stop words: empty, falsy


@pytest.mark.parametrize("text", ["", "   ", "!!!"])
def test_empty_text_gives_an_empty_vector(text: str) -> None:
    assert document_vector(text).indices == ()


def test_scripts_without_spaces_become_bigrams_and_marks_stay_in_their_word() -> None:
    # Thai has no spaces: bigrams of its characters (a letter with its marks is one)
    assert list(tokenize("นักเรียน", query=True)) == ["นัก", "กเ", "เรี", "รีย", "ยน"]
    # Devanagari vowel signs and the virama are part of the word, not separators
    assert list(tokenize("हिन्दी भाषा")) == ["हिन्दी", "भाषा"]
    # Vietnamese accents tell words apart: kept; a French word's are folded
    assert list(tokenize("người Việt")) == ["người", "việt"]
    assert list(tokenize("élève")) == ["eleve"]
    # Arabic harakat are marks of the word too
    assert list(tokenize("كَتَبَ")) == ["كَتَبَ"]


def test_bigram_chunks_count_a_third_of_a_word_each_in_their_length() -> None:
    counts, length = keywords.analyzer_for(None).counts("東京都 river")
    # two bigrams and a word; the document's three single characters count for nothing
    assert sum(counts.values()) == 6 and length == pytest.approx(2 / 3 + 1)


def test_a_language_stems_with_qdrants_snowball_and_keeps_codes_whole() -> None:
    german = keywords.analyzer_for("de")
    assert german is keywords.analyzer_for("de") and german.language == "german"
    assert german.id == f"{keywords.KEYWORDS_VERSION}:german"
    houses = german.document_vector("Die Häuser am See")
    house = german.query_vector("Haus")
    assert set(house.indices) <= set(houses.indices)  # Häuser and Haus share a stem
    assert not german.query_vector("die und das")  # German stop words
    code = german.query_vector("XR-7734")
    assert set(code.indices) <= set(german.document_vector("Filter XR-7734 tauschen").indices)
    assert len(code.indices) == 3  # the whole code, and its two parts
    mixed = german.counts("Tokio 東京都")[0]
    assert keywords._index("東京") in mixed and keywords._index("京都") in mixed
    russian = keywords.analyzer_for("russian")
    assert set(russian.query_vector("столицы").indices) == set(
        russian.query_vector("столица").indices
    )
    # its weights saturate and normalise by length like the built-in analyser's
    (w1,) = german.document_vector("Pumpe").values
    (w2,) = german.document_vector("Pumpe Pumpe").values
    assert w1 < w2 < keywords.K1 + 1


def _counted(text: str, query: bool = False) -> tuple[Counter[int], float]:
    """What ``KeywordAnalyzer().counts`` must give: each term of :func:`tokenize` counted, and
    the length summed term by term in the order of a query's terms (a bigram a third of a
    word; a document's single characters of a run are the terms a query does not have)."""
    expected = Counter(keywords._index(term) for term in tokenize(text, query=query))
    length = 0.0
    for term in tokenize(text, query=True):
        length += keywords.BIGRAM_LENGTH if keywords._RUN_RE.match(term) else 1.0
    return expected, length


def test_the_analyser_counts_exactly_the_terms_tokenize_yields() -> None:
    """Each word's analysis is remembered (a corpus repeats its vocabulary) and ASCII text is
    read by the standard library's engine: the counts and the length must stay exactly those
    of ``tokenize``, on first sight of a word and after, for ASCII text and any other."""
    pieces = [
        "Rivers",
        "rivières",
        "l'impôt",
        "XR-7734",
        "jeux",
        "bateaux",
        "the",
        "and",
        "Ñandú",
        "Straße",
        "ĐƯỜNG",
        "phở",
        "東京都",
        "京都",
        "ひらがな",
        "コーヒー",
        "猫",
        "ex\u00adample",
        "\u200d",
        "한국어",
        "ภาษาไทย",
        "नमस्ते",
        "مَدْرَسَة",
        "Москва",
        "Ἀθῆναι",
        "x",
        "42",
        "co-op's",
        "statuses",
        "ｆｕｌｌ",
        "Ⅻ",
        "",
    ]
    plain = [piece for piece in pieces if piece.isascii()] + ["O'Neil-2", "a-", "'b", "-"]
    separators = [" ", "  ", ", ", ". ", "\n\n", "-", "'", "/", "—"]
    rng = random.Random(5)
    analyser = keywords.KeywordAnalyzer()
    for i in range(600):
        words, between = (plain, separators[:-1]) if i % 2 else (pieces, separators)
        text = "".join(rng.choice(words) + rng.choice(between) for _ in range(rng.randint(1, 30)))
        assert text.isascii() or i % 2 == 0
        for _ in range(2):  # words first seen, then remembered
            assert analyser.counts(text) == _counted(text), text
            assert analyser.counts(text, query=True) == _counted(text, query=True), text


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120) | st.text(alphabet=string.printable, max_size=120))
def test_any_text_counts_the_terms_tokenize_yields(text: str) -> None:
    analyser = keywords.KeywordAnalyzer()
    assert analyser.counts(text) == _counted(text)
    assert analyser.counts(text, query=True) == _counted(text, query=True)


def test_no_term_of_a_word_is_a_bigram_in_any_script() -> None:
    """A word's terms each count one word in a chunk's length (``_word_indices``): runs of the
    unspaced scripts are cut out before words are read, and folding a word's accents never
    makes a letter of those scripts. Every code point, in a word of its own; and every letter
    of those scripts is at or above ``_UNSPACED_FROM`` (text below it is not searched)."""
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        prepared = keywords._RUN_RE.sub(" ", keywords._prepare(chr(code)))
        for word in keywords._WORD_RE.findall(prepared):
            for term in keywords._word_terms(word):
                assert not keywords._RUN_RE.search(term), (hex(code), term)
        if keywords._RUN_RE.match(chr(code)):  # text below the first of them has no run
            assert chr(code) >= keywords._UNSPACED_FROM, hex(code)


def test_long_words_are_analysed_but_not_kept() -> None:
    """The word cache keeps words of at most ``_WORD_CACHED`` characters: a query of one huge
    "word" per search must not grow it by the word's size; its vector is the same either way."""
    short, long = "riverbank", "x" * 5000 + "y"
    for word in (short, long):
        keywords._words.pop(word, None)
    first = document_vector(f"{short} {long}")
    assert short in keywords._words and long not in keywords._words
    assert document_vector(f"{short} {long}") == first
    assert query_vector(long).indices == document_vector(long).indices


def test_run_terms_are_counted_when_another_thread_clears_the_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run terms' dimensions are remembered in a bounded dict that any thread may clear
    when it is full: a count that read it meanwhile must still count every term."""
    expected = keywords.analyzer_for(None).counts("東京都に行く")

    class Cleared(dict[str, int]):
        def __getitem__(self, term: str) -> int:
            self.clear()  # as another thread's clear, between the update and the reads
            return super().__getitem__(term)

    monkeypatch.setattr(keywords, "_runs", Cleared())
    assert keywords.analyzer_for(None).counts("東京都に行く") == expected
