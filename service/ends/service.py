"""Accepting an ``end`` call: the memo log and the historian's job, in one transaction."""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.context import ConversationContext, checked_moment, scope_of
from service.db.engine import Database
from service.ends import repository
from service.ends.schemas import EndAccepted, EndRequest, MemoInfo
from service.errors import Conflict, Invalid
from service.events import service as events
from service.privacy.service import was_erased
from service.queue import repository as jobs
from service.queue.payloads import EndPayload
from service.settings import Settings
from service.tenants.service import TenantContext

END_JOB = "historian.end"
_CONTEXT_FIELDS = set(ConversationContext.model_fields)


async def check_erased(
    session: AsyncSession, tenant: TenantContext, ids: list[str | None]
) -> list[str]:
    """Apply the tenant's policy for data about erased people: refuse, or name them to flag."""
    if tenant.erased_policy == "accept":
        return []
    wanted = [i for i in ids if i]
    erased = await was_erased(session, tenant.tenant_id, wanted)
    if erased and tenant.erased_policy == "refuse":
        raise Invalid(
            "data about an erased person is refused by this tenant's policy",
            field="sender_id" if set(erased) & {ids[0]} else "user_id",
        )
    return sorted(erased)


def event_ids(request_id: str, end_seq: int, observations: int, memo: bool) -> list[str]:
    """Deterministic ids: ``rid:seq`` for a lone observation, ``rid:seq:N`` for several,
    ``rid:seq:memo`` for the bot's own action."""
    base = f"{request_id}:{end_seq}"
    ids = [base] if observations == 1 else [f"{base}:{n}" for n in range(1, observations + 1)]
    return [*ids, f"{base}:memo"] if memo else ids


def dedupe_key(request_id: str, end_seq: int) -> str:
    """The historian job's dedupe key: one job per (request_id, end_seq)."""
    return f"end:{request_id}:{end_seq}"


def neighbour_turns(request_id: str, end_seq: int, observations: int) -> list[tuple[str, int]]:
    """The other turns that may name an event as this one does: a lone observation's id
    (``r:s``) has the shape of one of several (``r:s:N``) where one request id is the
    other's followed by ':' and its end_seq (("t:1", 2) and ("t", 1)'s second: ``t:1:2``)."""
    if observations > 1:
        return [(f"{request_id}:{end_seq}", n) for n in range(1, observations + 1)]
    head, _, tail = request_id.rpartition(":")
    if observations == 1 and head and tail.isdigit() and tail == str(int(tail)):
        return [(head, int(tail))]
    return []


async def check_event_ids(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    request: EndRequest,
    ids: list[str],
    others: list[tuple[str, int]],
) -> None:
    """Refuse a turn whose event ``ids`` one of the ``others`` (``neighbour_turns``) holds
    (its events, or its job's receipt): the historian's write would replace that turn's
    events, of any conversation, with these."""
    if not others:
        return
    keys = [dedupe_key(*turn) for turn in others]
    taken = await jobs.listed_by_receipts(session, tenant_id, keys, ids)
    taken |= await events.held_by_other_turns(
        session, tenant_id, ids, request.request_id, request.end_seq
    )
    if taken:
        raise Conflict(
            f"event id {min(taken)} is another turn's; give this turn another request_id",
            field="request_id",
        )


async def accept_end(
    db: Database, tenant: TenantContext, request: EndRequest, settings: Settings
) -> EndAccepted:
    """Record the memo and enqueue the historian; idempotent by (request_id, end_seq)."""
    if not request.memo and not request.observations:
        return EndAccepted(enqueued=False, cognitive_enabled=tenant.cognitive_enabled)
    moment = request.moment(tenant.timezone)
    # The historian reads the time on the call's clocks, where one at the calendar's edge
    # may fall out of range (9999-12-30T00:00Z is 08:00 that day in Shanghai).
    checked_moment(moment, "timestamp")
    enqueue = tenant.cognitive_enabled
    ids = event_ids(
        request.request_id, request.end_seq, len(request.observations), bool(request.memo)
    )
    context = request.model_dump(mode="json", include=_CONTEXT_FIELDS)
    # The tenant's bot identity stands in when the call names none ("你" needs someone).
    context["bot_id"] = context.get("bot_id") or tenant.bot.get("id")
    context["bot_name"] = context.get("bot_name") or tenant.bot.get("name")
    payload = EndPayload(
        context=context,
        request_id=request.request_id,
        end_seq=request.end_seq,
        moment=moment.isoformat(),
        timezone=request.timezone or tenant.timezone,
        memo=request.memo,
        observations=request.observations,
        shareable=request.shareable,
        force=request.force,
        source_message=request.source_message,
        recent_messages=request.recent_messages,
        event_ids=ids,
        pii_policy=tenant.pii_policy,
    )
    private = request.request_type == "private"
    # The checks before the hand-over, in one transaction when there is any to make.
    others = neighbour_turns(request.request_id, request.end_seq, len(request.observations))
    others = others if enqueue else []
    flagged: list[str] = []
    if tenant.erased_policy != "accept" or others:
        async with db.tenant(tenant.tenant_id) as session:
            flagged = await check_erased(session, tenant, [request.sender_id, request.user_id])
            await check_event_ids(session, tenant.tenant_id, request, ids, others)
    async with db.tenant_connection(tenant.tenant_id, durable=not tenant.fast_ack) as conn:
        row = await conn.fetchrow(
            repository.ACCEPT_END,
            tenant.tenant_id,
            END_JOB,
            json.dumps(payload.model_dump(mode="json"), ensure_ascii=False),
            settings.cognitive.queue.max_attempts,
            dedupe_key(request.request_id, request.end_seq),
            enqueue,
            request.conversation_key,
            request.request_type,
            request.group_id,
            request.user_id or (request.private_user if private else None),
            request.sender_id,
            request.request_id,
            request.end_seq,
            request.memo,
            moment,
        )
    base: dict[str, Any] = {
        "request_id": request.request_id,
        "end_seq": request.end_seq,
        "memo_recorded": bool(request.memo),
        "warnings": [f"user {u} was erased before; this data is about them" for u in flagged],
    }
    if not enqueue:
        # Switched off: the memo log still works; no historian job is made (seed 002, 回退方式).
        return EndAccepted(enqueued=False, cognitive_enabled=False, **base)
    assert row is not None
    if row["created"] is not None:
        return EndAccepted(enqueued=True, job_id=row["created"], event_ids=ids, **base)
    existing_ids = row["existing_event_ids"]
    if isinstance(existing_ids, str):
        existing_ids = json.loads(existing_ids)
    return EndAccepted(
        enqueued=True,
        job_id=row["existing"],
        event_ids=list(existing_ids or ids),
        duplicate=True,
        **base,
    )


async def recent_memos(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    group_id: str | None,
    user_id: str | None,
    limit: int,
) -> list[MemoInfo]:
    """A conversation's memo log, newest first."""
    return await memo_log(session, tenant_id, scope_of(group_id, user_id), limit)


async def memo_log(
    session: AsyncSession, tenant_id: uuid.UUID, conversation_key: str, limit: int
) -> list[MemoInfo]:
    """The newest memos of a conversation (by its key), newest first."""
    rows = await repository.recent_memos(session, tenant_id, conversation_key, limit)
    return [MemoInfo(**row) for row in rows]


async def record_memo(session: AsyncSession, row: dict[str, Any]) -> bool:
    """Add a memo from elsewhere (an import), idempotent by (request_id, end_seq) like the
    hand-over's; False when that memo is already there."""
    return await repository.record_memo(session, row)
