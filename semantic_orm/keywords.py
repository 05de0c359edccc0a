"""BM25 keyword vectors: the sparse half of hybrid search, computed locally with no model.

Dense embeddings capture meaning but blur exact strings: a product code such as ``XR-7734`` or a
rare surname rarely lands near its own query. Keyword search catches those. Each chunk gets a
*sparse vector* beside its dense one:

* the text is normalised (NFKC, lower case, accents folded so ``évaluation`` matches
  ``evaluation``) and split into words; runs of CJK characters, which have no spaces, become
  overlapping character bigrams (``東京都`` -> ``東京``, ``京都``), the usual CJK indexing unit;
* English and French stop words are dropped and a light plural rule folds ``rivers`` onto
  ``river`` and ``bateaux`` onto ``bateau``;
* each term is hashed (CRC-32) to a sparse dimension, so no vocabulary is stored;
* a document's weight for a term is BM25's saturated term frequency
  ``tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len))``; a query's weight is 1 per term.

Qdrant multiplies by the inverse document frequency itself (the sparse vector is declared with
the IDF modifier), so the dot product Qdrant computes is the BM25 score, and IDF stays correct as
rows are added or deleted. Both store adapters use these same vectors, so keyword results do not
depend on the backend.
"""

from __future__ import annotations

import re
import unicodedata
import zlib
from collections import Counter
from collections.abc import Iterator

from .stores.base import SparseVector

__all__ = ["KEYWORDS_VERSION", "document_vector", "query_vector", "tokenize"]

KEYWORDS_VERSION = 1
"""Bumped whenever tokenization changes; stored in point payloads so sync rewrites them."""

K1 = 1.2
B = 0.75
AVG_LEN = 64.0
"""Typical chunk length in terms (chunks of ~300-1000 characters)."""

_CJK = (
    "\u3040-\u30ff"  # hiragana, katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs
    "\uac00-\ud7af"  # hangul syllables
)
_TOKEN_RE = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+(?:[-'][^\W_{_CJK}]+)*")
_CJK_RE = re.compile(rf"[{_CJK}]")

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


def _fold(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    decomposed = unicodedata.normalize("NFD", text)
    stripped = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return unicodedata.normalize("NFC", stripped)  # recompose Hangul syllables


def _stem(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word[-1] == "s" and word[-2] not in "su":
        return word[:-1]  # rivers -> river (not: status, class)
    if len(word) > 3 and word.endswith(("aux", "eux")):
        return word[:-1]  # bateaux -> bateau, jeux -> jeu
    return word


def tokenize(text: str) -> Iterator[str]:
    """The index terms of ``text``: folded words, stems, and CJK character bigrams.

    Words joined by ``-`` or an apostrophe (``XR-7734``, ``l'impôt``) yield the whole form and
    each part, so a product code matches as a unit and by its pieces.
    """
    for match in _TOKEN_RE.finditer(_fold(text)):
        token = match.group()
        if _CJK_RE.match(token):
            if len(token) == 1:
                yield token
            else:
                for i in range(len(token) - 1):
                    yield token[i : i + 2]
            continue
        parts = re.split(r"[-']", token)
        if len(parts) > 1:
            yield token
        for part in parts:
            if part and part not in _STOPWORDS:
                yield _stem(part)


def _index(term: str) -> int:
    return zlib.crc32(term.encode("utf-8")) & 0x7FFFFFFF


def document_vector(text: str) -> SparseVector:
    """The BM25 term-frequency vector of a chunk (IDF is applied by Qdrant)."""
    counts = Counter(_index(t) for t in tokenize(text))
    length = sum(counts.values())
    norm = K1 * (1 - B + B * length / AVG_LEN)
    indices = sorted(counts)
    values = [counts[i] * (K1 + 1) / (counts[i] + norm) for i in indices]
    return SparseVector(tuple(indices), tuple(values))


def query_vector(text: str) -> SparseVector:
    """A query's sparse vector: weight 1 for each distinct term."""
    indices = sorted({_index(t) for t in tokenize(text)})
    return SparseVector(tuple(indices), tuple(1.0 for _ in indices))
