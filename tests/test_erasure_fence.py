"""A job under way when a person is erased writes nothing about them afterwards: whatever it
read before the erasure is never written after it, whatever the job's kind."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.app import create_app
from service.historian.memories import MemoryKeeper
from service.queue import repository
from service.queue.worker import JobContext, Worker
from service.runtime import Runtime
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    until_finished,
    wait_for,
)

# The historian's tables: what a job writes about people.
WRITTEN = ("memories", "profiles", "events", "todos")


@pytest.fixture
async def running(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")


class Gate:
    """Holds the first memory decision of a job (between its reads and its write
    transaction) until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        self.held = False
        decide = MemoryKeeper.decide

        async def held_decide(keeper: MemoryKeeper, *args: Any, **kwargs: Any) -> Any:
            plan = await decide(keeper, *args, **kwargs)
            if not self.held:
                self.held = True
                self.reached.set()
                await asyncio.wait_for(self.release.wait(), timeout=60)
            return plan

        monkeypatch.setattr(MemoryKeeper, "decide", held_decide)


def person() -> tuple[str, str, str]:
    """A random person: id, name, and words of theirs no one else says."""
    tag = uuid.uuid4().hex
    return str(10**9 + uuid.UUID(tag).int % 10**9), f"名{tag[:6]}", f"暗号{tag[6:18]}"


async def traces(db_url: str, tenant: TenantHandle, needles: list[str]) -> list[str]:
    """The historian's rows of the tenant that hold any of the needles."""
    found = []
    async with raw_connection(db_url) as conn:
        for table in WRITTEN:
            rows = await conn.fetch(
                f"SELECT row_to_json(t)::text AS row FROM {table} AS t WHERE tenant_id = $1",
                uuid.UUID(tenant.id),
            )
            found += [
                f"{table}: {r['row'][:300]}" for r in rows if any(n in r["row"] for n in needles)
            ]
    return found


async def erase(client: AppClient, tenant: TenantHandle, user_id: str) -> None:
    response = await client.delete(f"/v1/users/{user_id}", headers=tenant.headers)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("policy", ["accept", "refuse"])
async def test_an_extraction_under_way_writes_nothing_about_a_person_erased_meanwhile(
    running: tuple[AppClient, TenantHandle],
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    policy: str,
) -> None:
    client, tenant = running
    setting = await client.patch(
        "/v1/settings", json={"erased_policy": policy}, headers=tenant.headers
    )
    assert setting.status_code == 200, setting.text
    gate = Gate(monkeypatch)
    user_id, name, words = person()
    group = {"request_type": "group", "group_id": f"g{uuid.uuid4().hex[:8]}", "group_name": "群"}
    message = {
        "message_id": uuid.uuid4().hex,
        "sender_id": user_id,
        "sender_name": name,
        "text": f"记住：我的{words}在柜子里",
    }
    posted = await client.post(
        "/v1/messages", json={**group, "messages": [message]}, headers=tenant.headers
    )
    assert posted.status_code == 202, posted.text
    [job_id] = posted.json()["extraction_job_ids"]
    await asyncio.wait_for(gate.reached.wait(), timeout=30)

    await erase(client, tenant, user_id)
    gate.release.set()
    job = await until_finished(client, tenant, job_id)

    assert job["status"] == "done", job
    assert await traces(db_url, tenant, [user_id, words]) == []
    assert job["result"]["erasures_fenced"] == 1, job["result"]


