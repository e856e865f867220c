"""Accepting an ``end`` call: the memo log and the historian's job, in one transaction."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from service.context import ConversationContext
from service.ends import repository
from service.ends.schemas import EndAccepted, EndRequest
from service.queue import repository as jobs
from service.settings import Settings
from service.tenants.service import TenantContext

END_JOB = "historian.end"
_CONTEXT_FIELDS = set(ConversationContext.model_fields)


def event_ids(request_id: str, end_seq: int, observations: int, memo: bool) -> list[str]:
    """Deterministic ids: ``rid:seq`` for a lone observation, ``rid:seq:N`` for several,
    ``rid:seq:memo`` for the bot's own action."""
    base = f"{request_id}:{end_seq}"
    ids = [base] if observations == 1 else [f"{base}:{n}" for n in range(1, observations + 1)]
    return [*ids, f"{base}:memo"] if memo else ids


async def accept_end(
    session: AsyncSession, tenant: TenantContext, request: EndRequest, settings: Settings
) -> EndAccepted:
    """Record the memo and enqueue the historian; idempotent by (request_id, end_seq)."""
    if not request.memo and not request.observations:
        return EndAccepted(enqueued=False, cognitive_enabled=tenant.cognitive_enabled)
    moment = request.moment(tenant.timezone)
    memo_recorded = False
    if request.memo:
        memo_recorded = True
        await repository.insert_memo(
            session,
            {
                "tenant_id": tenant.tenant_id,
                "conversation_key": request.conversation_key,
                "request_type": request.request_type,
                "group_id": request.group_id,
                "user_id": request.user_id
                or (request.private_user if request.request_type == "private" else None),
                "sender_id": request.sender_id,
                "request_id": request.request_id,
                "end_seq": request.end_seq,
                "memo": request.memo,
                "said_at": moment,
            },
        )
    base = {
        "request_id": request.request_id,
        "end_seq": request.end_seq,
        "memo_recorded": memo_recorded,
    }
    if not tenant.cognitive_enabled:
        # Switched off: the memo log still works; no historian job is made (seed 002, 回退方式).
        return EndAccepted(enqueued=False, cognitive_enabled=False, **base)
    ids = event_ids(
        request.request_id, request.end_seq, len(request.observations), bool(request.memo)
    )
    context = request.model_dump(mode="json", include=_CONTEXT_FIELDS)
    # The tenant's bot identity stands in when the call names none ("你" needs someone).
    context["bot_id"] = context.get("bot_id") or tenant.bot.get("id")
    context["bot_name"] = context.get("bot_name") or tenant.bot.get("name")
    payload = {
        "context": context,
        "request_id": request.request_id,
        "end_seq": request.end_seq,
        "moment": moment.isoformat(),
        "timezone": request.timezone or tenant.timezone,
        "memo": request.memo,
        "observations": request.observations,
        "force": request.force,
        "source_message": request.source_message,
        "recent_messages": request.recent_messages,
        "event_ids": ids,
    }
    job_id, created = await jobs.enqueue(
        session,
        tenant.tenant_id,
        END_JOB,
        payload,
        max_attempts=settings.cognitive.queue.job_max_retries + 1,
        dedupe_key=f"end:{request.request_id}:{request.end_seq}",
    )
    if not created:
        existing = await jobs.get_payload(session, tenant.tenant_id, job_id)
        ids = list((existing or {}).get("event_ids", ids))
    return EndAccepted(enqueued=True, job_id=job_id, event_ids=ids, duplicate=not created, **base)
