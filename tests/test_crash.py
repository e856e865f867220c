"""A worker process killed in the middle of a job: the job runs again, its events exist once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from typing import IO, Any

import pytest

from service.app import create_app
from tests.conftest import (
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    wait_for,
)
from tests.fake_llm import FakeLLM, Reply, quiet, tool


def start_worker(
    db_url: str, llm: FakeLLM, log: IO[bytes] | None = None
) -> subprocess.Popen[bytes]:
    """A ``memoria worker`` process on this database and scripted model (logs to ``log``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}
    env.update(
        MEMORIA_DATABASE_URL=db_url,
        MEMORIA_MODELS__HISTORIAN__API_URL=llm.base_url,
        MEMORIA_MODELS__HISTORIAN__MODEL_NAME="historian-test",
        MEMORIA_MODELS__HISTORIAN__MAX_RETRIES="0",
        MEMORIA_COGNITIVE__QUEUE__LEASE_SECONDS="2",
        MEMORIA_COGNITIVE__QUEUE__HEARTBEAT_SECONDS="0.5",
        MEMORIA_COGNITIVE__HISTORIAN__POLL_INTERVAL_SECONDS="0.2",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "service", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log if log is not None else subprocess.DEVNULL,
    )


async def killed_in_its_job(
    client: AppClient, tenant: TenantHandle, db_url: str, llm: FakeLLM, turn: dict[str, Any]
) -> int:
    """Hand ``turn`` over with a worker process running, and SIGKILL the worker while it is
    inside the job, waiting on the model (whose first answer hangs). The job's id."""
    llm.script(Reply(content="never", delay=60))
    first = start_worker(db_url, llm)
    try:
        response = await client.post("/v1/end", json=turn, headers=tenant.headers)
        assert response.status_code == 202, response.text
        job_id = int(response.json()["job_id"])

        async def mid_job() -> bool:
            job = (await client.get(f"/v1/jobs/{job_id}", headers=tenant.headers)).json()
            return job["status"] == "running" and len(llm.chat_requests) == 1

        await wait_for(mid_job, timeout=60)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    return job_id


@pytest.mark.slow
async def test_sigkilled_worker_job_is_reclaimed_and_written_once(
    db_url: str, llm: FakeLLM
) -> None:
    async with serve_app(
        create_app(make_settings(db_url), migrate=False, run_worker=False)
    ) as client:
        tenant = await new_tenant(client)
        llm.default = lambda request: Reply(content="no profile change")
        turn = {
            "request_type": "group",
            "group_id": "g1",
            "sender_id": "10001",
            "sender_name": "张三",
            "request_id": "crash-1",
            "timestamp": "2026-02-21T23:30:00+08:00",
            "observations": ["我明天去北京"],
        }
        job_id = await killed_in_its_job(client, tenant, db_url, llm, turn)
        job = (await client.get(f"/v1/jobs/{job_id}", headers=tenant.headers)).json()
        assert job["status"] == "running"  # stuck with a dead owner, until its lease runs out

        llm.script(
            tool(
                "submit_rewrite",
                {"rewrites": [{"index": 0, "text": "张三(10001) 2026-02-22 去北京"}]},
            )
        )
        second = start_worker(db_url, llm)
        try:

            async def done() -> dict[str, object] | None:
                current = (await client.get(f"/v1/jobs/{job_id}", headers=tenant.headers)).json()
                return current if current["status"] in ("done", "failed") else None

            finished = await wait_for(done, timeout=60)
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=30) == 0  # a clean shutdown on SIGTERM
        assert finished["status"] == "done"
        assert finished["attempts"] == 2

    async with raw_connection(db_url) as conn:
        rows = await conn.fetch("SELECT id, text FROM events WHERE request_id = 'crash-1'")
        running = await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'running'")
    assert [(r["id"], r["text"]) for r in rows] == [
        ("g:g1:crash-1:1.1", "张三(10001) 2026-02-22 去北京")
    ]
    assert running == 0


@pytest.mark.slow
async def test_a_job_whose_worker_died_writes_nothing_about_a_person_erased_meanwhile(
    db_url: str, llm: FakeLLM
) -> None:
    """The worker is killed inside a person's end job, the person is erased while the job's
    lease is still held by the dead worker, and a new worker starts: nothing about
    the person is written, in any table, after the restart."""
    tag = uuid.uuid4().hex
    person, name, words = (
        str(10**9 + uuid.UUID(tag).int % 10**9),
        f"名{tag[:6]}",
        f"暗号{tag[6:18]}",
    )
    group = f"g{tag[18:26]}"
    async with serve_app(
        create_app(make_settings(db_url), migrate=False, run_worker=False)
    ) as client:
        tenant = await new_tenant(client)
        llm.default = quiet
        turn = {
            "request_type": "group",
            "group_id": group,
            "sender_id": person,
            "sender_name": name,
            "request_id": f"r-{tag[:8]}",
            "timestamp": "2026-02-21T23:30:00+08:00",
            "observations": [f"{name}({person})说{words}，明天去北京"],
            "force": True,
        }
        await killed_in_its_job(client, tenant, db_url, llm, turn)

        erased = await client.delete(f"/v1/users/{person}", headers=tenant.headers)
        assert erased.status_code == 200, erased.text

        second = start_worker(db_url, llm)
        try:

            async def settled() -> bool:
                # The job is gone with the person's hand-overs, or was taken up and finished:
                # nothing of the tenant is left waiting or held.
                async with raw_connection(db_url) as conn:
                    left = await conn.fetchval(
                        "SELECT count(*) FROM jobs WHERE tenant_id = $1"
                        " AND status IN ('queued', 'running')",
                        uuid.UUID(tenant.id),
                    )
                return left == 0 and len(llm.chat_requests) >= 1

            await wait_for(settled, timeout=60)
            assert second.poll() is None, "the new worker died"
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=30)

    async with raw_connection(db_url) as conn:
        tables = await conn.fetch(
            "SELECT c.relname FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid"
            " WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace"
            " AND a.attname = 'tenant_id' AND NOT a.attisdropped"
        )
        found = []
        for (table,) in tables:
            rows = await conn.fetch(
                f'SELECT row_to_json(t)::text AS row FROM "{table}" AS t WHERE tenant_id = $1',
                uuid.UUID(tenant.id),
            )
            found += [
                f"{table}: {r['row'][:200]}"
                for r in rows
                if any(n in r["row"] for n in (person, name, words))
            ]
    # The erasure's own receipt names no one: it keeps a keyed hash, not the id.
    assert found == []
