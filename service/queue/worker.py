"""The worker loop: claim, run, heartbeat, retry; woken by LISTEN/NOTIFY, polling as fallback."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import random
import socket
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import Database
from service.errors import Unavailable
from service.observability import JOB_DONE, JOB_FAILURES, JOB_LATENCY, JOB_RETRIES, job_id_var
from service.queue import repository
from service.queue.repository import ClaimedJob
from service.settings import QueueSettings

log = logging.getLogger("service.worker")

CHANNEL = "memoria_jobs"


class PermanentJobError(Exception):
    """A job that can never succeed (bad payload, unknown kind): fail it without retrying."""


class LeaseLost(Exception):
    """Another worker took this job over; our writes for it must not commit."""


class JobInterrupted(Exception):
    """The worker is stopping: a long job stopped between two committed steps and goes back
    to the queue, to go on where it stopped."""


class Deferred(Exception):
    """The job cannot go on before ``delay`` seconds (its tenant's budget of model calls is
    spent): it goes back to the queue to run then, its attempt not counted, never failed
    for it."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


@dataclass
class JobRun:
    """The run of a job (or of a batch, one tenant's jobs) that the current task is part of:
    what a job calls without being handed its job (the historian's model) reads it here."""

    tenant_id: uuid.UUID
    # Calls the run was granted from its tenant's budget so far: a run that was granted some
    # waits for more rather than being deferred, which would make it ask for them again.
    spent: int = 0


# Set around each job and batch; None outside them.
current_run: contextvars.ContextVar[JobRun | None] = contextvars.ContextVar(
    "current_run", default=None
)


class ErasedMeanwhile(Exception):
    """A person or a group of the job's tenant was erased after the job was claimed: what it
    read may be theirs, so none of it is written (see ``repository.erased_since``)."""


# Why a fenced job is queued again (its last_error until it is done).
RERUN_NOTE = "a person or group of the tenant was erased while the job ran; it runs again"


