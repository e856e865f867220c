"""The raw message archive: ingest (which queues extraction), background embedding."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.ext.asyncio import AsyncSession

from service import pii
from service.context import conversation_key, in_range
from service.db import statistics
from service.db.engine import Database
from service.embedding import Embedder
from service.errors import Invalid
from service.messages import repository
from service.messages.models import passage_text
from service.messages.schemas import MessageBatch, MessagesStored
from service.privacy.service import was_erased
from service.queue import repository as jobs
from service.queue.payloads import ExtractPayload, NoPayload
from service.queue.worker import JobContext
from service.retrieval import floods
from service.retrieval.terms import terms, to_tsvector_literal
from service.settings import Settings
from service.tenants.service import TenantContext

EMBED_JOB = "messages.embed"
EXTRACT_JOB = "messages.extract"


def asks_to_remember(text: str, keywords: list[str]) -> bool:
    """A message that asks the bot to remember something triggers extraction at once."""
    lowered = text.lower()
    return any(keyword.lower() in lowered for keyword in keywords)


async def ingest(
    session: AsyncSession, tenant: TenantContext, batch: MessageBatch, settings: Settings
) -> MessagesStored:
    """Store a batch (duplicates ignored), count it per conversation, fire extraction triggers."""
    limits = settings.cognitive.messages
    if len(batch.messages) > limits.batch_max:
        raise Invalid(f"at most {limits.batch_max} messages per call", field="messages")
    rows: list[dict[str, Any]] = []
    group_names: dict[str, str] = {}
    dropped = 0
    for n, message in enumerate(batch.messages):
        if len(message.text) > limits.text_max_chars:
            raise Invalid(f"at most {limits.text_max_chars} characters", field=f"messages.{n}.text")
        if "\x00" in message.text:
            raise Invalid("text must not contain NUL characters", field=f"messages.{n}.text")
        body, _ = pii.apply(message.text, tenant.pii_policy)
        if body is None:
            dropped += 1  # the tenant's policy: items with personal data are not stored
            continue
        user = message.user_id or (message.sender_id if message.request_type == "private" else None)
        key = conversation_key(message.request_type, message.group_id, user)
        if message.group_name:
            group_names[key] = message.group_name
        rows.append(
            {
                "conversation_key": key,
                "message_id": message.message_id,
                "request_type": message.request_type,
                "group_id": message.group_id,
                "user_id": user,
                "sender_id": message.sender_id,
                "sender_name": message.sender_name,
                "text": body,
                "sent_at": _sent_at(
                    message.sent_at, message.timezone or tenant.timezone, tenant.timezone, n
                ),
                "lexical": to_tsvector_literal(terms(body)),
            }
        )
    if tenant.erased_policy != "accept":
        erased = await was_erased(
            session, tenant.tenant_id, [r["sender_id"] for r in rows if r["sender_id"]]
        )
        if erased and tenant.erased_policy == "refuse":
            raise Invalid("messages of an erased person are refused", field="messages.sender_id")
        warnings = [
            f"user {u} was erased before; these messages are about them" for u in sorted(erased)
        ]
    else:
        warnings = []
    if rows:
        keys = [r["conversation_key"] for r in rows]
        await repository.lock_conversations(session, tenant.tenant_id, keys)
    await copies(session, tenant.tenant_id, rows)
    inserted = await repository.insert_messages(session, tenant.tenant_id, rows) if rows else []
    per_conversation: dict[str, list[Any]] = defaultdict(list)
    for row in inserted:
        per_conversation[row.conversation_key].append(row)
    first_row = {r["conversation_key"]: r for r in reversed(rows)}
    extraction = settings.cognitive.extraction
    extraction_jobs = []
    for key, new in per_conversation.items():
        sample = first_row[key]
        pending, last_seq = await repository.touch_conversation(
            session,
            {
                "tenant_id": tenant.tenant_id,
                "conversation_key": key,
                "request_type": sample["request_type"],
                "group_id": sample["group_id"],
                "user_id": sample["user_id"] if sample["request_type"] == "private" else None,
                "group_name": group_names.get(key),
                "count": len(new),
                "term_count": sum(r.term_count for r in new),
                "last_at": max(r.sent_at for r in new),
                "last_seq": max(r.seq for r in new),
            },
        )
        remember = any(asks_to_remember(r.text, extraction.remember_keywords) for r in new)
        if pending >= extraction.every_n_messages or remember:
            reason = "remember" if remember else "count"
            extraction_jobs.append(
                await enqueue_extraction(session, tenant.tenant_id, key, last_seq, reason, settings)
            )
            await repository.reset_pending(session, tenant.tenant_id, key)
    embed_job = None
    if inserted and not await jobs.kind_queued(session, tenant.tenant_id, EMBED_JOB):
        embed_job, _ = await jobs.enqueue(
            session,
            tenant.tenant_id,
            EMBED_JOB,
            NoPayload(),
            max_attempts=settings.cognitive.queue.max_attempts,
        )
    return MessagesStored(
        stored=len(inserted),
        duplicates=len(rows) - len(inserted),
        dropped=dropped,
        warnings=warnings,
        extraction_job_ids=extraction_jobs,
        embed_job_id=embed_job,
    )


async def copies(session: AsyncSession, tenant_id: Any, rows: list[dict[str, Any]]) -> None:
    """Index the words of one copy of each flood (``service.retrieval.floods``) among the
    new ``rows`` and the conversations' latest stored messages: the new copies left
    unindexed get an empty ``lexical`` and are marked ``flood_copy`` (not searched by
    meaning either), the stored ones lose theirs likewise. In an 8,001-message
    group where an ad naming 王芳 came 3,000 times, a search for the name did not find the
    one member's line naming her."""
    told: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:  # a message id twice in a batch is stored once, the first
        if row["sender_id"] is not None and row["lexical"]:
            told.setdefault((row["conversation_key"], row["message_id"]), row)
    if not told:
        return
    moments = [r["sent_at"] for r in told.values()]
    stored = await repository.said_lately(session, tenant_id, list(told), moments)
    found = []
    for s in stored:
        # A new message repeating a stored id is the stored one: it will not be inserted.
        key = (s.conversation_key, s.message_id)
        told.pop(key, None)
        said = (s.conversation_key, s.sender_id, s.sent_at, floods.digest(s.text))
        found.append(floods.Copy(*said, order=(0, s.seq), ref=key, indexed=s.indexed))
    found += floods.new_copies(told.values(), "sent_at")
    await repository.unindex(session, tenant_id, floods.unindexed(found))
    for row in told.values():
        row["flood_copy"] = not row["lexical"]


