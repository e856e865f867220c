"""Re-embedding: remake every stored vector with another model, then switch in one transaction.

A run is started by ``memoria reembed`` and carried out by the workers. For each tenant and
each table with vectors a chain of jobs walks the rows in key order, a batch per job: the
batch's new vectors go to the shadow column, and the cursor advances, in the job's own
transaction. A worker that dies loses at most the batch in hand; nothing committed is
embedded twice. When every pass has reached its end the switch job embeds the rows written
meanwhile, then, holding the tables, the last few, swaps the columns, rebuilds the indexes
and the event vectors, and records the new model. Searches read the old vectors until then.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import Database
from service.db.meta import read_meta
from service.embedding import Embedder, build_embedder, vector_space
from service.errors import ConfigurationError, Conflict, Invalid, NotFound, Unavailable
from service.queue import repository as jobs
from service.queue.payloads import ReembedBatchPayload, ReembedSwitchPayload
from service.queue.worker import JobContext, PermanentJobError
from service.reembed import repository
from service.reembed.models import ACTIVE, ReembedRun
from service.reembed.repository import TableProgress, VectorTable, vector_table, vector_tables
from service.settings import EmbeddingModelSettings, Settings

log = logging.getLogger("service.reembed")

BATCH_JOB = "embeddings.reembed"
SWITCH_JOB = "embeddings.switch"
KINDS = [BATCH_JOB, SWITCH_JOB]
# Below live work: a re-embedding takes whatever the workers have to spare.
BATCH_PRIORITY = -1
# Waiting longer for a table lock would queue every query on that table behind the wait.
LOCK_WAIT_SECONDS = 5.0


def target_settings(
    base: EmbeddingModelSettings,
    *,
    provider: str | None = None,
    model: str | None = None,
    dimensions: int | None = None,
    api_url: str | None = None,
) -> EmbeddingModelSettings:
    """The configured embedding settings with a new model's overrides (the key, timeouts and
    batching stay as configured)."""
    values = base.model_dump()
    for name, value in (
        ("provider", provider),
        ("model_name", model),
        ("dimensions", dimensions),
        ("api_url", api_url),
    ):
        if value is not None:
            values[name] = value
    try:
        return EmbeddingModelSettings.model_validate(values)
    except ValueError as exc:
        raise Invalid(f"bad embedding model settings: {exc}") from exc


def run_settings(base: EmbeddingModelSettings, run: ReembedRun) -> EmbeddingModelSettings:
    """The settings of the model a run embeds with, on this process's configured ones."""
    return target_settings(
        base,
        provider=run.provider,
        model=run.model_name,
        dimensions=run.dimensions,
        api_url=run.api_url,
    )


async def stored_space(session: AsyncSession) -> tuple[str, int] | None:
    """The model and dimension of the stored vectors (None before the first migration)."""
    dimension = await read_meta(session, "embedding_dim")
    if dimension is None:
        return None
    return (await read_meta(session, "embedding_model") or "unknown"), int(dimension)


async def settle(
    session: AsyncSession, configured: EmbeddingModelSettings
) -> tuple[EmbeddingModelSettings, str | None]:
    """The embedding settings to use against this database, and a warning if they are not
    the configured ones.

    Vectors of different models do not compare, so the stored vectors' model wins: after a
    re-embedding, a process configured with the old model uses the new one (and says so). A
    dimension the stored vectors do not have, with no re-embedding to explain it, is refused.
    """
    stored = await stored_space(session)
    wanted = vector_space(configured)
    if stored is None or stored == wanted:
        return configured, None
    model, dimension = stored
    run = await repository.switched_to(session, model, dimension)
    if run is not None:
        return run_settings(configured, run), (
            f"the stored vectors were re-embedded with {model!r} ({dimension} dimensions); "
            f"using it instead of the configured {wanted[0]!r}. Set [models.embedding] "
            f"provider = {run.provider!r}, model_name = {model!r}, dimensions = {dimension}"
            + (f", api_url = {run.api_url!r}" if run.api_url else "")
            + " to match."
        )
    if wanted[1] != dimension:
        raise ConfigurationError(
            f"the embedding model {wanted[0]!r} makes {wanted[1]}-dimensional vectors, but this "
            f"database was created for {dimension}-dimensional vectors (model {model!r}). "
            f"Configure a {dimension}-dimensional model, or convert the stored vectors with "
            f"`memoria reembed --model {wanted[0]}`."
        )
    return configured, (
        f"the configured embedding model {wanted[0]!r} is not {model!r}, which made the stored "
        f"vectors; vectors of different models do not compare. Convert them with "
        f"`memoria reembed --model {wanted[0]}`, or configure {model!r}."
    )


# ---------------------------------------------------------------- operator commands


