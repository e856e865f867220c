"""The read path end to end: ``/v1/context`` and ``/v1/events/search`` over a million events.

Seeds the data of ``event_search_scale.py`` (1,000,000 events of one tenant over 1,000 skewed
groups, five of 50,000 events, plus 100 small tenants; random unit vectors, texts varied over
places, activities and moods), gives the groups asked about what a real conversation has
(a group profile, member profiles, memories, a memo log), starts ``memoria serve`` on it with
the local embedder, and measures over HTTP, one request at a time:
  1. ``/v1/context`` for distinct messages (every query embedded), busiest and typical groups;
  2. the same messages again (query embeddings cached: the rest of the path alone);
  3. ``/v1/events/search`` for distinct queries in the busiest groups;
  4. the query embedding alone (the same model in this process, cache off): its share;
  5. ``/v1/context`` from 4 concurrent clients (throughput).

Run: python bench/context_latency.py [--events 1000000] [--queries 300] [--keep]
     (--data-dir DIR reuses a directory kept by --keep and skips the seeding)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import asyncpg
import event_search_scale as scale
import httpx
import numpy as np
from measure import free_port, percentiles, serve

from service.client import MemoriaClient
from service.db.embedded import embedded_url, stop_embedded
from service.db.engine import Database
from service.embedding.local import LocalEmbedder
from service.recall.schemas import ContextRequest
from service.recall.service import build_query
from service.settings import EmbeddingModelSettings

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "bench-admin"
NAMES = ("张伟", "王芳", "李娜", "刘洋", "陈静", "Alice", "Bob", "赵磊")
ENGLISH = (
    "did anyone go {place_en} last weekend?",
    "I want to try {activity_en} again, who is in?",
    "remind me what we said about {activity_en}",
)
PLACES_EN = ("to the lake", "to the cinema", "hiking", "to the gym", "to the bookstore")
ACTIVITIES_EN = ("rowing", "running", "hot pot", "guitar", "badminton", "baking")


def messages(count: int, rng: np.random.Generator) -> list[str]:
    """Distinct chat messages in the bot's frame, most Chinese, some short, some English."""
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < count:
        kind = rng.integers(10)
        if kind < 6:
            place = scale.PLACES[rng.integers(len(scale.PLACES))]
            activity = scale.ACTIVITIES[rng.integers(len(scale.ACTIVITIES))]
            text = f"上次有人说在{place}{activity}，后来怎么样了？"
        elif kind < 8:
            text = f"{scale.ACTIVITIES[rng.integers(len(scale.ACTIVITIES))]}吗"  # short
        else:
            template = ENGLISH[rng.integers(len(ENGLISH))]
            text = template.format(
                place_en=PLACES_EN[rng.integers(len(PLACES_EN))],
                activity_en=ACTIVITIES_EN[rng.integers(len(ACTIVITIES_EN))],
            )
        name = NAMES[rng.integers(len(NAMES))]
        framed = f"<message><sender>{name}</sender><content>{text}</content></message>"
        if framed not in seen:
            seen.add(framed)
            out.append(framed)
    return out


def profile(kind: str, entity: str, group: str | None, name: str, fact: str) -> str:
    """A profile document: YAML front matter and a Markdown body."""
    bound = f'group_id: "{group}"\n' if group else ""
    return (
        f'---\nentity_type: {kind}\nentity_id: "{entity}"\n{bound}name: "{name}"\n'
        f"tags: [户外]\nupdated_at: 2026-01-01T00:00:00+08:00\n---\n\n# {name}\n\n- {fact}\n"
    )