def _sent_at(value: datetime | None, zone: str, clocks: str, n: int) -> datetime:
    """A message's time: one without an offset is read on ``zone``. Refused where the
    historian, reading it on ``clocks`` (the tenant's), could not: at the calendar's edge
    (9999-12-30T00:00-16:00 is the 31st in Shanghai), the extraction of its day failed, and
    with it every later extraction of the conversation."""
    if value is None:
        return datetime.now(UTC)
    if value.tzinfo is None:
        try:
            value = value.replace(tzinfo=ZoneInfo(zone))
        except (ZoneInfoNotFoundError, ValueError):
            field = f"messages.{n}.timezone"
            raise Invalid(f"unknown IANA timezone {zone!r}", field=field) from None
    try:
        in_range(value.astimezone(ZoneInfo(clocks)))
    except (OverflowError, ValueError) as exc:
        raise Invalid(f"on the tenant's clocks, {exc}", field=f"messages.{n}.sent_at") from None
    return value


async def enqueue_extraction(
    session: AsyncSession,
    tenant_id: Any,
    key: str,
    upto_seq: int,
    reason: str,
    settings: Settings,
) -> int:
    """Queue extraction of a conversation's messages up to ``upto_seq``, or have the
    conversation's extraction that waits to start read up to there too (one per
    conversation: a chat's every "remember this" is one job while the last one runs)."""
    job_id, _ = await jobs.enqueue_joined(
        session,
        tenant_id,
        EXTRACT_JOB,
        ExtractPayload(conversation_key=key, upto_seq=upto_seq, reason=reason),
        queueing_lock=f"extract:{key}",
        grow="upto_seq",
        max_attempts=settings.cognitive.queue.max_attempts,
    )
    return job_id