async def start(
    db: Database, settings: Settings, target: EmbeddingModelSettings, batch_size: int | None = None
) -> ReembedRun:
    """Start a run towards ``target``: shadow columns, one pass per tenant and table.

    ``Conflict`` when a run is going on, or when the vectors already are of that model.
    """
    model, dimensions = vector_space(target)
    batch = batch_size or target.batch_size
    if not 1 <= batch <= 2048:
        raise Invalid("the batch size must be between 1 and 2048", field="batch_size")
    async with db.system() as session:
        await repository.lock_runs(session)
        stored = await _startable(session, target)
        run_id = await repository.insert_run(
            session,
            {
                "provider": target.provider,
                "model_name": model,
                "dimensions": dimensions,
                "api_url": target.api_url if target.provider == "openai" else "",
                "batch_size": batch,
                "previous_model": stored[0],
                "previous_dimensions": stored[1],
            },
        )
        await repository.bound_lock_waits(session, LOCK_WAIT_SECONDS)
        await repository.drop_shadows(session)  # what a cancellation could not remove
        await repository.add_shadows(session, dimensions)
        tenants = await repository.tenant_ids(session)
        for tenant_id in tenants:
            for table in vector_tables():
                await repository.insert_progress(session, tenant_id, run_id, table.name)
                await _enqueue_batch(session, settings, tenant_id, run_id, table.name, 0)
        if not tenants:
            # No tenant, no rows: nothing to embed, the switch is only the catalog's.
            await _switch(session, run_id, None)
        run = await repository.get_run(session, run_id)
    assert run is not None
    return run


async def check_startable(db: Database, target: EmbeddingModelSettings) -> None:
    """Refuse early, as ``start`` would: a run is going on, or the vectors are of ``target``."""
    async with db.system() as session:
        await _startable(session, target)


async def _startable(session: AsyncSession, target: EmbeddingModelSettings) -> tuple[str, int]:
    """The stored vectors' model and dimension, unless a run towards ``target`` is refused."""
    running = await repository.active_run(session)
    if running is not None:
        raise Conflict(
            f"re-embedding run {running.id} (to {running.model_name!r}) is {running.status};"
            " wait for it, or cancel it with `memoria reembed --cancel`"
        )
    stored = await stored_space(session)
    if stored is None:
        raise ConfigurationError("the database has no schema yet; run `memoria migrate`")
    model, dimensions = vector_space(target)
    if stored == (model, dimensions):
        raise Conflict(f"the stored vectors already are {model!r} ({dimensions} dimensions)")
    return stored


@dataclass(frozen=True)
class RunReport:
    """A run, its progress per table, and its jobs."""

    run: ReembedRun
    tables: list[TableProgress]
    jobs: dict[str, int]
    last_error: str | None

    @property
    def stalled(self) -> bool:
        """Going on, but no job is left to carry it on (they failed, or were lost)."""
        return self.run.status in ACTIVE and self.jobs["queued"] + self.jobs["running"] == 0


async def report(db: Database, run_id: int | None = None) -> RunReport | None:
    """The given run, or the newest one; None when there has never been one."""
    async with db.system() as session:
        if run_id is None:
            run = await repository.latest_run(session)
        else:
            run = await repository.get_run(session, run_id)
        if run is None:
            return None
        tables = await repository.table_progress(session, run.id)
        counts, error = await jobs.work_status(session, KINDS, {"run_id": run.id})
    return RunReport(run, tables, counts, error)


async def cancel(db: Database) -> ReembedRun:
    """Stop the active run: its jobs and shadow columns go, the stored vectors stay as they
    were. ``NotFound`` when no run is going on."""
    async with db.system() as session:
        found = await repository.active_run(session)
        if found is None:
            raise NotFound("no re-embedding run is going on")
        # The switch locks the run first too: one of the two waits for the other.
        run = await repository.get_run(session, found.id, lock=True)
        if run is None or run.status not in ACTIVE:
            ended = run.status if run is not None else "gone"
            raise Conflict(f"re-embedding run {found.id} has just ended ({ended})")
        await jobs.drop_work(session, KINDS, {"run_id": run.id})
        await repository.delete_progress(session, run.id)
        await repository.set_status(session, run.id, "cancelled")
    # Committed first: from here no job of the run starts a batch, so the wait for the
    # tables below is at most one batch in hand. Leftovers of a failed attempt are removed
    # by the next start.
    await drop_shadows(db)
    return run


async def drop_shadows(db: Database, attempts: int = 6) -> None:
    """Remove the shadow columns and triggers, waiting for batches in hand to end."""
    for attempt in range(attempts):
        try:
            async with db.system() as session:
                await repository.bound_lock_waits(session, LOCK_WAIT_SECONDS)
                await repository.drop_shadows(session)
            return
        except Unavailable:
            if attempt == attempts - 1:
                raise


