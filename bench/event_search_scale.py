"""Exact event search at scale: ``nearest_events`` over a million events.

Seeds an embedded PostgreSQL in a temporary directory under ./data with synthetic events of
one tenant over skewed groups (five of 50,000 events, the rest a few hundred to a few
thousand; random unit vectors, written with binary COPY in chunks) plus 100 small tenants,
then applies the event-vector migration over them as an upgrade would (the copy into
event_vectors and the covering index build), and measures:
  1. nearest_events latency p50/p95/p99 at limit 10 and 36: busiest groups, typical groups,
     two conversations at once, and a time range;
  2. recall@10 against a brute-force numpy top-10 of the same filtered events;
  3. the cost of events written since the last vacuum (their heap pages are visited).

Run: python bench/event_search_scale.py [--events 1000000] [--queries 200] [--keep]
     (--data-dir DIR reuses a directory kept by --keep and skips the seeding)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
from alembic import command
from alembic.script import ScriptDirectory
from measure import percentiles
from pgvector import Vector
from sqlalchemy import text

from service.db.embedded import embedded_url, stop_embedded
from service.db.engine import Database
from service.db.migrate import alembic_config
from service.events.repository import nearest_events, upsert_events
from service.settings import Settings
from service.tenants.service import create_tenant

ROOT = Path(__file__).resolve().parents[1]
DIM = 384
START = datetime(2025, 1, 1, tzinfo=UTC)
SPAN = timedelta(days=365)
CHUNK = 20_000
COLUMNS = (
    "tenant_id", "id", "conversation_key", "request_type", "group_id", "user_id", "sender_id",
    "request_id", "end_seq", "kind", "perspective", "text", "source_text", "is_absolute",
    "warnings", "occurred_at", "timezone", "location_abs", "message_ids", "metadata",
    "embedding", "job_id",
)  # fmt: skip


# Event texts vary like a chat's: a place, an activity and a mood each shared by a fraction of
# a group's events, so that a query word matches some events of a group, not all of them.
PLACES = (
    "杭州西湖", "上海外滩", "北京故宫", "成都宽窄巷子", "公司楼下的咖啡馆", "学校图书馆",
    "家附近的公园", "深圳湾", "南京夫子庙", "西安城墙", "武汉东湖", "广州塔", "超市",
    "健身房", "电影院", "火锅店", "海边", "山里", "医院", "机场",
)  # fmt: skip
ACTIVITIES = (
    "划船", "拍照", "跑步", "吃火锅", "看电影", "写代码", "读小说", "遛狗", "买菜", "开会",
    "弹吉他", "打羽毛球", "学日语", "做蛋糕", "钓鱼", "爬山", "逛书店", "打游戏", "喝奶茶",
    "修自行车", "面试", "搬家", "看展览", "练瑜伽",
)  # fmt: skip
MOODS = (
    "心情很好",
    "有点累",
    "说下次还要去",
    "拍了很多照片",
    "和朋友一起",
    "遇到了老同学",
    "迟到了",
)


def unit_vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    vectors = rng.standard_normal((n, DIM), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


@dataclass
class Layout:
    """Who has which conversations of which size."""

    tenant: uuid.UUID
    sizes: dict[str, int]
    busy: list[str]
    typical: list[str]
    others: dict[uuid.UUID, list[str]] = field(default_factory=dict)


def group_sizes(events: int, groups: int, busy: int, rng: np.random.Generator) -> np.ndarray:
    """Five busy groups of 50,000 events (fewer on a small run); the rest log-normal."""
    busy_size = min(50_000, events // 20)
    rest = events - busy * busy_size
    weights = rng.lognormal(0.0, 0.6, groups - busy)
    share = weights / weights.sum() * rest
    sizes = np.floor(share).astype(np.int64)
    sizes[np.argsort(sizes - share)[: rest - int(sizes.sum())]] += 1  # largest remainders
    return np.concatenate([np.full(busy, busy_size, dtype=np.int64), sizes])


def vector_bytes(vectors: np.ndarray) -> list[bytes]:
    """pgvector's binary form (dimension, unused, big-endian float32s), a chunk at a time."""
    head = np.array([DIM, 0], dtype=">u2").tobytes()
    return [head + row.tobytes() for row in vectors.astype(">f4")]


