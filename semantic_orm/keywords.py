"""BM25 keyword vectors: the sparse half of hybrid search, computed locally with no model.

Dense embeddings capture meaning but blur exact strings: a product code such as ``XR-7734`` or a
rare surname rarely lands near its own query. Keyword search catches those. Each chunk gets a
*sparse vector* beside its dense one, from a :class:`KeywordAnalyzer`:

* the text is NFKC-normalised and lower-cased, loses its invisible format characters (a soft
  hyphen or a zero-width joiner inside a word), then is split by script: runs of Han, kana
  (with the long-vowel mark ``ー``) and Hangul (no spaces between words) become overlapping
  character bigrams (``東京都`` -> ``東京``, ``京都``), the usual CJK indexing unit, and so do
  runs of Thai, Lao, Khmer and Myanmar; a document's Chinese, Japanese and Korean runs also
  yield each of their characters (not counted in its length), so that a one-character query
  (``猫``) finds them; other text splits into words, whose combining marks (Devanagari vowel
  signs, Arabic harakat) stay part of the word;
* without a language (the default), accents are folded on Latin, Greek and Cyrillic words (so
  ``évaluation`` matches ``evaluation``), except words marked as Vietnamese (``ơ``, ``ư``,
  ``đ``, hook or dot below), where the accent tells words apart; English and French stop words
  are dropped and a light plural rule folds ``rivers`` onto ``river``, ``bateaux`` onto
  ``bateau``;
* with a language (``SemanticText(language="german")``), words go through Qdrant's own BM25
  tokenizer with that language's Snowball stemmer and stop-word list (the Rust implementation
  in ``qdrant-edge-py``): measured keyword-only MRR@5 on XQuAD, Russian 0.665 -> 0.794,
  Arabic 0.715 -> 0.802, German 0.850 -> 0.896, Spanish 0.908 -> 0.929;
* words joined by ``-`` or an apostrophe (``XR-7734``, ``l'impôt``) also yield the whole form;
* each term is hashed to a sparse dimension, so no vocabulary is stored;
* a document's weight for a term is BM25's saturated term frequency
  ``tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len))``, the length counting a bigram as
  a third of a word (bigram chunks hold about three times as many terms as word chunks of the
  same size), over an average of 64 words (256 with a language, Qdrant's own default, which its
  stop-word lists and stemmers were measured with); a query's weight is 1 per distinct term.
  Fixed averages rather than the live collection's: a point's weights would go stale as the
  average drifts, and the measured gain of the real average was under 0.006 MRR@5 outside CJK,
  which the bigram length captures.

Qdrant multiplies by the inverse document frequency itself (the sparse vector is declared with
the IDF modifier), so the dot product Qdrant computes is the BM25 score, and IDF stays correct as
rows are added or deleted. Both store adapters use these same vectors, so keyword results do not
depend on the backend. The analyser's :attr:`~KeywordAnalyzer.id` is stored with each point and
recorded with the collection. A change (a new version of this analysis, or another language) is
not drift: dense vectors stay valid, writes go on with the new analysis, and ``reindex --all``
(or ``reconcile``) rewrites the older points' keyword vectors without embedding anything.
"""

from __future__ import annotations

import functools
import itertools
import re
import unicodedata
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import regex

from .exc import MissingDependencyError
from .forking import RenewedLock
from .normalizing import LANGUAGES, check_language
from .stores.base import SparseVector

__all__ = [
    "KEYWORDS_VERSION",
    "KeywordAnalyzer",
    "analyzer_for",
    "document_vector",
    "query_vector",
    "tokenize",
]

KEYWORDS_VERSION = 3
"""Bumped whenever tokenization changes; stored in point payloads, so that a sync (and
``reindex --all``) rewrites the keyword vectors of points an older version wrote. 3: the
long-vowel mark in kana runs, the single characters of documents' CJK runs, invisible format
characters and variation selectors dropped."""

K1 = 1.2
B = 0.75
AVG_LEN = 64.0
"""The length normalisation's average, in words, of the built-in analyser."""
STEMMED_AVG_LEN = 256.0
"""The same for a language's analyser: Qdrant's BM25 default, which it was measured with. Its
stop-word lists are longer, so chunks count fewer words; at 64 the length penalty made the keyword
half of hybrid search too weak against a dense half the model only half understands (XQuAD-tr
hybrid 0.013 below keyword-only on all 1,190 questions)."""
BIGRAM_LENGTH = 1 / 3
"""What one character bigram counts for in a chunk's length, in words."""

