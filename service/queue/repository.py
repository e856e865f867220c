"""The queue's SQL. Every state change is guarded by the state it expects and checked by rowcount.

Claiming crosses tenants and runs as the owning role; everything a handler does for a job,
including marking it done, runs in that job's tenant transaction, so a job's writes and its
completion commit together or not at all.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.rows import dicts


def _rowcount(result: Any) -> int:
    """Rows touched by an UPDATE or DELETE."""
    return int(getattr(result, "rowcount", 0))


@dataclass(frozen=True)
class ClaimedJob:
    """A job this worker holds a lease on."""

    tenant_id: uuid.UUID
    id: int
    kind: str
    payload: dict[str, Any]
    attempts: int
    max_attempts: int
    created_at: datetime
    # What an earlier run of a long job recorded of its work (``checkpoint``), else None.
    progress: dict[str, Any] | None = None
    # The tenant's latest tombstone when the job was claimed (0: none), see ``erased_since``;
    # None for a job not claimed from the queue, which no fence guards.
    erasure_mark: int | None = None


# A job's turn, the claim's order after priority: a virtual time, its run_after or one step
# after the turn of its tenant's latest job queued to run at once, whichever is later. A burst
# of a tenant's jobs takes turns a step apart, so a job another tenant queues after the
# burst's first comes before most of it; a tenant with no such job queued starts at now, and
# the claim does not wait for a turn, so a lone tenant's burst runs at once. The step only has
# to outlast the time a backlogged tenant waits for its next job to be claimed (seconds, with
# the historian's jobs); a longer one keeps the turns fair under a slower queue, and costs a
# lone tenant nothing. A job queued to run later does not set its tenant's pace, nor does one
# put back in the queue (failed, reclaimed, released, retried), even once due: only a job
# whose run_after is not after its created_at does. Those jobs alone are in ix_jobs_pace, so
# the pace is one probe, however many of the tenant's jobs wait out a backoff (thousands, in a
# model's outage) or a later run_after; the latest *due* job was found past each of them, by
# reading its row. Under row-level security the enqueue sees its own tenant's jobs only,
# which are all it needs.
TURN_STEP_SECONDS = 10


def _next_turn(tenant: str, start: str) -> str:
    """The turn of a job of ``tenant`` that is due at ``start`` (SQL expressions)."""
    return f"""GREATEST({start}, (
        SELECT latest.turn FROM jobs AS latest
        WHERE latest.tenant_id = {tenant} AND latest.status = 'queued'
          AND latest.run_after <= latest.created_at
        ORDER BY latest.id DESC LIMIT 1) + make_interval(secs => {TURN_STEP_SECONDS}))"""


# Enqueue, idempotent by (tenant_id, dedupe_key): a repeated request finds the job it made
# the first time instead of making a second one.
_ENQUEUE = text(
    f"""
    INSERT INTO jobs (tenant_id, kind, payload, priority, run_after, turn, max_attempts,
                      dedupe_key)
    VALUES (:tenant_id, :kind, CAST(:payload AS jsonb), :priority,
            COALESCE(CAST(:run_after AS timestamptz), now()),
            {_next_turn(":tenant_id", "COALESCE(CAST(:run_after AS timestamptz), now())")},
            :max_attempts, :dedupe_key)
    ON CONFLICT (tenant_id, dedupe_key) DO NOTHING
    RETURNING id
    """
)

_FIND_BY_DEDUPE = text(
    "SELECT id FROM jobs WHERE tenant_id = :tenant_id AND dedupe_key = :dedupe_key"
)


async def enqueue(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    payload: dict[str, Any] | BaseModel,
    *,
    priority: int = 0,
    run_after: datetime | None = None,
    max_attempts: int = 4,
    dedupe_key: str | None = None,
) -> tuple[int, bool]:
    """Insert a job in the caller's transaction; returns (job id, created). ``payload`` is the
    kind's model (``service.queue.payloads``) or, for kinds without one, a dict."""
    if isinstance(payload, BaseModel):
        payload = payload.model_dump(mode="json")
    params = {
        "tenant_id": tenant_id,
        "kind": kind,
        "payload": json.dumps(payload, ensure_ascii=False),
        "priority": priority,
        "run_after": run_after,
        "max_attempts": max_attempts,
        "dedupe_key": dedupe_key,
    }
    created = (await session.execute(_ENQUEUE, params)).scalar_one_or_none()
    if created is not None:
        return int(created), True
    existing = await session.execute(
        _FIND_BY_DEDUPE, {"tenant_id": tenant_id, "dedupe_key": dedupe_key}
    )
    return int(existing.scalar_one()), False


