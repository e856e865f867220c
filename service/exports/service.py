"""Large exports: written by a job into chunks, fetched once ready, pruned after a while."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import IO, Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import Database
from service.errors import Conflict, NotFound, TooManyRequests
from service.exports import repository
from service.privacy import service as privacy
from service.queue import repository as jobs
from service.queue.payloads import ExportPayload
from service.queue.worker import JobContext
from service.settings import Settings
from service.tenants.service import ADMIN_ACTOR

EXPORT_JOB = "privacy.export"
# About this many characters per stored chunk; a chunk only ends between rows.
CHUNK_CHARS = 256_000
MEDIA_TYPES = {"user": "application/json", "group": "application/json"}
NDJSON = "application/x-ndjson"


def media_type(kind: str) -> str:
    """What a fetched export is: a JSON document, or NDJSON for a whole tenant."""
    return MEDIA_TYPES.get(kind, NDJSON)


def export_url(tenant_id: uuid.UUID, kind: str, export_id: int) -> str:
    """Where a finished export is fetched: by the tenant's key, or the admin's for a tenant."""
    if kind == "tenant":
        return f"/admin/tenants/{tenant_id}/exports/{export_id}"
    return f"/v1/exports/{export_id}"


@dataclass(frozen=True)
class ExportJob:
    """A pending export and the job that writes it."""

    export_id: int
    job_id: int
    url: str


async def export_later(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    subject: str,
    settings: Settings,
    *,
    requested_by: str | None,
    now: bool = False,
) -> ExportJob | None:
    """None when the export is small enough to stream now; else (or ``now``, whatever its
    size) a pending export and its job, enqueued in the caller's transaction. Only
    ``requested_by`` may fetch it. Asked again while it is written, the same export (its
    job run again if it failed; a new one if its job is gone); past
    ``max_exports_per_tenant`` kept, ``TooManyRequests`` until the first expires (a tenant
    asking for its whole export in a loop stored it again each time, for a day each)."""
    if not now and await privacy.count_export_rows(session, tenant_id, kind, subject) <= (
        settings.export_sync_limit
    ):
        return None
    keep = settings.export_retention_hours * 3600
    hashed = await privacy.subject_hash(session, tenant_id, kind, subject)
    again = await repository.pending_again(session, tenant_id, kind, hashed, requested_by)
    job = await jobs.get_job(session, tenant_id, again[1]) if again is not None else None
    if again is not None and job is not None and job["status"] != "done":
        if job["status"] == "failed":  # asked again: its job runs again
            await jobs.retry(session, tenant_id, again[1])
        return ExportJob(again[0], again[1], export_url(tenant_id, kind, again[0]))
    kept, first_expiry = await repository.kept(session, tenant_id)
    if kept >= settings.max_exports_per_tenant:
        raise TooManyRequests(
            f"a tenant keeps at most {settings.max_exports_per_tenant} exports written by"
            " jobs; the first of them expires in"
            f" {first_expiry / 3600:.1f} h (export_retention_hours)",
            retry_after=max(first_expiry, 1.0),
        )
    export_id = await repository.create(session, tenant_id, kind, hashed, keep, requested_by)
    job_id, _ = await jobs.enqueue(
        session,
        tenant_id,
        EXPORT_JOB,
        ExportPayload(export_id=export_id, kind=kind, subject=subject),
        max_attempts=settings.cognitive.queue.max_attempts,
    )
    await repository.attach_job(session, tenant_id, export_id, job_id)
    return ExportJob(export_id, job_id, export_url(tenant_id, kind, export_id))


async def write_chunks(
    session: AsyncSession, tenant_id: uuid.UUID, export_id: int, parts: AsyncIterator[str]
) -> int:
    """Store a document's pieces as chunks of whole rows; returns its size in bytes."""
    buffer: list[str] = []
    held = size = seq = 0
    async for part in parts:
        buffer.append(part)
        held += len(part)
        if held >= CHUNK_CHARS:
            data = "".join(buffer)
            await repository.append_chunk(session, tenant_id, export_id, seq, data)
            size += len(data.encode())
            seq += 1
            buffer, held = [], 0
    if buffer or seq == 0:
        data = "".join(buffer)
        await repository.append_chunk(session, tenant_id, export_id, seq, data)
        size += len(data.encode())
    return size


