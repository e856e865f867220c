"""The jobs table as a durable queue: exactly-once runs, retries, leases, wake-ups, pruning."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from service.db.engine import Database
from service.queue import repository
from service.queue.worker import JobContext, JobHandler, Worker
from service.settings import QueueSettings, Settings
from service.tenants.service import create_tenant


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = Database(db_url, pool_size=10)
    yield database
    await database.dispose()


@pytest.fixture
async def tenant_id(db: Database) -> uuid.UUID:
    async with db.system() as session:
        tenant, _ = await create_tenant(session, "queue-test", {}, Settings())
    return tenant.id


def queue_settings(**overrides: Any) -> QueueSettings:
    values: dict[str, Any] = {
        "concurrency": 4,
        "lease_seconds": 5.0,
        "heartbeat_seconds": 1.0,
        "retry_base_seconds": 0.01,
        "retry_cap_seconds": 0.05,
        "failed_cleanup_interval": 0,
    }
    values.update(overrides)
    return QueueSettings(**values)


async def enqueue_many(
    db: Database, tenant_id: uuid.UUID, kind: str, count: int, **kwargs: Any
) -> list[int]:
    ids = []
    async with db.tenant(tenant_id) as session:
        for n in range(count):
            job_id, _ = await repository.enqueue(session, tenant_id, kind, {"n": n}, **kwargs)
            ids.append(job_id)
    return ids


async def statuses(db: Database) -> dict[int, tuple[str, int, str | None]]:
    async with db.system() as session:
        rows = await session.execute(text("SELECT id, status, attempts, last_error FROM jobs"))
        return {r.id: (r.status, r.attempts, r.last_error) for r in rows}


async def run_until(
    workers: list[Worker], done: Callable[[], Awaitable[bool]], timeout: float = 30
) -> None:
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        deadline = time.monotonic() + timeout
        while not await done():
            if time.monotonic() > deadline:
                raise AssertionError("the queue did not reach the expected state in time")
            await asyncio.sleep(0.05)
    finally:
        for worker in workers:
            await worker.stop(timeout=5)
        await asyncio.gather(*tasks)


def all_in(db: Database, wanted: set[str]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return all(status in wanted for status, _, _ in (await statuses(db)).values())

    return check


async def test_two_workers_process_each_job_exactly_once(
    db: Database, tenant_id: uuid.UUID
) -> None:
    seen: list[tuple[int, str]] = []

    async def record(ctx: JobContext) -> dict[str, Any]:
        await asyncio.sleep(0.002)
        async with ctx.finishing():
            seen.append((ctx.job.id, ctx.worker_id))
        return {"ok": True}

    ids = await enqueue_many(db, tenant_id, "test.record", 150)
    handlers: dict[str, JobHandler] = {"test.record": record}
    workers = [Worker(db, handlers, queue_settings(), poll_interval=0.05) for _ in range(2)]
    await run_until(workers, all_in(db, {"done"}))

    counts = Counter(job_id for job_id, _ in seen)
    assert set(counts) == set(ids)
    assert max(counts.values()) == 1
    # Both workers really took part.
    assert len({worker for _, worker in seen}) == 2
    assert {s for s, _, _ in (await statuses(db)).values()} == {"done"}


async def test_a_failing_job_retries_with_backoff_then_fails_and_can_be_retried(
    db: Database, tenant_id: uuid.UUID
) -> None:
    calls: list[float] = []
    healthy = False

    async def flaky(ctx: JobContext) -> dict[str, Any]:
        calls.append(time.monotonic())
        if not healthy:
            raise ValueError("upstream said no")
        return {"ok": True}

    [job_id] = await enqueue_many(db, tenant_id, "test.flaky", 1, max_attempts=3)
    settings = queue_settings(retry_base_seconds=0.1, retry_cap_seconds=0.4)
    worker = Worker(db, {"test.flaky": flaky}, settings, poll_interval=0.02)
    await run_until([worker], all_in(db, {"failed"}))

    status, attempts, error = (await statuses(db))[job_id]
    assert (status, attempts) == ("failed", 3)
    assert error is not None and "upstream said no" in error
    assert len(calls) == 3
    # Backoff: the waits grow and are not zero (base 0.1 s, jitter down to half).
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert gaps[0] >= 0.04 and gaps[1] >= 0.09

    async with db.tenant(tenant_id) as session:
        assert await repository.retry(session, tenant_id, job_id)
        # retrying a job that is not failed is refused
        assert not await repository.retry(session, tenant_id, job_id)
    healthy = True
    worker = Worker(db, {"test.flaky": flaky}, settings, poll_interval=0.02)
    await run_until([worker], all_in(db, {"done"}))
    assert (await statuses(db))[job_id][0] == "done"


async def test_a_job_without_handler_fails_at_once(db: Database, tenant_id: uuid.UUID) -> None:
    [job_id] = await enqueue_many(db, tenant_id, "test.unknown", 1)
    worker = Worker(db, {}, queue_settings(), poll_interval=0.02)
    await run_until([worker], all_in(db, {"failed"}))
    status, attempts, error = (await statuses(db))[job_id]
    assert (status, attempts) == ("failed", 1)
    assert "no handler" in (error or "")


async def test_a_dead_workers_job_is_reclaimed_after_its_lease(
    db: Database, tenant_id: uuid.UUID
) -> None:
    [job_id] = await enqueue_many(db, tenant_id, "test.once", 1)
    async with db.system() as session:
        claimed = await repository.claim_jobs(session, "ghost-worker", 10, lease=0.3)
    assert [j.id for j in claimed] == [job_id]
    ran: list[int] = []

    async def once(ctx: JobContext) -> None:
        ran.append(ctx.job.attempts)

    await asyncio.sleep(0.4)
    worker = Worker(db, {"test.once": once}, queue_settings(), poll_interval=0.05)
    await run_until([worker], all_in(db, {"done"}))
    assert ran == [2]  # the ghost's attempt counted


async def test_a_job_killing_its_worker_every_time_runs_out_of_attempts(
    db: Database, tenant_id: uuid.UUID
) -> None:
    [job_id] = await enqueue_many(db, tenant_id, "test.poison", 1, max_attempts=2)
    for _ in range(2):
        async with db.system() as session:
            assert len(await repository.claim_jobs(session, "doomed", 10, lease=0.05)) == 1
        await asyncio.sleep(0.1)
        async with db.system() as session:
            await repository.reclaim_expired(session)
    status, attempts, error = (await statuses(db))[job_id]
    assert (status, attempts) == ("failed", 2)
    assert "lease expired" in (error or "")


async def test_a_job_whose_worker_died_or_failed_goes_behind_its_tenants_queued_jobs(
    db: Database, tenant_id: uuid.UUID
) -> None:
    # Taken again first, a job (and the batch claimed beside it) that kills its worker used up
    # its attempts back to back, and the jobs queued behind it waited all the while.
    first, *rest = await enqueue_many(db, tenant_id, "test.flood", 4)
    async with db.system() as session:
        [dead] = await repository.claim_jobs(session, "doomed", 1, lease=0.05)
    await asyncio.sleep(0.1)
    async with db.system() as session:
        assert await repository.reclaim_expired(session) == 1
        [second] = await repository.claim_jobs(session, "w1", 1, 5.0)
        assert await repository.fail(session, second, "w1", "model down", 0) == "queued"
    order: list[int] = []
    async with db.system() as session:
        while batch := await repository.claim_jobs(session, "w1", 1, 5.0):
            order += [job.id for job in batch]
    assert dead.id == first and second.id == rest[0]
    assert order == [*rest[1:], first, rest[0]]


async def test_heartbeats_keep_a_long_job_from_being_taken_over(
    db: Database, tenant_id: uuid.UUID
) -> None:
    runs: list[str] = []

    async def slow(ctx: JobContext) -> None:
        runs.append(ctx.worker_id)
        await asyncio.sleep(1.5)

    await enqueue_many(db, tenant_id, "test.slow", 1)
    settings = queue_settings(lease_seconds=0.6, heartbeat_seconds=0.15)
    workers = [Worker(db, {"test.slow": slow}, settings, poll_interval=0.05) for _ in range(2)]
    await run_until(workers, all_in(db, {"done"}))
    assert len(runs) == 1


async def test_writes_of_a_job_whose_lease_was_lost_roll_back(
    db: Database, tenant_id: uuid.UUID
) -> None:
    [job_id] = await enqueue_many(db, tenant_id, "test.stolen", 1)

    async def stolen(ctx: JobContext) -> None:
        # Another worker takes the job over while we work (our lease had run out).
        async with db.system() as session:
            await session.execute(
                text("UPDATE jobs SET lease_owner = 'thief' WHERE id = :id"), {"id": ctx.job.id}
            )
        async with ctx.finishing() as session:
            await repository.enqueue(session, tenant_id, "test.followup", {"from": ctx.job.id})

    worker = Worker(db, {"test.stolen": stolen}, queue_settings(), poll_interval=0.05)

    async def handled() -> bool:
        return worker.processed > 0 or (
            not worker._inflight and (await statuses(db))[job_id][0] == "running"
        )

    await run_until([worker], handled, timeout=10)
    rows = await statuses(db)
    assert list(rows) == [job_id]  # the follow-up job was never committed
    assert rows[job_id][0] == "running"  # and the thief still holds the job


async def test_a_long_jobs_checkpoint_reaches_its_next_attempt_and_not_a_thief(
    db: Database, tenant_id: uuid.UUID
) -> None:
    # A long job commits its progress with each step; its next attempt (after a failure)
    # reads it back. A step run after the job was taken over commits neither its writes nor
    # its progress.
    [job_id] = await enqueue_many(db, tenant_id, "test.steps", 1)
    seen: list[dict[str, Any] | None] = []

    async def steps(ctx: JobContext) -> None:
        seen.append(ctx.job.progress)
        done = (ctx.job.progress or {}).get("steps", 0)
        async with ctx.transaction() as session:
            await ctx.checkpoint(session, {"steps": done + 1})
        if len(seen) == 1:
            raise RuntimeError("stopped after one step")
        if len(seen) == 2:  # taken over: this step's writes must not commit
            async with db.system() as session:
                await session.execute(
                    text("UPDATE jobs SET lease_owner = 'thief' WHERE id = :id"), {"id": job_id}
                )
            async with ctx.transaction() as session:
                await repository.enqueue(session, tenant_id, "test.followup", {})
                await ctx.checkpoint(session, {"steps": 99})

    worker = Worker(db, {"test.steps": steps}, queue_settings(), poll_interval=0.05)

    async def taken() -> bool:
        return len(seen) == 2 and not worker._inflight

    await run_until([worker], taken, timeout=10)
    async with db.system() as session:
        progress = (
            await session.execute(text("SELECT result FROM jobs WHERE id = :id"), {"id": job_id})
        ).scalar_one()
    assert seen == [None, {"steps": 1}]
    assert progress == {"steps": 2}  # the thief's run saw the second step, not the 99
    assert list(await statuses(db)) == [job_id]


async def test_notify_wakes_an_idle_worker_without_waiting_for_the_poll(
    db: Database, tenant_id: uuid.UUID
) -> None:
    done = asyncio.Event()

    async def quick(ctx: JobContext) -> None:
        done.set()

    worker = Worker(db, {"test.quick": quick}, queue_settings(), poll_interval=60)
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.sleep(0.5)  # the worker has polled once and sleeps for a minute
        await enqueue_many(db, tenant_id, "test.quick", 1)
        await asyncio.wait_for(done.wait(), timeout=10)
    finally:
        await worker.stop(timeout=5)
        await task


async def test_shutdown_releases_unfinished_jobs_untouched(
    db: Database, tenant_id: uuid.UUID
) -> None:
    started = asyncio.Event()

    async def stuck(ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(3600)

    [job_id] = await enqueue_many(db, tenant_id, "test.stuck", 1)
    worker = Worker(db, {"test.stuck": stuck}, queue_settings(), poll_interval=0.05)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), timeout=10)
    await worker.stop(timeout=0.2)
    await task
    status, attempts, _ = (await statuses(db))[job_id]
    assert (status, attempts) == ("queued", 0)


async def test_a_job_claimed_as_the_shutdown_begins_goes_back_to_the_queue_unrun(
    db: Database, tenant_id: uuid.UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shutdown begins while a claim is on its way (a slow database): the shutdown
    waits for the jobs in hand, none yet. The job the claim then brings must go back to the
    queue at once, not start: started, it ran on after the worker stopped, against a
    database being closed, its task left pending when the process's loop ended (a test
    process's next collection then reported 'coroutine ignored GeneratorExit'), the job
    held until its lease ran out."""
    claiming, go_on = asyncio.Event(), asyncio.Event()
    claim_jobs = repository.claim_jobs

    async def slow_claim(*args: Any, **kwargs: Any) -> Any:
        claiming.set()
        await go_on.wait()
        return await claim_jobs(*args, **kwargs)

    monkeypatch.setattr(repository, "claim_jobs", slow_claim)
    ran: list[int] = []

    async def handler(ctx: JobContext) -> None:
        ran.append(ctx.job.id)
        await asyncio.sleep(3600)

    [job_id] = await enqueue_many(db, tenant_id, "test.late", 1)
    worker = Worker(db, {"test.late": handler}, queue_settings(), poll_interval=0.05)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(claiming.wait(), timeout=10)
    await worker.stop(timeout=0.2)  # nothing in hand yet: returns at once
    go_on.set()
    await asyncio.wait_for(task, timeout=10)
    await asyncio.sleep(0.1)
    assert ran == []
    status, attempts, _ = (await statuses(db))[job_id]
    assert (status, attempts) == ("queued", 0)