# Enqueue under a queueing lock: the lock's job queued and not yet started, if there is one,
# takes the request instead of a second job (ux_jobs_queueing_lock, whose WHERE this
# ON CONFLICT names, so concurrent requests meet on its entry and cannot make two). Joining
# keeps the waiting job's payload, its place in the line and its attempts; only the payload's
# :grow field rises to the greater of the two, so the job reads what both asked for. A job
# already started is not in the index: a request during its run queues the next job.
_ENQUEUE_JOINED = text(
    f"""
    INSERT INTO jobs AS j (tenant_id, kind, payload, max_attempts, queueing_lock, turn)
    VALUES (:tenant_id, :kind, CAST(:payload AS jsonb), :max_attempts, :queueing_lock,
            {_next_turn(":tenant_id", "now()")})
    ON CONFLICT (tenant_id, queueing_lock)
        WHERE status = 'queued' AND started_at IS NULL AND queueing_lock IS NOT NULL
    DO UPDATE SET
        payload = j.payload || jsonb_build_object(CAST(:grow AS text), GREATEST(
            CAST(j.payload ->> CAST(:grow AS text) AS bigint),
            CAST(EXCLUDED.payload ->> CAST(:grow AS text) AS bigint))),
        updated_at = now()
    RETURNING id, (xmax = 0) AS created
    """
)


async def enqueue_joined(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    payload: BaseModel,
    *,
    queueing_lock: str,
    grow: str,
    max_attempts: int = 4,
) -> tuple[int, bool]:
    """Queue a job of ``queueing_lock`` in the caller's transaction, or join the lock's job
    that waits to start, raising its payload's integer field ``grow`` to this one's; returns
    (job id, created)."""
    params = {
        "tenant_id": tenant_id,
        "kind": kind,
        "payload": json.dumps(payload.model_dump(mode="json"), ensure_ascii=False),
        "max_attempts": max_attempts,
        "queueing_lock": queueing_lock,
        "grow": grow,
    }
    row = (await session.execute(_ENQUEUE_JOINED, params)).one()
    return int(row.id), bool(row.created)


def enqueue_beside(write: str, *, existing_field: str) -> str:
    """One statement (for asyncpg's positional parameters) that runs a caller's write and
    enqueues a job, so the hot path pays one round trip: ``write`` is a data-modifying CTE
    body (named ``write``) that uses $1 (the tenant) and its own parameters from $8 on; the
    job takes $2 kind, $3 payload (JSON text), $4 max_attempts, $5 dedupe key, and is made
    only when $6 is true; $7 is the request's fingerprint (text, or NULL), kept with the
    receipt so that a repeat of the key can be told from another request reusing it. Both
    halves are idempotent: the write by its own ON CONFLICT, the job by its dedupe key.

    The job is made beside a receipt (``job_receipts``: its id, that field of its payload and
    the fingerprint) that outlives the job by ``receipt_retention_days``, so a repeat after
    the job was pruned still makes none. The row has ``created`` (the new job's id), or
    ``existing``, ``existing_<field>`` and ``existing_fingerprint`` (the receipt's) for the
    job an earlier call made. The outer SELECT runs on the statement's snapshot, so
    ``existing`` never finds the receipt made here, nor one a concurrent call committed while
    this one waited on its job's key: then neither is set, and ``receipt_beside`` reads it."""
    if not existing_field.isidentifier():
        raise ValueError(f"not a payload field name: {existing_field!r}")
    return f"""
WITH write AS (
{write}
), job AS (
    INSERT INTO jobs (tenant_id, kind, payload, max_attempts, dedupe_key, turn)
    SELECT $1, $2, CAST($3 AS jsonb), $4, CAST($5 AS text), {_next_turn("$1", "now()")}
    WHERE $6 AND NOT EXISTS (
        SELECT FROM job_receipts WHERE tenant_id = $1 AND dedupe_key = CAST($5 AS text))
    ON CONFLICT (tenant_id, dedupe_key) DO NOTHING
    RETURNING id
), receipt AS (
    INSERT INTO job_receipts (tenant_id, dedupe_key, job_id, answer, fingerprint)
    SELECT $1, CAST($5 AS text), id, CAST($3 AS jsonb) -> '{existing_field}', CAST($7 AS text)
    FROM job
    ON CONFLICT (tenant_id, dedupe_key) DO NOTHING
)
SELECT (SELECT id FROM job) AS created,
       existing.job_id AS existing,
       existing.answer AS existing_{existing_field},
       existing.fingerprint AS existing_fingerprint
FROM (SELECT 1) AS one
LEFT JOIN job_receipts AS existing
    ON existing.tenant_id = $1 AND existing.dedupe_key = CAST($5 AS text)
"""


def receipt_beside(existing_field: str) -> str:
    """The receipt of $1 (the tenant) and $2 (a dedupe key), in the columns of
    ``enqueue_beside``'s row for a job an earlier call made."""
    if not existing_field.isidentifier():
        raise ValueError(f"not a payload field name: {existing_field!r}")
    return f"""
SELECT job_id AS existing, answer AS existing_{existing_field},
       fingerprint AS existing_fingerprint
FROM job_receipts WHERE tenant_id = $1 AND dedupe_key = $2
"""


# Which of these (tenant, dedupe key) have a job. Asked apart from the rows they are keys of:
# under Citus the jobs stay on the coordinator, where a distributed table's statement cannot
# join them.
_KEYED = text(
    """
    SELECT k.tenant_id, k.dedupe_key
    FROM unnest(CAST(:tenants AS uuid[]), CAST(:keys AS text[])) AS k(tenant_id, dedupe_key)
    WHERE EXISTS (
        SELECT FROM jobs AS j WHERE j.tenant_id = k.tenant_id AND j.dedupe_key = k.dedupe_key)
    """
)