@dataclass
class Archivist:
    """The message stream's background job: embedding the stored messages."""

    db: Database
    embedder: Embedder
    settings: Settings

    async def run_embed(self, job: JobContext) -> dict[str, Any]:
        """Embed the tenant's messages that have no vector yet, a batch per transaction."""
        batch = self.settings.models.embedding.batch_size
        done = 0
        written: Counter[tuple[uuid.UUID, str]] = Counter()
        while True:
            if done:
                job.stop_point()  # each batch commits: a shutdown waits for one, not all
            async with job.transaction() as session:
                rows = await repository.unembedded_messages(session, job.job.tenant_id, batch)
                if not rows:
                    break
                vectors = await self.embedder.passages(
                    [passage_text(r.sender_name, r.text) for r in rows]
                )
                await repository.set_embeddings(session, job.job.tenant_id, rows, vectors)
            done += len(rows)
            written.update((job.job.tenant_id, r.conversation_key) for r in rows)
        if done:
            # A backlog of thousands just embedded (a history imported through the API) may
            # be most of the table: searched at once, it must not be planned as the table was.
            await statistics.analyze_outgrown(self.db, ["messages"], done, written)
        return {"embedded": done}


async def speakers(session: AsyncSession, tenant_id: uuid.UUID, key: str) -> list[str]:
    """The names a conversation's latest 200 messages were sent under (the context reads
    them: greeting one of them by name names nothing)."""
    return await repository.speakers(session, tenant_id, key)


# ---------------------------------------------------------------- the extraction's reads
# What the historian's extraction job (service.historian.extraction) reads of a conversation
# and marks as read, in its own transaction.


async def unread(
    session: AsyncSession, tenant_id: uuid.UUID, key: str, upto: int, limit: int
) -> tuple[int, list[Any]]:
    """Lock the conversation's bookkeeping (one extraction at a time); its high-water mark
    and up to ``limit`` messages after it, up to ``upto``."""
    return await repository.unread_messages(session, tenant_id, key, upto, limit)


async def mark_read(session: AsyncSession, tenant_id: uuid.UUID, key: str, seq: int) -> None:
    """The conversation's messages up to ``seq`` are extracted."""
    await repository.advance_extracted(session, tenant_id, key, seq)


async def group_name(session: AsyncSession, tenant_id: uuid.UUID, key: str) -> str | None:
    """The last name a group was seen under."""
    return await repository.group_name(session, tenant_id, key)


async def said_on_day(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    key: str,
    day: date,
    zone: tzinfo,
    *,
    without: str | None = None,
) -> list[Any]:
    """A conversation's messages on one local day (``sender_name``, ``text``); ``without``:
    but for the messages a person's erasure deletes."""
    return await repository.said_on_day(session, tenant_id, key, day, zone, without)


async def group_days(
    session: AsyncSession, tenant_id: uuid.UUID, person_id: str, zone: str
) -> list[tuple[str, date]]:
    """Each (group id, local day in ``zone``, an IANA name) a person's messages are on."""
    return await repository.group_days(session, tenant_id, person_id, zone)


async def take_quiet(session: AsyncSession, quiet_seconds: float, limit: int) -> list[Any]:
    """Conversations of every tenant quiet for ``quiet_seconds`` with messages not yet
    extracted, their pending count reset (each is taken once)."""
    return await repository.take_quiet_conversations(session, quiet_seconds, limit)