async def test_enqueue_is_idempotent_by_dedupe_key(db: Database, tenant_id: uuid.UUID) -> None:
    async with db.tenant(tenant_id) as session:
        first = await repository.enqueue(session, tenant_id, "test.x", {}, dedupe_key="req-1:1")
        again = await repository.enqueue(session, tenant_id, "test.x", {}, dedupe_key="req-1:1")
    assert first[1] is True and again == (first[0], False)
    assert len(await statuses(db)) == 1


async def test_prune_follows_the_retention_policy(db: Database, tenant_id: uuid.UUID) -> None:
    ids = await enqueue_many(db, tenant_id, "test.old", 6)
    async with db.system() as session:
        # two done long ago, one done just now, three failed at different times
        await session.execute(
            text(
                """
                UPDATE jobs SET status = CASE WHEN id = ANY(:done) THEN 'done' ELSE 'failed' END,
                       finished_at = now() - make_interval(days => CAST(:age - id AS int))
                """
            ),
            {"done": ids[:3], "age": ids[-1] + 1},
        )
        await session.execute(
            text("UPDATE jobs SET finished_at = now() WHERE id = :id"), {"id": ids[2]}
        )
        deleted = await repository.prune(
            session,
            done_age_seconds=3600,
            failed_max_age_days=365,
            failed_max_count=2,
            receipt_age_days=90,
        )
    remaining = await statuses(db)
    assert deleted == 3
    assert set(remaining) == {ids[2], ids[4], ids[5]}  # recent done, newest two failed


