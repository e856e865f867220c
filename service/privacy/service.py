"""Export of a person or a group: everything the tenant holds about them.

A person's rows are found by their id in id columns (see ``people``); rows of others that
name them are found in the conversations they took part in, by the names known to be theirs
(see ``redaction``): the same rows that an erasure deletes or redacts. Erasure itself is in
``erasure``.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db import registry
from service.db.engine import Database
from service.embedding import Embedder
from service.embedding.base import Vector
from service.errors import NotFound
from service.privacy.erasure import (
    count_group_rows,
    count_tenant_rows,
    count_user_rows,
    erase_group,
    erase_tenant,
    erase_user,
    sweep_erased_tenants,
    tenant_tables,
    was_erased,
)
from service.privacy.keys import subject_hash
from service.privacy.people import find_person
from service.queue import repository as jobs
from service.queue.payloads import (
    EraseGroupPayload,
    EraseTenantPayload,
    EraseUserPayload,
    JobPayload,
)
from service.settings import Settings

__all__ = [
    "ERASE_GROUP_JOB",
    "ERASE_TENANT_JOB",
    "ERASE_USER_JOB",
    "Erasure",
    "count_export_rows",
    "count_user_rows",
    "document_parts",
    "erase_group",
    "erase_group_now_or_later",
    "erase_tenant",
    "erase_tenant_now_or_later",
    "erase_user",
    "erase_user_now_or_later",
    "export_stream",
    "export_tenant",
    "subject_hash",
    "sweep_after_tenants",
    "tenant_erasure",
    "tenant_parts",
    "was_erased",
]

log = logging.getLogger("service.privacy")

ERASE_USER_JOB = "privacy.erase_user"
ERASE_GROUP_JOB = "privacy.erase_group"
ERASE_TENANT_JOB = "privacy.erase_tenant"

# ---------------------------------------------------------------- erasure


@dataclass(frozen=True)
class Erasure:
    """A person's or a group's erasure: done (``counts``), or handed to a job (``job_id``)."""

    counts: dict[str, int] | None = None
    job_id: int | None = None


async def erase_user_now_or_later(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    user_id: str,
    embedder: Embedder,
    settings: Settings,
    *,
    requested_by: str | None,
) -> Erasure:
    """Erase a person in the caller's transaction, or, past ``privacy_sync_limit`` rows,
    enqueue the erasure as a job in it."""
    return await _now_or_later(
        session,
        tenant_id,
        settings,
        await count_user_rows(session, tenant_id, user_id),
        ERASE_USER_JOB,
        EraseUserPayload(user_id=user_id, requested_by=requested_by),
        lambda: erase_user(
            session,
            tenant_id,
            user_id,
            Budgeted(embedder, settings.privacy_sync_embeddings),
            requested_by=requested_by,
            keep=settings.cognitive.profile.revision_keep,
        ),
    )


async def erase_group_now_or_later(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    group_id: str,
    settings: Settings,
    *,
    requested_by: str | None,
) -> Erasure:
    """Erase a group in the caller's transaction, or, past ``privacy_sync_limit`` rows,
    enqueue the erasure as a job in it."""
    return await _now_or_later(
        session,
        tenant_id,
        settings,
        await count_group_rows(session, tenant_id, group_id),
        ERASE_GROUP_JOB,
        EraseGroupPayload(group_id=group_id, requested_by=requested_by),
        lambda: erase_group(session, tenant_id, group_id, requested_by=requested_by),
    )


async def erase_tenant_now_or_later(
    session: AsyncSession, tenant_id: uuid.UUID, settings: Settings
) -> Erasure:
    """Erase a tenant in the caller's transaction, or, past ``privacy_sync_limit`` rows,
    enqueue the erasure as a job in it (a million events took 20 s in one transaction).
    A tenant already being erased answers with its job, even running (its keys are revoked:
    nothing new arrives), which runs again if it had failed (going on where it stopped):
    one erasure per tenant at a time."""
    begun = await _begun(session, tenant_id, ERASE_TENANT_JOB, {}, running=True)
    if begun is not None:
        return Erasure(job_id=begun)

    async def now() -> dict[str, int]:
        counts = await erase_tenant(session, tenant_id)
        if counts is None:
            raise NotFound("no such tenant")
        return counts

    return await _now_or_later(
        session,
        tenant_id,
        settings,
        await count_tenant_rows(session, tenant_id),
        ERASE_TENANT_JOB,
        EraseTenantPayload(requested_by="admin"),
        now,
        reuse=False,  # looked for above, a running job included
    )


async def tenant_erasure(session: AsyncSession, tenant_id: uuid.UUID) -> tuple[int, str] | None:
    """(id, status) of the job erasing the tenant while it is not done, else None."""
    return await jobs.unfinished(session, tenant_id, ERASE_TENANT_JOB)


async def sweep_after_tenants(session: AsyncSession, window_days: float) -> int:
    """Delete what was written under tenants erased in the last ``window_days`` after their
    erasure (see ``erasure.sweep_erased_tenants``), logged; returns how many rows."""
    swept = await sweep_erased_tenants(session, window_days)
    if swept:
        log.warning("rows written after their tenant's erasure were deleted: %s", swept)
    return sum(swept.values())


async def _now_or_later(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    settings: Settings,
    rows: int,
    kind: str,
    payload: JobPayload,
    erase: Callable[[], Awaitable[dict[str, int]]],
    *,
    reuse: bool = True,
) -> Erasure:
    if rows <= settings.privacy_sync_limit:
        try:
            async with session.begin_nested():
                return Erasure(counts=await erase())
        except TooLargeNow:
            pass  # what it did is undone; the job does it all
    # The same subject's erasure asked again while its job waits: that job (it will see what
    # commits meanwhile). Not one already running: it may be past a table that a person's
    # new rows have since reached.
    if reuse:
        subject = payload.model_dump(mode="json", exclude={"requested_by"})
        begun = await _begun(session, tenant_id, kind, subject, running=False)
        if begun is not None:
            return Erasure(job_id=begun)
    job_id, _ = await jobs.enqueue(
        session, tenant_id, kind, payload, max_attempts=settings.cognitive.queue.max_attempts
    )
    return Erasure(job_id=job_id)


async def _begun(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    subject: dict[str, Any],
    *,
    running: bool,
) -> int | None:
    """The job already erasing ``subject`` (waiting, failed, or if ``running`` running); a
    failed one is given its attempts again."""
    found = await jobs.unfinished(session, tenant_id, kind, subject, running=running)
    if found is None:
        return None
    if found[1] == "failed":
        await jobs.retry(session, tenant_id, found[0])
    return found[0]


class TooLargeNow(Exception):
    """An erasure run in the request found more to re-embed than a request should."""


class Budgeted:
    """The embedder of an erasure run in the request: ``TooLargeNow`` once it would embed
    more than ``budget`` passages. A person with one message of their own can be named in
    thousands of others' messages, each embedded again once redacted: 2,000 of them held a
    request for 40 s. The rows an erasure deletes are counted before it begins; these are
    found only as it goes."""

    def __init__(self, inner: Embedder, budget: int) -> None:
        self.inner, self.budget = inner, budget
        self.name, self.dimension = inner.name, inner.dimension
        self.calibration = inner.calibration

    async def passages(self, texts: Sequence[str]) -> list[Vector]:
        """Vectors of texts to be stored, or ``TooLargeNow`` past the budget."""
        self.budget -= len(texts)
        if self.budget < 0:
            raise TooLargeNow(f"{len(texts)} more texts to embed again, past the budget")
        return await self.inner.passages(texts)

    async def query(self, text: str) -> Vector:
        """The vector of a search query."""
        return await self.inner.query(text)

    async def close(self) -> None:
        """Nothing of its own to release."""


# ---------------------------------------------------------------- export
#
# Each aggregate declares its section of a person's export (their own rows, and others'
# rows in their conversations that may name them: kept only if they do; :u the id, :pk
# their private conversation) and of a group's (see ``service.db.registry``).


def _sections(kind: str) -> list[tuple[str, str]]:
    """(section name, query) of a person's or a group's export, in the aggregates' order."""
    out = []
    for table in registry.tables():
        query = table.export_user if kind == "user" else table.export_group
        if query is not None:
            out.append((table.section, query))
    return out


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