_UNSPACED = (
    r"\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}"
    "\u3006\u3031-\u3035\u303c\u30fc"
)
"""The scripts written without spaces, and the letters of kana and Han text that Unicode counts
in no script: the long-vowel mark ``ー`` (``コーヒー``, ``ラーメン``; NFKC makes the half-width
``ｰ`` this one), ``〆``, ``〼`` and the vertical kana repeat marks."""
_RUN_RE = regex.compile(rf"[{_UNSPACED}][{_UNSPACED}\p{{M}}]*")
_WORD_RE = regex.compile(r"[\p{L}\p{N}][\p{L}\p{N}\p{M}]*(?:[-'][\p{L}\p{N}][\p{L}\p{N}\p{M}]*)*")
"""A word, in text without runs of the scripts above (they are cut out first)."""
_CODE_RE = regex.compile(r"[\p{L}\p{N}][\p{L}\p{N}\p{M}]*(?:-[\p{L}\p{N}][\p{L}\p{N}\p{M}]*)+")
"""A hyphenated code (``XR-7734``), kept whole beside its parts by a language's analyser.

Not apostrophes: with a language they are the stemmer's business (Turkish writes every
suffix of a name after one, ``İstanbul'un``), and a whole form no other text repeats would
only dilute the query's keyword evidence (measured: XQuAD-tr hybrid MRR@5 -0.01)."""
_VIETNAMESE_RE = regex.compile("[\u01a1\u01b0\u0111\u0309\u031b\u0323]")
"""ơ, ư, đ and the hook above, horn and dot below: letters of Vietnamese only."""

_STOPWORDS = frozenset(
    """
    a an and are as at be been but by for from has have he her his i if in into is it its me my
    no not of on or our she so than that the their them then there these they this those to us
    was we were what when where which who whom why will with you your do does did can could
    would should how all any
    au aux avec ce ces cette dans de des du elle en et est il ils je la le les leur lui ma mais
    me meme mes moi mon ne nos notre nous on ou par pas pour qu que qui sa se ses son sur ta te
    tes toi ton tu un une vos votre vous y d l c j n s t
    """.split()
)


def _fold(word: str) -> str:
    """``word`` without the accents of its Latin, Greek and Cyrillic letters."""
    if word.isascii() or _VIETNAMESE_RE.search(unicodedata.normalize("NFD", word)):
        return word
    out: list[str] = []
    for ch in unicodedata.normalize("NFD", word):
        if unicodedata.combining(ch) and out and out[-1] < "\u0530":
            continue  # an accent on a Latin, Greek or Cyrillic letter
        out.append(ch)
    return unicodedata.normalize("NFC", "".join(out))


_GRAPHEME_RE = regex.compile(r"\X")


_IDEOGRAPHIC = r"\p{Han}\p{Hiragana}\p{Katakana}\p{Hangul}\u3006\u3031-\u3035\u303c\u30fc"
_IDEOGRAPHIC_RE = regex.compile(f"[{_IDEOGRAPHIC}]")
"""A letter whose single characters are words too (a Han character, a Hangul syllable):
Chinese, Japanese and Korean, not the alphabets of Thai, Lao, Khmer and Myanmar."""
_IDEOGRAPHIC_RUN_RE = regex.compile(rf"[{_IDEOGRAPHIC}\p{{M}}]+")
"""A run of those letters only (with their marks): all its characters are terms too."""


def _run_terms(run: str, grams: list[str], singles: list[str] | None) -> None:
    """Add the character bigrams of a run to ``grams`` (a letter with its marks counts as one
    character; a run of one character is its own term), and, for a document (``singles`` not
    ``None``), each character of a longer Chinese, Japanese or Korean run to ``singles``: a
    query of one character (``猫``) finds the text that holds it inside a word, and a query of
    two or more characters reads bigrams only, so its scores do not change."""
    chars = _GRAPHEME_RE.findall(run)
    if len(chars) == 1:
        grams += chars
        return
    grams += [a + b for a, b in itertools.pairwise(chars)]
    if singles is None:
        return
    if _IDEOGRAPHIC_RUN_RE.fullmatch(run):
        singles += chars
    elif _IDEOGRAPHIC_RE.search(run):  # mixed with Thai (written without spaces either)
        singles += [char for char in chars if _IDEOGRAPHIC_RE.match(char)]