async def keyed(
    session: AsyncSession, keys: list[tuple[uuid.UUID, str]]
) -> set[tuple[uuid.UUID, str]]:
    """Those of ``keys`` (tenant, dedupe key) that have a job, whatever its state."""
    if not keys:
        return set()
    params = {"tenants": [t for t, _ in keys], "keys": [k for _, k in keys]}
    return {(r.tenant_id, r.dedupe_key) for r in await session.execute(_KEYED, params)}


# Claim up to :limit due jobs for this worker.
# - FOR UPDATE SKIP LOCKED: concurrent workers take disjoint jobs without waiting on each other.
# - ORDER BY matches ix_jobs_claimable, whose WHERE matches this one, so it is an index scan
#   that stops at :limit, however many tenants have jobs queued. By turn (see _next_turn):
#   the tenants' jobs in turns within a priority. A job waiting to run (a retry's backoff, a
#   later run_after) has a turn no earlier than its run_after, but may still come before
#   due jobs: at a higher priority, or before the turns of a backlogged tenant, which run
#   ahead of the clock. It is passed over on its index entry (ix_jobs_claimable carries
#   run_after after the id), without a read of its row.
# - The attempt is counted here, at claim time, so a job that keeps killing its worker still
#   runs out of attempts.
# - :kinds (only these kinds) and :skip (not these) split the queue between batched kinds,
#   claimed many at a time, and the rest; NULL means no restriction.
# - A job whose queueing lock a running job holds waits for it (ix_jobs_running_lock: one
#   probe, for the jobs that have a lock): it would read the same rows as that one (the same
#   conversation's messages) and pay the model for them twice, and until it starts, later
#   requests of the lock join it.
_CLAIM = text(
    """
    WITH due AS (
        SELECT tenant_id, id FROM jobs
        WHERE status = 'queued' AND run_after <= now()
          AND (CAST(:kinds AS text[]) IS NULL OR kind = ANY(CAST(:kinds AS text[])))
          AND (CAST(:skip AS text[]) IS NULL OR kind <> ALL(CAST(:skip AS text[])))
          AND (queueing_lock IS NULL OR NOT EXISTS (
              SELECT FROM jobs AS holder
              WHERE holder.tenant_id = jobs.tenant_id AND holder.status = 'running'
                AND holder.queueing_lock = jobs.queueing_lock))
        ORDER BY priority DESC, turn, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        lease_owner = :worker,
        lease_expires_at = now() + make_interval(secs => :lease),
        started_at = now(),
        updated_at = now()
    FROM due
    WHERE j.tenant_id = due.tenant_id AND j.id = due.id
    RETURNING j.tenant_id, j.id, j.kind, j.payload, j.attempts, j.max_attempts, j.created_at,
              j.result AS progress
    """
)


async def claim_jobs(
    session: AsyncSession,
    worker: str,
    limit: int,
    lease: float,
    *,
    kinds: list[str] | None = None,
    skip: list[str] | None = None,
) -> list[ClaimedJob]:
    """Lease up to ``limit`` due jobs, most urgent first: only of ``kinds`` when given, and
    none of ``skip``."""
    params = {
        "worker": worker,
        "limit": limit,
        "lease": lease,
        "kinds": kinds or None,
        "skip": skip or None,
    }
    rows = list(await session.execute(_CLAIM, params))
    marks = {t: await erasure_mark(session, t) for t in {r.tenant_id for r in rows}}
    return [
        ClaimedJob(
            tenant_id=r.tenant_id,
            id=r.id,
            kind=r.kind,
            payload=r.payload,
            attempts=r.attempts,
            max_attempts=r.max_attempts,
            created_at=r.created_at,
            progress=r.progress,
            erasure_mark=marks[r.tenant_id],
        )
        for r in rows
    ]


# The erasure fence: a job that read a tenant's rows before a person's or a group's erasure
# writes nothing after it. Under READ COMMITTED each statement sees what had committed when
# it began, so the fence is a lock and an order, not a look at timestamps (a tombstone's
# created_at is its transaction's start, which may come before a job that still read the
# person's rows, the erasure not having committed yet):
# - an erasure takes its tenant's lock exclusively before its first statement (``erasing``)
#   and holds it to its commit: one erasure of a tenant at a time, and none while a job's
#   transaction holds the lock shared;
# - the claim reads the tenant's latest tombstone id, the job's mark, after taking the job's
#   row. Every tombstone committed later has a greater id: it was inserted either later (ids
#   grow) or by the one erasure under way, which took the lock after every earlier tombstone
#   of the tenant committed. An erasure that touches the job's own row (deletes it, redacts
#   its payload) waits for the claim's commit, so it cannot fall between the two;
# - every transaction a job opens through its context takes the lock shared, then, in a
#   statement of its own (whose snapshot begins after the lock is held), looks for a
#   tombstone past the mark. None: every erasure either committed before the job's rows were
#   read, or waits for this commit and then finds (and erases) what it wrote. One: the job
#   read rows from before that erasure, and must not write them.
_FENCE_KEY = "hashtextextended('memoria.erasures/' || CAST(:tenant_id AS text), 0)"
_ERASING = text(f"SELECT pg_advisory_xact_lock({_FENCE_KEY})")
_FENCED = text(f"SELECT pg_advisory_xact_lock_shared({_FENCE_KEY})")
# By the primary key (tenant_id, id): one index probe, however many tombstones.
_ERASURE_MARK = text("SELECT max(id) FROM erasures WHERE tenant_id = :tenant_id")
_ERASED_SINCE = text(
    "SELECT EXISTS (SELECT FROM erasures WHERE tenant_id = :tenant_id AND id > :mark)"
)