async def furnish(client: MemoriaClient, groups: list[str], rng: np.random.Generator) -> None:
    """What a lived-in conversation has besides events: profiles, memories, memos."""
    for key in groups:
        group = key[2:]
        await client.put_profile(
            "group", group, profile("group", group, None, f"群{group}", "喜欢周末一起出去玩")
        )
        for n in range(3):
            member = str(10000 + n)
            await client.put_profile(
                "member",
                member,
                profile("member", member, group, f"成员{member}", "常聊户外活动"),
                group_id=group,
            )
            await client.put_profile(
                "user", member, profile("user", member, None, f"用户{member}", "住在杭州")
            )
        for n in range(8):
            place = scale.PLACES[rng.integers(len(scale.PLACES))]
            activity = scale.ACTIVITIES[rng.integers(len(scale.ACTIVITIES))]
            await client.add_memory(
                scope="GROUP", group_id=group, content=f"群里约好每月去{place}{activity} #{n}"
            )
        for n in range(12):
            await client.end(
                request_type="group",
                group_id=group,
                sender_id="10000",
                memo=f"回答了关于第{n}次活动安排的问题",
            )


def load() -> str:
    """The machine's load as ``uptime`` prints it: wall times mean little without it."""
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


async def timed_calls(
    http: httpx.AsyncClient, path: str, bodies: list[dict[str, Any]]
) -> list[float]:
    samples = []
    for body in bodies:
        started = time.perf_counter()
        response = await http.post(path, json=body)
        samples.append(time.perf_counter() - started)
        if response.status_code != 200:
            raise RuntimeError(f"{path}: {response.status_code} {response.text}")
    return samples


def context_body(key: str, message: str, n: int) -> dict[str, Any]:
    return {
        "request_type": "group",
        "group_id": key[2:],
        "group_name": f"群{key[2:]}",
        "sender_id": str(10000 + n % 3),
        "sender_name": NAMES[n % len(NAMES)],
        "message": message,
    }


async def concurrent(
    http: httpx.AsyncClient, bodies: list[dict[str, Any]], clients: int
) -> tuple[float, list[float]]:
    queue = list(bodies)
    samples: list[float] = []

    async def one() -> None:
        while queue:
            body = queue.pop()
            started = time.perf_counter()
            response = await http.post("/v1/context", json=body)
            samples.append(time.perf_counter() - started)
            response.raise_for_status()

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return len(bodies) / (time.perf_counter() - started), samples


async def embedding_share(texts: list[str]) -> tuple[list[float], float]:
    """Wall times of embedding each text as a query, and the mean CPU time per query."""
    embedder = LocalEmbedder(EmbeddingModelSettings(query_cache_size=0))
    await embedder.query("warm up")
    samples = []
    cpu = time.process_time()
    for text in texts:
        started = time.perf_counter()
        await embedder.query(text)
        samples.append(time.perf_counter() - started)
    cpu = (time.process_time() - cpu) / max(len(texts), 1)
    await embedder.close()
    return samples, cpu