async def test_a_claim_beside_another_workers_claim_takes_the_next_jobs(
    db: Database, tenant_id: uuid.UUID
) -> None:
    # Two workers claiming one tenant's backlog at the same moment: the first holds its jobs
    # locked until its claim commits, and the second takes the ones after them, not nothing.
    ids = await enqueue_many(db, tenant_id, "test.flood", 12)
    async with db.system() as first:
        held = await repository.claim_jobs(first, "w1", 4, 5.0)
        async with db.system() as second:
            taken = await repository.claim_jobs(second, "w2", 4, 5.0)
    assert [job.id for job in held] == ids[:4]
    assert [job.id for job in taken] == ids[4:8]


async def test_one_tenants_burst_does_not_hold_up_another_tenants_job(
    db: Database, tenant_id: uuid.UUID
) -> None:
    async with db.system() as session:
        other, _ = await create_tenant(session, "queue-test-2", {}, Settings())
        later, _ = await create_tenant(session, "queue-test-3", {}, Settings())
    burst = await enqueue_many(db, tenant_id, "test.flood", 200)  # one tenant's burst …
    [single] = await enqueue_many(db, other.id, "test.flood", 1)  # … then another's one job
    # A retry waiting out its backoff is not taken before its time, whatever its turn.
    [waiting] = await enqueue_many(
        db, later.id, "test.flood", 1, run_after=datetime.now(UTC) + timedelta(hours=1)
    )
    claimed: list[int] = []
    async with db.system() as session:
        while batch := await repository.claim_jobs(session, "w1", 4, 5.0):
            claimed += [job.id for job in batch]
    # The other tenant's job is in the first claim, not after the whole burst; the burst
    # itself is not held back (all of it claimed at once, in its order).
    assert single in claimed[:4], claimed.index(single)
    assert [i for i in claimed if i != single] == burst
    assert waiting not in claimed