async def erasing(session: AsyncSession, tenant_id: uuid.UUID) -> None:
    """Hold the tenant's erasure fence for the caller's transaction: an erasure's first
    statement (it then waits for the jobs' transactions under way in the tenant)."""
    await session.execute(_ERASING, {"tenant_id": str(tenant_id)})


async def erasure_mark(session: AsyncSession, tenant_id: uuid.UUID) -> int:
    """The tenant's latest tombstone id, 0 when it has none."""
    found = await session.execute(_ERASURE_MARK, {"tenant_id": tenant_id})
    return int(found.scalar_one() or 0)


async def erased_since(session: AsyncSession, tenant_id: uuid.UUID, mark: int) -> bool:
    """Whether a person or a group of the tenant was erased after ``mark``; the caller's
    transaction then holds the fence shared, so no erasure commits before it does."""
    await session.execute(_FENCED, {"tenant_id": str(tenant_id)})
    found = await session.execute(_ERASED_SINCE, {"tenant_id": tenant_id, "mark": mark})
    return bool(found.scalar_one())


# Renew the leases of every job this worker still holds; a job missing from RETURNING was
# taken from us (our lease had expired and another worker reclaimed it).
_HEARTBEAT = text(
    """
    UPDATE jobs SET lease_expires_at = now() + make_interval(secs => :lease), updated_at = now()
    WHERE status = 'running' AND lease_owner = :worker AND id = ANY(:ids)
    RETURNING id
    """
)


async def heartbeat(session: AsyncSession, worker: str, ids: list[int], lease: float) -> set[int]:
    """Extend leases; returns the ids still held."""
    if not ids:
        return set()
    rows = await session.execute(_HEARTBEAT, {"worker": worker, "ids": ids, "lease": lease})
    return {r.id for r in rows}


# Done, only if we still hold the lease. Runs inside the handler's tenant transaction: if the
# lease was lost, the caller raises and the handler's writes roll back with it.
_COMPLETE = text(
    """
    UPDATE jobs
    SET status = 'done', result = CAST(:result AS jsonb), finished_at = now(), updated_at = now(),
        lease_owner = NULL, lease_expires_at = NULL, last_error = NULL
    WHERE tenant_id = :tenant_id AND id = :id AND status = 'running' AND lease_owner = :worker
    """
)


async def complete(
    session: AsyncSession, job: ClaimedJob, worker: str, result: dict[str, Any] | None
) -> bool:
    """Mark a held job done; False when the lease was lost."""
    params = {
        "tenant_id": job.tenant_id,
        "id": job.id,
        "worker": worker,
        "result": json.dumps(result, ensure_ascii=False) if result is not None else None,
    }
    return _rowcount(await session.execute(_COMPLETE, params)) == 1


# What a long job has done so far, kept in its result (until it is done, nothing else writes
# there) by each of its steps' transactions, only if we still hold the lease.
_CHECKPOINT = text(
    """
    UPDATE jobs SET result = CAST(:progress AS jsonb), updated_at = now()
    WHERE tenant_id = :tenant_id AND id = :id AND status = 'running' AND lease_owner = :worker
    """
)


async def checkpoint(
    session: AsyncSession, job: ClaimedJob, worker: str, progress: dict[str, Any]
) -> bool:
    """Record a held job's progress in the caller's transaction; False when the lease was
    lost. A later run of the job reads it back as ``ClaimedJob.progress``."""
    params = {
        "tenant_id": job.tenant_id,
        "id": job.id,
        "worker": worker,
        "progress": json.dumps(progress, ensure_ascii=False),
    }
    return _rowcount(await session.execute(_CHECKPOINT, params)) == 1


# A held job's row locked, for a last transaction that deletes it with the rest of its
# tenant (see JobContext.vanishing): no row, no lease.
_HOLD = text(
    """
    SELECT 1 FROM jobs
    WHERE tenant_id = :tenant_id AND id = :id AND status = 'running' AND lease_owner = :worker
    FOR UPDATE
    """
)


async def hold(session: AsyncSession, job: ClaimedJob, worker: str) -> bool:
    """Lock a held job's row to the end of the transaction; False when the lease was lost."""
    params = {"tenant_id": job.tenant_id, "id": job.id, "worker": worker}
    return (await session.execute(_HOLD, params)).first() is not None