async def resume(db: Database, settings: Settings) -> int:
    """Carry the active run on: failed jobs get new attempts, passes left without a job get
    one. Returns how many jobs were queued; ``NotFound`` when no run is going on."""
    async with db.system() as session:
        run = await repository.active_run(session)
        if run is None:
            raise NotFound("no re-embedding run is going on")
        queued = await jobs.retry_work(session, KINDS, {"run_id": run.id})
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        # A pass whose job failed for good, or was deleted (e.g. by an erasure whose pattern
        # matched its payload), is carried on by a new one.
        carried = {
            (tenant_id, payload.get("table"))
            for tenant_id, payload in await jobs.open_work(session, [BATCH_JOB], {"run_id": run.id})
        }
        for tenant_id, table, batches in await repository.open_passes(session, run.id):
            if (tenant_id, table) in carried:
                continue
            await _enqueue_batch(session, settings, tenant_id, run.id, table, batches, again=stamp)
            queued += 1
        if run.status == "embedding" and await repository.unfinished_passes(session, run.id) == 0:
            # Every pass ended but the switch was never asked for (its asker died).
            tenant = next(iter(await repository.tenant_ids(session)), None)
            if tenant is not None:
                queued += await _ask_for_switch(session, run.id, tenant)
        elif run.status == "switching":
            switch = await jobs.work_status(session, [SWITCH_JOB], {"run_id": run.id})
            if switch[0]["queued"] + switch[0]["running"] == 0:
                tenant = next(iter(await repository.tenant_ids(session)), None)
                if tenant is not None:
                    await _enqueue_switch(session, run.id, tenant, again=stamp)
                    queued += 1
    return queued


async def _enqueue_batch(
    session: AsyncSession,
    settings: Settings,
    tenant_id: uuid.UUID,
    run_id: int,
    table: str,
    batches: int,
    again: str = "",
) -> None:
    # One job per batch: a job retried after its batch committed finds its successor. A
    # pass resumed by hand gets a key of its own (the lost job's may still be taken).
    key = f"reembed:{run_id}:{table}:{batches}" + (f":{again}" if again else "")
    await jobs.enqueue(
        session,
        tenant_id,
        BATCH_JOB,
        ReembedBatchPayload(run_id=run_id, table=table),
        priority=BATCH_PRIORITY,
        max_attempts=settings.cognitive.queue.max_attempts,
        dedupe_key=key,
    )


async def _enqueue_switch(
    session: AsyncSession, run_id: int, tenant_id: uuid.UUID, again: str = ""
) -> None:
    # Queued under some tenant (every job belongs to one); many attempts, as the switch
    # may not get its table locks at once while the service is busy.
    key = f"reembed-switch:{run_id}" + (f":{again}" if again else "")
    await jobs.enqueue(
        session,
        tenant_id,
        SWITCH_JOB,
        ReembedSwitchPayload(run_id=run_id),
        max_attempts=20,
        dedupe_key=key,
    )


async def _ask_for_switch(session: AsyncSession, run_id: int, tenant_id: uuid.UUID) -> int:
    """Queue the switch once every pass has ended; returns 1 if this call queued it."""
    run = await repository.get_run(session, run_id, lock=True)
    if run is None or run.status != "embedding":
        return 0
    if await repository.unfinished_passes(session, run_id) > 0:
        return 0
    await repository.set_status(session, run_id, "switching")
    await _enqueue_switch(session, run_id, tenant_id)
    return 1


# ---------------------------------------------------------------- the jobs


def passage(table: VectorTable, row: Row[Any]) -> str:
    """The text a row's vector is made of, exactly as the service embeds it when writing."""
    return table.text_of(row)


