"""A worker process killed in the middle of a job: the job runs again, its events exist once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import IO

import pytest

from service.app import create_app
from tests.conftest import make_settings, new_tenant, raw_connection, serve_app, wait_for
from tests.fake_llm import FakeLLM, Reply, tool


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


@pytest.mark.slow
async def test_sigkilled_worker_job_is_reclaimed_and_written_once(
    db_url: str, llm: FakeLLM
) -> None:
    async with serve_app(
        create_app(make_settings(db_url), migrate=False, run_worker=False)
    ) as client:
        tenant = await new_tenant(client)
        # The first rewrite hangs: the worker will be inside the job, waiting on the LLM.
        llm.script(Reply(content="never", delay=60))
        llm.default = lambda request: Reply(content="no profile change")
        first = start_worker(db_url, llm)
        try:
            response = await client.post(
                "/v1/end",
                json={
                    "request_type": "group",
                    "group_id": "g1",
                    "sender_id": "10001",
                    "sender_name": "张三",
                    "request_id": "crash-1",
                    "timestamp": "2026-02-21T23:30:00+08:00",
                    "observations": ["我明天去北京"],
                },
                headers=tenant.headers,
            )
            job_id = response.json()["job_id"]

            async def mid_job() -> bool:
                job = (await client.get(f"/v1/jobs/{job_id}", headers=tenant.headers)).json()
                return job["status"] == "running" and len(llm.chat_requests) == 1

            await wait_for(mid_job, timeout=60)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
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