# A batch's jobs done in one statement, each only if we still hold its lease; the ids
# returned are those completed. Runs in the batch's tenant transaction, like _COMPLETE.
_COMPLETE_MANY = text(
    """
    UPDATE jobs AS j
    SET status = 'done', result = CAST(done.result AS jsonb), finished_at = now(),
        updated_at = now(), lease_owner = NULL, lease_expires_at = NULL, last_error = NULL
    FROM unnest(CAST(:ids AS bigint[]), CAST(:results AS text[])) AS done(id, result)
    WHERE j.tenant_id = :tenant_id AND j.id = done.id AND j.status = 'running'
      AND j.lease_owner = :worker
    RETURNING j.id
    """
)


async def complete_many(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    worker: str,
    results: dict[int, dict[str, Any] | None],
) -> set[int]:
    """Mark one tenant's held jobs done (job id → result); returns the ids completed (a job
    missing from them was taken over: its lease was lost)."""
    if not results:
        return set()
    ids = list(results)
    params = {
        "tenant_id": tenant_id,
        "worker": worker,
        "ids": ids,
        "results": [
            json.dumps(results[i], ensure_ascii=False) if results[i] is not None else None
            for i in ids
        ],
    }
    return {int(r.id) for r in await session.execute(_COMPLETE_MANY, params)}


# A failed attempt: back to 'queued' after :delay, or 'failed' for good once attempts are
# used up (or when the error is permanent). The error text is kept either way. Like a job
# whose worker died (_RECLAIM), it goes to the back of its tenant's line: kept at its early
# turn, it was taken again before anything its tenant queued meanwhile, so a job that kills
# or fails its worker used up its attempts back to back (and with it a batch's other jobs,
# claimed beside it each time); and while it waits out its backoff, it would sit at the
# front of the claimable index for every claim to pass over.
_FAIL = text(
    f"""
    UPDATE jobs
    SET status = CASE WHEN :permanent OR attempts >= max_attempts THEN 'failed' ELSE 'queued' END,
        run_after = now() + make_interval(secs => :delay),
        turn = {_next_turn("jobs.tenant_id", "now() + make_interval(secs => :delay)")},
        finished_at = CASE WHEN :permanent OR attempts >= max_attempts THEN now() END,
        last_error = :error,
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = now()
    WHERE tenant_id = :tenant_id AND id = :id AND status = 'running' AND lease_owner = :worker
    RETURNING status
    """
)


async def fail(
    session: AsyncSession,
    job: ClaimedJob,
    worker: str,
    error: str,
    delay: float,
    *,
    permanent: bool = False,
) -> str | None:
    """Record a failed attempt; returns the new status, or None when the lease was lost."""
    params = {
        "tenant_id": job.tenant_id,
        "id": job.id,
        "worker": worker,
        "error": error[:4000],
        "delay": delay,
        "permanent": permanent,
    }
    return (await session.execute(_FAIL, params)).scalar_one_or_none()


# Give back a job we will not finish (shutdown): the attempt we counted did not really run.
_RELEASE = text(
    """
    UPDATE jobs
    SET status = 'queued', attempts = GREATEST(attempts - 1, 0), run_after = now(),
        lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
    WHERE tenant_id = :tenant_id AND id = :id AND status = 'running' AND lease_owner = :worker
    """
)


async def release(session: AsyncSession, job: ClaimedJob, worker: str) -> bool:
    """Put a held job back in the queue untouched."""
    params = {"tenant_id": job.tenant_id, "id": job.id, "worker": worker}
    return _rowcount(await session.execute(_RELEASE, params)) == 1


# Give back a job the erasure fence stopped: it runs again at once, on the rows as the
# erasure left them, its attempt not counted (the erasure was not the job's failure). The
# times it was stopped are kept in its result (a later run's progress) and its error.
_RERUN = text(
    """
    UPDATE jobs
    SET status = 'queued', attempts = GREATEST(attempts - 1, 0), run_after = now(),
        lease_owner = NULL, lease_expires_at = NULL, updated_at = now(),
        result = COALESCE(result, '{}'::jsonb) || jsonb_build_object('erasures_fenced',
                 COALESCE(CAST(result ->> 'erasures_fenced' AS int), 0) + 1),
        last_error = :error
    WHERE tenant_id = :tenant_id AND id = :id AND status = 'running' AND lease_owner = :worker
    """
)


async def rerun(session: AsyncSession, job: ClaimedJob, worker: str, error: str) -> bool:
    """Put a held job back in the queue to run again from the start; False when it is gone
    (an erasure deleted it) or was taken over."""
    params = {"tenant_id": job.tenant_id, "id": job.id, "worker": worker, "error": error}
    return _rowcount(await session.execute(_RERUN, params)) == 1