class ExportWriter:
    """The ``privacy.export`` job: the document, written in the job's one transaction."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def run(self, job: JobContext) -> dict[str, Any]:
        """Write the export's chunks and mark it ready, together with the job's completion."""
        tenant_id = job.job.tenant_id
        payload = ExportPayload.of(job.job.payload)
        export_id, kind, subject = payload.export_id, payload.kind, payload.subject
        async with job.finishing() as session:
            if not await repository.lock_pending(session, tenant_id, export_id):
                # Erased or pruned before the job ran (or written by an earlier attempt).
                job.result = {"export_id": export_id, "skipped": "the export is gone or written"}
                return job.result
            counts: dict[str, int] = {}
            parts = (
                privacy.tenant_parts(session, tenant_id, counts)
                if kind == "tenant"
                else privacy.document_parts(
                    session, tenant_id, kind, subject, counts, spare_job=job.job.id
                )
            )
            size = await write_chunks(session, tenant_id, export_id, parts)
            keep = self.settings.export_retention_hours * 3600
            await repository.finish(session, tenant_id, export_id, size, counts, keep)
            job.result = {
                "export_id": export_id,
                "export_url": export_url(tenant_id, kind, export_id),
                "bytes": size,
                "counts": counts,
            }
        return job.result


async def ready(
    session: AsyncSession, tenant_id: uuid.UUID, export_id: int, *, caller: str | None
) -> dict[str, Any]:
    """An export that ``caller`` may fetch now; NotFound, or Conflict while it is written.

    ``caller`` None: the admin, who may fetch any of the tenant's exports. Otherwise only the
    caller's own exports of a person or a group: a whole-tenant export (audit trail and key
    metadata included) is the admin's alone, and ids are sequential, so another key's export
    is answered as if it did not exist.
    """
    row = await repository.get(session, tenant_id, export_id)
    foreign = row is not None and (row["kind"] == "tenant" or row["requested_by"] != caller)
    if caller is not None and caller != ADMIN_ACTOR and foreign:
        row = None
    if row is None:
        raise NotFound("no such export (or it expired)", field="export_id")
    if row["ready_at"] is None:
        job_id = row["job_id"]
        job = await jobs.get_job(session, tenant_id, job_id) if job_id is not None else None
        status = job["status"] if job is not None else "gone"
        if job is not None and status == "failed":
            raise Conflict(
                f"the export could not be written: its job {job_id} failed ({job['last_error']})",
                field="export_id",
            )
        raise Conflict(
            f"the export is not ready yet: its job {job_id} is {status}; retry later",
            field="export_id",
        )
    return row


# A document sent as it is read holds its transaction, and a pooled connection, for as long
# as the client takes to read it: thirty clients reading slowly (pool 20 + overflow 10) held
# the whole pool, and every tenant's requests waited. So no transaction is open while the
# client reads: a ready export's chunks are read a few at a time, each read a transaction of
# its own (an export is written once; one erased meanwhile ends early), and a small export
# made now is read whole first, into a file kept in memory up to SPOOL_MEMORY_BYTES.
CHUNKS_PER_READ = 4
SPOOL_MEMORY_BYTES = 8 * 2**20
SEND_BYTES = 2**16
# Past SPOOL_MEMORY_BYTES the spool is a file on disk, and a write or read of it on the event
# loop would stall every other request of the process while the disk works: those leave the
# loop, in pieces of about this many bytes (not a thread hop per row, nor per block sent).
DISK_BYTES = 2**20


async def content(db: Database, tenant_id: uuid.UUID, export_id: int) -> AsyncIterator[bytes]:
    """A ready export's document, chunk by chunk (see CHUNKS_PER_READ)."""
    after = -1
    while True:
        async with db.tenant(tenant_id, read_only=True) as session:
            page = await repository.chunk_page(
                session, tenant_id, export_id, after, CHUNKS_PER_READ
            )
        for _, piece in page:
            yield piece.encode()
        if len(page) < CHUNKS_PER_READ:
            return
        after = page[-1][0]