async def test_a_claim_passes_over_no_job_waiting_out_its_backoff(
    db: Database, tenant_id: uuid.UUID
) -> None:
    # During a model's outage every job fails and waits out a backoff. Left with its early
    # turn, each would stay at the front of the claimable index, and every claim would read
    # past all of them before reaching a due job.
    backing_off = await enqueue_many(db, tenant_id, "test.flood", 300)
    async with db.system() as session:
        held = await repository.claim_jobs(session, "w1", 300, 5.0)
        for job in held:
            assert await repository.fail(session, job, "w1", "model down", 3600) == "queued"
    assert sorted(job.id for job in held) == backing_off
    [due] = await enqueue_many(db, tenant_id, "test.flood", 1)
    async with db.system() as session:
        plan = (
            await session.execute(
                text(
                    "EXPLAIN (ANALYZE, FORMAT JSON) SELECT id FROM jobs"
                    " WHERE status = 'queued' AND run_after <= now()"
                    " ORDER BY priority DESC, turn, id LIMIT 4 FOR UPDATE SKIP LOCKED"
                )
            )
        ).scalar_one()
        taken = await repository.claim_jobs(session, "w1", 4, 5.0)
    assert [job.id for job in taken] == [due]

    def passed_over(node: dict[str, Any]) -> int:
        own = int(node.get("Rows Removed by Filter", 0))
        return own + sum(passed_over(child) for child in node.get("Plans", []))

    assert passed_over(plan[0]["Plan"]) == 0


