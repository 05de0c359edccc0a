"""Rerankers: the "fine" stage of a broad-then-fine search.

A first-stage search (dense, keyword or hybrid) is fast and broad, but it scores the query and
each passage separately, so passages that look alike (two clauses of the same contract, two
versions of one procedure) often come out in the wrong order. A reranker reads the query and a
passage *together* and scores how well that passage answers that query: too slow for a whole
collection, affordable for the first few dozen candidates. ``semantic_search(..., rerank=...)``
reorders the top ``rerank_window`` hits with one (see :mod:`semantic_orm.search`).

A reranker is anything that satisfies the small :class:`Reranker` protocol: a ``name`` and a
``score(query, passages)`` method returning one finite number per passage, higher meaning more
relevant; the whole candidate window is passed in one call, so an implementation can batch.

:class:`CrossEncoderReranker` is the real one: a sentence-transformers ``CrossEncoder``
(``"cross-encoder/ms-marco-MiniLM-L-6-v2"``, ``"BAAI/bge-reranker-base"``, a local path),
imported and loaded only when it first scores. :class:`~semantic_orm.testing.OverlapReranker` is a
deterministic test double.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .chunking import encoding_lock
from .exc import ConfigurationError, EmbeddingError, MissingDependencyError
from .forking import RenewedLock, running_torch

__all__ = ["CrossEncoderReranker", "Reranker", "rerank_scores"]


@runtime_checkable
class Reranker(Protocol):
    """What semantic_orm needs from a reranker."""

    @property
    def name(self) -> str:
        """The reranker's identity (a model name), used in error messages."""
        ...

    def score(self, query: str, passages: Sequence[str]) -> Sequence[float]:
        """One relevance score per passage, higher is better (any scale, finite)."""
        ...


def rerank_scores(reranker: Reranker, query: str, passages: Sequence[str]) -> list[float]:
    """``reranker.score(query, passages)``, checked: one finite float per passage.

    Raises:
        EmbeddingError: The reranker failed, or returned the wrong number of scores or a NaN
            or infinite one (the message names the reranker).
    """
    if not passages:
        return []
    name = getattr(reranker, "name", repr(reranker))
    try:
        raw = reranker.score(query, list(passages))
        scores = [float(s) for s in raw]
    except EmbeddingError:
        raise
    except Exception as exc:
        raise EmbeddingError(f"reranker {name!r} failed to score: {exc}") from exc
    if len(scores) != len(passages):
        raise EmbeddingError(
            f"reranker {name!r} returned {len(scores)} scores for {len(passages)} passages"
        )
    if not all(math.isfinite(s) for s in scores):
        raise EmbeddingError(f"reranker {name!r} returned a NaN or infinite score")
    return scores


class CrossEncoderReranker:
    """A sentence-transformers ``CrossEncoder``, loaded lazily, scoring (query, passage) pairs.

    Args:
        model: Model name on the hub, or a local path.
        batch_size: Pairs scored per forward pass.
        device: Torch device (``"cpu"``, ``"cuda"``); ``None`` lets sentence-transformers choose.
        max_length: Tokens read per pair (query and passage together); ``None``: the model's.
        model_kwargs: Extra keyword arguments for ``CrossEncoder(...)`` (e.g. ``num_labels``).
    """

    def __init__(
        self,
        model: str,
        *,
        batch_size: int = 32,
        device: str | None = None,
        max_length: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ConfigurationError(
                f"CrossEncoderReranker model must be a name or path, got {model!r}"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigurationError(
                f"CrossEncoderReranker batch_size must be an int > 0, got {batch_size!r}"
            )
        self._name = model
        self.batch_size = batch_size
        self._device = device
        self._max_length = max_length
        self._model_kwargs = dict(model_kwargs or {})
        self._model: Any = None
        self._lock = RenewedLock()

    def __repr__(self) -> str:
        return f"CrossEncoderReranker({self._name!r})"

    @property
    def name(self) -> str:
        """The model's name or path, as given."""
        return self._name

    @property
    def loaded(self) -> bool:
        """Whether the model has been loaded (it is on the first :meth:`score`)."""
        return self._model is not None

    @property
    def model(self) -> Any:
        """The loaded ``CrossEncoder`` (loaded on first access)."""
        if self._model is None:
            with self._lock:
                if self._model is None:
                    self._model = self._load()
        return self._model

    def _load(self) -> Any:
        try:
            from sentence_transformers import CrossEncoder
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingDependencyError(
                "CrossEncoderReranker needs sentence-transformers: "
                "pip install 'semantic-orm[embed]' (and torch==2.13.0 for a CPU build)"
            ) from exc
        running_torch()  # a torch model: a process forked from this one runs it on one thread
        try:
            return CrossEncoder(
                self._name,
                device=self._device,
                max_length=self._max_length,
                **self._model_kwargs,
            )
        except Exception as exc:
            raise EmbeddingError(f"could not load reranker model {self._name!r}: {exc}") from exc

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One relevance score per passage (the model's activated output, higher is better)."""
        if not passages:
            return []
        model = self.model
        try:
            with encoding_lock(getattr(model, "tokenizer", None)):  # (it tokenizes inside)
                raw = model.predict(
                    [(query, p) for p in passages],
                    batch_size=self.batch_size,
                    show_progress_bar=False,
                    convert_to_numpy=True,
                )
        except Exception as exc:
            raise EmbeddingError(f"reranker model {self._name!r} failed to score: {exc}") from exc
        values = np.asarray(raw, dtype=np.float64).reshape(len(passages), -1)
        if values.shape[1] != 1:
            raise EmbeddingError(
                f"reranker model {self._name!r} gives {values.shape[1]} scores per pair: use a "
                "model with one output (num_labels=1)"
            )
        return [float(s) for s in values[:, 0]]
