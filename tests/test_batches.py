"""The historian's end jobs in batches: a poisoned job fails alone, a batch killed in the
middle of its writes runs again with nothing written twice, and a batch leaves the profiles
one-by-one processing leaves."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event as sql_event

from service.db.engine import Database
from service.embedding import build_embedder
from service.ends.schemas import EndRequest
from service.ends.service import END_JOB, accept_end
from service.historian.service import Historian
from service.queue.worker import Worker
from service.settings import EmbeddingModelSettings, Settings
from service.tenants.service import TenantContext, create_tenant
from tests.conftest import FAST_QUEUE, raw_connection, wait_for
from tests.fake_llm import FakeLLM

START = datetime(2026, 3, 2, 9, tzinfo=UTC)
LINES = [
    "我在字节上班",
    "我喜欢喝咖啡",
    "我搬到杭州了",
    "我在阿里上班",
    "我喜欢喝咖啡",
    "我今天在公园跑步",
    "我搬到成都了",
    "我不喜欢吃香菜",
]


def hash_embedding(llm: FakeLLM) -> dict[str, Any]:
    """The scripted server's hash vectors (fast, deterministic) as the embedder."""
    return {"provider": "openai", "api_url": llm.base_url, "model_name": "hash-384"}


def end_request(n: int, tag: str, people: int = 3) -> EndRequest:
    """Call ``n`` of a chat: one of ``people`` members of one group, one line each."""
    person = n % people
    body: dict[str, Any] = {
        "request_type": "group",
        "group_id": "g1",
        "group_name": "跑步群",
        "sender_id": f"{10000 + person}",
        "sender_name": f"成员{person}",
        "bot_id": "20002",
        "bot_name": "小助手",
        "request_id": f"{tag}-{n}",
        "timestamp": (START + timedelta(minutes=7 * n)).isoformat(),
        "observations": [LINES[n % len(LINES)]],
    }
    if n % 4 == 0:
        body["memo"] = f"我记下了第{n}条"
    return EndRequest.model_validate(body)


class Setup:
    """A database with tenants, the settings the worker runs with, and a way to queue."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings

    async def tenant(self, name: str) -> TenantContext:
        async with self.db.system() as session:
            row, _ = await create_tenant(session, name, {}, self.settings)
        return TenantContext(row.id, name, None, None, {}, self.settings)

    async def queue(self, tenant: TenantContext, count: int, tag: str) -> None:
        for n in range(count):
            await accept_end(self.db, tenant, end_request(n, tag), self.settings)

    def worker(self, *, batches: bool, batch_size: int = 32) -> Worker:
        """A worker running end jobs one at a time, or in batches of ``batch_size``."""
        embedder = build_embedder(EmbeddingModelSettings(**hash_embedding_of(self.settings)))
        historian = Historian(embedder, None, self.settings)
        queue = self.settings.cognitive.queue.model_copy(
            update={"batch_size": batch_size, "concurrency": 1 if not batches else 2}
        )
        return Worker(
            self.db,
            {END_JOB: historian.run_end},
            queue,
            poll_interval=0.05,
            batch_handlers={END_JOB: historian.run_end_batch} if batches else None,
        )


def hash_embedding_of(settings: Settings) -> dict[str, Any]:
    embedding = settings.models.embedding
    return {
        "provider": embedding.provider,
        "api_url": embedding.api_url,
        "model_name": embedding.model_name,
    }


@pytest.fixture
async def setup(db_url: str, llm: FakeLLM) -> AsyncIterator[Setup]:
    settings = Settings(
        database_url=db_url,
        models={"embedding": hash_embedding(llm)},
        cognitive={"queue": FAST_QUEUE},
    )
    db = Database(db_url, pool_size=10)
    yield Setup(db, settings)
    await db.dispose()


async def drain(worker: Worker, db_url: str, tenant_id: uuid.UUID, count: int) -> None:
    """Run ``worker`` until the tenant's ``count`` jobs are done or failed."""
    task = asyncio.create_task(worker.run())

    async def finished() -> bool:
        async with raw_connection(db_url) as conn:
            n = await conn.fetchval(
                "SELECT count(*) FROM jobs WHERE tenant_id = $1 AND status IN ('done', 'failed')",
                tenant_id,
            )
        return bool(n >= count)

    try:
        await wait_for(finished, timeout=90, interval=0.2)
    finally:
        await worker.stop()
        await task