# Give back a job that cannot go on yet (its tenant's budget of model calls is spent): due
# again once it can, its attempt not counted (waiting is not failing, and a job waits as
# often as its tenant's work outruns the budget). Like a failed attempt (_FAIL), it goes to
# the back of its tenant's line. Why it waits is its last_error until it is done.
_DEFER = text(
    f"""
    UPDATE jobs
    SET status = 'queued', attempts = GREATEST(attempts - 1, 0),
        run_after = now() + make_interval(secs => :delay),
        turn = {_next_turn("jobs.tenant_id", "now() + make_interval(secs => :delay)")},
        lease_owner = NULL, lease_expires_at = NULL, last_error = :note, updated_at = now()
    WHERE tenant_id = :tenant_id AND id = :id AND status = 'running' AND lease_owner = :worker
    """
)


async def defer(
    session: AsyncSession, job: ClaimedJob, worker: str, note: str, delay: float
) -> bool:
    """Put a held job back in the queue, due in ``delay`` seconds; False when it is gone or
    was taken over."""
    params = {
        "tenant_id": job.tenant_id,
        "id": job.id,
        "worker": worker,
        "note": note[:4000],
        "delay": delay,
    }
    return _rowcount(await session.execute(_DEFER, params)) == 1


# Jobs whose worker died: the lease ran out with no heartbeat. They go back to the queue
# (their attempt was already counted at claim), at the back of their tenant's line (see
# _FAIL), or to 'failed' if that was the last one.
_RECLAIM = text(
    f"""
    UPDATE jobs
    SET status = CASE WHEN attempts >= max_attempts THEN 'failed' ELSE 'queued' END,
        finished_at = CASE WHEN attempts >= max_attempts THEN now() END,
        last_error = 'lease expired: the worker ' || COALESCE(lease_owner, '?')
                     || ' stopped without finishing',
        run_after = now(),
        turn = {_next_turn("jobs.tenant_id", "now()")},
        lease_owner = NULL,
        lease_expires_at = NULL,
        updated_at = now()
    WHERE status = 'running' AND lease_expires_at < now()
    RETURNING id
    """
)


async def reclaim_expired(session: AsyncSession) -> int:
    """Requeue jobs whose lease expired; returns how many."""
    return len((await session.execute(_RECLAIM)).all())


_RETRY = text(
    """
    UPDATE jobs
    SET status = 'queued', attempts = 0, run_after = now(), finished_at = NULL, updated_at = now()
    WHERE tenant_id = :tenant_id AND id = :id AND status = 'failed'
    RETURNING id
    """
)


async def retry(session: AsyncSession, tenant_id: uuid.UUID, job_id: int) -> bool:
    """Give a failed job a fresh set of attempts; False unless it was failed."""
    result = await session.execute(_RETRY, {"tenant_id": tenant_id, "id": job_id})
    return result.scalar_one_or_none() is not None


# Done jobs older than the retention; failed jobs older than failed_max_age_days, and beyond
# the newest failed_max_files per tenant (the seeds' policy for the failed/ directory);
# receipts older than theirs (by ix_job_receipts_created: a day's receipts at a time).
_PRUNE_RECEIPTS = text(
    "DELETE FROM job_receipts WHERE created_at < now() - make_interval(secs => :age)"
)
_PRUNE_DONE = text(
    "DELETE FROM jobs WHERE status = 'done' AND finished_at < now() - make_interval(secs => :age)"
)
_PRUNE_FAILED_AGE = text(
    "DELETE FROM jobs WHERE status = 'failed'"
    " AND finished_at < now() - make_interval(days => :days)"
)
_PRUNE_FAILED_COUNT = text(
    """
    DELETE FROM jobs AS j USING (
        SELECT tenant_id, id,
               row_number() OVER (PARTITION BY tenant_id ORDER BY finished_at DESC, id DESC) AS n
        FROM jobs WHERE status = 'failed'
    ) AS ranked
    WHERE j.tenant_id = ranked.tenant_id AND j.id = ranked.id AND ranked.n > :keep
    """
)


async def prune(
    session: AsyncSession,
    done_age_seconds: float,
    failed_max_age_days: int,
    failed_max_count: int,
    receipt_age_days: float,
) -> int:
    """Delete finished jobs past their retention, and receipts past theirs; returns how many
    jobs."""
    await session.execute(_PRUNE_RECEIPTS, {"age": receipt_age_days * 86400})
    deleted = (await session.execute(_PRUNE_DONE, {"age": done_age_seconds})).rowcount  # type: ignore[attr-defined]
    if failed_max_age_days > 0:
        deleted += (
            await session.execute(_PRUNE_FAILED_AGE, {"days": failed_max_age_days})
        ).rowcount  # type: ignore[attr-defined]
    if failed_max_count > 0:
        deleted += (await session.execute(_PRUNE_FAILED_COUNT, {"keep": failed_max_count})).rowcount  # type: ignore[attr-defined]
    return int(deleted)


_COUNTS = text(
    """
    SELECT status, count(*) AS n,
           EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE status = 'queued')) AS oldest
    FROM jobs GROUP BY status
    """
)


async def status_counts(session: AsyncSession) -> tuple[dict[str, int], float | None]:
    """Jobs per status, and the age in seconds of the oldest queued job."""
    counts = {"queued": 0, "running": 0, "done": 0, "failed": 0}
    oldest: float | None = None
    for row in await session.execute(_COUNTS):
        counts[row.status] = int(row.n)
        if row.oldest is not None:
            oldest = float(row.oldest)
    return counts, oldest


