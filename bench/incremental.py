"""Incremental re-embedding: edit one paragraph of a long document, count what gets embedded.

In one run, with the real default model on SQLite + Qdrant Edge:

1. save a long document (the longest SQuAD v1.1 dev article, paragraphs joined with blank
   lines: well over 50 chunks at the default 1,000 / 200);
2. edit one paragraph in the middle and commit: only the chunks touching it should be embedded;
3. save the edited document as a new row: the full re-embed it is compared with.

    python bench/incremental.py [--squad PATH]

The last line is JSON: {"chunks_total": ..., "chunks_embedded_after_edit": ...,
"edit_vs_full_time": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from semantic_orm import (
    EdgeStore,
    SemanticIndex,
    SemanticText,
    SentenceTransformerEmbedder,
    signals,
)

DEFAULT_SQUAD = (
    Path(__file__).resolve().parents[2] / "shared" / "datasets" / "squad-v1.1-dev" / "dev-v1.1.json"
)


class Base(DeclarativeBase):
    pass


class Document(Base):
    __tablename__ = "document"
    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(200))
    body: Mapped[str | None] = mapped_column(SemanticText())


def longest_article(path: Path) -> tuple[str, list[str]]:
    data = json.loads(path.read_text("utf-8"))["data"]
    best = max(data, key=lambda a: sum(len(p["context"]) for p in a["paragraphs"]))
    return best["title"], [p["context"] for p in best["paragraphs"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--squad", type=Path, default=DEFAULT_SQUAD)
    args = parser.parse_args()
    title, paragraphs = longest_article(args.squad)
    work = Path(tempfile.mkdtemp(prefix="semantic_orm_incremental_"))
    embedded: list[int] = []

    def count(sender: Any, **kw: Any) -> None:
        embedded.append(kw["count"])

    try:
        engine = create_engine(f"sqlite:///{work / 'bench.sqlite3'}")
        Base.metadata.create_all(engine)
        index = SemanticIndex(
            store=EdgeStore(work / "vectors"), embedder=SentenceTransformerEmbedder()
        )
        Session = sessionmaker(engine, expire_on_commit=False)
        index.install(Session)
        index.embedder.encode(["warm up"])
        signals.embedded.connect(count)
        with Session() as s:
            doc = Document(title=title, body="\n\n".join(paragraphs))
            s.add(doc)
            s.commit()
            total = index.store.count("document__body")
            embedded.clear()

            middle = len(paragraphs) // 2
            edited = list(paragraphs)
            edited[middle] = edited[middle].replace(".", " indeed.", 1) + " This sentence is new."
            t0 = time.perf_counter()
            doc.body = "\n\n".join(edited)
            s.commit()
            t_edit = time.perf_counter() - t0
            after_edit = sum(embedded)
            embedded.clear()

            t0 = time.perf_counter()
            s.add(Document(title=title + " (copy)", body="\n\n".join(edited)))
            s.commit()
            t_full = time.perf_counter() - t0
            full = sum(embedded)
        signals.embedded.disconnect(count)
        index.close()
        print(
            f"document: {title!r}, {len(paragraphs)} paragraphs, "
            f"{sum(map(len, paragraphs)):,} characters, {total} chunks (SemanticText() defaults)"
        )
        print(f"{'':26}{'chunks embedded':>18}{'seconds':>10}")
        print(f"{'edit one paragraph':26}{after_edit:>18}{t_edit:>10.2f}")
        print(f"{'full re-embed':26}{full:>18}{t_full:>10.2f}")
        print(f"edit / full time: {t_edit / t_full:.3f}")
        print(
            json.dumps(
                {
                    "chunks_total": total,
                    "chunks_embedded_after_edit": after_edit,
                    "edit_vs_full_time": round(t_edit / t_full, 4),
                }
            )
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
