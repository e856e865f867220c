"""Where the read path's time goes: ``/v1/context`` and ``/v1/messages/search``, step by step.

Runs the service's own read code in this process (no HTTP) on the data of
``context_latency.py --keep`` (a million events; ``--data-dir DIR``), and adds two archive
conversations of 1,000 and 50,000 messages there (random unit vectors, chat texts) unless
they exist. For each case, ``--calls`` distinct queries:

* the query embedding alone (cache off): wall percentiles and CPU time per call;
* the rest of the path with the vector cached: wall percentiles, this process's CPU time
  per call (``time.process_time``), SQL round trips, and per statement the client's wall
  time and PostgreSQL's own (planning + execution, from ``EXPLAIN (ANALYZE, BUFFERS)`` run
  once more on the same parameters after the timed calls), with the buffers it touched;
* the Python steps: ranking, assembling, serializing the response (CPU per call).

Wall times depend on what else the machine runs; CPU times and round trips do not much.
``uptime``'s load is printed next to the wall figures.

The context reads its lexical side on a second transaction, beside the dense pass, as the
route does; ``--own-transaction`` reads it on the request's own, to compare. On the busiest
group (50,000 events), one run after the other: the rest of the path p50 40.2 / p95 47.4 ms
on its own transaction, 31.3 / 43.0 ms beside, at the same CPU per call (10.1 / 9.7 ms); a
typical group 17.7 / 20.7 and 16.4 / 20.6 ms.

Run: python bench/read_breakdown.py --data-dir data/bench-context-XXXX [--calls 50]
     [--own-transaction]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import event_search_scale as scale
import numpy as np
from context_latency import context_body, messages
from litestar.serialization import encode_json
from measure import percentiles
from sqlalchemy import event, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.db.embedded import embedded_url, stop_embedded
from service.db.engine import Database
from service.embedding.local import LocalEmbedder
from service.messages import repository as archive_rows
from service.messages import search as archive
from service.messages.schemas import MessageSearch
from service.recall import ranking, service
from service.recall.schemas import ContextRequest
from service.recall.service import Reader, build_query
from service.retrieval import fusion
from service.retrieval.terms import terms, to_tsvector_literal
from service.settings import EmbeddingModelSettings, Settings
from service.tenants.service import tenant_context

T = TypeVar("T")
ARCHIVES = (1_000, 50_000)


@dataclass
class Statement:
    """One SQL statement as sent, and what its executions cost."""

    sql: str
    params: Any
    walls: list[float] = field(default_factory=list)


@dataclass
class Tally:
    """What one kind of call cost, summed over its calls."""

    statements: dict[str, Statement] = field(default_factory=dict)
    round_trips: int = 0
    python: dict[str, float] = field(default_factory=lambda: defaultdict(float))


class Recorder:
    """Counts and times the statements a database's engine sends while one is active."""

    def __init__(self, db: Database) -> None:
        self.tally: Tally | None = None
        self._started: dict[int, float] = {}
        engine = db.engine.sync_engine
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def _before(self, conn: Any, cursor: Any, sql: str, params: Any, *_: Any) -> None:
        self._started[id(cursor)] = time.perf_counter()

    def _after(self, conn: Any, cursor: Any, sql: str, params: Any, *_: Any) -> None:
        wall = time.perf_counter() - self._started.pop(id(cursor), time.perf_counter())
        if self.tally is None:
            return
        self.tally.round_trips += 1
        statement = self.tally.statements.setdefault(sql, Statement(sql, params))
        statement.walls.append(wall)

    @contextmanager
    def recording(self, tally: Tally) -> Iterator[None]:
        self.tally = tally
        try:
            yield
        finally:
            self.tally = None


def timed(tally_of: Callable[[], Tally | None], name: str, function: Callable[..., T]) -> Any:
    """``function`` wrapped to add its CPU time to the active tally under ``name``."""

    def wrapper(*args: Any, **kwargs: Any) -> T:
        started = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            tally = tally_of()
            if tally is not None:
                tally.python[name] += time.process_time() - started

    return wrapper


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def label(sql: str) -> str:
    """A short name for a statement: its first distinctive words."""
    words = " ".join(sql.split())
    for marker in ("FROM ", "INTO ", "UPDATE "):
        at = words.find(marker)
        if at >= 0 and (marker != "FROM " or words.startswith(("SELECT", "WITH"))):
            tail = words[at + len(marker) :].split(" ")[0]
            head = words[:28]
            return f"{head}… {marker.strip()} {tail}"[:70]
    return words[:70]