def records(
    tenant: uuid.UUID,
    keys: list[str],
    group_of: np.ndarray,
    seconds: np.ndarray,
    first: int,
    rng: np.random.Generator,
) -> Iterator[tuple[Any, ...]]:
    """Event rows shaped like the historian's (same metadata keys, short Chinese texts)."""
    for offset, (group, vector) in enumerate(
        zip(group_of, vector_bytes(unit_vectors(rng, len(group_of))), strict=True)
    ):
        n = first + offset
        key = keys[group]
        at = START + timedelta(seconds=float(seconds[offset]))
        sender = str(10000 + n % 997)
        words = (
            f"{at:%Y-%m-%d} 成员{sender}在{PLACES[n % len(PLACES)]}"
            f"{ACTIVITIES[(n // len(PLACES)) % len(ACTIVITIES)]}，{MOODS[n % len(MOODS)]}"
        )
        meta = {
            "tenant_id": str(tenant), "request_id": f"r{n}", "end_seq": 1,
            "timestamp_utc": at.isoformat(), "timestamp_local": at.isoformat(),
            "timestamp_epoch": int(at.timestamp()), "timezone": "Asia/Shanghai",
            "location_abs": None, "request_type": "group", "user_id": None,
            "group_id": key[2:], "sender_id": sender, "message_ids": [f"m{n}"],
            "perspective": "group", "is_absolute": True, "has_new_info": True,
            "schema_version": 1,
        }  # fmt: skip
        yield (
            tenant, f"r{n}:1", key, "group", key[2:], None, sender, f"r{n}", 1, "observation",
            "group", words, words, True, "[]", at, "Asia/Shanghai", None, f'["m{n}"]',
            json.dumps(meta, ensure_ascii=False), vector, None,
        )  # fmt: skip


async def copy_events(
    conn: asyncpg.Connection,
    tenant: uuid.UUID,
    sizes: dict[str, int],
    first: int,
    rng: np.random.Generator,
) -> int:
    """COPY one tenant's events in time order (as they would arrive), a chunk at a time."""
    keys = list(sizes)
    group_of = np.repeat(np.arange(len(keys), dtype=np.int32), list(sizes.values()))
    seconds = rng.uniform(0, SPAN.total_seconds(), len(group_of))
    order = np.argsort(seconds)
    group_of, seconds = group_of[order], seconds[order]
    for start in range(0, len(group_of), CHUNK):
        stop = start + CHUNK
        rows = records(tenant, keys, group_of[start:stop], seconds[start:stop], first + start, rng)
        await conn.copy_records_to_table("events", records=rows, columns=COLUMNS)
    return first + len(group_of)