async def read_once(dsn: str, tenant: Any, groups: list[str]) -> float:
    """Read the asked groups' events once, rows, vectors and terms: a server that has been
    answering these groups holds them in memory. Without it the first requests read the
    table from disk, and how much of it the operating system still cached from the last run
    (other programs, other benchmarks) moved the busiest groups' p95 from 50 to 100 ms."""
    started = time.perf_counter()
    connection = await asyncpg.connect(dsn)
    try:
        for key in groups:
            where = "WHERE tenant_id = $1 AND conversation_key = $2"
            await connection.fetchval(
                "SELECT sum(length(text) + vector_dims(embedding) + length(lexical))"
                f" FROM events {where}",
                tenant,
                key,
            )
            await connection.fetchval(
                f"SELECT sum(l2_norm(embedding)) FROM event_vectors {where}", tenant, key
            )
    finally:
        await connection.close()
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser()
    scale.add_data_arguments(parser)
    parser.add_argument("--queries", type=int, default=300, help="requests per case")
    args = parser.parse_args()

    data_dir, reuse = scale.data_directory(args, "bench-context-")
    url = embedded_url(data_dir / "pg")
    dsn = url.replace("postgresql+asyncpg://", "postgresql://")
    db = Database(url, pool_size=1, max_overflow=0)
    rng = np.random.default_rng(args.seed + 2)
    server = None
    try:
        if reuse:
            layout = await scale.load_layout(dsn)
        else:
            await asyncio.to_thread(scale.migrate, url, scale.before_event_vectors(url))
            layout = await scale.seed(db, dsn, url, args)
        await db.dispose()
        scale.choose_groups(layout, rng)
        typical = layout.typical[:20]
        sizes = [layout.sizes[k] for k in typical]
        print(
            f"groups asked: 5 busiest ({layout.sizes[layout.busy[0]]:,} events each), "
            f"20 typical ({min(sizes)}-{max(sizes)} events)"
        )

        port = free_port()
        env = {
            **os.environ,
            "MEMORIA_DATABASE_URL": url,
            "MEMORIA_ADMIN_TOKEN": ADMIN,
            "MEMORIA_LOG_LEVEL": "WARNING",
        }
        server = serve(port, env)
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=60) as admin:
            for _ in range(600):
                try:
                    if (await admin.get("/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
            created = await admin.post(
                f"/admin/tenants/{layout.tenant}/keys",
                json={"name": "bench"},
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
            created.raise_for_status()
            key = created.json()["key"]
        groups = layout.busy + typical
        async with MemoriaClient(base, key) as client:
            started = time.perf_counter()
            await furnish(client, groups, rng)
            print(f"furnished {len(groups)} groups in {time.perf_counter() - started:.1f} s")
        print(f"read the asked groups once in {await read_once(dsn, layout.tenant, groups):.1f} s")

        texts = messages(args.queries * 3, rng)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:
            warm = [context_body(groups[n % len(groups)], f"热身 {n}", n) for n in range(30)]
            await timed_calls(http, "/v1/context", warm)
            busy = [context_body(layout.busy[n % 5], texts[n], n) for n in range(args.queries)]
            quiet = [
                context_body(typical[n % len(typical)], texts[args.queries + n], n)
                for n in range(args.queries)
            ]
            tail = [
                context_body(groups[n % len(groups)], texts[2 * args.queries + n], n)
                for n in range(args.queries)
            ]
            print(f"POST /v1/context, one client, distinct messages (each embedded; {load()}):")
            print(
                f"  busiest groups (50k events):  {percentiles(await timed_calls(http, '/v1/context', busy))}"
            )
            print(
                f"  typical groups:               {percentiles(await timed_calls(http, '/v1/context', quiet))}"
            )
            print(f"POST /v1/context, the same messages again (embeddings cached; {load()}):")
            print(
                f"  busiest groups (50k events):  {percentiles(await timed_calls(http, '/v1/context', busy))}"
            )
            print(
                f"  typical groups:               {percentiles(await timed_calls(http, '/v1/context', quiet))}"
            )
            searches = [
                {
                    "query": f"{scale.PLACES[n % 20]}{scale.ACTIVITIES[n % 24]}",
                    "context": {"request_type": "group", "group_id": layout.busy[n % 5][2:]},
                }
                for n in range(args.queries)
            ]
            print(f"POST /v1/events/search, busiest groups, top 12, distinct queries ({load()}):")
            print(f"  {percentiles(await timed_calls(http, '/v1/events/search', searches))}")
            rate, samples = await concurrent(http, tail, 4)
            print(
                f"POST /v1/context, 4 concurrent clients: {rate:,.0f} requests/s, {percentiles(samples)}"
            )

        # The embedder in this process, after the server is gone: the same model, an idle CPU.
        server.terminate()
        server.wait(timeout=30)
        server = None
        alone, cpu = await embedding_share([build_query(ContextRequest(**b)) for b in busy])
        print(f"query embedding alone (local model, cache off; {load()}): {percentiles(alone)}")
        print(f"  mean {statistics.fmean(alone) * 1000:.2f} ms, CPU {cpu * 1000:.2f} ms per query")
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        await db.dispose()
        stop_embedded()
        if args.keep or reuse:
            print(f"data kept in {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
