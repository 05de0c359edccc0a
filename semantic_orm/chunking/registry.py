"""A name registry of chunking strategies, so a column can say ``chunker="sentence"``."""

from __future__ import annotations

from ._core import Chunker, ChunkerFactory

__all__ = ["available_chunkers", "get_chunker", "register_chunker"]

_REGISTRY: dict[str, ChunkerFactory] = {}


def register_chunker(name: str, factory: ChunkerFactory, *, replace: bool = False) -> None:
    """Make a chunking strategy available to :func:`get_chunker` under ``name``.

    Args:
        name: Strategy name, as stored in ``config()["strategy"]``.
        factory: Callable accepting ``chunk_size=`` and ``overlap=`` keyword arguments and
            returning a :class:`Chunker` (a chunker class usually qualifies).
        replace: Allow replacing an existing registration.

    Raises:
        ValueError: If ``name`` is empty or already registered and ``replace`` is false.
        TypeError: If ``factory`` is not callable.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"chunker name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory for chunker {name!r} must be callable")
    if name in _REGISTRY and not replace:
        raise ValueError(
            f"chunker strategy {name!r} is already registered; pass replace=True to override"
        )
    _REGISTRY[name] = factory


def available_chunkers() -> list[str]:
    """Return the registered strategy names, sorted.

    Returns:
        The names accepted by :func:`get_chunker`.
    """
    return sorted(_REGISTRY)


def get_chunker(
    strategy: str | Chunker = "recursive",
    *,
    chunk_size: int = 1000,
    overlap: int = 200,
) -> Chunker:
    """Resolve a strategy name (or pass through a chunker instance).

    Args:
        strategy: A registered strategy name, or an object implementing :class:`Chunker`,
            which is returned unchanged (``chunk_size`` and ``overlap`` are then ignored).
        chunk_size: Maximum chunk length in code points, for named strategies.
        overlap: Maximum overlap between consecutive chunks, for named strategies.

    Returns:
        A chunker.

    Raises:
        ValueError: If the strategy name is unknown (the message lists the known ones), or
            the sizes are invalid.
        TypeError: If ``strategy`` is neither a string nor a chunker, or a factory returns
            something that is not a chunker.
    """
    if isinstance(strategy, str):
        factory = _REGISTRY.get(strategy)
        if factory is None:
            known = ", ".join(repr(name) for name in available_chunkers()) or "none"
            raise ValueError(f"unknown chunking strategy {strategy!r}; known strategies: {known}")
        chunker = factory(chunk_size=chunk_size, overlap=overlap)
        if not isinstance(chunker, Chunker):
            raise TypeError(f"factory for chunking strategy {strategy!r} did not return a Chunker")
        return chunker
    if isinstance(strategy, Chunker):
        return strategy
    raise TypeError(f"strategy must be a strategy name or a Chunker, got {type(strategy).__name__}")