_LIST = text(
    """
    SELECT id, kind, status, priority, attempts, max_attempts, run_after, last_error, result,
           created_at, started_at, finished_at
    FROM jobs
    WHERE tenant_id = :tenant_id AND (CAST(:status AS text) IS NULL OR status = :status)
      AND (CAST(:before AS bigint) IS NULL OR id < :before)
    ORDER BY id DESC
    LIMIT :limit
    """
)


async def list_jobs(
    session: AsyncSession, tenant_id: uuid.UUID, status: str | None, before: int | None, limit: int
) -> list[dict[str, Any]]:
    """A tenant's jobs, newest first, paginated by id."""
    params = {"tenant_id": tenant_id, "status": status, "before": before, "limit": limit}
    return dicts(await session.execute(_LIST, params))


_GET = text(
    """
    SELECT id, kind, status, priority, attempts, max_attempts, run_after, last_error, result,
           created_at, started_at, finished_at
    FROM jobs WHERE tenant_id = :tenant_id AND id = :id
    """
)


async def get_job(
    session: AsyncSession, tenant_id: uuid.UUID, job_id: int
) -> dict[str, Any] | None:
    """One of a tenant's jobs."""
    row = (await session.execute(_GET, {"tenant_id": tenant_id, "id": job_id})).first()
    return dict(row._mapping) if row is not None else None


# The jobs of one piece of work across tenants (e.g. a re-embedding run), found by kind and
# by what their payload contains. Only for operators' commands: no index serves it.
_WORK_STATUS = text(
    """
    SELECT status, count(*) AS n,
           (array_agg(last_error ORDER BY updated_at DESC)
                FILTER (WHERE last_error IS NOT NULL))[1] AS last_error
    FROM jobs WHERE kind = ANY(:kinds) AND payload @> CAST(:match AS jsonb)
    GROUP BY status
    """
)


async def work_status(
    session: AsyncSession, kinds: list[str], match: dict[str, Any]
) -> tuple[dict[str, int], str | None]:
    """Jobs of these kinds whose payload contains ``match``, per status; the latest error."""
    counts = {"queued": 0, "running": 0, "done": 0, "failed": 0}
    error: str | None = None
    params = {"kinds": kinds, "match": json.dumps(match)}
    for row in await session.execute(_WORK_STATUS, params):
        counts[row.status] = int(row.n)
        if row.status == "failed" or error is None:
            error = row.last_error or error
    return counts, error


_OPEN_WORK = text(
    """
    SELECT tenant_id, payload FROM jobs
    WHERE status IN ('queued', 'running') AND kind = ANY(:kinds)
      AND payload @> CAST(:match AS jsonb)
    """
)


async def open_work(
    session: AsyncSession, kinds: list[str], match: dict[str, Any]
) -> list[tuple[uuid.UUID, dict[str, Any]]]:
    """The queued or running jobs of these kinds whose payload contains ``match``:
    (tenant, payload)."""
    params = {"kinds": kinds, "match": json.dumps(match)}
    rows = await session.execute(_OPEN_WORK, params)
    return [
        (r.tenant_id, json.loads(r.payload) if isinstance(r.payload, str) else r.payload)
        for r in rows
    ]


# Failed jobs of one piece of work get a fresh set of attempts (an operator fixed the cause).
_RETRY_WORK = text(
    """
    UPDATE jobs
    SET status = 'queued', attempts = 0, run_after = now(), finished_at = NULL, updated_at = now()
    WHERE status = 'failed' AND kind = ANY(:kinds) AND payload @> CAST(:match AS jsonb)
    """
)


async def retry_work(session: AsyncSession, kinds: list[str], match: dict[str, Any]) -> int:
    """Queue again the failed jobs of these kinds whose payload contains ``match``."""
    result = await session.execute(_RETRY_WORK, {"kinds": kinds, "match": json.dumps(match)})
    return _rowcount(result)


# Queued jobs of abandoned work are dropped; a running one finds its work gone and stops.
_DROP_WORK = text(
    """
    DELETE FROM jobs
    WHERE status = 'queued' AND kind = ANY(:kinds) AND payload @> CAST(:match AS jsonb)
    """
)


async def drop_work(session: AsyncSession, kinds: list[str], match: dict[str, Any]) -> int:
    """Delete the queued jobs of these kinds whose payload contains ``match``."""
    result = await session.execute(_DROP_WORK, {"kinds": kinds, "match": json.dumps(match)})
    return _rowcount(result)


_REPLACE_PAYLOAD = text(
    "UPDATE jobs SET payload = CAST(:payload AS jsonb) WHERE tenant_id = :tenant_id AND id = :id"
)


async def replace_payload(
    session: AsyncSession, tenant_id: uuid.UUID, job_id: int, payload: BaseModel
) -> None:
    """Overwrite a job's payload (an erasure's job must not keep the id it erased)."""
    params = {
        "tenant_id": tenant_id,
        "id": job_id,
        "payload": json.dumps(payload.model_dump(mode="json"), ensure_ascii=False),
    }
    await session.execute(_REPLACE_PAYLOAD, params)


