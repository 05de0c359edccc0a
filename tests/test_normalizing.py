"""Text normalisation declared on a column: what the embedder and the keyword analyser read,
for chunks and queries alike, without touching the stored text or the offsets."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from semantic_orm import SemanticIndex, SemanticSearchMixin, SemanticText
from semantic_orm.normalizing import Normalizer
from semantic_orm.testing import HashEmbedder, MemoryStore


def test_steps_fold_width_case_accents_and_traditional_chinese() -> None:
    assert Normalizer()("ＡＢＣ１２３ ﬁne") == "ABC123 fine"  # nfkc, the default
    assert Normalizer(("lower",))("Straße") == "strasse"
    assert Normalizer(("accents",))("Évaluation naïve") == "Evaluation naive"
    # only Latin, Greek and Cyrillic accents: a Hindi vowel sign is a letter there
    assert Normalizer(("accents",))("हिन्दी") == "हिन्दी"
    pytest.importorskip("opencc")
    assert Normalizer(("t2s",))("漢字簡化，臺灣") == "汉字简化，台湾"  # no width folding
    assert Normalizer(())("ＡＢＣ") == "ＡＢＣ"


class _Recorder(HashEmbedder):
    """A HashEmbedder remembering every text it was asked to encode."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def encode(self, texts: Any) -> Any:
        self.seen.extend(texts)
        return super().encode(texts)


def test_the_model_and_the_analyser_read_normalised_text_and_offsets_stay_the_originals(
    engine: Any,
) -> None:
    pytest.importorskip("opencc")

    class B(DeclarativeBase):
        pass

    class Doc(SemanticSearchMixin, B):
        __tablename__ = "norm_doc"
        id: Mapped[int] = mapped_column(primary_key=True)
        body: Mapped[str | None] = mapped_column(SemanticText(normalize=("nfkc", "t2s")))

    B.metadata.create_all(engine)
    embedder = _Recorder()
    index = SemanticIndex(store=MemoryStore(), embedder=embedder)
    factory = sessionmaker(engine, expire_on_commit=False)
    index.install(factory)
    try:
        text = "電腦型號ＸＲ７７３４，適合學校使用。"
        with factory() as s:
            s.add(Doc(id=1, body=text))
            s.commit()
            assert embedder.seen == ["电脑型号XR7734,适合学校使用。"]  # full-width comma folded
            # a Simplified query finds the Traditional text by keyword; offsets index the original
            (hit,) = Doc.semantic_search(s, "电脑 学校", mode="keyword")
            assert hit.obj.id == 1 and hit.chunk.text == text
            assert (hit.chunk.start_offset, hit.chunk.end_offset) == (0, len(text))
            Doc.semantic_search(s, "ＸＲ７７３４", mode="dense")
            assert embedder.seen[-1] == "XR7734"  # the query is folded the same way
    finally:
        index.uninstall(factory)
        B.metadata.drop_all(engine)