def migrate(url: str, target: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        command.upgrade(alembic_config(url, Settings()), target)


def before_event_vectors(url: str) -> str:
    script = ScriptDirectory.from_config(alembic_config(url, Settings()))
    down = script.get_revision("0006").down_revision
    assert isinstance(down, str)
    return down


async def seed(db: Database, dsn: str, url: str, args: argparse.Namespace) -> Layout:
    rng = np.random.default_rng(args.seed)
    async with db.system() as session:
        tenant = (await create_tenant(session, "busy-bots", {}, Settings()))[0].id
        others = [
            (await create_tenant(session, f"small-{i}", {}, Settings()))[0].id
            for i in range(args.tenants)
        ]
    sizes = group_sizes(args.events, args.groups, 5, rng)
    layout = Layout(tenant, {f"g:{100000 + i}": int(s) for i, s in enumerate(sizes)}, [], [])
    conn = await asyncpg.connect(dsn)
    await conn.set_type_codec(
        "vector", schema="public", encoder=bytes, decoder=Vector.from_binary, format="binary"
    )
    started = time.perf_counter()
    n = await copy_events(conn, tenant, layout.sizes, 0, rng)
    per_tenant = max(30, args.events // 2000)
    for other in others:
        keys = {f"g:{900000 + i}": per_tenant // 3 for i in range(3)}
        layout.others[other] = list(keys)
        n = await copy_events(conn, other, keys, n, rng)
    seconds = time.perf_counter() - started
    await conn.close()
    print(f"seeding: {n:,} events by binary COPY in {seconds:.1f} s ({n / seconds:,.0f} rows/s)")

    started = time.perf_counter()
    await asyncio.to_thread(migrate, url, "0006")
    print(
        f"migration 0006 (copy into event_vectors + covering index build): "
        f"{time.perf_counter() - started:.1f} s"
    )
    await asyncio.to_thread(migrate, url, "head")  # any later migrations, untimed
    conn = await asyncpg.connect(dsn)
    started = time.perf_counter()
    await conn.execute("VACUUM (ANALYZE) event_vectors")
    vacuum = time.perf_counter() - started
    await conn.execute("VACUUM (ANALYZE) events")
    started = time.perf_counter()
    await conn.execute("REINDEX INDEX ix_event_vectors_scan")
    print(
        f"covering index build alone (REINDEX): {time.perf_counter() - started:.1f} s; "
        f"VACUUM (ANALYZE) event_vectors: {vacuum:.1f} s"
    )
    await conn.close()
    return layout


async def load_layout(dsn: str) -> Layout:
    conn = await asyncpg.connect(dsn)
    rows = await conn.fetch(
        "SELECT tenant_id, conversation_key, count(*) AS n FROM event_vectors"
        " GROUP BY 1, 2 ORDER BY 1, 2"
    )
    await conn.close()
    per_tenant: dict[uuid.UUID, dict[str, int]] = {}
    for row in rows:
        per_tenant.setdefault(row["tenant_id"], {})[row["conversation_key"]] = row["n"]
    tenant = max(per_tenant, key=lambda t: sum(per_tenant[t].values()))
    layout = Layout(tenant, per_tenant.pop(tenant), [], [])
    layout.others = {t: list(sizes) for t, sizes in per_tenant.items()}
    return layout


def choose_groups(layout: Layout, rng: np.random.Generator) -> None:
    ordered = sorted(layout.sizes, key=lambda k: -layout.sizes[k])
    layout.busy = ordered[:5]
    middle = ordered[len(ordered) // 4 : 3 * len(ordered) // 4]  # the middle half by size
    layout.typical = list(rng.choice(middle, size=min(200, len(middle)), replace=False))


async def sizes_report(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    rows = await conn.fetch(
        """
        SELECT c.relname, pg_size_pretty(pg_relation_size(c.oid)) AS own,
               pg_size_pretty(pg_total_relation_size(c.oid)) AS total
        FROM pg_class c WHERE c.relname IN ('events', 'event_vectors')
        UNION ALL
        SELECT i.relname, pg_size_pretty(pg_relation_size(i.oid)), ''
        FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
        JOIN pg_class t ON t.oid = x.indrelid WHERE t.relname IN ('events', 'event_vectors')
        ORDER BY 1
        """
    )
    await conn.close()
    for row in rows:
        total = f" (with TOAST and indexes {row['total']})" if row["total"] else ""
        print(f"  {row['relname']:32} {row['own']:>9}{total}")


class Recording:
    """A session that keeps its statements (two mean the exactness proof took a second pass)."""

    def __init__(self, session: Any) -> None:
        self.session, self.statements = session, []

    async def execute(self, statement: Any, params: Any = None) -> Any:
        self.statements.append((statement, params))
        return await self.session.execute(statement, params)


@dataclass
class Search:
    keys: list[str]
    window: dict[str, datetime] = field(default_factory=dict)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a server process (other load on the machine does not count)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Timing:
    samples: list[float]
    second_passes: int
    cpu_per_query: float


async def timed(
    db: Database, tenant: uuid.UUID, searches: list[Search], limit: int, rng: np.random.Generator
) -> Timing:
    samples, second_passes = [], 0
    async with db.system() as session:  # the pool holds one connection: this is its server
        pid = (await session.execute(text("SELECT pg_backend_pid()"))).scalar_one()
    cpu = cpu_seconds(pid)
    for search, query in zip(searches, unit_vectors(rng, len(searches)), strict=True):
        async with db.tenant(tenant) as session:
            recording = Recording(session)
            started = time.perf_counter()
            await nearest_events(recording, tenant, search.keys, query, limit, **search.window)  # type: ignore[arg-type]
            samples.append(time.perf_counter() - started)
            second_passes += len(recording.statements) > 1
    return Timing(samples, second_passes, (cpu_seconds(pid) - cpu) / len(searches))


def last_days(days: int) -> dict[str, datetime]:
    return {"time_from": START + SPAN - timedelta(days=days), "time_to": START + SPAN}


async def latencies(db: Database, layout: Layout, queries: int, rng: np.random.Generator) -> None:
    tenant, busy, typical = layout.tenant, layout.busy, layout.typical
    cases = {
        f"busiest groups ({layout.sizes[busy[0]]:,} events)": [
            Search([busy[i % len(busy)]]) for i in range(queries)
        ],
        f"typical groups ({min(layout.sizes[k] for k in typical)}-"
        f"{max(layout.sizes[k] for k in typical)} events)": [
            Search([typical[i % len(typical)]]) for i in range(queries)
        ],
        "busiest + typical group (two keys)": [
            Search([busy[i % len(busy)], typical[i % len(typical)]]) for i in range(queries)
        ],
        "busiest groups, last 30 days": [
            Search([busy[i % len(busy)]], last_days(30)) for i in range(queries)
        ],
        "busiest groups, last 180 days": [
            Search([busy[i % len(busy)]], last_days(180)) for i in range(queries)
        ],
        "typical groups, last 30 days": [
            Search([typical[i % len(typical)]], last_days(30)) for i in range(queries)
        ],
    }
    await timed(db, tenant, cases[next(iter(cases))], 10, rng)  # warm the caches
    for limit in (10, 36):
        load = os.getloadavg()[0]
        print(f"nearest_events latency, limit {limit} ({queries} queries each; load {load:.1f}):")
        for label, searches in cases.items():
            timing = await timed(db, tenant, searches, limit, rng)
            note = f"  second pass {timing.second_passes}" if timing.second_passes else ""
            cpu = f"  server CPU {timing.cpu_per_query * 1000:5.2f} ms/query"
            print(f"  {label:38} {percentiles(timing.samples)}{cpu}{note}")


async def group_vectors(dsn: str, tenant: uuid.UUID, key: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    await conn.set_type_codec(
        "vector", schema="public", encoder=bytes, decoder=Vector.from_binary, format="binary"
    )
    rows = await conn.fetch(
        "SELECT id, occurred_at, embedding FROM events"
        " WHERE tenant_id = $1 AND conversation_key = $2 AND embedding IS NOT NULL",
        tenant,
        key,
    )
    await conn.close()
    return list(rows)


async def recall(
    db: Database, dsn: str, layout: Layout, queries: int, rng: np.random.Generator
) -> None:
    plan = [(key, None) for key in layout.busy]
    plan += [(key, last_days(30)) for key in layout.busy]
    plan += [(key, None) for key in layout.typical[:20]]
    per_case = max(1, -(-queries // len(plan)))
    found_share, exact, total = [], 0, 0
    for key, window in plan:
        rows = await group_vectors(dsn, layout.tenant, key)
        if window:
            rows = [r for r in rows if window["time_from"] <= r["occurred_at"] < window["time_to"]]
        ids = [r["id"] for r in rows]
        matrix = np.stack([r["embedding"].to_numpy() for r in rows]).astype(np.float64)
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
        for query in unit_vectors(rng, per_case):
            truth = [ids[i] for i in np.argsort(-(matrix @ query.astype(np.float64)))[:10]]
            async with db.tenant(layout.tenant) as session:
                got = await nearest_events(
                    session, layout.tenant, [key], query, 10, **(window or {})
                )
            got_ids = [r["id"] for r in got]
            found_share.append(len(set(got_ids) & set(truth)) / len(truth))
            exact += got_ids == truth
            total += 1
    print(
        f"recall@10 against brute force: {statistics.mean(found_share):.4f} over {total} queries"
        f" ({exact} of {total} identical top-10 lists, in order)"
    )


async def explain(db: Database, tenant: uuid.UUID, key: str, rng: np.random.Generator) -> str:
    """The plan of the first statement nearest_events runs for one busiest-group query."""
    query = unit_vectors(rng, 1)[0]
    async with db.tenant(tenant) as session:
        recording = Recording(session)
        await nearest_events(recording, tenant, [key], query, 10)  # type: ignore[arg-type]
        statement, params = recording.statements[0]
        sql = text("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + str(statement))
        plan = [r[0] for r in await session.execute(sql, params)]
    # The query vector appears as a literal in the plan; cut it short.
    return "\n".join("    " + (line if len(line) < 150 else line[:146] + " …") for line in plan)


def fresh_row(tenant: uuid.UUID, key: str, i: int, vector: np.ndarray) -> dict[str, Any]:
    return {
        "tenant_id": tenant, "id": f"fresh-{uuid.uuid4().hex}", "conversation_key": key,
        "request_type": "group", "group_id": key[2:], "user_id": None, "sender_id": "10001",
        "request_id": "fresh", "end_seq": 1, "kind": "observation", "perspective": "group",
        "text": "新写入的事件", "source_text": "新写入的事件", "is_absolute": True,
        "warnings": [], "occurred_at": START + SPAN - timedelta(seconds=i),
        "timezone": "Asia/Shanghai", "location_abs": None, "message_ids": [],
        "metadata": {}, "embedding": vector, "job_id": None,
    }  # fmt: skip


async def fresh_rows(
    db: Database, dsn: str, layout: Layout, queries: int, rng: np.random.Generator
) -> None:
    key, tenant = layout.busy[0], layout.tenant
    vectors = unit_vectors(rng, 2000)
    rows = [fresh_row(tenant, key, i, vector) for i, vector in enumerate(vectors)]
    for start in range(0, len(rows), 8):  # as the historian writes them: a job at a time
        async with db.tenant(tenant) as session:
            await upsert_events(session, rows[start : start + 8])
    searches = [Search([key]) for _ in range(queries)]
    timing = await timed(db, tenant, searches, 10, rng)
    print(
        f"  2,000 events just written, not vacuumed {percentiles(timing.samples)}"
        f"  server CPU {timing.cpu_per_query * 1000:5.2f} ms/query"
    )
    print(await explain(db, tenant, key, rng))
    conn = await asyncpg.connect(dsn)
    await conn.execute("VACUUM event_vectors")
    await conn.close()
    timing = await timed(db, tenant, searches, 10, rng)
    print(
        f"  after VACUUM event_vectors              {percentiles(timing.samples)}"
        f"  server CPU {timing.cpu_per_query * 1000:5.2f} ms/query"
    )
    conn = await asyncpg.connect(dsn)  # leave a kept directory as it was seeded
    await conn.execute("DELETE FROM events WHERE request_id = 'fresh'")
    await conn.execute("VACUUM events, event_vectors")
    await conn.close()


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The dataset's shape, and keeping or reusing it."""
    parser.add_argument("--events", type=int, default=1_000_000, help="events of the big tenant")
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--tenants", type=int, default=100, help="other, small tenants")
    parser.add_argument("--seed", type=int, default=20260221)
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument("--data-dir", type=Path, help="reuse a seeded directory (from --keep)")


def data_directory(args: argparse.Namespace, prefix: str) -> tuple[Path, bool]:
    """The data directory to use, and whether it is one seeded before (``--data-dir``)."""
    if args.data_dir is not None:
        return args.data_dir.resolve(), True
    (ROOT / "data").mkdir(exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=ROOT / "data")), False


async def shared_buffers(dsn: str, value: str | None) -> str:
    """Set (or, with None, reset) shared_buffers for the next start; the current value."""
    conn = await asyncpg.connect(dsn)
    current = str(await conn.fetchval("SHOW shared_buffers"))
    if value:
        await conn.execute(f"ALTER SYSTEM SET shared_buffers = '{value}'")
    else:
        await conn.execute("ALTER SYSTEM RESET shared_buffers")
    await conn.close()
    return current


async def main() -> None:
    parser = argparse.ArgumentParser()
    add_data_arguments(parser)
    parser.add_argument("--queries", type=int, default=200, help="per latency case and recall")
    parser.add_argument(
        "--shared-buffers",
        default="4GB",
        help="measure again after a restart with this shared_buffers ('' to skip)",
    )
    args = parser.parse_args()

    data_dir, reuse = data_directory(args, "bench-events-")
    url = embedded_url(data_dir / "pg")
    dsn = url.replace("postgresql+asyncpg://", "postgresql://")
    db = Database(url, pool_size=1, max_overflow=0)
    rng = np.random.default_rng(args.seed + 1)
    try:
        if reuse:
            layout = await load_layout(dsn)
        else:
            await asyncio.to_thread(migrate, url, before_event_vectors(url))
            layout = await seed(db, dsn, url, args)
        choose_groups(layout, rng)
        print("sizes:")
        await sizes_report(dsn)
        current = await shared_buffers(dsn, None)
        settings = [current] + ([args.shared_buffers] if args.shared_buffers else [])
        for setting in settings:
            if setting != current:
                await shared_buffers(dsn, setting)
                await db.dispose()
                stop_embedded()
                url = embedded_url(data_dir / "pg")
                db = Database(url, pool_size=1, max_overflow=0)
            print(f"=== shared_buffers {setting} ===")
            print("plan of the first statement, busiest group, limit 10 (cold):")
            print(await explain(db, layout.tenant, layout.busy[0], rng))
            await latencies(db, layout, args.queries, rng)
        await recall(db, dsn, layout, args.queries, rng)
        print("writes since the last vacuum (busiest group, limit 10):")
        await fresh_rows(db, dsn, layout, args.queries, rng)
        await shared_buffers(dsn, None)
    finally:
        await db.dispose()
        stop_embedded()
        if args.keep or reuse:
            print(f"data kept in {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
