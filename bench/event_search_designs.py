"""The designs weighed for exact filtered event search, measured side by side.

Works on a data directory seeded and kept by ``event_search_scale.py --keep`` and compares,
for the busiest groups (and typical ones where it matters), the SQL alone:
  A. the events table's own B-tree, full-precision vectors read from the heap (the old way);
  B. a covering B-tree carrying full-precision vectors (index-only scan, exact as is);
  C. the covering B-tree of half-precision unit vectors (event_vectors), cosine vs inner
     product, and the whole of nearest_events on it (exact re-score of the best);
  D. a binary-quantized pre-scan (hamming distance) with an exact re-score of the best R;
  E. an HNSW index on one busy group only (partial), recall against ef_search;
  F. parallel workers for the half-precision scan.
Side tables for B and D hold only the busiest groups and 100 typical ones (their per-group
latency does not depend on the rest); their build rate is extrapolated to all rows.

Run: python bench/event_search_designs.py --data-dir data/bench-events-XXXX [--queries 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
from measure import percentiles
from pgvector import Vector
from sqlalchemy import text

from service.db.embedded import embedded_url, stop_embedded
from service.db.engine import Database
from service.events.repository import nearest_events

DIM = 384
ROOT = Path(__file__).resolve().parents[1]


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    vectors = rng.standard_normal((n, DIM), dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


async def connect(dsn: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(dsn)
    await conn.set_type_codec(
        "vector",
        schema="public",
        encoder=lambda v: Vector(v).to_binary(),
        decoder=Vector.from_binary,
        format="binary",
    )
    return conn


class Truth:
    """Brute force over one group's full-precision vectors."""

    def __init__(self, rows: list[asyncpg.Record]) -> None:
        self.ids = [r["id"] for r in rows]
        matrix = np.stack([r["embedding"].to_numpy() for r in rows]).astype(np.float64)
        self.matrix = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)

    def top(self, query: np.ndarray, k: int = 10) -> list[str]:
        order = np.argsort(-(self.matrix @ query.astype(np.float64)))[:k]
        return [self.ids[i] for i in order]


# Server processes whose CPU time is counted (the machine may be busy with other work).
BACKENDS: list[int] = []


def cpu_seconds() -> float:
    total = 0
    for pid in BACKENDS:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def run(
    label: str,
    queries: np.ndarray,
    groups: list[str],
    search: Callable[[str, np.ndarray], Awaitable[list[str]]],
    truths: dict[str, Truth] | None = None,
) -> None:
    for query in queries[:5]:  # warm up
        await search(groups[0], query)
    samples, shares = [], []
    cpu = cpu_seconds()
    for i, query in enumerate(queries):
        group = groups[i % len(groups)]
        started = time.perf_counter()
        ids = await search(group, query)
        samples.append(time.perf_counter() - started)
        if truths is not None:
            truth = truths[group].top(query)
            shares.append(len(set(ids[:10]) & set(truth)) / 10)
    cpu = (cpu_seconds() - cpu) / len(queries) * 1000
    recall = f"  recall@10 {np.mean(shares):.3f}" if shares else ""
    print(f"  {label:48} {percentiles(samples)}  CPU {cpu:6.2f} ms{recall}")


async def timed_sql(conn: asyncpg.Connection, sql: str) -> float:
    started = time.perf_counter()
    await conn.execute(sql)
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--shared-buffers", default="4GB", help="'' keeps the server's own")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    pg = args.data_dir.resolve() / "pg"
    if args.shared_buffers:  # applies at the next start
        conn = await asyncpg.connect(embedded_url(pg).replace("+asyncpg", ""))
        await conn.execute(f"ALTER SYSTEM SET shared_buffers = '{args.shared_buffers}'")
        await conn.close()
        stop_embedded()
    url = embedded_url(pg)
    dsn = url.replace("postgresql+asyncpg://", "postgresql://")
    rng = np.random.default_rng(args.seed)
    conn = await connect(dsn)
    try:
        print(f"shared_buffers {await conn.fetchval('SHOW shared_buffers')}")
        await compare(conn, url, args.queries, rng)
    finally:
        await conn.execute("DROP TABLE IF EXISTS design_full, design_bits")
        await conn.execute("DROP INDEX IF EXISTS design_hnsw")
        await conn.execute("ALTER SYSTEM RESET shared_buffers")
        await conn.close()
        stop_embedded()