class Reembedder:
    """The re-embedding jobs of a worker, with the new model's embedder of each run."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings
        self._embedders: dict[int, Embedder] = {}

    def embedder(self, run: ReembedRun) -> Embedder:
        """The run's model, built once per process from this worker's settings."""
        embedder = self._embedders.get(run.id)
        if embedder is None:
            embedder = build_embedder(run_settings(self.settings.models.embedding, run))
            self._embedders[run.id] = embedder
        return embedder

    async def close(self) -> None:
        """Release every embedder built."""
        for embedder in self._embedders.values():
            await embedder.close()
        self._embedders.clear()

    async def run_batch(self, job: JobContext) -> dict[str, Any]:
        """Embed one batch of a tenant's pass over a table and queue the next, or end it."""
        payload = ReembedBatchPayload.of(job.job.payload)
        run_id = payload.run_id
        try:
            table = vector_table(payload.table)
        except KeyError as exc:
            raise PermanentJobError(f"malformed re-embedding job payload: {exc}") from exc
        async with self.db.system() as session:
            run = await repository.get_run(session, run_id)
        if run is None or run.status != "embedding":
            return {"skipped": f"run {run_id} is {run.status if run else 'gone'}"}
        tenant_id = job.job.tenant_id
        async with job.transaction() as session:
            progress = await repository.lock_progress(session, tenant_id, run_id, table.name)
            if progress is None:
                return {"skipped": "no such pass"}
            ended = progress.finished
            if not ended:
                total = progress.rows_total
                if total is None:
                    total = await repository.count_vectors(session, table, tenant_id)
                rows = await repository.next_batch(
                    session, table, tenant_id, progress.cursor, run.batch_size
                )
                if rows:
                    vectors = await self.embedder(run).passages([passage(table, r) for r in rows])
                    written = await repository.write_shadows(session, table, rows, vectors)
                    last = rows[-1]
                    await repository.advance(
                        session,
                        tenant_id,
                        run_id,
                        table.name,
                        cursor=[getattr(last, column) for column in table.key],
                        written=written,
                        total=total,
                        finished=False,
                    )
                    await _enqueue_batch(
                        session, self.settings, tenant_id, run_id, table.name, progress.batches + 1
                    )
                    job.result = {"table": table.name, "embedded": written, "read": len(rows)}
                    # The batch, the cursor, the next job and this job's end: all or nothing.
                    await job.complete_in(session)
                    return job.result
                await repository.advance(
                    session,
                    tenant_id,
                    run_id,
                    table.name,
                    cursor=None,
                    written=0,
                    total=total,
                    finished=True,
                )
        # The pass has ended (now or in an attempt that died before this point). Asking for
        # the switch comes after that commit and before this job's end, so a crash in
        # between runs this job again rather than leaving the run without its switch.
        async with self.db.system() as session:
            await _ask_for_switch(session, run_id, tenant_id)
        return {"table": table.name, "ended": True}

    async def run_switch(self, job: JobContext) -> dict[str, Any]:
        """Catch up on rows written during the run, then switch to the new vectors."""
        run_id = ReembedSwitchPayload.of(job.job.payload).run_id
        async with self.db.system() as session:
            run = await repository.get_run(session, run_id)
        if run is None or run.status != "switching":
            return {"skipped": f"run {run_id} is {run.status if run else 'gone'}"}
        embedder = self.embedder(run)
        caught_up = 0
        # Without locks first, a batch per transaction, while full batches keep coming.
        while True:
            full = False
            for table in vector_tables():
                async with self.db.system() as session:
                    written, read = await _catch_up(session, table, embedder, run.batch_size)
                    await repository.count_caught_up(session, run_id, written)
                caught_up += written
                full = full or read == run.batch_size
            if not full:
                break
        async with self.db.system() as session:
            last = await _switch(session, run_id, embedder)
        return {
            "switched_to": run.model_name,
            "dimensions": run.dimensions,
            "caught_up": caught_up + last,
        }


async def _catch_up(
    session: AsyncSession, table: VectorTable, embedder: Embedder, limit: int
) -> tuple[int, int]:
    """Embed up to ``limit`` rows lacking a shadow vector; (rows written, rows read)."""
    rows = await repository.stale_rows(session, table, limit)
    if not rows:
        return 0, 0
    vectors = await embedder.passages([passage(table, r) for r in rows])
    return await repository.write_shadows(session, table, rows, vectors), len(rows)


async def _switch(session: AsyncSession, run_id: int, embedder: Embedder | None) -> int:
    """The switch, in the caller's transaction: returns the rows embedded under the locks.

    The run's row is locked before the tables, as a cancellation does, so the two cannot
    deadlock. With the tables held nothing else writes: the rows still lacking a shadow
    vector are the last ones, and once embedded every row has its new vector.
    """
    run = await repository.get_run(session, run_id, lock=True)
    if run is None or run.status not in ACTIVE:
        return 0
    await repository.bound_lock_waits(session, LOCK_WAIT_SECONDS)
    await repository.lock_tables(session)
    last = 0
    for table in vector_tables():
        while True:
            rows = await repository.stale_rows(session, table, run.batch_size)
            if not rows:
                break
            if embedder is None:
                raise ConfigurationError("rows to embed but no embedder for the switch")
            vectors = await embedder.passages([passage(table, r) for r in rows])
            written = await repository.write_shadows(session, table, rows, vectors)
            if written != len(rows):  # nothing writes under our locks
                raise RuntimeError(f"{table.name}: rows changed under the switch's lock")
            last += written
    await repository.release_copies(session)
    for table in vector_tables():
        await repository.swap_columns(session, table)
    await repository.rebuild_copies(session, run.dimensions)
    await repository.record_model(session, run.model_name, run.dimensions)
    await repository.count_caught_up(session, run_id, last)
    await repository.set_status(session, run_id, "done")
    log.info(
        "re-embedding run %s switched the stored vectors to %r (%d dimensions)",
        run_id,
        run.model_name,
        run.dimensions,
    )
    return last