async def test_a_tenants_unfinished_job_of_a_kind_is_found_past_none_of_its_backlog(
    db: Database, tenant_id: uuid.UUID
) -> None:
    # A model's outage leaves a tenant twenty thousand historian jobs queued; every new key,
    # settings change or admin call within the tenant asks whether it is being erased, and
    # each asked by reading all of them.
    [older, erasing] = await enqueue_many(db, tenant_id, "test.erase", 2)
    async with db.system() as session:
        await session.execute(
            text(
                "INSERT INTO jobs (tenant_id, kind, payload, status, attempts)"
                " SELECT :t, 'test.backlog', jsonb_build_object('n', n),"
                " (ARRAY['queued', 'running', 'failed'])[1 + n % 3], n % 2"
                " FROM generate_series(1, 20000) AS n"
            ),
            {"t": tenant_id},
        )
        await session.execute(text("UPDATE jobs SET status = 'done' WHERE id = :id"), {"id": older})
        await session.execute(text("ANALYZE jobs"))
    params = {
        "tenant_id": tenant_id,
        "kind": "test.erase",
        "statuses": ["queued", "failed", "running"],
        "match": "{}",
    }
    async with db.tenant(tenant_id) as session:
        found = await repository.unfinished(session, tenant_id, "test.erase")
        plan = (
            await session.execute(
                text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + repository._UNFINISHED.text),
                params,
            )
        ).scalar_one()
        done = await repository.unfinished(session, tenant_id, "test.none")
    assert found == (erasing, "queued") and done is None
    # A handful: the index's entries and the one row; before, some twenty thousand rows.
    top = plan[0]["Plan"]
    touched = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    assert touched < 20, touched


async def test_an_enqueue_reads_past_none_of_its_tenants_jobs_not_yet_due(
    db: Database, tenant_id: uuid.UUID
) -> None:
    # Thousands of a tenant's jobs wait out a retry's backoff during a model's outage, or were
    # queued to run later; the enqueue's turn was found past each of them, by its row.
    [due] = await enqueue_many(db, tenant_id, "test.flood", 1)
    async with db.system() as session:
        await session.execute(
            text(
                "INSERT INTO jobs (tenant_id, kind, run_after, turn, last_error)"
                " SELECT :t, 'test.flood', now() + interval '1 hour',"
                " now() + interval '1 hour' + make_interval(secs => n), 'model down'"
                " FROM generate_series(1, 3000) AS n"
            ),
            {"t": tenant_id},
        )
    params = {
        "tenant_id": tenant_id,
        "kind": "test.flood",
        "payload": "{}",
        "priority": 0,
        "run_after": None,
        "max_attempts": 4,
        "dedupe_key": None,
    }
    async with db.tenant(tenant_id) as session:
        trial = await session.begin_nested()
        plan = (
            await session.execute(
                text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + repository._ENQUEUE.text), params
            )
        ).scalar_one()
        await trial.rollback()
        after, _ = await repository.enqueue(session, tenant_id, "test.flood", {})
    async with db.system() as session:
        rows = await session.execute(
            text("SELECT id, turn FROM jobs WHERE id IN (:a, :b)"), {"a": due, "b": after}
        )
        turns = {r.id: r.turn for r in rows}
    # A step after the due job, not after the jobs waiting: they do not set the pace.
    assert turns[after] - turns[due] == timedelta(seconds=repository.TURN_STEP_SECONDS)
    # About a dozen: the row, its indexes' entries and the probe for the pace; the probe
    # alone read some ninety, past each of the jobs waiting.
    top = plan[0]["Plan"]
    touched = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    assert touched < 50, touched