_KIND_QUEUED = text(
    """
    SELECT 1 FROM jobs WHERE tenant_id = :tenant_id AND status = 'queued' AND kind = :kind LIMIT 1
    """
)


async def kind_queued(session: AsyncSession, tenant_id: uuid.UUID, kind: str) -> bool:
    """Whether the tenant has a job of this kind not yet started (it will see what commits now)."""
    params = {"tenant_id": tenant_id, "kind": kind}
    return (await session.execute(_KIND_QUEUED, params)).first() is not None


# A tenant's newest job of a kind in these statuses whose payload holds ``match``
# (ix_jobs_unfinished: only its unfinished jobs of that kind are read, newest first).
_UNFINISHED = text(
    """
    SELECT id, status FROM jobs
    WHERE tenant_id = :tenant_id AND status = ANY(CAST(:statuses AS text[])) AND kind = :kind
      AND payload @> CAST(:match AS jsonb)
    ORDER BY id DESC LIMIT 1
    """
)


async def unfinished(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    match: dict[str, Any] | None = None,
    *,
    running: bool = True,
) -> tuple[int, str] | None:
    """(id, status) of the tenant's newest job of ``kind`` that is not done (queued, failed,
    and unless ``running`` is False running), whose payload holds ``match``, if any."""
    params = {
        "tenant_id": tenant_id,
        "kind": kind,
        "statuses": ["queued", "failed", *(["running"] if running else [])],
        "match": json.dumps(match or {}, ensure_ascii=False),
    }
    row = (await session.execute(_UNFINISHED, params)).first()
    return (int(row.id), str(row.status)) if row is not None else None


_KIND_STATUS_COUNTS = text("SELECT kind, status, count(*) AS n FROM jobs GROUP BY kind, status")


async def kind_status_counts(session: AsyncSession) -> list[tuple[str, str, int]]:
    """Jobs per (kind, status), for the metrics."""
    rows = await session.execute(_KIND_STATUS_COUNTS)
    return [(str(r.kind), str(r.status), int(r.n)) for r in rows]


# ---------------------------------------------------------------- erasure
# An erasure (service.privacy.erasure) removes or rewrites the jobs that hold a person's or a
# group's data, in the erasure's transaction. Its registries run these statements with their
# parameters: :t the tenant, :u the person, :pk their private conversation, :spare the
# erasure's own job (which scrubs its payload itself); :g the group, :k its conversation.

# A person's hand-overs, their private chat's jobs, an export or erasure of them.
DELETE_JOBS_OF_PERSON = """DELETE FROM jobs WHERE tenant_id = :t AND id <> :spare
           AND (payload -> 'context' ->> 'sender_id' = :u
                OR payload -> 'context' ->> 'user_id' = :u
                OR payload ->> 'conversation_key' = :pk
                OR (kind IN ('privacy.export', 'privacy.erase_user')
                    AND COALESCE(payload ->> 'subject', payload ->> 'user_id') = :u
                    AND COALESCE(payload ->> 'kind', 'user') = 'user'))"""

# A group's hand-overs and conversation jobs, and an export of it.
DELETE_JOBS_OF_GROUP = (
    "DELETE FROM jobs WHERE tenant_id = :t AND (payload -> 'context' ->> 'group_id'"
    " = :g OR payload ->> 'conversation_key' = :k OR (kind = 'privacy.export'"
    " AND payload ->> 'kind' = 'group' AND payload ->> 'subject' = :g))"
)

_JOBS_OF_CONVERSATIONS = text(
    """
    SELECT id, payload, result, last_error FROM jobs WHERE tenant_id = :tenant_id
      AND (payload -> 'context' ->> 'group_id' = ANY(:groups)
           OR payload ->> 'conversation_key' = ANY(:keys))
    """
)


async def jobs_of_conversations(
    session: AsyncSession, tenant_id: uuid.UUID, groups: list[str], keys: list[str]
) -> list[Any]:
    """The tenant's jobs of these groups or conversations: (id, payload, result, last_error)."""
    params = {"tenant_id": tenant_id, "groups": groups, "keys": keys}
    return list(await session.execute(_JOBS_OF_CONVERSATIONS, params))


_REWRITE = text(
    """
    UPDATE jobs SET payload = CAST(:payload AS jsonb), result = CAST(:result AS jsonb),
                    last_error = :last_error
    WHERE tenant_id = :tenant_id AND id = :id
    """
)


async def rewrite(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    job_id: int,
    payload: dict[str, Any],
    result: dict[str, Any] | None,
    last_error: str | None,
) -> None:
    """Replace what a job holds (an erasure's redaction of someone's name in it)."""
    params = {
        "tenant_id": tenant_id,
        "id": job_id,
        "last_error": last_error,
        "payload": json.dumps(payload, ensure_ascii=False),
        "result": json.dumps(result, ensure_ascii=False) if result is not None else None,
    }
    await session.execute(_REWRITE, params)
