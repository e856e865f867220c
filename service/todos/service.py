"""Todo rules: the lifecycle, due lists, expiry, and webhook delivery of due todos."""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import checked_moment, conversation_key, on_clocks, scope_of
from service.db.engine import Database
from service.errors import Invalid, NotFound
from service.queue import repository as jobs
from service.queue.payloads import DeliverPayload
from service.queue.worker import JobContext, PermanentJobError
from service.settings import Settings
from service.tenants.service import find as get_tenant
from service.todos import repository, webhook

log = logging.getLogger("service.todos")

DELIVER_JOB = "todos.deliver"
# At most this many due todos in one answer.
DUE_LIMIT = 1000
# From a state, the states a todo may move to.
TRANSITIONS = {
    "PENDING": {"COMPLETED", "CANCELLED", "EXPIRED"},
    "COMPLETED": {"PENDING"},
    "CANCELLED": {"PENDING"},
    "EXPIRED": {"PENDING", "COMPLETED", "CANCELLED"},
}


async def patch(
    session: Any, tenant_id: uuid.UUID, todo_id: int, values: dict[str, Any], zone: tzinfo
) -> dict[str, Any]:
    """Change a todo; status moves only along the lifecycle, and a ``trigger_time`` without
    an offset is on ``zone``, the tenant's clocks."""
    if "trigger_time" in values:
        values["trigger_time"] = on_clocks(values["trigger_time"], zone)
    current = await repository.get(session, tenant_id, todo_id)
    if current is None:
        raise NotFound("no such todo")
    status = values.get("status")
    if status and status != current["status"] and status not in TRANSITIONS[current["status"]]:
        raise Invalid(f"a {current['status']} todo cannot become {status}", field="status")
    if "trigger_time" in values or (status == "PENDING" and current["status"] != "PENDING"):
        values["delivered_at"] = None  # a new time (or a reopened todo) is delivered again
    if values:
        await repository.update(session, tenant_id, todo_id, values)
    updated = await repository.get(session, tenant_id, todo_id)
    assert updated is not None
    return updated


# A todo's description: one statement a reminder can carry.
MAX_DESCRIPTION = 2000


@dataclass(frozen=True)
class Place:
    """Where a todo lives: the conversation it was asked in (``conversation_key``), the
    group's id, or the private chat's person (``user_id``), and who asked (``creator_id``)."""

    conversation_key: str
    group_id: str | None
    user_id: str | None
    creator_id: str | None

    @classmethod
    def of(cls, request_type: str, group_id: str | None, person: str | None) -> Place:
        """A group's todo is the group's; a private chat's is that chat's person's."""
        key = conversation_key(request_type, group_id, person)
        if request_type == "group":
            return cls(key, group_id, None, person)
        return cls(key, None, person, person)


def check_description(value: str | None) -> str:
    """A todo's description: non-empty, of reasonable length, with no NUL."""
    text = " ".join((value or "").split())
    if not text:
        raise Invalid("the description is empty", field="description")
    if len(text) > MAX_DESCRIPTION:
        raise Invalid(f"at most {MAX_DESCRIPTION} characters", field="description")
    if "\x00" in text:
        raise Invalid("the description must not contain NUL characters", field="description")
    return text


async def add(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    place: Place,
    description: str,
    trigger_time: datetime | None,
    zone: tzinfo,
    *,
    assignee_id: str | None = None,
    evidence: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], bool]:
    """A new pending todo of a conversation (the historian's ``add_todo``, a bot's
    ``POST /v1/todos``); a ``trigger_time`` without an offset is on ``zone``, the
    conversation's clocks. Returns the todo, and whether it is new: the same pending todo
    of the conversation (its description, due time and assignee) is not made twice, so a
    bot's retried call or a reminder asked for again is delivered once."""
    row = {
        "conversation_key": place.conversation_key,
        "group_id": place.group_id,
        "user_id": place.user_id,
        "creator_id": place.creator_id,
        "assignee_id": assignee_id,
        "description": check_description(description),
        "trigger_time": checked_moment(on_clocks(trigger_time, zone), "trigger_time"),
        "evidence": evidence or {},
    }
    existing = await repository.same_pending(session, tenant_id, row)
    if existing is not None:
        return existing, False
    todo_id = await repository.insert(session, tenant_id, row)
    made = await repository.get(session, tenant_id, todo_id)
    assert made is not None
    return made, True


async def pending(
    session: AsyncSession, tenant_id: uuid.UUID, conversation_key: str, limit: int
) -> list[dict[str, Any]]:
    """A conversation's pending todos, soonest first: what the bot and the historian are shown."""
    return await repository.listing(
        session,
        tenant_id,
        status="PENDING",
        conversation_key=conversation_key,
        due_before=None,
        limit=limit,
    )


# The due scan reads due todos a page at a time and gives a job to those without one, until a
# page's worth has one or the pages of a pass are read. A todo whose job exists (queued,
# retrying, or failed: a webhook that is down) is passed over; read from the same start at
# every pass, a page of such todos took every pass, and no other todo of any tenant got a job.
# Each pass goes on where the last stopped, and starts over after the last due todo.
DUE_PAGE = 500
DUE_PAGES = 20


