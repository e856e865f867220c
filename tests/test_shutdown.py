"""Stopping while the worker embeds a large backlog: the batch in hand commits, the job goes
back to the queue where it stopped, and the stop takes one batch, not the whole backlog."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import text

from service.messages.service import EMBED_JOB, Archivist
from service.queue.worker import Worker
from tests.conftest import AppClient, new_tenant
from tests.test_queue import queue_settings

BATCH = 16


class SlowEmbedder:
    """Vectors of the configured width, each call taking a while (as a CPU-bound model does)."""

    def __init__(self, dimension: int, seconds: float) -> None:
        self.dimension = dimension
        self.seconds = seconds
        self.calls = 0

    async def passages(self, texts: Sequence[str]) -> list[Any]:
        self.calls += 1
        await asyncio.sleep(self.seconds)
        return [np.full(self.dimension, 0.1, dtype=np.float32) for _ in texts]


async def test_a_stop_during_a_large_embedding_takes_one_batch_and_requeues_the_rest(
    client: AppClient,
) -> None:
    tenant = await new_tenant(client)
    for part in range(4):
        messages = [
            {"message_id": f"m{part}-{n}", "sender_id": "1", "text": f"第{part}批 消息 {n}"}
            for n in range(100)
        ]
        body = {"request_type": "group", "group_id": "g", "messages": messages}
        stored = await client.post("/v1/messages", json=body, headers=tenant.headers)
        assert stored.status_code in (200, 201, 202), stored.text
    runtime = client.app.state.runtime
    settings = runtime.settings.model_copy(deep=True)
    settings.models.embedding.batch_size = BATCH
    embedder = SlowEmbedder(settings.models.embedding.dimensions, seconds=0.3)
    archivist = Archivist(runtime.db, embedder, settings)  # type: ignore[arg-type]
    worker = Worker(
        runtime.db, {EMBED_JOB: archivist.run_embed}, queue_settings(), poll_interval=0.05
    )
    task = asyncio.create_task(worker.run())
    deadline = time.monotonic() + 30
    while embedder.calls < 3:
        assert time.monotonic() < deadline, "the embedding never started"
        await asyncio.sleep(0.05)

    began = time.monotonic()
    await worker.stop(timeout=120)  # the grace a job in hand could use: not needed here
    await task
    took = time.monotonic() - began

    async with runtime.db.system() as session:
        embedded = (
            await session.execute(text("SELECT count(*) FROM messages WHERE embedding IS NOT NULL"))
        ).scalar_one()
        jobs = (
            await session.execute(
                text("SELECT status, attempts FROM jobs WHERE kind = :kind"), {"kind": EMBED_JOB}
            )
        ).all()
    # The stop waited for the batch in hand (0.3 s), not for the 25 batches of the backlog.
    assert took < 5, took
    # What was done stays done; the rest is the job's again, its attempt given back.
    assert 0 < embedded < 400 and embedded % BATCH == 0
    assert [tuple(j) for j in jobs if j.status != "done"] == [("queued", 0)]
