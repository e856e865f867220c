"""Accepting an ``end`` call: the memo log and the historian's job, in one transaction."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.context import ConversationContext, checked_moment, key_part, scope_of
from service.db.engine import Database
from service.ends import repository
from service.ends.schemas import EndAccepted, EndRequest, MemoInfo
from service.errors import Conflict, Invalid
from service.privacy.service import was_erased
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


def turn_key(conversation_key: str, request_id: str, end_seq: int) -> str:
    """One turn of one conversation: ``g:<group>:<request_id>:<end_seq>`` (``p:<user>`` for a
    private chat), the group or user id and the request id escaped ('%' and ':'), so that no
    two (conversation, request_id, end_seq) ever make the same key."""
    kind, _, target = conversation_key.partition(":")
    return f"{kind}:{key_part(target)}:{key_part(request_id)}:{end_seq}"


def event_ids(
    conversation_key: str, request_id: str, end_seq: int, observations: int, memo: bool
) -> list[str]:
    """Deterministic ids: the turn's key, then ``.N`` for observation N and ``.memo`` for
    the bot's own action. The last part (``1.2``) is never one that ids made before the
    conversation was part of them end in (digits, or ``memo``), so none is ever reused."""
    base = turn_key(conversation_key, request_id, end_seq)
    ids = [f"{base}.{n}" for n in range(1, observations + 1)]
    return [*ids, f"{base}.memo"] if memo else ids


def dedupe_key(conversation_key: str, request_id: str, end_seq: int) -> str:
    """The historian job's dedupe key: one job per turn of a conversation."""
    return f"end:{turn_key(conversation_key, request_id, end_seq)}"


def fingerprint(request: EndRequest) -> str:
    """What a repeat of a turn must carry to be the same turn: a digest of the call as read
    (older field names read as the current ones)."""
    body = json.dumps(request.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()


def replayed(request: EndRequest, first: str | None, given: str) -> None:
    """Refuse a repeated turn key whose call differs from the first one (a receipt made
    before calls were fingerprinted has none, and is taken as the same call)."""
    if first is not None and first != given:
        raise Conflict(
            f"request_id {request.request_id!r} (end_seq {request.end_seq}) was already "
            "handed over in this conversation with another body; give this turn its own "
            "request_id",
            field="request_id",
        )


async def accept_end(
    db: Database, tenant: TenantContext, request: EndRequest, settings: Settings
) -> EndAccepted:
    """Record the memo and enqueue the historian, once per turn of a conversation: a repeat
    of (conversation, request_id, end_seq) with the same call is answered as the first was,
    one with another call is refused (``Conflict`` on ``request_id``)."""
    if not request.memo and not request.observations:
        return EndAccepted(enqueued=False, cognitive_enabled=tenant.cognitive_enabled)
    moment = request.moment(tenant.timezone)
    # The historian reads the time on the call's clocks, where one at the calendar's edge
    # may fall out of range (9999-12-30T00:00Z is 08:00 that day in Shanghai).
    checked_moment(moment, "timestamp")
    enqueue = tenant.cognitive_enabled
    key = request.conversation_key
    ids = event_ids(
        key, request.request_id, request.end_seq, len(request.observations), bool(request.memo)
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
    flagged: list[str] = []
    if tenant.erased_policy != "accept":
        async with db.tenant(tenant.tenant_id) as session:
            flagged = await check_erased(session, tenant, [request.sender_id, request.user_id])
    given = fingerprint(request)
    turn = dedupe_key(key, request.request_id, request.end_seq)
    async with db.tenant_connection(tenant.tenant_id, durable=not tenant.fast_ack) as conn:
        row = await conn.fetchrow(
            repository.ACCEPT_END,
            tenant.tenant_id,
            END_JOB,
            json.dumps(payload.model_dump(mode="json"), ensure_ascii=False),
            settings.cognitive.queue.max_attempts,
            turn,
            enqueue,
            given,
            key,
            request.request_type,
            request.group_id,
            request.user_id or (request.private_user if private else None),
            request.sender_id,
            request.request_id,
            request.end_seq,
            request.memo,
            moment,
        )
        assert row is not None
        first: Any = row
        if enqueue and row["created"] is None and row["existing"] is None:
            # A repeat that ran beside the first call: the receipt the statement could not
            # see (it began before the first committed) is there now.
            first = await conn.fetchrow(repository.RECEIPT, tenant.tenant_id, turn) or row
        if enqueue and row["created"] is None:
            # Raised inside the transaction: a refused repeat records nothing, not its memo.
            replayed(request, first["existing_fingerprint"], given)
    base: dict[str, Any] = {
        "request_id": request.request_id,
        "end_seq": request.end_seq,
        "memo_recorded": bool(request.memo),
        "warnings": [f"user {u} was erased before; this data is about them" for u in flagged],
    }
    if not enqueue:
        # Switched off: the memo log still works; no historian job is made (seed 002, 回退方式).
        return EndAccepted(enqueued=False, cognitive_enabled=False, **base)
    if row["created"] is not None:
        return EndAccepted(enqueued=True, job_id=row["created"], event_ids=ids, **base)
    existing_ids = first["existing_event_ids"]
    if isinstance(existing_ids, str):
        existing_ids = json.loads(existing_ids)
    return EndAccepted(
        enqueued=True,
        job_id=first["existing"],
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
    """Add a memo from elsewhere (an import), idempotent by its conversation's (request_id,
    end_seq) like the hand-over's; False when that memo is already there."""
    return await repository.record_memo(session, row)
