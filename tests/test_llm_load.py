"""What one chat can make the historian's model do: extraction requests join one pending job
per conversation, and a tenant's model calls keep to its budget per minute."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.app import create_app
from service.db.engine import Database
from service.queue import repository
from service.queue.payloads import ExtractPayload
from service.settings import Settings
from service.tenants.service import create_tenant
from tests.conftest import (
    ADMIN,
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    wait_for,
)
from tests.fake_llm import FakeLLM, Reply, quiet


def remember(group: str, n: int, word: str) -> dict[str, Any]:
    """One POST /v1/messages body: a member asks the bot to remember a word."""
    return {
        "request_type": "group",
        "group_id": group,
        "messages": [
            {
                "message_id": f"m{n}-{uuid.uuid4().hex[:6]}",
                "sender_id": f"u{n % 7}",
                "sender_name": f"member {n % 7}",
                "text": f"remember this: the code word {n} is {word}",
                "sent_at": f"2026-03-01T10:{n % 60:02d}:{n // 60:02d}+08:00",
            }
        ],
    }


def prompts(llm: FakeLLM) -> str:
    """Everything the model was sent."""
    return "\n".join(json.dumps(r["messages"], ensure_ascii=False) for r in llm.chat_requests)


async def extraction_jobs(db_url: str) -> list[dict[str, Any]]:
    async with raw_connection(db_url) as conn:
        rows = await conn.fetch(
            "SELECT id, status, payload, result FROM jobs"
            " WHERE kind = 'messages.extract' ORDER BY id"
        )
    return [dict(r) for r in rows]


async def extracted(db_url: str, key: str) -> bool:
    async with raw_connection(db_url) as conn:
        row = await conn.fetchrow(
            "SELECT extracted_seq, last_seq FROM conversations WHERE conversation_key = $1", key
        )
        busy = await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')"
        )
    return row is not None and row["extracted_seq"] == row["last_seq"] and busy == 0


@pytest.fixture
async def online(db_url: str, llm: FakeLLM) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(
        db_url,
        cognitive={"queue": {**FAST_QUEUE, "concurrency": 4}},
        **llm_settings_slow(llm),
    )
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")


def llm_settings_slow(llm: FakeLLM) -> dict[str, Any]:
    """The scripted model, given time: a test holds its first answer back."""
    return {
        "models": {
            "historian": {
                "api_url": llm.base_url,
                "api_key": "sk-test",
                "model_name": "historian-test",
                "max_retries": 0,
                "retry_base_seconds": 0.01,
                "timeout_seconds": 120.0,
            }
        }
    }


def held(gate: threading.Event) -> Any:
    """The quiet model, whose answers wait for ``gate``."""

    def answer(request: dict[str, Any]) -> Reply:
        gate.wait(timeout=120)
        return quiet(request)

    return answer


async def test_a_hundred_remember_messages_make_a_few_jobs_and_lose_none(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM, db_url: str
) -> None:
    client, tenant = online
    group = f"g-{uuid.uuid4().hex[:8]}"
    words = [uuid.uuid4().hex[:10] for _ in range(100)]
    gate = threading.Event()
    llm.default = held(gate)
    first = await client.post(
        "/v1/messages", json=remember(group, 0, words[0]), headers=tenant.headers
    )
    assert first.status_code == 202, first.text

    async def asked() -> bool:
        return bool(llm.chat_requests)

    # The first message's job is with the model; the other 99 arrive one request each.
    await wait_for(asked)
    job_ids = set(first.json()["extraction_job_ids"])
    for n in range(1, 100):
        response = await client.post(
            "/v1/messages", json=remember(group, n, words[n]), headers=tenant.headers
        )
        assert response.status_code == 202, response.text
        job_ids |= set(response.json()["extraction_job_ids"])
    # One job with the model, one pending that the other 99 joined.
    assert len(job_ids) == 2, sorted(job_ids)
    gate.set()
    await wait_for(lambda: extracted(db_url, f"g:{group}"), timeout=60)
    jobs = await extraction_jobs(db_url)
    assert len(jobs) <= 3, [(j["id"], j["status"]) for j in jobs]
    assert all(j["status"] == "done" for j in jobs), jobs
    assert sum(json.loads(j["result"])["messages"] for j in jobs) == 100
    assert len(llm.chat_requests) <= 8, len(llm.chat_requests)
    sent = prompts(llm)
    assert [w for w in words if w not in sent] == []


async def test_concurrent_posts_join_one_pending_job(db_url: str) -> None:
    settings = make_settings(db_url)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        tenant = await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")
        group = f"g-{uuid.uuid4().hex[:8]}"
        answers = await asyncio.gather(
            *(
                client.post(
                    "/v1/messages",
                    json=remember(group, n, uuid.uuid4().hex[:10]),
                    headers=tenant.headers,
                )
                for n in range(20)
            )
        )
        assert all(a.status_code == 202 for a in answers), [a.text for a in answers]
        ids = {i for a in answers for i in a.json()["extraction_job_ids"]}
        jobs = await extraction_jobs(db_url)
        assert len(ids) == 1 and len(jobs) == 1, (ids, jobs)
        async with raw_connection(db_url) as conn:
            last = await conn.fetchval(
                "SELECT last_seq FROM conversations WHERE conversation_key = $1", f"g:{group}"
            )
        # The one job reads every message that asked.
        assert json.loads(jobs[0]["payload"])["upto_seq"] == last


def held_back(metrics: str) -> float:
    """Model calls held to a later window so far, every purpose together."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("memoria_llm_budget_reached_total{")
    )


