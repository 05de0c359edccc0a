"""semantic_orm: a ``semantic text`` column for SQLAlchemy models.

Declare a column with :class:`SemanticText`, install a :class:`SemanticIndex` on your sessions,
save rows as usual, and search them by meaning::

    from semantic_orm import SemanticIndex, SemanticSearchMixin, SemanticText

    class KnowledgeArticle(SemanticSearchMixin, Base):
        __tablename__ = "knowledge_article"
        id: Mapped[int] = mapped_column(primary_key=True)
        title: Mapped[str]
        content: Mapped[str | None] = mapped_column(SemanticText())

    index = SemanticIndex()              # Qdrant Edge in ./.semantic_orm, all-MiniLM-L6-v2
    index.install(SessionLocal)          # commits of these sessions now sync

    with SessionLocal() as session:
        session.add(KnowledgeArticle(title="SYSCOHADA", content=text))
        session.commit()                 # chunk -> embed -> upsert, after the commit
        for hit in KnowledgeArticle.semantic_search(session, "plan comptable", limit=5):
            print(hit.score, hit.obj.title, hit.chunk.start_offset, hit.chunk.end_offset)

Importing this package registers no event listener and loads no model: sentence-transformers
and the Qdrant packages are imported when first used.
"""

from __future__ import annotations

from . import evaluation, keywords, outbox, signals
from .chunking import Chunk, Chunker, RecursiveChunker, get_chunker, register_chunker
from .column import SemanticText
from .embedding import DEFAULT_MODEL, Embedder, SentenceTransformerEmbedder, TokenAwareEmbedder
from .evaluation import EvalReport, evaluate
from .exc import (
    ChunkTooLongWarning,
    CollectionMismatchError,
    ConfigurationError,
    EmbeddingDriftError,
    EmbeddingError,
    FilterFallbackWarning,
    MissingDependencyError,
    ModelCoverageWarning,
    SemanticORMError,
    SemanticTypeError,
    SemanticValueError,
    SyncError,
    VectorStoreError,
)
from .index import SemanticIndex, index_for
from .ranking import Fusion, ReciprocalRankFusion, ScoreFusion
from .rerank import CrossEncoderReranker, Reranker
from .search import (
    ScoredChunk,
    SearchHit,
    SearchOptions,
    SemanticSearchMixin,
    asemantic_search,
    semantic_search,
)
from .stores import EdgeStore, QdrantClientStore, Store, StoreAdmin, VectorStore
from .version import __version__
from .worker import AsyncWorker, Worker

__all__ = [
    "DEFAULT_MODEL",
    "AsyncWorker",
    "Chunk",
    "ChunkTooLongWarning",
    "Chunker",
    "CollectionMismatchError",
    "ConfigurationError",
    "CrossEncoderReranker",
    "EdgeStore",
    "Embedder",
    "EmbeddingDriftError",
    "EmbeddingError",
    "EvalReport",
    "FilterFallbackWarning",
    "Fusion",
    "MissingDependencyError",
    "ModelCoverageWarning",
    "QdrantClientStore",
    "ReciprocalRankFusion",
    "RecursiveChunker",
    "Reranker",
    "ScoreFusion",
    "ScoredChunk",
    "SearchHit",
    "SearchOptions",
    "SemanticIndex",
    "SemanticORMError",
    "SemanticSearchMixin",
    "SemanticText",
    "SemanticTypeError",
    "SemanticValueError",
    "SentenceTransformerEmbedder",
    "Store",
    "StoreAdmin",
    "SyncError",
    "TokenAwareEmbedder",
    "VectorStore",
    "VectorStoreError",
    "Worker",
    "__version__",
    "asemantic_search",
    "evaluate",
    "evaluation",
    "get_chunker",
    "index_for",
    "keywords",
    "outbox",
    "register_chunker",
    "semantic_search",
    "signals",
]