async def explain(db: Database, tenant_id: Any, statement: Statement) -> tuple[float, float, str]:
    """(planning ms, execution ms, buffers) of the statement, run once more with EXPLAIN."""
    async with db.tenant(tenant_id) as session:
        connection = await session.connection()
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        params = statement.params
        args = list(params.values()) if isinstance(params, dict) else list(params or ())
        plan = await driver.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _numbered(statement.sql), *args
        )
        await session.rollback()
    import json

    top = json.loads(plan)[0] if isinstance(plan, str) else plan[0]
    node = top["Plan"]
    buffers = f"hit {node.get('Shared Hit Blocks', 0)} read {node.get('Shared Read Blocks', 0)}"
    return top["Planning Time"], top["Execution Time"], buffers


def _numbered(sql: str) -> str:
    # The asyncpg dialect's statements already carry $n placeholders (its own cursor rewrites
    # %s forms): pass them through.
    return sql


async def measure(
    title: str,
    calls: list[Callable[[], Awaitable[Any]]],
    embed_texts: list[str],
    embedder: LocalEmbedder,
    recorder: Recorder,
    db: Database,
    tenant_id: Any,
) -> None:
    """Print the breakdown of one case."""
    print(f"\n{title}  ({len(calls)} calls; {load()})")
    embedding_walls, embedding_cpu = [], []
    for text_ in embed_texts:
        wall, cpu = time.perf_counter(), time.process_time()
        await embedder.query(text_)
        embedding_walls.append(time.perf_counter() - wall)
        embedding_cpu.append(time.process_time() - cpu)
    print(
        f"  query embedding alone:  {percentiles(embedding_walls)}"
        f"   CPU {statistics.fmean(embedding_cpu) * 1000:.2f} ms/call"
    )
    tally = Tally()
    walls, cpus = [], []
    global ACTIVE
    ACTIVE = tally
    with recorder.recording(tally):
        for call in calls:
            wall, cpu = time.perf_counter(), time.process_time()
            result = await call()
            started = time.process_time()
            encode_json(result.model_dump(mode="json"))  # as the pydantic plugin does
            tally.python["serialize"] += time.process_time() - started
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    ACTIVE = None
    n = len(calls)
    print(
        f"  rest (vector cached):   {percentiles(walls)}"
        f"   CPU {statistics.fmean(cpus) * 1000:.2f} ms/call, "
        f"{tally.round_trips / n:.1f} statements/call (+ BEGIN, COMMIT)"
    )
    print(
        f"    {'statement':<70} {'n/call':>6} {'client ms':>9} {'plan ms':>7} "
        f"{'exec ms':>7}  buffers"
    )
    for statement in tally.statements.values():
        planning, execution, buffers = await explain(db, tenant_id, statement)
        print(
            f"    {label(statement.sql):<70} {len(statement.walls) / n:>6.2f} "
            f"{statistics.fmean(statement.walls) * 1000:>9.2f} {planning:>7.2f} "
            f"{execution:>7.2f}  {buffers}"
        )
    steps = ", ".join(
        f"{name} {seconds / n * 1000:.2f} ms" for name, seconds in tally.python.items()
    )
    print(f"    Python CPU per call: {steps}")


ACTIVE: Tally | None = None


def instrument() -> None:
    """Time the read path's Python steps (module functions, looked up at call time)."""

    def active() -> Tally | None:
        return ACTIVE

    ranking.fuse = timed(active, "fuse", ranking.fuse)
    ranking.decay_scores = timed(active, "decay", ranking.decay_scores)
    ranking.without_duplicates = timed(active, "dedupe", ranking.without_duplicates)
    service._assemble = timed(active, "assemble", service._assemble)
    archive.rank_candidates = timed(active, "rank", archive.rank_candidates)
    archive.first_distinct = timed(active, "dedupe", fusion.first_distinct)