class Spool:
    """A document read whole before its first byte is sent (its transaction closed then):
    in memory up to SPOOL_MEMORY_BYTES, then in a file written and read off the loop."""

    def __init__(self) -> None:
        # Closed at the end of blocks(), or by fill() when it gives up.
        self._file: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115
        self.size = 0

    async def fill(self, parts: AsyncIterator[bytes], limit: int | None = None) -> bool:
        """Read ``parts`` to their end; False, the spool closed and ``parts`` too, once
        they come to more than ``limit`` bytes."""
        written = 0
        pending: list[bytes] = []
        try:
            async for part in parts:
                self.size += len(part)
                if limit is not None and self.size > limit:
                    await asyncio.to_thread(self._file.close)
                    return False
                if self.size <= SPOOL_MEMORY_BYTES:  # the spool stays in memory
                    self._file.write(part)
                    written = self.size
                    continue
                pending.append(part)
                if self.size - written >= DISK_BYTES:
                    await asyncio.to_thread(self._file.write, b"".join(pending))
                    pending, written = [], self.size
        except BaseException:
            await asyncio.to_thread(self._file.close)
            raise
        finally:
            close = getattr(parts, "aclose", None)  # its transaction ends now, not when collected
            if close is not None:
                await close()
        if self.size <= SPOOL_MEMORY_BYTES:
            self._file.seek(0)
        else:
            await asyncio.to_thread(_rewind, self._file, b"".join(pending))
        return True

    async def blocks(self) -> AsyncIterator[bytes]:
        """The document, SEND_BYTES at a time; the spool is closed after."""
        try:
            if self.size <= SPOOL_MEMORY_BYTES:
                while block := self._file.read(SEND_BYTES):
                    yield block
                return
            while data := await asyncio.to_thread(self._file.read, DISK_BYTES):
                for start in range(0, len(data), SEND_BYTES):
                    yield data[start : start + SEND_BYTES]
        finally:
            await asyncio.to_thread(self._file.close)


def _rewind(spool: IO[bytes], rest: bytes) -> None:
    spool.write(rest)
    spool.seek(0)  # flushes what the file still buffers


async def prune(db: Database) -> int:
    """Delete every tenant's expired exports; returns how many."""
    async with db.system() as session:
        return await repository.prune(session)


async def export_now_or_later(
    session: AsyncSession,
    db: Database,
    tenant_id: uuid.UUID,
    kind: str,
    subject: str,
    settings: Settings,
    *,
    requested_by: str | None,
) -> AsyncIterator[bytes] | ExportJob:
    """A small export as a stream to send now (from a transaction of its own); a large one
    as a pending export whose job is enqueued in the caller's transaction."""
    later = await export_later(
        session, tenant_id, kind, subject, settings, requested_by=requested_by
    )
    if later is not None:
        return later
    if kind == "tenant":
        parts = privacy.export_tenant(db, tenant_id)
    else:
        parts = privacy.export_stream(db, tenant_id, kind, subject)
    # The count reads a person's own rows; others' messages naming them are found only as
    # the document is read, and can be thousands: past export_sync_bytes, a job writes it.
    spool = Spool()
    if await spool.fill(parts, settings.export_sync_bytes):
        return spool.blocks()
    made = await export_later(
        session, tenant_id, kind, subject, settings, requested_by=requested_by, now=True
    )
    assert made is not None
    return made
