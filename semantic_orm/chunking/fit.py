"""Make chunks fit the embedding model's token window, without giving up character offsets.

Characters, not tokens
----------------------
Chunk sizes are set in characters because characters are what the database stores, what
offsets count and what a user can reason about. The embedding model, however, reads *tokens*
and silently truncates everything past its window: ``all-MiniLM-L6-v2`` reads 256 tokens, of
which ``[CLS]`` and ``[SEP]`` take two, leaving **254 content tokens**. Text past the window
is simply not embedded, so a chunk that overflows is a retrieval blind spot.

How many tokens a character holds depends on the language and on the tokenizer's vocabulary.
Measured with ``bench/chunking.py`` (:class:`~semantic_orm.chunking.RecursiveChunker`,
overlap 20 % of the size, MiniLM's uncased WordPiece tokenizer), the share of chunks over 254
content tokens is (over-window chunks / chunks):

==========  =======  =======  =======  =======  =======  =======
chunk_size      500      600      700      800      900     1000
==========  =======  =======  =======  =======  =======  =======
English       0.00%    0.00%    0.03%    0.03%    0.14%    0.43%
French           0%       0%       0%       0%      14%      60%
Chinese         67%      80%      80%      75%      67%     100%
==========  =======  =======  =======  =======  =======  =======

In chunks over the window / chunks: English 0/5511, 0/4693, 1/3955, 1/3326, 4/2890, 11/2582;
French 0/14, 0/9, 0/9, 0/8, 1/7, 3/5; Chinese 4/6, 4/5, 4/5, 3/4, 2/3, 2/2.

English: the 2,067 SQuAD v1.1 dev contexts (1.6 M characters). French and Chinese: the few KB
of ``tests/data/fr.txt`` / ``zh.txt``, so those rows are indicative only. The averages explain
the rows: English has about 4.85 characters per MiniLM token, French 2.96 (accents are
stripped, but the English vocabulary cuts French words into pieces), and Chinese 1.02: every
Han character is a token of its own (most of them ``[UNK]``; the model is English-only).

**For the default model, ``SemanticText()`` uses ``chunk_size=900`` (overlap 180).** It meets
the "almost no chunk needs a second split" target on English (0.14 % of recursive chunks; 1000
would give 0.43 %), and it measured best for retrieval in ``bench/retrieval.py``; smaller chunks
multiply vectors. Text that is mostly French or another European language needs about
``chunk_size=700`` (254 tokens × 2.96 ≈ 750 characters). No character budget fits Chinese or
Japanese short of ~250 characters: run :func:`fit_to_window` (or use a multilingual model) for
CJK.

The second split
----------------
:func:`fit_to_window` is the safety net. Given chunks from any chunker and a function that
returns the ``(start, end)`` character offsets of each token of a string (special tokens
excluded), it leaves chunks within ``max_tokens`` untouched and splits the others:

1. Tokenize the remaining text of the chunk; if it fits, it is the last piece.
2. Otherwise the piece may end no later than the start of token number ``max_tokens``. Inside
   the last quarter of that budget it looks, in order, for a paragraph break, a line break,
   a sentence end and a space (the recursive chunker's separator levels), and cuts at the
   last one found, or at the token boundary itself if there is none.
3. The cut is snapped back to a grapheme-cluster boundary, trailing whitespace is excluded,
   and the piece is re-tokenized on its own: sub-word tokenizers may tokenize a cut word
   differently, so if the piece still has too many tokens the budget shrinks by the excess
   and the cut is chosen again.

Offsets are computed in the original document throughout, so ``text[start:end] == piece``
holds exactly. Pieces of one chunk never overlap one another and inherit the chunk's
metadata; the result is renumbered (``index``/``total_chunks``) as one list, kept in the input
order. Only a single grapheme cluster that alone exceeds ``max_tokens`` tokens is cut inside
(at a token boundary), the same exception the chunkers make for ``chunk_size``.

:func:`tokenizer_spans` adapts a Hugging Face tokenizer to it; :func:`tokenizer_lock`,
:func:`encoding_lock` and :func:`reading_copy` keep threads sharing a model from changing each
other's tokenizer settings (a tokenizer keeps its padding and truncation on one object).
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import Any

from ..forking import RenewedLock
from ._core import (
    DEFAULT_LEVELS,
    Chunk,
    chunks_from_spans,
    first_boundary_after,
    skip_ws,
    snap_back,
)
from .recursive import RecursiveChunker

__all__ = [
    "TokenSpans",
    "encoding_lock",
    "fit_to_window",
    "reading_copy",
    "tokenizer_lock",
    "tokenizer_spans",
]

#: Returns the ``(start, end)`` character offsets of each token of a string.
TokenSpans = Callable[[str], Sequence[tuple[int, int]]]

_SEARCH_LEVELS = tuple(level for level in DEFAULT_LEVELS if level.forward is not None)


_tokenizer_locks: weakref.WeakKeyDictionary[Any, RenewedLock] = weakref.WeakKeyDictionary()
_unkeyed = RenewedLock(reentrant=True)
"""The lock of a tokenizer that cannot be a weak key (one lock for all of those)."""
_finding = RenewedLock()
_borrows: bool | None = None
"""Whether the installed transformers refuses a second call meanwhile (``None``: not looked up
yet)."""
_uncopied: weakref.WeakSet[Any] = weakref.WeakSet()
"""Tokenizers :func:`reading_copy` could not copy: their encoding calls are locked too."""


def _borrowing() -> bool:
    """Whether a tokenizer of the installed transformers fails a call made while another
    thread's runs (before transformers 5; assumed when the version is unknown)."""
    global _borrows
    if _borrows is None:
        try:
            _borrows = int(metadata.version("transformers").split(".")[0]) < 5
        except (metadata.PackageNotFoundError, ValueError):
            _borrows = True
    return _borrows


