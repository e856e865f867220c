"""On a Citus cluster: tenants' rows live in shards on the workers, row-level security holds
there, and a request for one tenant is answered by one node (router queries).

Runs only when ``TEST_DATABASE_URL`` points at a Citus coordinator, e.g. the local cluster of
``deploy/citus/cluster.py``; skipped on a plain PostgreSQL.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from service.app import create_app
from service.db.engine import Database
from service.events.repository import _first_pass
from tests.conftest import (
    ADMIN_TOKEN,
    FAST_QUEUE,
    AppClient,
    DatabaseFactory,
    TenantHandle,
    _citus_template,
    database_url,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    until_finished,
)
from tests.test_cli import clean_env, free_port, memoria

GROUP = {
    "request_type": "group",
    "group_id": "g1",
    "group_name": "Python 群",
    "sender_id": "10001",
    "sender_name": "张三",
    "timezone": "Asia/Shanghai",
}


@pytest.fixture
def cluster(databases: DatabaseFactory) -> DatabaseFactory:
    if not databases.citus:
        pytest.skip("needs TEST_DATABASE_URL at a Citus coordinator (deploy/citus/cluster.py)")
    return databases


def chat(tenant: int, n: int) -> dict[str, Any]:
    return {
        **GROUP,
        "messages": [
            {
                "message_id": f"t{tenant}m{i}",
                "sender_id": "10001",
                "sender_name": "张三",
                "text": f"第 {i} 条消息，来自租户 {tenant}",
                "sent_at": f"2026-03-01T10:{i:02d}:00",
            }
            for i in range(n)
        ],
    }


async def fetch(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    async with raw_connection(url) as conn:
        return list(await conn.fetch(sql, *args))


async def test_tenants_rows_live_in_their_shards_on_both_workers(
    cluster: DatabaseFactory, db_url: str
) -> None:
    database = make_url(db_url).database or ""
    worker_ports = {make_url(w).port for w in cluster.workers}
    placed: dict[int, list[tuple[str, int]]] = {}  # worker port -> (tenant, messages written)
    settings = make_settings(db_url)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        # Tenants are hashed to shards: add tenants until both workers hold some (8 shards
        # over 2 workers: a handful of tenants almost always suffices; 24 bounds the loop).
        for n in range(24):
            tenant = await new_tenant(client, name=f"tenant-{n}")
            count = 3 + n % 4
            response = await client.post(
                "/v1/messages", json=chat(n, count), headers=tenant.headers
            )
            assert response.status_code == 202, response.text
            (shard,) = await fetch(
                db_url,
                "SELECT s.shardid, s.nodeport FROM citus_shards s WHERE s.shardid ="
                " get_shard_id_for_distribution_column('messages', $1::uuid)",
                tenant.id,
            )
            placed.setdefault(shard["nodeport"], []).append((tenant.id, count))
            if n >= 3 and worker_ports <= placed.keys():
                break
    # Distributed shards are on the workers only; the coordinator keeps metadata.
    assert set(placed) == worker_ports

    for worker in cluster.workers:
        port = make_url(worker).port
        shards = await fetch(
            db_url,
            "SELECT shardid FROM citus_shards WHERE table_name = 'messages'::regclass"
            " AND nodeport = $1",
            port,
        )
        union = " UNION ALL ".join(
            f"SELECT tenant_id, count(*) AS n FROM messages_{s['shardid']} GROUP BY tenant_id"
            for s in shards
        )
        # Straight from the worker's own tables, not through the coordinator.
        found = {
            str(r["tenant_id"]): r["n"] for r in await fetch(database_url(worker, database), union)
        }
        assert found == dict(placed[port])


async def test_row_level_security_holds_on_the_workers(
    cluster: DatabaseFactory, db_url: str
) -> None:
    settings = make_settings(db_url)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        tenants = [await new_tenant(client, name=f"t{i}") for i in range(4)]
        for i, tenant in enumerate(tenants):
            response = await client.post(
                "/v1/messages", json=chat(i, i + 2), headers=tenant.headers
            )
            assert response.status_code == 202, response.text
    db = Database(db_url, pool_size=2)
    try:
        for i, tenant in enumerate(tenants):
            tenant_id = uuid.UUID(tenant.id)
            # No tenant filter: a multi-shard query on every worker; only RLS confines it.
            everything = text("SELECT tenant_id, count(*) AS n FROM messages GROUP BY tenant_id")
            async with db.tenant(tenant_id) as session:
                rows = (await session.execute(everything)).all()
            assert [(r.tenant_id, r.n) for r in rows] == [(tenant_id, i + 2)]
            async with db.tenant_connection(tenant_id) as conn:
                raw = await conn.fetch(everything.text)
            assert [(r["tenant_id"], r["n"]) for r in raw] == [(tenant_id, i + 2)]
    finally:
        await db.dispose()


async def counters(db_url: str) -> tuple[int, int]:
    (row,) = await fetch(
        db_url,
        "SELECT query_execution_single_shard AS single, query_execution_multi_shard AS multi"
        " FROM citus_stat_counters WHERE name = current_database()",
    )
    return int(row["single"]), int(row["multi"])


@pytest.fixture
async def served(
    cluster: DatabaseFactory, db_url: str
) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    database = make_url(db_url).database
    # Counted per query by Citus; the app's connections are opened after this.
    await fetch(db_url, f'ALTER DATABASE "{database}" SET citus.enable_stat_counters = on')
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client)


async def test_one_tenants_requests_are_router_queries(
    served: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = served
    for request_id, observation in (("a", "我在学 asyncio 和数据库连接池"), ("b", "我喜欢喝咖啡")):
        response = await client.post(
            "/v1/end",
            json={**GROUP, "request_id": request_id, "memo": "聊了", "observations": [observation]},
            headers=tenant.headers,
        )
        assert response.status_code == 202, response.text
        job = await until_finished(client, tenant, response.json()["job_id"])
        assert job["status"] == "done", job
    response = await client.post("/v1/messages", json=chat(0, 5), headers=tenant.headers)
    assert response.status_code == 202, response.text

    # The per-turn context, the event and message searches, the end hand-over and its job, of one
    # tenant: every statement Citus executes for them touches one shard.
    before = await counters(db_url)
    ask = {**GROUP, "message": "<message><content>asyncio 连接池怎么配置？</content></message>"}
    context = await client.post("/v1/context", json=ask, headers=tenant.headers)
    assert context.status_code == 200, context.text
    assert context.json()["events"], "the context found no event: nothing was routed"
    events = await client.post(
        "/v1/events/search",
        json={
            "query": "asyncio",
            "context": {"request_type": "group", "group_id": "g1", "sender_id": "10001"},
        },
        headers=tenant.headers,
    )
    assert events.status_code == 200, events.text
    messages = await client.post(
        "/v1/messages/search", json={"group_id": "g1", "query": "消息"}, headers=tenant.headers
    )
    assert messages.status_code == 200, messages.text
    end = await client.post(
        "/v1/end",
        json={**GROUP, "request_id": "c", "memo": "又聊了", "observations": ["明天交周报"]},
        headers=tenant.headers,
    )
    assert end.status_code == 202, end.text
    # And the historian's work on it: its event (a batch of one tenant's rows), profiles, memories.
    job = await until_finished(client, tenant, end.json()["job_id"])
    assert job["status"] == "done", job
    after = await counters(db_url)
    assert after[0] > before[0]  # Citus did execute them, one shard each
    assert after[1] == before[1], "a single tenant's request ran a multi-shard query"


async def test_explain_shows_the_event_search_is_routed_to_one_shard(
    served: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    _, tenant = served
    db = Database(db_url, pool_size=2)
    try:
        params = {
            "tenant_id": uuid.UUID(tenant.id),
            "conversation_keys": ["group:g1"],
            "query": np.ones(384, dtype=np.float32) / np.sqrt(384),
            "limit": 5,
            "pool": 29,
            "sample": 1000,
        }
        async with db.tenant(uuid.UUID(tenant.id)) as session:
            plan = "\n".join(
                r[0]
                for r in await session.execute(
                    text("EXPLAIN " + _first_pass(False, False, False).text), params
                )
            )
    finally:
        await db.dispose()
    task_counts = [line.split(":")[1].strip() for line in plan.splitlines() if "Task Count" in line]
    assert task_counts, plan
    assert set(task_counts) == {"1"}, plan


def _serve(url: str, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--port", str(port)],
        env=clean_env(MEMORIA_DATABASE_URL=url, MEMORIA_ADMIN_TOKEN=ADMIN_TOKEN),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _until_ready(port: int, proc: subprocess.Popen[bytes], limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            stderr = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"serve exited with {proc.returncode}:\n{stderr[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("serve never became ready")


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


async def test_the_readmes_procedure_survives_migrating_again_and_restarting_serve(
    cluster: DatabaseFactory,
) -> None:
    # The README's steps on a database of its own: Citus and pgvector on every node, the
    # coordinator in the metadata (so the reference tables have a placement, a shard relation,
    # on the coordinator too), the workers added; then `memoria migrate`, `memoria serve`.
    name = f"memoria_r_{uuid.uuid4().hex[:12]}"
    try:
        await _citus_template(cluster.server_url, cluster.workers, name)
        url = database_url(cluster.server_url, name)
        env = clean_env(MEMORIA_DATABASE_URL=url)
        for attempt in range(2):
            migrated = await asyncio.to_thread(memoria, "migrate", env=env, timeout=300)
            assert migrated.returncode == 0, (attempt, migrated.stderr[-3000:])
        on_coordinator = await fetch(
            url,
            "SELECT count(*) AS n FROM citus_shards WHERE citus_table_type = 'reference'"
            " AND nodeport = $1",
            make_url(cluster.server_url).port,
        )
        assert on_coordinator[0]["n"] > 0, "the coordinator holds no placement: nothing to trip on"

        port = free_port()
        name_of_tenant = f"t-{uuid.uuid4().hex[:8]}"
        key = ""
        for start in range(2):
            proc = _serve(url, port)
            try:
                await asyncio.to_thread(_until_ready, port, proc)
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                    if start == 0:
                        created = await client.post(
                            "/admin/tenants",
                            json={"name": name_of_tenant},
                            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                        )
                        assert created.status_code == 201, created.text
                        key = created.json()["api_key"]["key"]
                    me = await client.get("/v1/tenant", headers={"Authorization": f"Bearer {key}"})
                    assert me.status_code == 200, me.text
                    assert me.json()["name"] == name_of_tenant
            finally:
                code = await asyncio.to_thread(_stop, proc)
            assert code == 0, f"serve start {start} stopped with {code}"
    finally:
        await cluster.drop(name)