async def count_export_rows(
    session: AsyncSession, tenant_id: uuid.UUID, kind: str, subject: str
) -> int:
    """A quick size of an export, from indexed ids only: decides between streaming it now and
    writing it by a job."""
    if kind == "user":
        return await count_user_rows(session, tenant_id, subject)
    if kind == "group":
        return await count_group_rows(session, tenant_id, subject)
    return await count_tenant_rows(session, tenant_id)


async def document_parts(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    subject: str,
    counts: dict[str, int],
    *,
    spare_job: int = 0,
) -> AsyncIterator[str]:
    """One JSON document, written section by section from server-side cursors (a large
    export never sits in memory), ending with a manifest of counts. Each piece holds whole
    rows. ``counts`` is filled as the sections are written; ``spare_job``: the export's own
    job, which is not part of what is exported."""
    person = None
    if kind == "user":
        person = await find_person(session, tenant_id, subject)
        params: dict[str, Any] = {
            "t": tenant_id,
            "u": subject,
            "pk": person.private_key,
            "keys": person.conversations,
            "groups": person.groups,
            "peers": person.peers,
            "needles": person.needles,
            "spare": spare_job,
        }
        sections = _sections("user")
    else:
        params = {"t": tenant_id, "g": subject, "k": f"g:{subject}"}
        sections = _sections("group")
    head = {"subject": {"kind": kind, "id": subject}, "generated_at": datetime.now(UTC)}
    yield _json(head)[:-1]
    for name, query in sections:
        yield f', "{name}": ['
        count = 0
        result = await session.stream(text(query), params)
        async for row in result:
            data = dict(row._mapping)
            if person is not None:
                # Another's row is in the export only if it names the person for certain.
                own = data.pop("own")
                if not own and not any(person.redactor.mentions(v) for v in _strings(data)):
                    continue
            yield (", " if count else "") + _json(data)
            count += 1
        yield "]"
        counts[name] = count
    manifest = {"counts": counts, "note": "embeddings are derived from the texts and omitted"}
    yield f', "manifest": {_json(manifest)}}}'


