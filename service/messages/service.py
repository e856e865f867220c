"""The raw message archive: ingest, extraction triggers, background embedding, search."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.ext.asyncio import AsyncSession

from service.context import conversation_key, scope_of
from service.db.engine import Database
from service.embedding import Embedder
from service.errors import Invalid
from service.messages import repository
from service.messages.schemas import (
    MessageBatch,
    MessageHit,
    MessageSearch,
    MessageSearchResult,
    MessagesStored,
)
from service.queue import repository as jobs
from service.queue.worker import JobContext
from service.settings import Settings
from service.tenants.service import TenantContext

log = logging.getLogger("service.messages")

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
    rows = []
    group_names: dict[str, str] = {}
    for n, message in enumerate(batch.messages):
        if len(message.text) > limits.text_max_chars:
            raise Invalid(f"at most {limits.text_max_chars} characters", field=f"messages.{n}.text")
        if "\x00" in message.text:
            raise Invalid("text must not contain NUL characters", field=f"messages.{n}.text")
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
                "text": message.text,
                "sent_at": _sent_at(message.sent_at, message.timezone or tenant.timezone, n),
            }
        )
    inserted = await repository.insert_messages(session, tenant.tenant_id, rows)
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
                "last_at": max(r.sent_at for r in new),
                "last_seq": max(r.seq for r in new),
            },
        )
        remember = any(asks_to_remember(r.text, extraction.remember_keywords) for r in new)
        if pending >= extraction.every_n_messages or remember:
            reason = "remember" if remember else "count"
            extraction_jobs.append(
                await _enqueue_extraction(
                    session, tenant.tenant_id, key, last_seq, reason, settings
                )
            )
            await repository.reset_pending(session, tenant.tenant_id, key)
    embed_job = None
    if inserted and not await repository.embed_job_queued(session, tenant.tenant_id, EMBED_JOB):
        embed_job, _ = await jobs.enqueue(
            session,
            tenant.tenant_id,
            EMBED_JOB,
            {},
            max_attempts=settings.cognitive.queue.job_max_retries + 1,
        )
    return MessagesStored(
        stored=len(inserted),
        duplicates=len(rows) - len(inserted),
        extraction_job_ids=extraction_jobs,
        embed_job_id=embed_job,
    )


def _sent_at(value: datetime | None, zone: str, n: int) -> datetime:
    if value is None:
        return datetime.now(UTC)
    if value.tzinfo is not None:
        return value
    try:
        return value.replace(tzinfo=ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError):
        raise Invalid(f"unknown IANA timezone {zone!r}", field=f"messages.{n}.timezone") from None


async def _enqueue_extraction(
    session: AsyncSession,
    tenant_id: Any,
    key: str,
    upto_seq: int,
    reason: str,
    settings: Settings,
) -> int:
    job_id, _ = await jobs.enqueue(
        session,
        tenant_id,
        EXTRACT_JOB,
        {"conversation_key": key, "upto_seq": upto_seq, "reason": reason},
        max_attempts=settings.cognitive.queue.job_max_retries + 1,
        dedupe_key=f"extract:{key}:{upto_seq}",
    )
    return job_id


async def search(
    session: AsyncSession, tenant: TenantContext, request: MessageSearch, embedder: Embedder
) -> MessageSearchResult:
    """The conversation's archived messages nearest in meaning to the query."""
    key = scope_of(request.group_id, request.user_id)
    warnings = []
    time_from, time_to = request.time_from, request.time_to
    if time_from and time_to and time_from > time_to:
        time_from, time_to = time_to, time_from
        warnings.append("time_from was after time_to; the two were swapped")
    vector = await embedder.query(request.query)
    rows = await repository.search_messages(
        session, tenant.tenant_id, key, vector, request.top_k, time_from, time_to
    )
    return MessageSearchResult(messages=[MessageHit(**row) for row in rows], warnings=warnings)


@dataclass
class Archivist:
    """The message stream's background jobs: embedding, extraction bookkeeping, the pause."""

    db: Database
    embedder: Embedder
    settings: Settings

    async def run_embed(self, job: JobContext) -> dict[str, Any]:
        """Embed the tenant's messages that have no vector yet, a batch per transaction."""
        batch = self.settings.models.embedding.batch_size
        done = 0
        while True:
            async with job.transaction() as session:
                rows = await repository.unembedded_messages(session, job.job.tenant_id, batch)
                if not rows:
                    break
                vectors = await self.embedder.passages([r.text for r in rows])
                await repository.set_embeddings(session, job.job.tenant_id, rows, vectors)
            done += len(rows)
        return {"embedded": done}

    async def run_extract(self, job: JobContext) -> dict[str, Any]:
        """Hand the conversation's unread messages to extraction and advance the mark.

        What extraction derives from them (memories, profiles) is added by later parts;
        this job owns the bookkeeping: which messages have been processed.
        """
        payload = job.job.payload
        key, upto = str(payload["conversation_key"]), int(payload["upto_seq"])
        limit = self.settings.cognitive.extraction.max_batch
        async with job.finishing() as session:
            mark, unread = await repository.unread_messages(
                session, job.job.tenant_id, key, upto, limit
            )
            if unread:
                last = unread[-1].seq
                await repository.advance_extracted(session, job.job.tenant_id, key, last)
                if last < upto:
                    # More than one batch: the rest goes to a follow-up job.
                    await _enqueue_extraction(
                        session, job.job.tenant_id, key, upto, "continuation", self.settings
                    )
            job.result = {
                "conversation_key": key,
                "from_seq": mark,
                "to_seq": unread[-1].seq if unread else mark,
                "messages": len(unread),
                "reason": payload.get("reason"),
            }
        return job.result

    async def trigger_quiet_conversations(self) -> int:
        """The pause trigger: extraction for conversations quiet for ``pause_minutes``."""
        extraction = self.settings.cognitive.extraction
        async with self.db.system() as session:
            quiet = await repository.take_quiet_conversations(
                session, extraction.pause_minutes * 60, limit=500
            )
            for row in quiet:
                await _enqueue_extraction(
                    session,
                    row.tenant_id,
                    row.conversation_key,
                    row.last_seq,
                    "pause",
                    self.settings,
                )
        if quiet:
            log.info("extraction queued for %d quiet conversation(s)", len(quiet))
        return len(quiet)