def tokenizer_lock(tokenizer: Any) -> contextlib.AbstractContextManager[Any]:
    """What this library holds while it calls ``tokenizer``: a lock per tokenizer object.

    A Hugging Face fast tokenizer called with padding or truncation settings first sets them on
    its one Rust object, then tokenizes: a second thread calling it meanwhile with other
    settings changed the first one's under it (transformers 5: a chunk embedded untruncated,
    another vector; a count cut at the 256 tokens another call truncated to), and transformers
    4 refuses a second call outright (``RuntimeError: Already borrowed``). The library's own
    reading calls (counts, token spans, coverage) go to a copy of the model's tokenizer
    (:func:`reading_copy`), under this lock; encoding calls, which all use one model's
    settings, take it only where they must (:func:`encoding_lock`).
    """
    with _finding:
        try:
            lock = _tokenizer_locks.get(tokenizer)
            if lock is None:
                lock = _tokenizer_locks[tokenizer] = RenewedLock(reentrant=True)
        except TypeError:  # unhashable, or no weak reference
            lock = _unkeyed
    return lock


def encoding_lock(tokenizer: Any) -> contextlib.AbstractContextManager[Any]:
    """What an encoding call holds on ``tokenizer`` (a model's, which tokenizes every batch with
    the same padding and truncation): :func:`tokenizer_lock` where the installed transformers
    refuses concurrent calls (4), or where :func:`reading_copy` could not copy it (the reading
    calls use it too); else nothing: a search's query is embedded beside a sync's batch."""
    if _borrowing() or tokenizer in _uncopied:
        return tokenizer_lock(tokenizer)
    return contextlib.nullcontext()


def reading_copy(tokenizer: Any) -> Any:
    """A copy of a model's ``tokenizer`` for the library's reading calls (token counts, spans,
    coverage: other settings than encoding's), so that they never change an encoding call's
    settings; ``tokenizer`` itself where it cannot be copied (its encoding calls are locked
    then, see :func:`encoding_lock`)."""
    try:
        return copy.deepcopy(tokenizer)
    except Exception:
        with contextlib.suppress(TypeError):  # (not weakly referable: _unkeyed, locked anyway)
            _uncopied.add(tokenizer)
        return tokenizer