async def test_an_end_job_under_way_writes_nothing_about_a_person_erased_meanwhile(
    running: tuple[AppClient, TenantHandle], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, tenant = running
    gate = Gate(monkeypatch)
    user_id, name, words = person()
    other, other_name, _ = person()
    group = {"request_type": "group", "group_id": f"g{uuid.uuid4().hex[:8]}", "group_name": "群"}
    # The person speaks in the group: the erasure knows their name from it.
    said = {"message_id": uuid.uuid4().hex, "sender_id": user_id, "sender_name": name}
    posted = await client.post(
        "/v1/messages",
        json={**group, "messages": [{**said, "text": f"我的{words}在柜子里"}]},
        headers=tenant.headers,
    )
    assert posted.status_code == 202, posted.text
    # Another member's hand-over: the erased person is one of the conversation's
    # participants (a sender of the reference messages), not its sender, so the erasure
    # redacts the job rather than deleting it: the statement stays, without their name or
    # their words.
    handed = await client.post(
        "/v1/end",
        json={
            **group,
            "sender_id": other,
            "sender_name": other_name,
            "request_id": uuid.uuid4().hex,
            "observations": [f"{name}说柜子里有东西"],
            "recent_messages": [
                {"sender_id": user_id, "sender_name": name, "text": f"我的{words}在柜子里"}
            ],
        },
        headers=tenant.headers,
    )
    assert handed.status_code == 202, handed.text
    await asyncio.wait_for(gate.reached.wait(), timeout=30)

    await erase(client, tenant, user_id)
    gate.release.set()
    job = await until_finished(client, tenant, handed.json()["job_id"])
    assert job["status"] == "done", job
    assert await traces(db_url, tenant, [user_id, name, words]) == []
    assert job["result"]["erasures_fenced"] == 1, job["result"]


async def test_the_erased_persons_own_end_job_under_way_writes_nothing(
    running: tuple[AppClient, TenantHandle], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, tenant = running
    gate = Gate(monkeypatch)
    user_id, name, words = person()
    group = {"request_type": "group", "group_id": f"g{uuid.uuid4().hex[:8]}", "group_name": "群"}
    handed = await client.post(
        "/v1/end",
        json={
            **group,
            "sender_id": user_id,
            "sender_name": name,
            "request_id": uuid.uuid4().hex,
            "observations": [f"我的{words}在柜子里"],
        },
        headers=tenant.headers,
    )
    assert handed.status_code == 202, handed.text
    await asyncio.wait_for(gate.reached.wait(), timeout=30)

    await erase(client, tenant, user_id)
    gate.release.set()

    worker = client.app.state.runtime.worker
    assert worker is not None

    async def settled() -> bool:
        return not worker._inflight  # the job's last transaction ended, one way or another

    await wait_for(settled)
    response = await client.get(f"/v1/jobs/{handed.json()['job_id']}", headers=tenant.headers)
    assert response.status_code == 404  # the erasure took the job with it
    assert await traces(db_url, tenant, [user_id, words]) == []


# ---------------------------------------------------------------- any job kind


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    """The app without its worker: the tests run a worker of their own kinds."""
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        yield client, await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")


def worker_of(client: AppClient, kind: str, handler: Any) -> Worker:
    rt: Runtime = client.app.state.runtime
    settings = rt.settings.cognitive.queue.model_copy(update={"concurrency": 1})
    return Worker(rt.db, {kind: handler}, settings, poll_interval=0.05)


async def queued(client: AppClient, tenant: TenantHandle, kind: str) -> int:
    rt: Runtime = client.app.state.runtime
    async with rt.db.tenant(uuid.UUID(tenant.id)) as session:
        job_id, _ = await repository.enqueue(session, uuid.UUID(tenant.id), kind, {})
    return job_id


async def about(db_url: str, user_id: str) -> list[str]:
    """The jobs that name the person in their payload."""
    async with raw_connection(db_url) as conn:
        rows = await conn.fetch(
            "SELECT kind FROM jobs WHERE payload -> 'context' ->> 'sender_id' = $1", user_id
        )
    return [r["kind"] for r in rows]


async def test_a_job_of_any_kind_that_read_before_an_erasure_runs_again_after_it(
    app: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = app
    user_id, _, _ = person()
    reached, release = asyncio.Event(), asyncio.Event()
    runs: list[int] = []

    async def reads_then_writes(ctx: JobContext) -> None:
        runs.append(ctx.job.attempts)
        async with ctx.transaction():
            pass  # what the job read of the person, before their erasure
        if len(runs) == 1:
            reached.set()
            await release.wait()
        async with ctx.finishing() as session:
            await repository.enqueue(
                session, ctx.job.tenant_id, "test.about", {"context": {"sender_id": user_id}}
            )

    job_id = await queued(client, tenant, "test.any")
    worker = worker_of(client, "test.any", reads_then_writes)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(reached.wait(), timeout=30)
        await erase(client, tenant, user_id)
        release.set()
        job = await until_finished(client, tenant, job_id)
    finally:
        await worker.stop()
        await running

    assert job["status"] == "done" and job["attempts"] == 1, job
    assert job["result"] == {"erasures_fenced": 1}, job
    assert runs == [1, 1]  # the attempt the erasure stopped was not counted
    assert await about(db_url, user_id) == ["test.about"]  # the second run's write alone


async def test_an_erasure_waits_for_a_job_writing_and_erases_what_it_wrote(
    app: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = app
    user_id, _, _ = person()
    reached, release = asyncio.Event(), asyncio.Event()

    async def writes(ctx: JobContext) -> None:
        async with ctx.finishing() as session:
            await repository.enqueue(
                session, ctx.job.tenant_id, "test.about", {"context": {"sender_id": user_id}}
            )
            reached.set()
            await release.wait()  # the write is made, not yet committed

    job_id = await queued(client, tenant, "test.writes")
    worker = worker_of(client, "test.writes", writes)
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(reached.wait(), timeout=30)
        erasing = asyncio.create_task(erase(client, tenant, user_id))
        await asyncio.sleep(0.5)  # the erasure under way meanwhile
        release.set()
        await erasing
        job = await until_finished(client, tenant, job_id)
    finally:
        await worker.stop()
        await running

    assert job["status"] == "done", job
    assert await about(db_url, user_id) == []