async def seed_archive(db: Database, tenant_id: Any, size: int, rng: np.random.Generator) -> str:
    """A group chat of ``size`` messages (unless it exists): chat lines and random vectors."""
    key = f"g:archive-{size}"
    async with db.tenant(tenant_id) as session:
        found = (
            await session.execute(
                text(
                    "SELECT count(*) FROM messages WHERE tenant_id = :t AND conversation_key = :k"
                ),
                {"t": tenant_id, "k": key},
            )
        ).scalar_one()
    if found >= size:
        return key
    started = datetime(2025, 1, 1, tzinfo=UTC)
    for start in range(0, size, 5000):
        rows = []
        for n in range(start, min(size, start + 5000)):
            place = scale.PLACES[rng.integers(len(scale.PLACES))]
            activity = scale.ACTIVITIES[rng.integers(len(scale.ACTIVITIES))]
            body = f"我们{place}{activity}吧，第{n % 97}次了"
            rows.append(
                {
                    "conversation_key": key,
                    "message_id": f"m{n}",
                    "request_type": "group",
                    "group_id": key[2:],
                    "user_id": None,
                    "sender_id": str(10000 + n % 7),
                    "sender_name": f"成员{n % 7}",
                    "text": body,
                    "sent_at": started + timedelta(minutes=n),
                    "lexical": to_tsvector_literal(terms(body)),
                }
            )
        vectors = rng.standard_normal((len(rows), 384)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        async with db.tenant(tenant_id) as session:
            inserted = await archive_rows.insert_messages(session, tenant_id, rows)
            await archive_rows.touch_conversation(
                session,
                {
                    "tenant_id": tenant_id,
                    "conversation_key": key,
                    "request_type": "group",
                    "group_id": key[2:],
                    "user_id": None,
                    "group_name": None,
                    "count": len(inserted),
                    "term_count": sum(r.term_count for r in inserted),
                    "last_at": max(r["sent_at"] for r in rows),
                    "last_seq": max(r.seq for r in inserted),
                },
            )
            await archive_rows.set_embeddings(
                session,
                tenant_id,
                [
                    type("Row", (), {"conversation_key": key, "message_id": r["message_id"]})
                    for r in rows
                ],
                list(vectors),
            )
    await vacuum(db)
    return key


async def vacuum(db: Database) -> None:
    """The archive as autovacuum leaves a table at rest: statistics, pages all-visible."""
    async with db.engine.connect() as connection:
        autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
        await autocommit.execute(text("VACUUM (ANALYZE) messages"))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", type=Path, required=True, help="from context_latency --keep")
    parser.add_argument("--calls", type=int, default=50, help="distinct queries per case")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--own-transaction",
        action="store_true",
        help="the context's lexical side on the request's own transaction, not beside it",
    )
    args = parser.parse_args()

    url = embedded_url(args.data_dir.resolve() / "pg")
    dsn = url.replace("postgresql+asyncpg://", "postgresql://")
    await asyncio.to_thread(scale.migrate, url, "head")  # migrations newer than the data
    layout = await scale.load_layout(dsn)
    rng = np.random.default_rng(args.seed)
    scale.choose_groups(layout, rng)
    db = Database(url, pool_size=2, max_overflow=0)
    recorder = Recorder(db)
    embedder = LocalEmbedder(EmbeddingModelSettings(query_cache_size=0))
    cached = LocalEmbedder(EmbeddingModelSettings())
    instrument()
    try:
        await embedder.warm_up()
        await cached.warm_up()
        await vacuum(db)
        async with db.system() as session:
            tenant = await tenant_context(session, layout.tenant, Settings())
        # As the routes read: the lexical side on a second transaction of the same database
        # (--own-transaction: on the request's own, after the reads that need no vector).
        reader = Reader(cached, None, None if args.own_transaction else db)
        texts = messages(args.calls * 2, rng)
        groups = (("busiest group (50,000 events)", layout.busy[0], 0),)
        groups += (("typical group", layout.typical[0], args.calls),)
        for title, key, offset in groups:
            requests = [
                ContextRequest(**context_body(key, texts[offset + n], n)) for n in range(args.calls)
            ]
            queries = [build_query(r) for r in requests]
            for query in queries:
                await cached.query(query)

            def context_call(request: ContextRequest) -> Callable[[], Awaitable[Any]]:
                async def call() -> Any:
                    async with db.tenant(tenant.tenant_id, read_only=True) as session:
                        return await reader.context(session, tenant, request)

                return call

            await context_call(requests[0])()  # plans cached, pages warm
            await measure(
                f"/v1/context, {title}",
                [context_call(r) for r in requests],
                queries,
                embedder,
                recorder,
                db,
                tenant.tenant_id,
            )
        for size in ARCHIVES:
            key = await seed_archive(db, tenant.tenant_id, size, rng)
            searches = [
                MessageSearch(
                    query=f"{scale.PLACES[n % 20]}{scale.ACTIVITIES[n % 24]}",
                    group_id=key[2:],
                    top_k=10,
                )
                for n in range(args.calls)
            ]
            for search in searches:
                await cached.query(search.query)

            def search_call(search: MessageSearch) -> Callable[[], Awaitable[Any]]:
                async def call() -> Any:
                    # As the route does: a big conversation's lexical side on a second
                    # transaction of the same database.
                    async with db.tenant(tenant.tenant_id, read_only=True) as session:
                        return await archive.search(session, tenant, search, cached, db)

                return call

            await search_call(searches[0])()
            await measure(
                f"/v1/messages/search, {size:,} messages",
                [search_call(s) for s in searches],
                [s.query for s in searches],
                embedder,
                recorder,
                db,
                tenant.tenant_id,
            )
    finally:
        await embedder.close()
        await cached.close()
        await db.dispose()
        stop_embedded()


if __name__ == "__main__":
    asyncio.run(main())