@dataclass
class Courier:
    """Delivers due todos to a tenant's webhook, through the jobs queue (with its retries)."""

    db: Database
    settings: Settings
    _after: tuple[uuid.UUID, int] = field(default=repository.BEFORE_ALL, init=False)

    async def enqueue_due(self) -> int:
        """Periodic: one delivery job per due, undelivered todo (version) of a tenant with a
        webhook; returns how many were queued."""
        made = 0
        async with self.db.system() as session:
            for _ in range(DUE_PAGES):
                page = await repository.due(session, self._after, DUE_PAGE)
                full = len(page) == DUE_PAGE
                self._after = page[-1][:2] if full else repository.BEFORE_ALL
                keys = {todo: repository.delivery_key(todo, version) for _, todo, version in page}
                have = await jobs.keyed(session, [(t, keys[todo]) for t, todo, _ in page])
                for tenant, todo, version in page:
                    if (tenant, keys[todo]) in have:
                        continue
                    await jobs.enqueue(
                        session,
                        tenant,
                        DELIVER_JOB,
                        DeliverPayload(todo_id=todo, version=version),
                        max_attempts=self.settings.cognitive.queue.max_attempts,
                        dedupe_key=keys[todo],
                    )
                    made += 1
                if not full or made >= DUE_PAGE:
                    break
        return made

    async def run_deliver(self, job: JobContext) -> dict[str, Any]:
        """POST the todo to the webhook; a non-2xx answer fails the attempt (retried)."""
        payload = DeliverPayload.of(job.job.payload)
        todo_id = payload.todo_id
        async with job.transaction() as session:
            todo = await repository.get(session, job.job.tenant_id, todo_id)
            tenant = await get_tenant(session, job.job.tenant_id)
            settings = dict(tenant.settings or {}) if tenant is not None else {}
        url = settings.get("webhook_url")
        if todo is None or todo["status"] != "PENDING" or todo["delivered_at"] is not None:
            return {"skipped": True}
        if payload.version is not None and todo["updated_at"] != payload.version:
            # Changed since it was found due (rescheduled, say): that version has its own job,
            # once it is due.
            return {"skipped": True}
        if not url:
            raise PermanentJobError("the tenant has no webhook_url")
        body = {
            "event": "todo.due",
            "tenant_id": str(job.job.tenant_id),
            "todo": json.loads(json.dumps(todo, default=str)),
        }
        try:
            response = await webhook.post(
                url,
                body,
                timeout=self.settings.cognitive.memory.webhook_timeout_seconds,
                allow_private=self.settings.webhook_allow_private,
            )
        except webhook.Refused as exc:
            raise PermanentJobError(str(exc)) from None
        except (httpx.HTTPError, TimeoutError):
            # Not why (refused, timed out, …): the job's error is the tenant's to read, and
            # would tell it what answers where.
            log.info("todo %s: the webhook could not be reached", todo_id, exc_info=True)
            raise RuntimeError("the webhook could not be reached") from None
        if response.status_code >= 300:
            log.info("todo %s: the webhook answered %s", todo_id, response.status_code)
            raise RuntimeError("the webhook did not accept the delivery")
        async with job.finishing() as session:
            await repository.mark_delivered(session, job.job.tenant_id, todo_id, todo["updated_at"])
        return {"delivered": todo_id}


async def listing(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    status: str | None,
    group_id: str | None,
    user_id: str | None,
    due_before: datetime | None,
    limit: int,
    zone: tzinfo,
) -> list[dict[str, Any]]:
    """Todos by status, conversation (a group's or a private chat's) and due time (without an
    offset, on ``zone``, the tenant's clocks)."""
    key = scope_of(group_id, user_id) if (group_id or user_id) else None
    return await repository.listing(
        session,
        tenant_id,
        status=status,
        conversation_key=key,
        due_before=on_clocks(checked_moment(due_before, "due_before"), zone),
        limit=limit,
    )


async def due(
    session: AsyncSession, tenant_id: uuid.UUID, group_id: str | None, user_id: str | None
) -> list[dict[str, Any]]:
    """Pending todos whose time has come (bots poll them, then mark them done)."""
    key = scope_of(group_id, user_id) if (group_id or user_id) else None
    return await repository.listing(
        session,
        tenant_id,
        status="PENDING",
        conversation_key=key,
        due_before=datetime.now(UTC),
        limit=DUE_LIMIT,
    )


def overdue_before(now: datetime, settings: Settings) -> datetime:
    """Pending todos triggered before this are expired by maintenance."""
    return now - timedelta(days=settings.cognitive.memory.todo_expire_after_days)


async def expire_overdue(
    session: AsyncSession, tenant_id: uuid.UUID, now: datetime, settings: Settings
) -> int:
    """Expire the tenant's pending todos whose time passed long ago; returns how many."""
    return await repository.expire_overdue(session, tenant_id, overdue_before(now, settings))