def _stem(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word[-1] == "s" and word[-2] not in "su":
        return word[:-1]  # rivers -> river (not: status, class)
    if len(word) > 3 and word.endswith(("aux", "eux")):
        return word[:-1]  # bateaux -> bateau, jeux -> jeu
    return word


_INVISIBLE_RE = regex.compile(
    r"[[\p{Cf}--[\u200b\u200c]]\ufe00-\ufe0f\U000e0100-\U000e01ef]", regex.V1
)
"""Invisible format characters, which Unicode's word boundaries (UAX #29) pass over inside a
word: the soft hyphen of hyphenated HTML (``ex\u00adample``), the zero-width joiner of Indic
scripts, the word joiner, a byte-order mark, bidirectional marks. Not the zero-width space,
which is a boundary, nor the zero-width non-joiner, which in Persian parts a word from its
suffix (``کتاب‌ها``, books: a query ``کتاب`` finds it, as Lucene's Persian analysis reads it).
And the variation selectors, which choose a glyph of the same character (a Japanese name's
``辻󠄀``, an emoji's text or picture form): a query typed without them finds the text."""


def _prepare(text: str) -> str:
    """``text`` NFKC-normalised and lower-cased, without invisible format characters."""
    text = unicodedata.normalize("NFKC", text).lower()
    return text if text.isascii() else _INVISIBLE_RE.sub("", text)


def tokenize(text: str, *, query: bool = False) -> Iterator[str]:
    """The index terms of ``text`` without a language: folded words, stems, bigrams, and (not
    for a ``query``) the single characters of the Chinese, Japanese and Korean runs the bigrams
    come from, after them.

    Words joined by ``-`` or an apostrophe (``XR-7734``, ``l'impôt``) yield the whole form and
    each part, so a product code matches as a unit and by its pieces.
    """
    text = _prepare(text)
    if _RUN_RE.search(text):
        grams: list[str] = []
        singles: list[str] | None = None if query else []
        for run in _RUN_RE.findall(text):
            _run_terms(run, grams, singles)
        yield from grams
        yield from singles or ()
        text = _RUN_RE.sub(" ", text)
    for match in _WORD_RE.finditer(text):
        yield from _word_terms(match.group())


def _index(term: str) -> int:
    return zlib.crc32(term.encode("utf-8")) & 0x7FFFFFFF


_SPLIT_RE = re.compile(r"[-']")
_ASCII_WORD_RE = re.compile(r"[A-Za-z0-9]+(?:[-'][A-Za-z0-9]+)*")
""":data:`_WORD_RE` on ASCII text, where ``\\p{L}``, ``\\p{N}`` and ``\\p{M}`` are these letters
and digits and nothing else: the standard library's engine finds them several times faster."""
_UNSPACED_FROM = "\u0e00"
"""Every script of the bigram runs starts at or above Thai: text below it has no run."""
_FROM_THAI_RE = re.compile(f"[{_UNSPACED_FROM}-\U0010ffff]")
"""A character at or above :data:`_UNSPACED_FROM` (found faster than a run is searched)."""
_WORDS_KEPT = 1 << 17
_WORD_CACHED = 40
"""Longest word kept in :data:`_words` (longer ones are rare, and bound its memory)."""
_words: dict[str, tuple[int, ...]] = {}
"""Each word seen lately, with its terms' dimensions: a text repeats its words, and a corpus its
vocabulary, so most words are analysed once (bounded: cleared when full, words of at most
:data:`_WORD_CACHED` characters)."""


_runs: dict[str, int] = {}
"""The dimension of each bigram and character of a run seen lately (bounded as :data:`_words`
is, by count and by length): CJK text repeats a few thousand characters and their pairs, so
that most of them are hashed once, and a chunk's terms are counted by dimension in one pass of
the interpreter's own loops."""


def _run_counts(terms: list[str]) -> Counter[int]:
    """How many times each dimension occurs among the run terms ``terms``."""
    new = set(terms).difference(_runs)
    if new:
        if max(map(len, new)) > _WORD_CACHED:  # a letter with thousands of marks: not kept
            return Counter(map(_index, terms))
        if len(_runs) + len(new) > _WORDS_KEPT:
            _runs.clear()
            new = set(terms)
        _runs.update((term, _index(term)) for term in new)
    try:
        return Counter(map(_runs.__getitem__, terms))
    except KeyError:  # another thread cleared it meanwhile (it was full)
        return Counter(map(_index, terms))


def _word_terms(word: str) -> Iterator[str]:
    """The index terms of one word of :func:`tokenize` (folded, split at ``-'``, stemmed)."""
    token = _fold(word)
    parts = _SPLIT_RE.split(token) if "-" in token or "'" in token else (token,)
    if len(parts) > 1:
        yield token
    for part in parts:
        if part and part not in _STOPWORDS:
            yield _stem(part)


def _word_indices(word: str) -> tuple[int, ...]:
    """The dimensions of ``word``'s terms. Each counts one word in a chunk's length: the runs
    of unspaced scripts are cut out before words are found, so no term of a word is a bigram
    (checked over every code point by the tests)."""
    found = _words.get(word)
    if found is None:
        found = tuple(_index(t) for t in _word_terms(word))
        if len(word) <= _WORD_CACHED:  # not a 20,000-character "word" a query may send
            if len(_words) >= _WORDS_KEPT:
                _words.clear()
            _words[word] = found
    return found


class KeywordAnalyzer:
    """Turns chunks and queries into BM25 sparse vectors (see the module docstring).

    Args:
        language: A Snowball language (``"german"``, or its code ``"de"``) for stemming and
            stop words, through ``qdrant-edge-py``; ``None`` for the built-in analyser.

    Raises:
        ConfigurationError: An unknown language.
    """

    def __init__(self, language: str | None = None) -> None:
        self.language = check_language(language)
        self._words: Any = None
        self._lock = RenewedLock()

    def __repr__(self) -> str:
        return f"KeywordAnalyzer({self.language!r})"

    @property
    def id(self) -> str:
        """What produced a vector, stored with each point: the version and the language."""
        return (
            str(KEYWORDS_VERSION)
            if self.language is None
            else f"{KEYWORDS_VERSION}:{self.language}"
        )

    def _qdrant(self) -> Any:
        if self._words is None:
            with self._lock:
                if self._words is None:
                    try:
                        import qdrant_edge as qe
                    except ImportError as exc:
                        raise MissingDependencyError(
                            f"keyword analysis in {self.language} uses Qdrant's stemmers: "
                            "pip install 'semantic-orm[edge]'"
                        ) from exc
                    name = LANGUAGES[str(self.language)]
                    stop = getattr(qe.Language, name, None)
                    config = qe.Bm25Config(
                        k=K1,
                        b=0.0,  # weights carry the term frequency; the length is applied here
                        tokenizer=qe.TokenizerType.Word,
                        stemmer=qe.SnowballParams(getattr(qe.SnowballLanguage, name)),
                        stopwords=stop if stop is not None else qe.StopwordsSet(),
                    )
                    self._words = qe.Bm25(config)
        return self._words

    def counts(self, text: str, *, query: bool = False) -> tuple[Counter[int], float]:
        """Each term's dimension and count in ``text``, and the text's length in words (the
        single characters a document's runs add count for nothing in it: the bigrams already
        measure the run)."""
        words = _prepare(text)
        counts: Counter[int]
        length = 0.0
        if not words.isascii() and _FROM_THAI_RE.search(words) and _RUN_RE.search(words):
            grams: list[str] = []
            singles: list[str] | None = None if query else []
            for run in _RUN_RE.findall(words):
                _run_terms(run, grams, singles)
            for _ in grams:  # summed one at a time, as a term-by-term count sums them
                length += BIGRAM_LENGTH
            counts = _run_counts(grams + singles if singles else grams)
            words = _RUN_RE.sub(" ", words)
        else:
            counts = Counter()
        get = counts.get
        if self.language is None:  # the terms of tokenize(), each distinct word analysed once
            found = (_ASCII_WORD_RE if words.isascii() else _WORD_RE).findall(words)
            terms = 0
            known = _words.get
            for word, times in Counter(found).items():
                indices = known(word)
                if indices is None:
                    indices = _word_indices(word)
                for index in indices:
                    counts[index] = get(index, 0) + times
                    terms += times
            if length:  # after bigrams, one word at a time: the very sum a word-by-word count makes
                for _ in range(terms):
                    length += 1.0
            else:
                length = float(terms)
            return counts, length
        if "-" in words:
            for match in _CODE_RE.finditer(words):  # product codes as a whole, too
                index = _index(match.group())
                counts[index] = get(index, 0) + 1
                length += 1.0
        if words.strip():
            stemmed = self._qdrant().embed_document(words)
            for index, value in zip(stemmed.indices, stemmed.values, strict=True):
                tf = round(K1 * value / (K1 + 1 - value))  # b=0: value = tf (k1+1) / (tf+k1)
                counts[int(index)] += tf
                length += tf
        return counts, length

    def document_vector(self, text: str) -> SparseVector:
        """The BM25 term-frequency vector of a chunk (IDF is applied by Qdrant)."""
        counts, length = self.counts(text)
        average = AVG_LEN if self.language is None else STEMMED_AVG_LEN
        norm = K1 * (1 - B + B * length / average)
        indices = tuple(sorted(counts))
        scale = K1 + 1
        values = tuple([tf * scale / (tf + norm) for tf in map(counts.__getitem__, indices)])
        return SparseVector(indices, values)

    def query_vector(self, text: str) -> SparseVector:
        """A query's sparse vector: weight 1 for each distinct term."""
        counts, _ = self.counts(text, query=True)
        indices = sorted(counts)
        return SparseVector(tuple(indices), tuple(1.0 for _ in indices))


@functools.cache
def analyzer_for(language: str | None) -> KeywordAnalyzer:
    """The shared analyser for ``language`` (``None``: the built-in one)."""
    return KeywordAnalyzer(language)


def document_vector(text: str) -> SparseVector:
    """The BM25 term-frequency vector of a chunk, with the built-in analyser."""
    return analyzer_for(None).document_vector(text)


def query_vector(text: str) -> SparseVector:
    """A query's sparse vector with the built-in analyser: weight 1 for each distinct term."""
    return analyzer_for(None).query_vector(text)