def tokenizer_spans(tokenizer: Any) -> Callable[[str], list[tuple[int, int]]]:
    """Adapt a Hugging Face *fast* tokenizer to the ``token_spans`` callable of
    :func:`fit_to_window`.

    Args:
        tokenizer: A ``transformers`` fast tokenizer, e.g. ``SentenceTransformer.tokenizer``.

    Returns:
        A function mapping a string to its tokens' ``(start, end)`` character offsets,
        without special tokens.

    Example:
        >>> spans = tokenizer_spans(model.tokenizer)  # doctest: +SKIP
        >>> fit_to_window(chunks, text, spans, max_tokens=254)  # doctest: +SKIP
    """

    lock = tokenizer_lock(tokenizer)

    def spans(s: str) -> list[tuple[int, int]]:
        # verbose=False: counting a long text is the point here, not a reason to warn
        with lock:
            enc = tokenizer(s, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        return [(int(a), int(b)) for a, b in enc["offset_mapping"]]

    return spans


def fit_to_window(
    chunks: Sequence[Chunk],
    text: str,
    token_spans: TokenSpans,
    max_tokens: int,
) -> list[Chunk]:
    """Split every chunk with more than ``max_tokens`` tokens at token boundaries.

    Args:
        chunks: Chunks of ``text``, from any chunker.
        text: The original document the chunks' offsets refer to.
        token_spans: Returns ``(start, end)`` character offsets of each token of a string,
            special tokens excluded (see :func:`tokenizer_spans`).
        max_tokens: Budget of content tokens per chunk (the model window minus special
            tokens, e.g. 254 for all-MiniLM-L6-v2).

    Returns:
        The chunks, with over-long ones replaced by consecutive pieces that each have at most
        ``max_tokens`` tokens and exact offsets into ``text``; renumbered as one list.

    Raises:
        ValueError: If ``max_tokens < 1`` or a chunk's text does not match ``text`` at its
            offsets.
        TypeError: If ``max_tokens`` is not an int.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise TypeError(f"max_tokens must be an int, got {type(max_tokens).__name__}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    pieces: list[tuple[int, int, Mapping[str, Any]]] = []
    for c in chunks:
        if text[c.start_offset : c.end_offset] != c.text:
            raise ValueError(
                f"chunk {c.index} does not match text[{c.start_offset}:{c.end_offset}]"
            )
        spans = token_spans(c.text)
        if len(spans) <= max_tokens:
            pieces.append((c.start_offset, c.end_offset, c.metadata))
            continue
        for s, e in _split(text, c.start_offset, c.end_offset, spans, token_spans, max_tokens):
            pieces.append((s, e, c.metadata))
    return chunks_from_spans(text, pieces)


def _split(
    text: str,
    lo: int,
    hi: int,
    spans: Sequence[tuple[int, int]],
    token_spans: TokenSpans,
    max_tokens: int,
) -> list[tuple[int, int]]:
    """Split ``text[lo:hi]`` (whose tokens are ``spans``) into pieces of ``<= max_tokens``."""
    out: list[tuple[int, int]] = []
    pos = lo
    toks = spans
    while True:
        if len(toks) <= max_tokens:
            out.append((pos, hi))
            return out
        budget = max_tokens
        while True:
            end = _choose_end(text, pos, hi, toks, budget)
            n = len(token_spans(text[pos:end]))
            if n <= max_tokens:
                break
            if budget == 1:
                # One grapheme cluster holds more than max_tokens tokens: cut inside it.
                end = pos + max(1, toks[max_tokens][0])
                break
            budget = max(1, budget - (n - max_tokens))
        out.append((pos, end))
        nxt = skip_ws(text, end, hi)
        if nxt >= hi:
            return out
        pos = snap_back(text, nxt, end)
        toks = token_spans(text[pos:hi])


def _choose_end(text: str, pos: int, hi: int, toks: Sequence[tuple[int, int]], budget: int) -> int:
    """Return a trimmed, grapheme-safe end for a piece starting at ``pos`` of ``budget`` tokens."""
    limit = pos + toks[budget][0]  # start of the first token that does not fit
    min_end = first_boundary_after(text, pos, pos, hi)
    if limit <= pos:
        return min_end
    window_lo = max(pos + 1, pos + toks[(3 * budget) // 4][0])
    cut = limit
    for level in _SEARCH_LEVELS:
        found = level.last_cut(text, window_lo, limit, pos)
        if found is not None and found > pos:
            cut = found
            break
    cut = snap_back(text, cut, pos)
    if cut < min_end:
        return min_end
    return RecursiveChunker._trim_end(text, cut, min_end)