async def compare(
    conn: asyncpg.Connection, url: str, queries: int, rng: np.random.Generator
) -> None:
    counts = await conn.fetch(
        "SELECT tenant_id, conversation_key, count(*) AS n FROM event_vectors"
        " GROUP BY 1, 2 ORDER BY n DESC"
    )
    tenant: uuid.UUID = counts[0]["tenant_id"]
    BACKENDS.append(await conn.fetchval("SELECT pg_backend_pid()"))
    mine = [r for r in counts if r["tenant_id"] == tenant]
    busy = [r["conversation_key"] for r in mine[:5]]
    middle = mine[len(mine) // 4 : 3 * len(mine) // 4]
    typical = [r["conversation_key"] for r in middle[:: max(1, len(middle) // 100)]][:100]
    sizes = {r["conversation_key"]: r["n"] for r in mine}
    total = sum(r["n"] for r in counts)
    print(
        f"load {os.getloadavg()[0]:.1f}; {total:,} event vectors; busiest groups "
        f"{sizes[busy[0]]:,} events; typical "
        f"{min(sizes[k] for k in typical)}-{max(sizes[k] for k in typical)}"
    )
    truths = {
        key: Truth(
            await conn.fetch(
                "SELECT id, embedding FROM events WHERE tenant_id = $1 AND conversation_key = $2",
                tenant,
                key,
            )
        )
        for key in busy
    }
    qs = unit_vectors(rng, queries)

    async def fetch_ids(sql: str, group: str, query: Any, *extra: Any) -> list[str]:
        return [r[0] for r in await conn.fetch(sql, tenant, group, query, *extra)]

    print("A. events B-tree, full vectors from the heap (exact):")
    sql_a = """SELECT id FROM events WHERE tenant_id = $1 AND conversation_key = $2
               ORDER BY embedding <=> $3 LIMIT 10"""
    await run(
        "busiest groups", qs[: max(20, queries // 5)], busy, lambda g, q: fetch_ids(sql_a, g, q)
    )
    await run("typical groups", qs, typical, lambda g, q: fetch_ids(sql_a, g, q))

    picked = busy + typical
    subset = sum(sizes[k] for k in picked)
    print(f"B. covering B-tree with full-precision vectors ({subset:,} rows copied):")
    await conn.execute(
        """CREATE TABLE design_full AS SELECT tenant_id, conversation_key, occurred_at,
           id AS event_id, embedding FROM events
           WHERE tenant_id = $1 AND conversation_key = ANY($2::text[])""".replace(
            "$1", f"'{tenant}'"
        ).replace("$2::text[]", "ARRAY[" + ",".join(f"'{k}'" for k in picked) + "]")
    )
    build = await timed_sql(
        conn,
        "CREATE INDEX design_full_scan ON design_full (tenant_id, conversation_key, occurred_at)"
        " INCLUDE (event_id, embedding)",
    )
    await conn.execute("VACUUM (ANALYZE) design_full")
    size = await conn.fetchval("SELECT pg_relation_size('design_full_scan')")
    print(
        f"  index build {build:.1f} s, {size / subset:.0f} bytes/row"
        f" → for {total:,} rows ≈ {build * total / subset:.0f} s, {size * total / subset / 2**30:.2f} GiB"
    )
    sql_b = """SELECT event_id FROM design_full WHERE tenant_id = $1 AND conversation_key = $2
               ORDER BY embedding <=> $3 LIMIT 10"""
    await run("busiest groups, cosine", qs, busy, lambda g, q: fetch_ids(sql_b, g, q), truths)
    await run("typical groups, cosine", qs, typical, lambda g, q: fetch_ids(sql_b, g, q))

    print("C. covering B-tree of half-precision unit vectors (event_vectors):")
    size = await conn.fetchval("SELECT pg_relation_size('ix_event_vectors_scan')")
    print(f"  {size / total:.0f} bytes/row in the index")
    for op in ("<=>", "<#>"):
        sql_c = f"""SELECT event_id FROM event_vectors WHERE tenant_id = $1
                    AND conversation_key = $2
                    ORDER BY embedding {op} (SELECT CAST($3::vector AS halfvec)) LIMIT 10"""
        await run(
            f"busiest groups, halfvec {op} alone (no re-score)",
            qs,
            busy,
            lambda g, q, s=sql_c: fetch_ids(s, g, q),
            truths,
        )
    db = Database(url, pool_size=1, max_overflow=0)
    async with db.system() as session:
        BACKENDS.append((await session.execute(text("SELECT pg_backend_pid()"))).scalar_one())

    async def chosen(group: str, query: np.ndarray, limit: int = 10) -> list[str]:
        async with db.tenant(tenant) as session:
            rows = await nearest_events(session, tenant, [group], query, limit)
        return [r["id"] for r in rows]

    await run("busiest groups, nearest_events (exact), limit 10", qs, busy, chosen, truths)
    await run(
        "busiest groups, nearest_events (exact), limit 36",
        qs,
        busy,
        lambda g, q: chosen(g, q, 36),
        truths,
    )
    await run("typical groups, nearest_events (exact), limit 10", qs, typical, chosen)

    print("D. binary quantization (hamming pre-scan) + exact re-score of the best R:")
    await conn.execute(
        f"""CREATE TABLE design_bits AS SELECT tenant_id, conversation_key, occurred_at,
            event_id, binary_quantize(embedding)::bit({DIM}) AS bits FROM event_vectors
            WHERE tenant_id = '{tenant}' AND conversation_key = ANY(ARRAY[
            {",".join(f"'{k}'" for k in picked)}])"""
    )
    build = await timed_sql(
        conn,
        "CREATE INDEX design_bits_scan ON design_bits (tenant_id, conversation_key, occurred_at)"
        " INCLUDE (event_id, bits)",
    )
    await conn.execute("VACUUM (ANALYZE) design_bits")
    print(f"  index build {build:.1f} s for {subset:,} rows")
    for pool in (34, 100, 400, 1000, 3000):
        sql_d = f"""WITH c AS MATERIALIZED (
                        SELECT event_id FROM design_bits WHERE tenant_id = $1
                        AND conversation_key = $2
                        ORDER BY bits <~> (SELECT binary_quantize($3::vector)::bit({DIM}))
                        LIMIT {pool})
                    SELECT e.id FROM c JOIN events e ON e.tenant_id = $1 AND e.id = c.event_id
                    ORDER BY e.embedding <=> $3 LIMIT 10"""
        await run(
            f"busiest groups, R = {pool}",
            qs,
            busy,
            lambda g, q, s=sql_d: fetch_ids(s, g, q),
            truths,
        )

    print(f"E. HNSW (halfvec, inner product) on one busy group only ({sizes[busy[0]]:,} rows):")
    build = await timed_sql(
        conn,
        f"""CREATE INDEX design_hnsw ON event_vectors USING hnsw (embedding halfvec_ip_ops)
            WITH (m = 16, ef_construction = 64)
            WHERE tenant_id = '{tenant}' AND conversation_key = '{busy[0]}'""",
    )
    print(f"  build {build:.1f} s (m 16, ef_construction 64)")
    # A partial index is only used when the planner can prove its predicate: the tenant and
    # group must be constants in the statement (a prepared statement's generic plan won't do).
    sql_e = f"""WITH c AS MATERIALIZED (
                    SELECT event_id FROM event_vectors
                    WHERE tenant_id = '{tenant}' AND conversation_key = '{busy[0]}'
                    ORDER BY embedding <#> CAST($1::vector AS halfvec) LIMIT 34)
                SELECT e.id FROM c JOIN events e ON e.tenant_id = '{tenant}' AND e.id = c.event_id
                ORDER BY e.embedding <=> $1 LIMIT 10"""

    async def hnsw(group: str, query: np.ndarray) -> list[str]:
        return [r[0] for r in await conn.fetch(sql_e, query)]

    for ef in (40, 100, 200, 400, 1000):
        await conn.execute(f"SET hnsw.ef_search = {ef}")
        if ef == 40:
            plan = await conn.fetch("EXPLAIN " + sql_e, qs[0])
            assert any("design_hnsw" in r[0] for r in plan), "the HNSW index is not used"
        await run(
            f"ef_search {ef}, best 34 re-scored",
            qs,
            busy[:1],
            hnsw,
            truths,
        )
    await conn.execute("DROP INDEX design_hnsw")

    print("F. parallel workers for the half-precision scan (2 cores):")
    sql_f = """SELECT event_id FROM event_vectors WHERE tenant_id = $1 AND conversation_key = $2
               ORDER BY embedding <#> (SELECT CAST($3::vector AS halfvec)) LIMIT 34"""
    for workers in (0, 2):
        await conn.execute(
            f"SET max_parallel_workers_per_gather = {workers};"
            " SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;"
            " SET min_parallel_index_scan_size = 0"
        )
        await run(
            f"busiest groups, {workers} workers", qs, busy, lambda g, q: fetch_ids(sql_f, g, q)
        )
    await db.dispose()


if __name__ == "__main__":
    asyncio.run(main())