async def test_a_tenants_budget_holds_its_calls_to_the_window_and_does_the_rest_later(
    db_url: str, llm: FakeLLM, caplog: pytest.LogCaptureFixture
) -> None:
    window = 4.0
    budget = 3
    settings = make_settings(
        db_url,
        # One attempt per job: waiting for the budget must never use it up.
        cognitive={"queue": {**FAST_QUEUE, "concurrency": 4, "job_max_retries": 0}},
        models={
            "historian": {
                **llm_settings_slow(llm)["models"]["historian"],
                "budget_window_seconds": window,
            }
        },
    )
    asked: list[float] = []

    def answer(request: dict[str, Any]) -> Reply:
        asked.append(time.monotonic())
        return quiet(request)

    llm.default = answer
    caplog.set_level(logging.WARNING, logger="service.tenants.budget")
    caplog.set_level(logging.DEBUG, logger="service.worker")
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        refused = await client.post(
            "/admin/tenants",
            json={"name": "t", "settings": {"llm_calls_per_minute": 0}},
            headers=ADMIN,
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["field"] == "settings.llm_calls_per_minute", refused.text
        created = await client.post(
            "/admin/tenants",
            json={
                "name": f"t-{uuid.uuid4().hex[:8]}",
                "settings": {"llm_calls_per_minute": budget},
            },
            headers=ADMIN,
        )
        assert created.status_code == 201, created.text
        headers = {"Authorization": f"Bearer {created.json()['api_key']['key']}"}
        before = held_back((await client.get("/metrics")).text)
        # Five chats, each one "remember this": five jobs of two model calls each.
        groups = [f"g-{uuid.uuid4().hex[:8]}" for _ in range(5)]
        words = [uuid.uuid4().hex[:10] for _ in groups]
        for n, (group, word) in enumerate(zip(groups, words, strict=True)):
            response = await client.post(
                "/v1/messages", json=remember(group, n, word), headers=headers
            )
            assert response.status_code == 202, response.text
        for group in groups:
            await wait_for(lambda g=group: extracted(db_url, f"g:{g}"), timeout=90)
        after = held_back((await client.get("/metrics")).text)
    jobs = await extraction_jobs(db_url)
    assert len(jobs) == 5 and all(j["status"] == "done" for j in jobs), jobs
    sent = prompts(llm)
    assert [w for w in words if w not in sent] == []
    # No more than the budget within a window of the first call (less a margin for the
    # time between a call's count and its arrival); the rest came in later windows.
    first = asked[0]
    assert len([t for t in asked if t < first + window - 0.5]) <= budget, asked
    assert len(asked) == 10 and asked[-1] - first >= window, asked
    assert after - before >= 1
    reached = [r for r in caplog.records if "reached its budget of 3 LLM calls" in r.getMessage()]
    windows = int((asked[-1] - first) / window) + 1
    assert 1 <= len(reached) <= windows, [r.getMessage() for r in reached]
    # A job refused its first call gave its slot back until the window's end, and still
    # finished on its one attempt.
    assert any("deferred" in r.getMessage() for r in caplog.records if r.name == "service.worker")


async def test_a_job_put_back_in_the_queue_leaves_the_waiting_one_alone(db_url: str) -> None:
    db = Database(db_url, pool_size=4)
    try:
        async with db.system() as session:
            tenant, _ = await create_tenant(session, f"t-{uuid.uuid4().hex[:8]}", {}, Settings())
        lock = f"extract:g:{uuid.uuid4().hex[:8]}"

        async def ask(upto: int) -> tuple[int, bool]:
            payload = ExtractPayload(conversation_key=lock[8:], upto_seq=upto, reason="remember")
            async with db.tenant(tenant.id) as session:
                return await repository.enqueue_joined(
                    session,
                    tenant.id,
                    "messages.extract",
                    payload,
                    queueing_lock=lock,
                    grow="upto_seq",
                )

        first, created = await ask(1)
        assert created
        async with db.system() as session:
            [running] = await repository.claim_jobs(session, "w", 5, 30.0)
        assert running.id == first
        # Asked during the run: a job of its own, which later requests join.
        second, created = await ask(2)
        assert created and second != first
        assert await ask(3) == (second, False)
        async with db.system() as session:
            # Not claimed while the first runs: it would read the same messages.
            assert await repository.claim_jobs(session, "w", 5, 30.0) == []
            # The first goes back to the queue (a shutdown) beside the waiting one.
            assert await repository.release(session, running, "w")
        assert await ask(4) == (second, False)
        async with raw_connection(db_url) as conn:
            rows = await conn.fetch("SELECT id, status, payload FROM jobs ORDER BY id")
        assert [(r["id"], r["status"], json.loads(r["payload"])["upto_seq"]) for r in rows] == [
            (first, "queued", 1),
            (second, "queued", 4),
        ]
    finally:
        await db.dispose()