def with_notes(job: ClaimedJob, result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The job's result, noting the runs the erasure fence stopped before this one."""
    fenced = (job.progress or {}).get("erasures_fenced")
    if not fenced:
        return result
    return {**(result or {}), "erasures_fenced": fenced}


async def fence(session: AsyncSession, jobs: list[ClaimedJob]) -> None:
    """The erasure fence in a transaction of these jobs (one tenant's): it holds the
    tenant's fence shared until it ends, and ``ErasedMeanwhile`` if an erasure came after
    any of their claims."""
    marks = [job.erasure_mark for job in jobs if job.erasure_mark is not None]
    if marks and await repository.erased_since(session, jobs[0].tenant_id, min(marks)):
        raise ErasedMeanwhile(f"jobs {[job.id for job in jobs]}: {RERUN_NOTE}")


@dataclass
class JobContext:
    """What a handler gets besides the job: tenant transactions and a way to finish in one."""

    job: ClaimedJob
    db: Database
    worker_id: str
    result: dict[str, Any] | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = field(default=False, init=False)

    def stop_point(self) -> None:
        """Between two committed steps of a long job: give the job back if the worker is
        stopping (a shutdown then waits for one step, not for the whole job)."""
        if self.stopping.is_set():
            raise JobInterrupted(f"job {self.job.id}: the worker is stopping")

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A transaction in the job's tenant (row-level security applies), behind the
        erasure fence: ``ErasedMeanwhile`` if a person or a group of the tenant was erased
        after the job was claimed, and no erasure commits before this transaction ends."""
        async with self.db.tenant(self.job.tenant_id) as session:
            await fence(session, [self.job])
            yield session

    @asynccontextmanager
    async def finishing(self, *, fenced: bool = True) -> AsyncIterator[AsyncSession]:
        """The job's last transaction: its writes and the job's completion commit together.

        If the lease was lost meanwhile, ``LeaseLost`` rolls the writes back, so a job that a
        second worker took over never has its effects applied twice. Behind the erasure
        fence (see ``transaction``), but for an erasure's own job (``fenced=False``), which
        takes the fence itself.
        """
        async with self.db.tenant(self.job.tenant_id) as session:
            if fenced:
                await fence(session, [self.job])
            yield session
            await self.complete_in(session)

    @asynccontextmanager
    async def vanishing(self) -> AsyncIterator[AsyncSession]:
        """The last transaction of a job whose writes delete its own row (its tenant's
        erasure), as the owning role: the lease is checked and the row locked first, and
        there is nothing left to mark done. ``LeaseLost`` if another worker took it over."""
        async with self.db.system() as session:
            if not await repository.hold(session, self.job, self.worker_id):
                raise LeaseLost(f"job {self.job.id}: lease lost before its last transaction")
            yield session
        self.finished = True

    async def checkpoint(self, session: AsyncSession, progress: dict[str, Any]) -> None:
        """Record what the job has done so far in the caller's transaction, so it commits
        with that step's writes; a later run reads it as ``job.progress``. ``LeaseLost`` if
        another worker took the job over."""
        if not await repository.checkpoint(session, self.job, self.worker_id, progress):
            raise LeaseLost(f"job {self.job.id}: lease lost before a checkpoint")

    async def complete_in(self, session: AsyncSession) -> None:
        """Mark the job done in the caller's transaction, so it commits with the job's writes."""
        result = with_notes(self.job, self.result)
        if not await repository.complete(session, self.job, self.worker_id, result):
            raise LeaseLost(f"job {self.job.id}: lease lost before completion")
        self.finished = True


JobHandler = Callable[[JobContext], Awaitable[dict[str, Any] | None]]


@dataclass
class BatchContext:
    """Jobs of one kind and one tenant that a batch handler runs together.

    The handler finishes the jobs it can with ``finishing()`` (their writes and completions in
    one transaction), or one at a time with each job's own ``JobContext``; it puts a job that
    failed on its own in ``failed``, so that its batch-mates go on. What the handler leaves
    unfinished and not failed runs again one by one with the kind's job handler.
    """

    jobs: list[ClaimedJob]
    db: Database
    worker_id: str
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    failed: dict[int, Exception] = field(default_factory=dict)
    contexts: dict[int, JobContext] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        tenants = {job.tenant_id for job in self.jobs}
        if len(tenants) > 1:
            raise ValueError("a batch holds the jobs of one tenant")
        self.contexts = {
            job.id: JobContext(
                job=job, db=self.db, worker_id=self.worker_id, stopping=self.stopping
            )
            for job in self.jobs
        }

    @property
    def tenant_id(self) -> uuid.UUID:
        """The tenant whose jobs these are."""
        return self.jobs[0].tenant_id

    def job(self, job_id: int) -> JobContext:
        """One job's context, for the steps that run per job."""
        return self.contexts[job_id]

    def stop_point(self) -> None:
        """Between two steps: give the batch back if the worker is stopping."""
        if self.stopping.is_set():
            raise JobInterrupted("the worker is stopping")

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A transaction in the batch's tenant, behind the erasure fence (see
        ``JobContext.transaction``) for all its jobs."""
        async with self.db.tenant(self.tenant_id) as session:
            await fence(session, self.jobs)
            yield session

    @asynccontextmanager
    async def finishing(self, job_ids: list[int]) -> AsyncIterator[AsyncSession]:
        """The last transaction of these jobs: the writes, then every job marked done with
        its context's ``result``, in one statement. If any lease was lost meanwhile,
        ``LeaseLost`` rolls the whole transaction back (the handler may then finish the
        others one by one); so does ``ErasedMeanwhile`` (the erasure fence, see
        ``JobContext.transaction``)."""
        async with self.db.tenant(self.tenant_id) as session:
            await fence(session, [self.contexts[i].job for i in job_ids])
            yield session
            results = {
                i: with_notes(self.contexts[i].job, self.contexts[i].result) for i in job_ids
            }
            completed = await repository.complete_many(
                session, self.tenant_id, self.worker_id, results
            )
            if completed != set(job_ids):
                lost = sorted(set(job_ids) - completed)
                raise LeaseLost(f"jobs {lost}: lease lost before completion")
        for job_id in job_ids:
            self.contexts[job_id].finished = True


BatchHandler = Callable[[BatchContext], Awaitable[None]]

# Batches a worker runs at once: while one waits on the database, the next one's CPU work
# goes on; more would mostly race for the same profiles.
BATCHES_IN_FLIGHT = 2


@dataclass(frozen=True)
class Periodic:
    """Work a worker runs every ``interval`` seconds (several workers may run it; it must be
    safe to run concurrently, e.g. by claiming rows with SKIP LOCKED)."""

    name: str
    interval: float
    run: Callable[[], Awaitable[Any]]


def retry_delay(attempt: int, base: float, cap: float) -> float:
    """Exponential backoff with jitter: about base·2^(attempt-1), never above cap."""
    ceiling = min(cap, base * 2 ** max(attempt - 1, 0))
    return float(random.uniform(ceiling / 2, ceiling))  # noqa: S311


# The longest wait between two tries of an unreachable database (the wake-up on the LISTEN
# connection's return usually ends a wait sooner).
OUTAGE_BACKOFF_CAP = 5.0


class Outage:
    """Consecutive failures of one of the worker's database loops: an exponential backoff,
    and one log line when the outage starts and one when it ends (not one per try)."""

    def __init__(self, worker: str, loop: str, base: float, cap: float) -> None:
        self.worker = worker
        self.loop = loop
        self.base = base
        self.cap = cap
        self.failures = 0
        self.since = 0.0

    def failed(self, exc: BaseException) -> float:
        """Count a failed try; returns how long to wait before the next one."""
        self.failures += 1
        # A lost connection needs no traceback; anything else gets one.
        expected = isinstance(
            exc, Unavailable | OSError | asyncpg.PostgresError | asyncpg.InterfaceError
        )
        if self.failures == 1:
            self.since = time.monotonic()
            log.warning(
                "worker %s: %s: %s (%s); retrying with backoff",
                self.worker,
                self.loop,
                "database unavailable" if expected else "unexpected error",
                exc,
                exc_info=None if expected else exc,
            )
        else:
            log.debug("worker %s: %s: still failing (%s)", self.worker, self.loop, exc)
        return retry_delay(self.failures, self.base, self.cap)

    def recovered(self) -> None:
        """A try succeeded: say so once if an outage ends here."""
        if self.failures:
            log.info(
                "worker %s: %s: database reachable again after %.1fs (%d failed tries)",
                self.worker,
                self.loop,
                time.monotonic() - self.since,
                self.failures,
            )
            self.failures = 0


def listen_dsn(db: Database) -> str:
    """A plain asyncpg DSN for the listening connection (same server as the engine)."""
    url = db.engine.url.set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


class Worker:
    """Runs jobs from the shared queue, up to ``concurrency`` at a time."""

    def __init__(
        self,
        db: Database,
        handlers: Mapping[str, JobHandler],
        settings: QueueSettings,
        *,
        poll_interval: float = 1.0,
        name: str | None = None,
        periodic: list[Periodic] | None = None,
        batch_handlers: Mapping[str, BatchHandler] | None = None,
    ) -> None:
        self.db = db
        self.handlers = dict(handlers)
        # Kinds run in batches; each needs its one-job handler too (the fallback).
        self.batch_handlers = {
            kind: handler
            for kind, handler in (batch_handlers or {}).items()
            if kind in self.handlers
        }
        self.settings = settings
        self.poll_interval = poll_interval
        self.id = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._inflight: dict[int, tuple[ClaimedJob, asyncio.Task[None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # a batch is one task, one slot
        self._contexts: dict[int, JobContext] = {}  # the jobs of batches in hand
        self._batches = 0
        self._listener: asyncpg.Connection | None = None
        self._periodic = list(periodic or [])
        self.processed = 0

    async def run(self) -> None:
        """Work until ``stop()``; survives database outages by retrying."""
        log.info("worker %s started (concurrency %d)", self.id, self.settings.concurrency)
        tasks = [
            asyncio.create_task(self._listen(), name="worker-listen"),
            asyncio.create_task(self._heartbeats(), name="worker-heartbeat"),
            *(asyncio.create_task(self._every(p), name=f"worker-{p.name}") for p in self._periodic),
        ]
        outage = self._outage("queue")
        loops = 0
        try:
            while not self._stopping.is_set():
                loops += 1
                claimed = 0
                try:
                    if loops == 1 or loops % 10 == 0:
                        await self._reclaim()
                    interval = self.settings.failed_cleanup_interval
                    if interval and loops % interval == 0:
                        await self._prune()
                    claimed = await self._claim()
                except Exception as exc:
                    # Whatever went wrong (mostly: the database is away), the worker stays
                    # up and tries again later; jobs in hand go on meanwhile.
                    await self._sleep(outage.failed(exc))
                    continue
                outage.recovered()
                if claimed == 0 or len(self._tasks) >= self.settings.concurrency:
                    await self._sleep(self.poll_interval)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self._close_listener()
            log.info("worker %s stopped after %d jobs", self.id, self.processed)

    async def stop(self, timeout: float = 30.0) -> None:
        """Stop claiming; let jobs in hand finish for ``timeout`` s, then release the rest."""
        self._stopping.set()
        self._wake.set()
        pending = list(self._tasks)
        if pending:
            _, still = await asyncio.wait(pending, timeout=timeout)
            for task in still:
                task.cancel()
            if still:
                await asyncio.wait(still, timeout=5)

    def _outage(self, loop: str) -> Outage:
        return Outage(
            self.id, loop, self.poll_interval, max(OUTAGE_BACKOFF_CAP, self.poll_interval)
        )

    async def _sleep(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)

    async def _claim(self) -> int:
        free = self.settings.concurrency - len(self._tasks)
        if free <= 0 or self._stopping.is_set():
            return 0
        batched: list[ClaimedJob] = []
        kinds = sorted(self.batch_handlers)
        async with self.db.system() as session:
            if kinds and self._batches < BATCHES_IN_FLIGHT:
                batched = await repository.claim_jobs(
                    session,
                    self.id,
                    self.settings.batch_size,
                    self.settings.lease_seconds,
                    kinds=kinds,
                )
            groups: dict[tuple[str, uuid.UUID], list[ClaimedJob]] = {}
            for job in sorted(batched, key=lambda j: j.id):
                groups.setdefault((job.kind, job.tenant_id), []).append(job)
            left = min(free - len(groups), self.settings.claim_batch)
            jobs = []
            if left > 0:
                jobs = await repository.claim_jobs(
                    session, self.id, left, self.settings.lease_seconds, skip=kinds
                )
        if self._stopping.is_set():
            # The shutdown began while the claim was on its way: it waits only for the jobs
            # in hand before it, so these go back at once (from here to their start nothing
            # awaits: a shutdown beginning later sees them in hand).
            for job in [*batched, *jobs]:
                await self._release(job)
            return 0
        for (kind, _), members in groups.items():
            self._batches += 1  # counted here: the next claim may come before the task starts
            self._start(members, self._run_batch(kind, members), f"batch-{members[0].id}")
        for job in jobs:
            self._start([job], self._run_job(job), f"job-{job.id}")
        return len(batched) + len(jobs)

    def _start(self, jobs: list[ClaimedJob], work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        for job in jobs:
            self._inflight[job.id] = (job, task)

    async def _run_batch(self, kind: str, jobs: list[ClaimedJob]) -> None:
        """Run jobs of one kind and tenant with the kind's batch handler; what it leaves
        unfinished runs one by one."""
        context = BatchContext(jobs=jobs, db=self.db, worker_id=self.id, stopping=self._stopping)
        self._contexts.update(context.contexts)
        leftover: list[ClaimedJob] = []
        run = current_run.set(JobRun(context.tenant_id))
        try:
            try:
                await self.batch_handlers[kind](context)
            except (asyncio.CancelledError, JobInterrupted):
                raise
            except Exception as exc:
                if len(jobs) == 1 and not context.job(jobs[0].id).finished:
                    # Alone, the job has nobody to be told apart from: its attempt failed.
                    context.failed.setdefault(jobs[0].id, exc)
                else:
                    log.warning(
                        "batch of %d %s job(s) failed (%s: %s); running them one by one",
                        len(jobs),
                        kind,
                        type(exc).__name__,
                        exc,
                    )
            for job in jobs:
                if job.id in context.failed:
                    error = context.failed[job.id]
                    if isinstance(error, LeaseLost):
                        log.warning("worker %s: %s", self.id, error)
                    elif isinstance(error, JobInterrupted):
                        await self._release(job)
                    elif isinstance(error, ErasedMeanwhile):
                        await self._rerun(job)
                    elif isinstance(error, Deferred):
                        await self._defer(job, error)
                    else:
                        await self._record_failure(job, error)
                elif context.job(job.id).finished:
                    self._done(job)
                else:
                    leftover.append(job)
        except (asyncio.CancelledError, JobInterrupted) as exc:
            for job in jobs:
                if not context.job(job.id).finished:
                    await self._release(job)
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.info(
                "batch of %d %s job(s): stopped for the shutdown, queued again", len(jobs), kind
            )
        finally:
            current_run.reset(run)
            self._batches -= 1
            for job in jobs:
                self._contexts.pop(job.id, None)
                if job not in leftover:
                    self._inflight.pop(job.id, None)
            self._wake.set()
        for job in leftover:
            await self._run_job(job)

    async def _run_job(self, job: ClaimedJob) -> None:
        context = JobContext(job=job, db=self.db, worker_id=self.id, stopping=self._stopping)
        token = job_id_var.set(job.id)
        run = current_run.set(JobRun(job.tenant_id))
        try:
            handler = self.handlers.get(job.kind)
            if handler is None:
                raise PermanentJobError(f"no handler for job kind {job.kind!r}")
            result = await handler(context)
            if not context.finished:
                context.result = result if result is not None else context.result
                async with self.db.tenant(job.tenant_id) as session:
                    noted = with_notes(job, context.result)
                    if not await repository.complete(session, job, self.id, noted):
                        raise LeaseLost(f"job {job.id}: lease lost before completion")
            self._done(job)
        except asyncio.CancelledError:
            await self._release(job)
            raise
        except JobInterrupted:
            await self._release(job)
            log.info("job %s (%s): stopped for the shutdown, queued again", job.id, job.kind)
        except LeaseLost as exc:
            log.warning("worker %s: %s", self.id, exc)
        except ErasedMeanwhile:
            await self._rerun(job)
        except Deferred as exc:
            await self._defer(job, exc)
        except Exception as exc:
            await self._record_failure(job, exc)
        finally:
            current_run.reset(run)
            job_id_var.reset(token)
            self._inflight.pop(job.id, None)
            self._wake.set()

    def _done(self, job: ClaimedJob) -> None:
        self.processed += 1
        JOB_DONE.labels(job.kind).inc()
        JOB_LATENCY.labels(job.kind).observe(
            max((datetime.now(UTC) - job.created_at).total_seconds(), 0.0)
        )

    async def _record_failure(self, job: ClaimedJob, exc: Exception) -> None:
        permanent = isinstance(exc, PermanentJobError)
        delay = retry_delay(
            job.attempts, self.settings.retry_base_seconds, self.settings.retry_cap_seconds
        )
        custom = getattr(exc, "retry_after", None)
        if isinstance(custom, int | float) and custom > delay:
            delay = float(custom)
        error = f"{type(exc).__name__}: {exc}"
        if not permanent and not isinstance(exc, Unavailable):
            log.warning(
                "job %s (%s) attempt %d failed: %s\n%s",
                job.id,
                job.kind,
                job.attempts,
                error,
                "".join(traceback.format_exception(exc)[-3:]),
            )
        for _ in range(3):
            try:
                async with self.db.system() as session:
                    status = await repository.fail(
                        session, job, self.id, error, delay, permanent=permanent
                    )
                if status == "failed":
                    JOB_FAILURES.labels(job.kind).inc()
                    log.error("job %s (%s) failed for good: %s", job.id, job.kind, error)
                elif status == "queued":
                    JOB_RETRIES.labels(job.kind).inc()
                return
            except (Unavailable, OSError):
                await asyncio.sleep(1)
        # The lease will expire and the job will be reclaimed; nothing is lost.
        log.warning(
            "job %s (%s): its failure could not be recorded (database unavailable);"
            " it runs again once its lease expires",
            job.id,
            job.kind,
        )

    async def _release(self, job: ClaimedJob) -> None:
        with contextlib.suppress(Exception):
            async with self.db.system() as session:
                await repository.release(session, job, self.id)

    async def _rerun(self, job: ClaimedJob) -> None:
        """Queue a job the erasure fence stopped again, to run on the rows as the erasure
        left them (if the erasure deleted the job, nothing is left to run)."""
        try:
            async with self.db.system() as session:
                queued = await repository.rerun(session, job, self.id, RERUN_NOTE)
        except Exception as exc:
            # Its lease runs out and it is reclaimed: it runs again all the same.
            log.warning("job %s (%s): could not be queued again: %s", job.id, job.kind, exc)
            return
        log.info(
            "job %s (%s): %s",
            job.id,
            job.kind,
            RERUN_NOTE if queued else "stopped by an erasure, which took it (or it was taken over)",
        )

    async def _defer(self, job: ClaimedJob, exc: Deferred) -> None:
        """Queue a job that cannot go on yet to run once it can, its attempt not counted."""
        try:
            async with self.db.system() as session:
                queued = await repository.defer(session, job, self.id, str(exc), exc.delay)
        except Exception as error:
            # Its lease runs out and it is reclaimed: it runs again all the same.
            log.warning("job %s (%s): could not be deferred: %s", job.id, job.kind, error)
            return
        if queued:
            log.debug("job %s (%s): deferred %.1fs: %s", job.id, job.kind, exc.delay, exc)

    async def _reclaim(self) -> None:
        async with self.db.system() as session:
            count = await repository.reclaim_expired(session)
        if count:
            log.warning("requeued %d job(s) whose lease ran out before they finished", count)

    async def _prune(self) -> None:
        async with self.db.system() as session:
            deleted = await repository.prune(
                session,
                self.settings.done_retention_hours * 3600,
                self.settings.failed_max_age_days,
                self.settings.failed_max_files,
                self.settings.receipt_retention_days,
            )
        if deleted:
            log.info("pruned %d finished job(s)", deleted)

    async def _heartbeats(self) -> None:
        # Beats keep their pace through an outage, so leases renew as soon as it ends.
        outage = self._outage("heartbeat")
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            ids = list(self._inflight)
            if not ids:
                continue
            try:
                async with self.db.system() as session:
                    held = await repository.heartbeat(
                        session, self.id, ids, self.settings.lease_seconds
                    )
            except Exception as exc:
                outage.failed(exc)
                continue
            outage.recovered()
            for job_id in set(ids) - held:
                entry = self._inflight.get(job_id)
                context = self._contexts.get(job_id)
                if context is not None and context.finished:
                    continue  # done by its batch, whose other jobs are still in hand
                if entry is not None:
                    log.warning("job %s was taken over by another worker; abandoning it", job_id)
                    entry[1].cancel()

    async def _every(self, periodic: Periodic) -> None:
        while True:
            await asyncio.sleep(periodic.interval)
            try:
                await periodic.run()
            except Exception as exc:
                log.warning("worker %s: %s failed: %s", self.id, periodic.name, exc)

    async def _listen(self) -> None:
        """Keep a LISTEN connection open; reconnect when it drops. Polling covers the gaps."""
        dsn = listen_dsn(self.db)
        outage = self._outage("LISTEN")
        while True:
            try:
                if self._listener is None or self._listener.is_closed():
                    self._listener = await asyncpg.connect(dsn, timeout=10)
                    await self._listener.add_listener(CHANNEL, self._notified)
                    outage.recovered()
                    self._wake.set()  # catch up on anything enqueued while we were away
                await asyncio.sleep(5)
                await self._listener.execute("SELECT 1")  # notices a dead connection
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._close_listener()
                await asyncio.sleep(outage.failed(exc))

    def _notified(self, *_: Any) -> None:
        self._wake.set()

    async def _close_listener(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close(timeout=2)
            self._listener = None