async def export_stream(
    db: Database, tenant_id: uuid.UUID, kind: str, subject: str
) -> AsyncIterator[bytes]:
    """A person's or a group's document, streamed from one tenant transaction."""
    async with db.tenant(tenant_id) as session:
        async for part in document_parts(session, tenant_id, kind, subject, {}):
            yield part.encode()


def _hidden(table: registry.PersonalTable) -> set[str]:
    """Columns a whole-tenant export leaves out: secrets, and vectors (their copies and,
    during a re-embedding, their shadow columns), which are derived from the texts."""
    hidden = set(table.hidden)
    for column in registry.embedded():
        if column.table == table.table:
            hidden |= {column.vector, column.shadow}
    hidden |= {copy.column for copy in registry.derived() if copy.table == table.table}
    return hidden


async def tenant_parts(
    session: AsyncSession, tenant_id: uuid.UUID, counts: dict[str, int]
) -> AsyncIterator[str]:
    """The whole tenant as NDJSON: one line per row, ``{"table": …, "row": …}``; ``counts``
    gets the rows per table. The tenant's own row comes first."""
    for table in registry.tables():
        if table.tenant_key != "tenant_id" and table.tenant_export:
            row = (
                await session.execute(
                    text(f"SELECT * FROM {table.table} WHERE {table.tenant_key} = :t"),
                    {"t": tenant_id},
                )
            ).first()
            if row is not None:
                yield _json({"table": table.table, "row": dict(row._mapping)}) + "\n"
                counts[table.table] = 1
    for table in tenant_tables():
        hidden = _hidden(table)
        result = await session.stream(
            text(f"SELECT * FROM {table.table} WHERE tenant_id = :t"), {"t": tenant_id}
        )
        count = 0
        async for row in result:
            data = {k: v for k, v in row._mapping.items() if k not in hidden}
            yield _json({"table": table.table, "row": data}) + "\n"
            count += 1
        counts[table.table] = count


async def export_tenant(db: Database, tenant_id: uuid.UUID) -> AsyncIterator[bytes]:
    """The whole tenant as NDJSON, streamed from one tenant transaction."""
    async with db.tenant(tenant_id) as session:
        async for part in tenant_parts(session, tenant_id, {}):
            yield part.encode()
