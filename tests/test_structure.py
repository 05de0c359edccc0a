"""Structure tags: block types on a real chapter, tagged chunks, and the search options.

The chapter is a verbatim public-domain text (``tests/data/hlm_ch13.txt``, see the README there).
Search tests run on SQLite and PostgreSQL and on both store adapters with the fake embedder and
keyword mode, which is enough to check the store filter and the de-duplication plumbing.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker
from sqlalchemy.orm import Session as OrmSession

from semantic_orm import ConfigurationError, SemanticIndex, SemanticSearchMixin, SemanticText
from semantic_orm.chunking import (
    CHUNK_TYPES,
    TYPE_KEY,
    TYPES_KEY,
    Chunk,
    HybridChunker,
    TaggingChunker,
    get_chunker,
    structure,
    tag_chunks,
)
from semantic_orm.search import pick_column
from semantic_orm.stores.base import PayloadIndex
from tests.test_chunking import assert_invariants

DATA = Path(__file__).parent / "data"
CHAPTER = (DATA / "hlm_ch13.txt").read_bytes().decode("utf-8")
HEADING = "第十三回　秦可卿死封龙禁尉　王熙凤协理宁国府"
CLOSING = "不知凤姐如何处治，且听下回分解。"


def visible(text: str) -> int:
    return len("".join(text.split()))


# -- blocks of the real chapter ---------------------------------------------------------------


def test_the_chapter_file_is_the_recorded_verbatim_slice() -> None:
    raw = (DATA / "hlm_ch13.txt").read_bytes()
    assert hashlib.sha256(raw).hexdigest() in (DATA / "README.md").read_text(encoding="utf-8")
    assert CHAPTER.startswith(HEADING) and "\r\n" in CHAPTER


def test_chapter_blocks_have_exact_offsets_and_cover_every_character() -> None:
    blocks = structure(CHAPTER)
    assert blocks[0].type == "title"
    assert CHAPTER[blocks[0].start : blocks[0].end] == HEADING
    previous_end = 0
    for blk in blocks:
        piece = CHAPTER[blk.start : blk.end]
        assert piece == piece.strip() and piece, blk
        assert blk.start >= previous_end, "blocks do not overlap and are in order"
        assert blk.type in CHUNK_TYPES
        assert blk.section == HEADING and blk.section_index == 0
        previous_end = blk.end
    assert sum(visible(CHAPTER[b.start : b.end]) for b in blocks) == visible(CHAPTER)


def test_chapter_verse_title_and_closing_formula() -> None:
    blocks = structure(CHAPTER)
    typed = [(b.type, CHAPTER[b.start : b.end]) for b in blocks]
    assert [t for kind, t in typed if kind == "title"] == [HEADING]
    verse = [t for kind, t in typed if kind == "verse"]
    assert [v[:10] for v in verse] == [
        "【庚辰：诗曰：一步行",  # 诗曰： inside a commentary, verse on the same line
        "三春去后诸芳尽，各自",  # after "……因念道：", one paragraph later
        "正是：",  # the formula alone on its line
        "金紫万千谁治国，裙钗",  # the couplet after it
    ]
    assert [t for kind, t in typed if kind == "boilerplate"] == [CLOSING]
    # the paragraph holding the closing formula keeps its story as text, before and after it
    closing = next(i for i, (kind, _) in enumerate(typed) if kind == "boilerplate")
    assert typed[closing - 1][0] == "text" and typed[closing - 1][1].endswith(
        "此五件实是宁国府中风俗。"
    )
    assert (
        blocks[closing - 1].paragraph == blocks[closing].paragraph == blocks[closing + 1].paragraph
    )
    # a formula that ends a paragraph leaves that paragraph text; prose after 写道： is not verse
    intro = next(t for kind, t in typed if t.endswith("因念道："))
    assert ("text", intro) in typed
    resume = next(t for _, t in typed if t.startswith("江南江宁府江宁县监生贾蓉"))
    assert ("text", resume) in typed
    # a commentator's quatrain with no introducing formula stays text
    assert ("text", next(t for _, t in typed if t.startswith("【蒙：生死穷通"))) in typed


def test_generic_headings_endings_and_non_cjk_text() -> None:
    text = (
        "# Guide\n\nIntro text here.\n\n1.2 Results\n\nWe measured it.\n\n"
        "1. Install the package.\n\nHe said: it flows, the river, and it ends.\n\n"
        "To be continued...\n\n一、总则\n\n正是：\n\nHello there, my friend.\n"
    )
    kinds = {text[b.start : b.end]: b.type for b in structure(text)}
    assert kinds["# Guide"] == "title"
    assert kinds["1.2 Results"] == "title"
    assert kinds["1. Install the package."] == "text"  # a sentence, not a heading
    assert kinds["He said: it flows, the river, and it ends."] == "text"
    assert kinds["To be continued..."] == "boilerplate"
    assert kinds["一、总则"] == "title"
    assert kinds["Hello there, my friend."] == "text"  # verse detection is for CJK clauses
    assert structure("") == [] and structure("  \n\n ") == []
    with pytest.raises(TypeError):
        structure(b"x")  # type: ignore[arg-type]


def test_verse_continues_over_lines_of_the_same_length_only() -> None:
    text = "后人有诗叹曰：\n白马银枪出阵前\n英雄胆气冲霄汉\n玄德闻言，大喜，遂引众人入城去了。"
    typed = [(b.type, text[b.start : b.end]) for b in structure(text)]
    assert typed == [
        ("verse", "后人有诗叹曰："),
        ("verse", "白马银枪出阵前"),
        ("verse", "英雄胆气冲霄汉"),
        ("text", "玄德闻言，大喜，遂引众人入城去了。"),
    ]
    inline = (
        "玄德看罢，叹息良久，心中不乐，遂命众人退下。后人有诗赞曰：桃园结义三兄弟，千古英名万世传。"
    )
    ((k1, t1), (k2, t2)) = [(b.type, inline[b.start : b.end]) for b in structure(inline)]
    assert (k1, k2) == ("text", "verse") and t2.startswith("后人有诗赞曰") and t1.endswith("退下。")


# -- tagged chunks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "size", "overlap"),
    [("hybrid", 200, 40), ("recursive", 120, 30), ("sentence", 20, 0), ("sentence", 60, 10)],
)
def test_tagged_chunks_keep_offsets_and_carry_type_section_paragraph(
    strategy: str, size: int, overlap: int
) -> None:
    inner = get_chunker(strategy, chunk_size=size, overlap=overlap)
    plain = inner.chunk(CHAPTER)
    tagged = TaggingChunker(inner).chunk(CHAPTER)
    assert_invariants(CHAPTER, tagged, size, overlap)
    assert [(c.start_offset, c.end_offset, c.index) for c in tagged] == [
        (c.start_offset, c.end_offset, c.index) for c in plain
    ]
    for before, after in zip(plain, tagged, strict=True):
        assert after.metadata[TYPE_KEY] in CHUNK_TYPES
        assert after.metadata["section_index"] == 0 and after.metadata["section"] == HEADING
        assert isinstance(after.metadata["paragraph"], int)
        for key, value in before.metadata.items():  # the chunker's own metadata is kept
            assert after.metadata[key] == value


def test_small_sentence_chunks_isolate_the_closing_formula_and_verse() -> None:
    chunks = TaggingChunker(get_chunker("sentence", chunk_size=20, overlap=0)).chunk(CHAPTER)
    by_type: dict[str, list[str]] = {}
    for c in chunks:
        by_type.setdefault(c.metadata[TYPE_KEY], []).append(c.text)
    assert by_type["boilerplate"] == [CLOSING]
    assert "三春去后诸芳尽，各自须寻各自门。" in by_type["verse"]
    assert any(t.startswith("金紫万千谁治国") for t in by_type["verse"])
    assert "\u3000".join(by_type["title"]) == HEADING  # 22 characters: two chunks


def test_a_chunk_takes_the_type_of_most_of_its_characters() -> None:
    text = "第一回　桃园结义\n\n话说天下大势，分久必合，合久必分。\n\n且听下回分解。"
    merged = tag_chunks(get_chunker("hybrid", chunk_size=60, overlap=0).chunk(text), text)
    assert [(c.text, c.metadata[TYPE_KEY]) for c in merged] == [(text, "text")]
    apart = tag_chunks(HybridChunker(60, 0, merge_short=False).chunk(text), text)
    assert [(c.text, c.metadata[TYPE_KEY], c.metadata["paragraph"]) for c in apart] == [
        ("第一回　桃园结义", "title", 0),
        ("话说天下大势，分久必合，合久必分。", "text", 1),
        ("且听下回分解。", "boilerplate", 2),
    ]


def test_a_chunk_lists_every_type_it_contains_the_most_present_first() -> None:
    text = "第一回　桃园结义\n\n话说天下大势，分久必合，合久必分。\n\n且听下回分解。"
    merged = tag_chunks(get_chunker("hybrid", chunk_size=60, overlap=0).chunk(text), text)
    assert [c.metadata[TYPES_KEY] for c in merged] == [["text", "title", "boilerplate"]]
    apart = tag_chunks(HybridChunker(60, 0, merge_short=False).chunk(text), text)
    assert [c.metadata[TYPES_KEY] for c in apart] == [["title"], ["text"], ["boilerplate"]]
    # the real chapter in 900-character windows: every chunk's main type leads its list, and
    # the couplets quoted in the narration are listed where they are not the main type
    chunks = TaggingChunker(get_chunker("hybrid", chunk_size=900, overlap=180)).chunk(CHAPTER)
    for c in chunks:
        types = c.metadata[TYPES_KEY]
        assert types[0] == c.metadata[TYPE_KEY] and len(set(types)) == len(types)
        assert set(types) <= set(CHUNK_TYPES)
    hidden = [c for c in chunks if "verse" in c.metadata[TYPES_KEY][1:]]
    assert any("三春去后诸芳尽" in c.text for c in hidden)


def test_tags_are_a_recorded_column_setting() -> None:
    col = SemanticText(tags=True)
    assert repr(col) == "SemanticText(tags=True)"
    chunker = col.make_chunker()
    assert isinstance(chunker, TaggingChunker)
    assert chunker.config() == {**SemanticText().make_chunker().config(), "tags": "structure/1"}
    assert "tags" not in SemanticText().make_chunker().config()  # untagged configs unchanged
    assert col.settings_key() != SemanticText().settings_key()
    assert col.copy().tags is True
    with pytest.raises(ConfigurationError, match="tags"):
        SemanticText(tags="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        TaggingChunker("hybrid")  # type: ignore[arg-type]


# -- search -----------------------------------------------------------------------------------


class _Base(DeclarativeBase):
    pass


class Chapter(SemanticSearchMixin, _Base):
    """Small sentence chunks, tagged: formulas and couplets get chunks of their own."""

    __tablename__ = "chapter"

    id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[str | None] = mapped_column(
        SemanticText(chunker="sentence", chunk_size=20, overlap=0, tags=True)
    )


class Windows(SemanticSearchMixin, _Base):
    """Hybrid windows that overlap inside long paragraphs (untagged: hybrid has the keys)."""

    __tablename__ = "windows"

    id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[str | None] = mapped_column(
        SemanticText(chunker="hybrid", chunk_size=120, overlap=60)
    )


class Plain(SemanticSearchMixin, _Base):
    """Untagged recursive chunks: no types, no section/paragraph metadata."""

    __tablename__ = "plain_chunks"

    id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[str | None] = mapped_column(SemanticText(chunker="recursive"))


@pytest.fixture
def factory(engine: Engine, index: SemanticIndex) -> Iterator[sessionmaker[OrmSession]]:
    _Base.metadata.create_all(engine)
    made = sessionmaker(engine, expire_on_commit=False)
    index.install(made)
    yield made
    index.uninstall(made)


class Pages(SemanticSearchMixin, _Base):
    """The default 900-character hybrid windows, tagged: verse sits inside narration."""

    __tablename__ = "pages"

    id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[str | None] = mapped_column(SemanticText(tags=True))


def test_tagged_column_indexes_the_type_keys(index: SemanticIndex) -> None:
    spec = index.binding_for(pick_column(inspect(Chapter), None)).spec
    assert PayloadIndex("meta.type", "keyword") in spec.indexes
    assert PayloadIndex("meta.types", "keyword") in spec.indexes
    assert spec.metadata["chunker"]["tags"] == "structure/1"


def test_search_requires_or_excludes_chunk_types(factory: sessionmaker[OrmSession]) -> None:
    with factory() as s:
        s.add(Chapter(id=1, body=CHAPTER))
        s.commit()
        query = "且听下回分解 凤姐"
        every = Chapter.semantic_search(s, query, mode="keyword", group_by="chunk", limit=5)
        assert every[0].chunk.text == CLOSING
        assert every[0].chunk.metadata[TYPE_KEY] == "boilerplate"
        kept = Chapter.semantic_search(
            s, query, mode="keyword", group_by="chunk", limit=5, exclude_chunk_types=["boilerplate"]
        )
        assert kept and all(h.chunk.metadata[TYPE_KEY] != "boilerplate" for h in kept)
        assert CLOSING not in [h.chunk.text for h in kept]
        verse = Chapter.semantic_search(
            s, "金紫万千谁治国", mode="keyword", group_by="chunk", limit=5, chunk_types="verse"
        )
        assert verse[0].chunk.text.startswith("金紫万千谁治国")
        assert {h.chunk.metadata[TYPE_KEY] for h in verse} == {"verse"}
        both = Chapter.semantic_search(
            s,
            "凤姐 诸芳 下回",
            mode="keyword",
            group_by="chunk",
            limit=50,
            chunk_types=("text", "verse"),
            exclude_chunk_types=("verse",),
        )
        assert both and {h.chunk.metadata[TYPE_KEY] for h in both} == {"text"}
        rows = Chapter.semantic_search(s, query, mode="keyword", chunk_types=("title",))
        assert rows == []  # the heading has none of the query's terms


def test_chunk_types_finds_verse_inside_narration_and_exclusion_reads_the_main_type(
    factory: sessionmaker[OrmSession],
) -> None:
    with factory() as s:
        s.add(Pages(id=1, body=CHAPTER))
        s.commit()
        query = "三春去后诸芳尽"
        verse = Pages.semantic_search(
            s, query, mode="keyword", group_by="chunk", limit=3, chunk_types="verse"
        )
        assert verse and query in verse[0].chunk.text
        found = verse[0].chunk.metadata
        assert found[TYPE_KEY] == "text" and "verse" in found[TYPES_KEY]  # inside narration
        assert all("verse" in h.chunk.metadata[TYPES_KEY] for h in verse)
        # that chunk is mostly narration: excluding verse keeps it
        kept = Pages.semantic_search(
            s, query, mode="keyword", group_by="chunk", limit=3, exclude_chunk_types="verse"
        )
        assert kept[0].chunk.start_offset == verse[0].chunk.start_offset
        # no chunk of the chapter holds a title but the first (the heading merged into it)
        titled = Pages.semantic_search(
            s, "凤姐 宁国府", mode="keyword", group_by="chunk", limit=50, chunk_types="title"
        )
        assert [h.chunk.index for h in titled] == [0]


def test_points_tagged_before_types_existed_answer_chunk_types_by_their_main_type(
    factory: sessionmaker[OrmSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    tagging = importlib.import_module("semantic_orm.chunking.structure")  # not the function
    tag = tagging.tag_chunks

    def without_types(chunks: Any, text: str) -> list[Chunk]:  # what version 1 wrote
        out = tag(chunks, text)
        for chunk in out:
            del chunk.metadata[TYPES_KEY]
        return out

    monkeypatch.setattr(tagging, "tag_chunks", without_types)
    with factory() as s:
        s.add(Chapter(id=1, body=CHAPTER))
        s.commit()
        verse = Chapter.semantic_search(
            s, "金紫万千谁治国", mode="keyword", group_by="chunk", limit=5, chunk_types="verse"
        )
        assert verse and verse[0].chunk.text.startswith("金紫万千谁治国")
        assert all(TYPES_KEY not in h.chunk.metadata for h in verse)
        assert {h.chunk.metadata[TYPE_KEY] for h in verse} == {"verse"}


def test_dedupe_keeps_one_passage_per_paragraph_or_section(
    factory: sessionmaker[OrmSession],
) -> None:
    long_paragraph = " ".join(
        f"The keeper logged storm number {i} near the rocks of the bay." for i in range(12)
    )
    body = f"# Log\n\n{long_paragraph}\n\nThe keeper slept.\n\n# Second\n\nThe keeper left."
    with factory() as s:
        s.add(Windows(id=1, body=body))
        s.commit()
        kw = {"mode": "keyword", "group_by": "chunk", "limit": 20}

        def units(hits: list[object], *keys: str) -> list[tuple[object, ...]]:
            return [tuple(h.chunk.metadata[k] for k in keys) for h in hits]  # type: ignore[attr-defined]

        plain = Windows.semantic_search(s, "keeper storm", **kw)  # type: ignore[arg-type]
        paragraphs = units(plain, "section_index", "paragraph")
        assert len(paragraphs) > len(set(paragraphs)), "overlapping windows of one paragraph"
        once = Windows.semantic_search(s, "keeper storm", dedupe="paragraph", **kw)  # type: ignore[arg-type]
        got = units(once, "section_index", "paragraph")
        assert len(got) == len(set(got)) == len(set(paragraphs))
        assert once[0].chunk == plain[0].chunk  # the best passage of each paragraph is kept
        sections = Windows.semantic_search(s, "keeper", dedupe="section", **kw)  # type: ignore[arg-type]
        assert sorted(units(sections, "section_index")) == [(0,), (1,)]
        rows = Windows.semantic_search(s, "keeper storm", mode="keyword", chunks_per_row=5)
        per_row = Windows.semantic_search(
            s, "keeper storm", mode="keyword", chunks_per_row=5, dedupe="paragraph"
        )
        chunk_units = [
            (c.chunk.metadata["section_index"], c.chunk.metadata["paragraph"])
            for c in per_row[0].chunks
        ]
        assert len(chunk_units) == len(set(chunk_units)) < len(rows[0].chunks)


def test_structure_options_are_validated(factory: sessionmaker[OrmSession]) -> None:
    with factory() as s:
        with pytest.raises(ConfigurationError, match=r"unknown chunk type.*poem.*known: title"):
            Chapter.semantic_search(s, "x", chunk_types=["poem"])
        with pytest.raises(ConfigurationError, match="exclude_chunk_types takes chunk type"):
            Chapter.semantic_search(s, "x", exclude_chunk_types=5)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="dedupe must be"):
            Chapter.semantic_search(s, "x", dedupe="line")  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=r"Windows\.body is not tagged.*tags=True"):
            Windows.semantic_search(s, "x", chunk_types=["text"])
        with pytest.raises(ConfigurationError, match=r"'recursive' chunker of Plain\.body"):
            Plain.semantic_search(s, "x", dedupe="paragraph")


def test_traditional_chinese_and_japanese_structure_is_tagged_as_simplified_is() -> None:
    """Headings with 節 and 話, verse introduced by 後人有詩讚曰：, the closing 且聽下回分解 and a
    後記 were text: only their Simplified forms (节, 诗, 赞, 听, 后记) were known."""

    def typed(text: str) -> list[tuple[str, str]]:
        return [(b.type, text[b.start : b.end]) for b in structure(text)]

    for heading in ("第三節　飲食文化", "第１話　港町", "第二话 出发"):
        text = f"前言的一段文字。\n\n{heading}\n\n珍珠奶茶是台灣的飲料。"
        assert ("title", heading) in typed(text), heading
        (after,) = [b for b in structure(text) if text[b.start : b.end].startswith("珍珠")]
        assert after.section == heading  # a section of its own: no chunk crosses into it
    story = (
        "第一回　甄士隱夢幻識通靈\n\n那僧便說道：此乃天機，不可洩漏。\n\n"
        "後人有詩讚曰：\n無材可去補蒼天，枉入紅塵若許年。\n此係身前身後事，倩誰記去作奇傳？\n\n"
        "不知後事如何，且聽下回分解。\n\n後記\n\n全書至此。"
    )
    kinds = typed(story)
    assert any(kind == "verse" and t.endswith("倩誰記去作奇傳？") for kind, t in kinds), kinds
    assert any(kind == "boilerplate" and "且聽下回分解" in t for kind, t in kinds), kinds
    assert ("title", "後記") in kinds
