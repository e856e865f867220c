"""A stream of end calls while worker processes are SIGKILLed at random and restarted."""

from __future__ import annotations

import asyncio
import ctypes
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from service.app import create_app
from tests.conftest import make_settings, new_tenant, raw_connection, serve_app, wait_for
from tests.fake_llm import FakeLLM

CALLS = int(os.environ.get("MEMORIA_SOAK_CALLS", "1000"))
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # A run killed outright (SIGKILL, a second timeout) cannot stop its workers: the kernel
    # does, so that none goes on polling a database that is about to be deleted.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


async def ended(worker: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether the process exits within ``timeout`` seconds; the event loop runs meanwhile."""
    deadline = time.monotonic() + timeout
    while worker.poll() is None:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def stop_workers(workers: list[subprocess.Popen[bytes]], graceful: bool) -> None:
    """SIGTERM and a minute to finish the jobs in hand when the soak ends; when it is
    interrupted or failed, SIGKILL at once (what the soak does to them anyway)."""
    for worker in workers:
        worker.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
    for worker in workers:
        if not await ended(worker, 60 if graceful else 5):
            worker.kill()
            await ended(worker, 5)


def start_worker(db_url: str, llm: FakeLLM) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}
    env.update(
        MEMORIA_DATABASE_URL=db_url,
        # Hash vectors from the scripted server: the soak is about the queue surviving kills;
        # the local model would spend most of it embedding, and each restart reloading it.
        MEMORIA_MODELS__EMBEDDING__PROVIDER="openai",
        MEMORIA_MODELS__EMBEDDING__API_URL=llm.base_url,
        MEMORIA_MODELS__EMBEDDING__MODEL_NAME="hash-384",
        MEMORIA_COGNITIVE__QUEUE__LEASE_SECONDS="2",
        MEMORIA_COGNITIVE__QUEUE__HEARTBEAT_SECONDS="0.5",
        MEMORIA_COGNITIVE__QUEUE__CONCURRENCY="8",
        MEMORIA_COGNITIVE__QUEUE__RETRY_BASE_SECONDS="0.1",
        MEMORIA_COGNITIVE__QUEUE__RETRY_CAP_SECONDS="2",
        MEMORIA_COGNITIVE__QUEUE__JOB_MAX_RETRIES="20",
        MEMORIA_COGNITIVE__HISTORIAN__POLL_INTERVAL_SECONDS="0.2",
        MEMORIA_LOG_LEVEL="WARNING",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "service", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent if sys.platform == "linux" else None,
    )


@pytest.mark.slow
async def test_every_accepted_end_is_written_exactly_once_despite_kills(
    db_url: str, llm: FakeLLM
) -> None:
    rng = random.Random(7)
    kills = 0
    async with serve_app(
        create_app(make_settings(db_url), migrate=False, run_worker=False)
    ) as client:
        tenant = await new_tenant(client)
        workers = [start_worker(db_url, llm), start_worker(db_url, llm)]

        async def chaos() -> None:
            nonlocal kills
            while True:
                await asyncio.sleep(rng.uniform(0.3, 1.2))
                victim = rng.randrange(len(workers))
                workers[victim].send_signal(signal.SIGKILL)
                await ended(workers[victim], 10)
                kills += 1
                workers[victim] = start_worker(db_url, llm)

        monkey = asyncio.create_task(chaos())
        accepted: list[str] = []
        finished = False
        try:
            for n in range(CALLS):
                response = await client.post(
                    "/v1/end",
                    json={
                        "request_type": "group",
                        "group_id": f"g{n % 7}",
                        "sender_id": f"{10000 + n % 13}",
                        "sender_name": "张三",
                        "request_id": f"soak-{n}",
                        "observations": [f"我明天要去第 {n} 号会议室开会"],
                        "timestamp": "2026-02-21T23:30:00+08:00",
                    },
                    headers=tenant.headers,
                )
                if response.status_code == 202:
                    accepted.append(f"g:g{n % 7}:soak-{n}:1.1")
                if n % 50 == 0:
                    await asyncio.sleep(0)

            async def drained() -> bool:
                async with raw_connection(db_url) as conn:
                    return bool(
                        await conn.fetchval(
                            "SELECT count(*) = 0 FROM jobs WHERE status IN ('queued', 'running')"
                        )
                    )

            started = time.monotonic()
            await asyncio.sleep(3)
            monkey.cancel()
            await wait_for(drained, timeout=900, interval=0.5)
            drain_seconds = time.monotonic() - started
            finished = True
        finally:
            monkey.cancel()
            await stop_workers(workers, graceful=finished)

    async with raw_connection(db_url) as conn:
        stored = await conn.fetch(
            "SELECT id, count(*) OVER (PARTITION BY id) AS copies FROM events"
        )
        statuses = dict(await conn.fetch("SELECT status, count(*) FROM jobs GROUP BY status"))
        failures = [
            dict(r)
            for r in await conn.fetch(
                "SELECT attempts, left(last_error, 120) AS error, count(*) FROM jobs"
                " WHERE status = 'failed' GROUP BY 1, 2"
            )
        ]
        end_jobs = await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE kind = 'historian.end' AND status = 'done'"
        )
    ids = [r["id"] for r in stored]
    assert len(accepted) == CALLS
    # Every accepted call's event, exactly once (the failed jobs say why not).
    assert sorted(ids) == sorted(accepted), failures
    assert all(r["copies"] == 1 for r in stored)
    assert set(statuses) == {"done"}  # nothing stuck running, nothing failed
    assert end_jobs == CALLS  # (the periodic maintenance job may have run too)
    assert kills >= 3
    print(
        f"soak: {CALLS} end calls, {kills} worker kills, all {len(ids)} events written once;"
        f" queue drained {drain_seconds:.0f} s after the last call"
    )
