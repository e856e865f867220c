"""What a claim costs with many tenants' jobs queued: the claim is one scan of the claimable
index by (priority, turn), whatever the number of tenants, and an enqueue finds its tenant's
pace by one probe, however many of its jobs are not yet due.

Queues ``--jobs`` jobs for each of ``--tenants`` tenants (turns as a burst of each would get
them), then times claims of ``--limit`` jobs, each in its own committed transaction, and
enqueues of one tenant's jobs (each rolled back), beside its due jobs, then also beside
``--waiting`` newer ones waiting out a backoff; prints their percentiles and the claim's plan.

Run: python bench/queue_claims.py [--tenants 2000] [--jobs 100] [--claims 500] [--limit 8]
     [--waiting 3000]
     [--url postgresql+asyncpg://…  (a database migrated here; default: an embedded one)]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import percentiles
from service.db.embedded import embedded_url, stop_embedded
from service.db.engine import Database
from service.db.migrate import upgrade_to_head
from service.queue import repository
from service.settings import Settings

_TENANTS = text(
    "INSERT INTO tenants (id, name) SELECT gen_random_uuid(), 'bench-' || n"
    " FROM generate_series(1, :n) AS n RETURNING id"
)
# Each tenant's jobs as a burst of them queued a moment apart gets them (see _next_turn).
_JOBS = text(
    """
    INSERT INTO jobs (tenant_id, kind, payload, turn)
    SELECT t.id, 'bench.job', jsonb_build_object('n', k),
           now() + make_interval(secs => t.start) + make_interval(secs => k * :step)
    FROM (SELECT id, random() * 60 AS start FROM tenants WHERE name LIKE 'bench-%') AS t,
         generate_series(0, :jobs - 1) AS k
    """
)
# A tenant's jobs waiting out a backoff (a model's outage), newer than its due ones.
_WAITING = text(
    """
    INSERT INTO jobs (tenant_id, kind, payload, run_after, turn, last_error)
    SELECT :t, 'bench.job', jsonb_build_object('n', k), now() + interval '1 hour',
           now() + interval '1 hour' + make_interval(secs => k), 'model down'
    FROM generate_series(1, :n) AS k
    """
)
_PLAN = text(
    """
    EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
    SELECT tenant_id, id FROM jobs
    WHERE status = 'queued' AND run_after <= now()
      AND (queueing_lock IS NULL OR NOT EXISTS (
          SELECT FROM jobs AS holder
          WHERE holder.tenant_id = jobs.tenant_id AND holder.status = 'running'
            AND holder.queueing_lock = jobs.queueing_lock))
    ORDER BY priority DESC, turn, id LIMIT 8 FOR UPDATE SKIP LOCKED
    """
)


async def enqueues(db: Database, tenant: uuid.UUID) -> str:
    """Percentiles of 200 enqueues of ``tenant``'s, each rolled back: all find the same queue."""
    times: list[float] = []
    for n in range(200):
        async with db.tenant(tenant) as session:
            trial = await session.begin_nested()
            started = time.perf_counter()
            await repository.enqueue(session, tenant, "bench.job", {"n": n})
            times.append(time.perf_counter() - started)
            await trial.rollback()
    return percentiles(times)


async def measure(db: Database, args: argparse.Namespace) -> None:
    async with db.system() as session:
        tenants = [r.id for r in await session.execute(_TENANTS, {"n": args.tenants})]
        step = repository.TURN_STEP_SECONDS
        await session.execute(_JOBS, {"jobs": args.jobs, "step": step})
        await session.execute(text("ANALYZE jobs"))
    print(f"{args.tenants} tenants x {args.jobs} jobs queued")

    claims: list[float] = []
    for _ in range(args.claims):
        async with db.system() as session:
            started = time.perf_counter()
            taken = await repository.claim_jobs(session, "bench", args.limit, 30.0)
            claims.append(time.perf_counter() - started)
        assert len(taken) == args.limit
    print(f"claim of {args.limit}:  {percentiles(claims)}")

    tenant: uuid.UUID = tenants[len(tenants) // 2]
    print(f"enqueue beside {args.jobs} queued of its tenant:  {await enqueues(db, tenant)}")
    async with db.system() as session:
        await session.execute(_WAITING, {"t": tenant, "n": args.waiting})
    print(f"  and {args.waiting} of its jobs not yet due:  {await enqueues(db, tenant)}")

    async with db.system() as session:
        plan = [r[0] for r in await session.execute(_PLAN)]
    print("\n".join(plan))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--waiting", type=int, default=3000)
    parser.add_argument("--url")
    args = parser.parse_args()
    data_dir = Path(tempfile.mkdtemp(prefix="bench-queue-"))
    url = args.url or embedded_url(data_dir / "pg")
    try:
        await asyncio.to_thread(upgrade_to_head, url, Settings(database_url=url))
        db = Database(url)
        try:
            await measure(db, args)
        finally:
            await db.dispose()
    finally:
        stop_embedded()
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