async def fetch(db_url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    async with raw_connection(db_url) as conn:
        return list(await conn.fetch(query, *args))


async def test_a_poisoned_job_fails_alone_and_its_batch_mates_are_stored(
    setup: Setup, db_url: str
) -> None:
    tenant = await setup.tenant("poison")
    await setup.queue(tenant, 12, "p")
    jobs = await fetch(
        db_url, "SELECT id, payload FROM jobs WHERE tenant_id = $1 ORDER BY id", tenant.tenant_id
    )
    unreadable, unwritable = jobs[3]["id"], jobs[8]["id"]
    async with raw_connection(db_url) as conn:
        # One job cannot be read (no moment); another fails inside the shared write (an event
        # id longer than the column), after its batch-mates' rows went into the transaction.
        await conn.execute("UPDATE jobs SET payload = payload - 'moment' WHERE id = $1", unreadable)
        await conn.execute(
            "UPDATE jobs SET payload = jsonb_set(payload, '{event_ids,0}', to_jsonb($2::text))"
            " WHERE id = $1",
            unwritable,
            "x" * 1001,
        )

    await drain(setup.worker(batches=True), db_url, tenant.tenant_id, 12)

    rows = await fetch(
        db_url,
        "SELECT id, status, last_error FROM jobs WHERE tenant_id = $1 ORDER BY id",
        tenant.tenant_id,
    )
    failed = {r["id"]: r["last_error"] for r in rows if r["status"] == "failed"}
    assert set(failed) == {unreadable, unwritable}
    assert "malformed EndPayload" in failed[unreadable]
    assert all(r["status"] == "done" for r in rows if r["id"] not in failed)
    stored = {
        r["request_id"]
        for r in await fetch(
            db_url, "SELECT request_id FROM events WHERE tenant_id = $1", tenant.tenant_id
        )
    }
    assert stored == {f"p-{n}" for n in range(12)} - {"p-3", "p-8"}


async def test_a_batch_leaves_the_profiles_that_one_by_one_processing_leaves(
    setup: Setup, db_url: str
) -> None:
    one_by_one = await setup.tenant("one-by-one")
    batched = await setup.tenant("batched")
    count = 24
    await setup.queue(one_by_one, count, "c")
    await drain(setup.worker(batches=False), db_url, one_by_one.tenant_id, count)
    await setup.queue(batched, count, "c")
    await drain(setup.worker(batches=True, batch_size=count), db_url, batched.tenant_id, count)

    query = "SELECT profile_key, document, version FROM profiles WHERE tenant_id = $1 ORDER BY 1"
    single = await fetch(db_url, query, one_by_one.tenant_id)
    together = await fetch(db_url, query, batched.tenant_id)
    assert [r["profile_key"] for r in single] == [r["profile_key"] for r in together]
    assert len(single) >= 3  # the group's members, each with several facts
    for a, b in zip(single, together, strict=True):
        assert a["document"] == b["document"], a["profile_key"]
    # The same text in fewer writes.
    assert sum(r["version"] for r in together) < sum(r["version"] for r in single)
    events = "SELECT id, text, embedding::text FROM events WHERE tenant_id = $1 ORDER BY id"
    assert [tuple(r) for r in await fetch(db_url, events, one_by_one.tenant_id)] == [
        tuple(r) for r in await fetch(db_url, events, batched.tenant_id)
    ]
    memories = "SELECT content, scope, user_id FROM memories WHERE tenant_id = $1 ORDER BY 1, 3"
    assert [tuple(r) for r in await fetch(db_url, memories, one_by_one.tenant_id)] == [
        tuple(r) for r in await fetch(db_url, memories, batched.tenant_id)
    ]


def start_worker(db_url: str, llm: FakeLLM, batch_size: int) -> subprocess.Popen[bytes]:
    """A ``memoria worker`` process with the hash embedder and batches of ``batch_size``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}
    env.update(
        MEMORIA_DATABASE_URL=db_url,
        MEMORIA_MODELS__EMBEDDING__PROVIDER="openai",
        MEMORIA_MODELS__EMBEDDING__API_URL=llm.base_url,
        MEMORIA_MODELS__EMBEDDING__MODEL_NAME="hash-384",
        MEMORIA_COGNITIVE__QUEUE__LEASE_SECONDS="2",
        MEMORIA_COGNITIVE__QUEUE__HEARTBEAT_SECONDS="0.5",
        MEMORIA_COGNITIVE__QUEUE__BATCH_SIZE=str(batch_size),
        MEMORIA_COGNITIVE__HISTORIAN__POLL_INTERVAL_SECONDS="0.2",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "service", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.slow
async def test_a_batch_killed_in_its_writes_runs_again_and_writes_everything_once(
    setup: Setup, db_url: str, llm: FakeLLM
) -> None:
    tenant = await setup.tenant("crash")
    count = 10
    await setup.queue(tenant, count, "k")
    # The batch's texts are embedded; the profiles' new digests, inside the transaction
    # that has already written the events, are held: the worker dies there.
    llm.hold_embeddings(after=1)
    first = start_worker(db_url, llm, batch_size=count)
    try:

        async def held() -> bool:
            return llm.embeddings_waiting > 0

        await wait_for(held, timeout=60)
        running = await fetch(db_url, "SELECT id FROM jobs WHERE status = 'running'")
        assert len(running) == count  # one batch holds every job
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    llm.release_embeddings()
    assert await fetch(db_url, "SELECT id FROM events WHERE tenant_id = $1", tenant.tenant_id) == []

    second = start_worker(db_url, llm, batch_size=count)
    try:

        async def all_done() -> bool:
            rows = await fetch(
                db_url, "SELECT status FROM jobs WHERE tenant_id = $1", tenant.tenant_id
            )
            return all(r["status"] in ("done", "failed") for r in rows)

        await wait_for(all_done, timeout=90, interval=0.2)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0

    jobs = await fetch(
        db_url, "SELECT status, attempts FROM jobs WHERE tenant_id = $1", tenant.tenant_id
    )
    assert [(j["status"], j["attempts"]) for j in jobs] == [("done", 2)] * count
    events = await fetch(
        db_url, "SELECT request_id, kind FROM events WHERE tenant_id = $1", tenant.tenant_id
    )
    expected = count + len([n for n in range(count) if n % 4 == 0])  # observations + memos
    assert len(events) == expected
    assert {e["request_id"] for e in events} == {f"k-{n}" for n in range(count)}
    memories = await fetch(
        db_url,
        "SELECT content, count(*) AS n FROM memories WHERE tenant_id = $1 GROUP BY 1",
        tenant.tenant_id,
    )
    assert memories and all(m["n"] == 1 for m in memories)
    history = await fetch(
        db_url,
        "SELECT count(*) AS n FROM memory_history WHERE tenant_id = $1 AND action = 'add'",
        tenant.tenant_id,
    )
    assert history[0]["n"] == len(memories)


async def test_the_rules_read_memories_by_meaning_only_for_the_duplicate_rule(
    setup: Setup, db_url: str
) -> None:
    """Offline, nothing compares a new item with the memories near it but the duplicate rule
    at write: one read by meaning per item, however many memories there are (a second read,
    for a comparison nobody makes, grew with the memories and slowed every job)."""
    tenant = await setup.tenant("reads")
    await setup.queue(tenant, 24, "r")
    reads: list[str] = []

    def seen(*args: Any) -> None:
        statement = args[2]
        if "FROM memories" in statement and "<=>" in statement:
            reads.append(statement)

    sql_event.listen(setup.db.engine.sync_engine, "before_cursor_execute", seen)
    try:
        await drain(setup.worker(batches=True), db_url, tenant.tenant_id, 24)
    finally:
        sql_event.remove(setup.db.engine.sync_engine, "before_cursor_execute", seen)
    added = await fetch(
        db_url,
        "SELECT count(*) AS n FROM memory_history WHERE tenant_id = $1"
        " AND action IN ('add', 'noop_duplicate')",
        tenant.tenant_id,
    )
    assert added[0]["n"] > 0
    assert len(reads) == added[0]["n"]
