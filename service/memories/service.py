"""Memory rules: every change with its history row, duplicates suppressed, validity kept."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import and_
from sqlalchemy.ext.asyncio import AsyncSession

from service import pii
from service.embedding.base import Calibration, Vector
from service.errors import Invalid, NotFound
from service.memories import repository
from service.memories.models import CATEGORIES, SCOPES, Memory
from service.memories.schemas import (
    MemorySearch,
)
from service.memories.scope import MEMORY
from service.retrieval.terms import near_duplicate
from service.settings import MemorySettings
from service.visibility import Viewer

MAX_CONTENT = 2000


def check_content(content: str, field: str = "content") -> str:
    """A memory's content: one non-empty statement of reasonable length."""
    text = re.sub(r"\s+", " ", content or "").strip()
    if not text:
        raise Invalid("the content is empty", field=field)
    if len(text) > MAX_CONTENT:
        raise Invalid(f"at most {MAX_CONTENT} characters", field=field)
    if "\x00" in text:
        raise Invalid("the content must not contain NUL characters", field=field)
    return text


def check_binding(scope: str, user_id: str | None, group_id: str | None) -> None:
    """GLOBAL and PRIVATE need a user, GROUP a group, MEMBER_IN_GROUP both."""
    if scope not in SCOPES:
        raise Invalid(f"scope is one of {', '.join(SCOPES)}", field="scope")
    if scope in ("GLOBAL", "PRIVATE") and (not user_id or group_id):
        raise Invalid(f"a {scope} memory is bound to a user_id only", field="user_id")
    if scope == "GROUP" and (not group_id or user_id):
        raise Invalid("a GROUP memory is bound to a group_id only", field="group_id")
    if scope == "MEMBER_IN_GROUP" and (not group_id or not user_id):
        raise Invalid("a MEMBER_IN_GROUP memory needs group_id and user_id", field="group_id")


def conversation_filter(
    group_id: str | None, user_id: str | None, scopes: Sequence[str] | None
) -> Viewer:
    """The hard scope filter of a request (a conversation, optionally narrowed to scopes): a
    group's (with its person's), or a person's private chat (PRIVATE and GLOBAL)."""
    if not group_id and not user_id:
        raise Invalid("group_id or user_id is required", field="group_id")
    return Viewer(group_id, user_id, tuple(scopes) if scopes else SCOPES)


async def search_in_scope(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    scope: Viewer,
    vector: Vector,
    *,
    limit: int,
    active_only: bool = True,
    categories: Sequence[str] | None = None,
    mark_used: bool = True,
    calibration: Calibration = Calibration(),  # noqa: B008 (frozen, shared safely)
    min_relevance: float | None = None,
    with_vectors: bool = False,
) -> list[dict[str, Any]]:
    """The memories nearest in meaning that a conversation may see, best first.

    The one place a conversation reads memories by meaning (REST search, the bot's tools, the
    context builder): ``scope`` is the hard filter that keeps a group's and a person's private
    memories apart. Each row's ``relevance`` is its cosine on the embedder's ``calibration``
    (the scale events are ranked on); under ``min_relevance`` a memory is not found. What is
    found counts as used, unless ``mark_used`` is off (a search for memories to forget, or a
    turn that marks only what it injects: ``mark_used``).
    """
    conditions = [scope.where(MEMORY)]
    if active_only:
        conditions.append(Memory.is_active.is_(True))
    if categories:
        conditions.append(Memory.category.in_(categories))
    rows = await repository.nearest(
        session, tenant_id, vector, where=and_(*conditions), limit=limit, with_vectors=with_vectors
    )
    for row in rows:
        row["relevance"] = float(calibration.similarity(float(row["score"])))
    if min_relevance is not None:
        rows = [r for r in rows if r["relevance"] >= min_relevance]
    if mark_used:
        await repository.touch(session, tenant_id, [r["id"] for r in rows])
    return rows


async def used(session: AsyncSession, tenant_id: uuid.UUID, ids: Sequence[int]) -> None:
    """Count these memories as used now (a turn that injected them)."""
    if ids:
        await repository.touch(session, tenant_id, list(ids))


async def search(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    request: MemorySearch,
    vector: Vector,
    calibration: Calibration = Calibration(),  # noqa: B008 (frozen, shared safely)
) -> list[dict[str, Any]]:
    """``POST /v1/memories/search`` and ``cognitive_search_memories``: nearest in meaning,
    within the conversation's scopes only, at least ``min_relevance`` relevant when the
    request sets it; what is found counts as used."""
    return await search_in_scope(
        session,
        tenant_id,
        conversation_filter(request.group_id, request.user_id, request.scopes),
        vector,
        limit=request.top_k,
        active_only=not request.include_inactive,
        categories=request.categories,
        calibration=calibration,
        min_relevance=request.min_relevance,
    )


def check_personal(scope: str, content: str, policy: str, field: str = "content") -> str:
    """The content to store under the tenant's personal-data ``policy`` (masked, or refused
    for ``drop``); ``Invalid`` for a GLOBAL memory holding sensitive data (health, ids,
    contact data): a GLOBAL memory is read in every group its person is in."""
    kinds = pii.sensitive(content)
    if scope == "GLOBAL" and kinds:
        raise Invalid(
            f"a GLOBAL memory is read in every group; it must not hold {', '.join(kinds)} "
            "(use PRIVATE or MEMBER_IN_GROUP)",
            field=field,
        )
    kept, found = pii.apply(content, policy)
    if kept is None:
        raise Invalid(f"the tenant's policy drops personal data ({', '.join(found)})", field=field)
    return kept


def check_category(category: str) -> str:
    """One of the four categories."""
    if category not in CATEGORIES:
        raise Invalid(f"category is one of {', '.join(CATEGORIES)}", field="category")
    return category


def same_binding(scope: str, user_id: str | None, group_id: str | None) -> Any:
    """SQL: memories bound exactly like this (the duplicate rule compares within a scope)."""
    return and_(
        Memory.scope == scope,
        Memory.user_id.is_(None) if user_id is None else Memory.user_id == user_id,
        Memory.group_id.is_(None) if group_id is None else Memory.group_id == group_id,
        Memory.is_active.is_(True),
    )


async def bound_to(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    scope: str,
    user_id: str | None,
    group_id: str | None,
    limit: int = 200,
) -> list[dict[str, Any]]:
    """The active memories bound exactly like this (not day summaries), newest first."""
    where = and_(same_binding(scope, user_id, group_id), Memory.category != "SUMMARY")
    return await repository.listing(session, tenant_id, where=where, limit=limit, before=None)


async def add(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    *,
    scope: str,
    user_id: str | None,
    group_id: str | None,
    category: str,
    content: str,
    vector: np.ndarray[Any, Any],
    settings: MemorySettings,
    cause: dict[str, Any],
    confidence: float = 0.5,
    importance: float = 0.5,
    valid_from: datetime | None = None,
    valid_to: datetime | None = None,
    evidence: dict[str, Any] | None = None,
    reason: str | None = None,
) -> tuple[int, bool]:
    """Add a memory, or record a no-op when an active one of the scope already says it.

    Returns (memory id, created).
    """
    check_binding(scope, user_id, group_id)
    check_category(category)
    content = check_content(content)
    nearest = await repository.nearest(
        session, tenant_id, vector, where=same_binding(scope, user_id, group_id), limit=1
    )
    if nearest and near_duplicate(
        content, nearest[0]["content"], float(nearest[0]["score"]), settings.duplicate_threshold
    ):
        existing = nearest[0]
        await repository.add_history(
            session,
            tenant_id,
            existing["id"],
            "noop_duplicate",
            old=existing["content"],
            new=content,
            reason=f"near-duplicate (cosine {float(existing['score']):.3f})",
            cause=cause,
        )
        return int(existing["id"]), False
    memory_id = await repository.insert(
        session,
        tenant_id,
        {
            "scope": scope,
            "user_id": user_id,
            "group_id": group_id,
            "category": category,
            "content": content,
            "embedding": vector,
            "confidence": min(max(confidence, 0.0), 1.0),
            "importance": min(max(importance, 0.0), 1.0),
            "valid_from": valid_from,
            "valid_to": valid_to,
            "evidence": evidence or {},
        },
    )
    await repository.add_history(
        session, tenant_id, memory_id, "add", new=content, reason=reason, cause=cause
    )
    return memory_id, True


async def change(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    memory_id: int,
    *,
    cause: dict[str, Any],
    reason: str | None = None,
    content: str | None = None,
    vector: np.ndarray[Any, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Update a memory's content or fields; the old content stays in its history."""
    current = await repository.get(session, tenant_id, memory_id, lock=True)
    if current is None:
        raise NotFound("no such memory")
    values: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    if "category" in values:
        check_category(values["category"])
    for name in ("confidence", "importance"):
        if name in values:
            values[name] = min(max(float(values[name]), 0.0), 1.0)
    new_content = current["content"]
    if content is not None:
        new_content = check_content(content)
        if new_content != current["content"]:
            values["content"] = new_content
            values["embedding"] = vector
    active = values.pop("is_active", None)
    if values:
        await repository.update(session, tenant_id, memory_id, values)
        await repository.add_history(
            session,
            tenant_id,
            memory_id,
            "update",
            old=current["content"],
            new=new_content,
            reason=reason,
            cause=cause,
        )
    if active is not None and active != current["is_active"]:
        if active:
            await restore(session, tenant_id, memory_id, cause=cause, reason=reason)
        else:
            await deactivate(session, tenant_id, memory_id, cause=cause, reason=reason)
    updated = await repository.get(session, tenant_id, memory_id)
    assert updated is not None
    return updated


async def deactivate(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    memory_id: int,
    *,
    cause: dict[str, Any],
    reason: str | None,
    valid_to: datetime | None = None,
    action: str = "deactivate",
) -> None:
    """A fact that stopped being true: kept, but inactive from ``valid_to`` on."""
    current = await repository.get(session, tenant_id, memory_id, lock=True)
    if current is None:
        raise NotFound("no such memory")
    if not current["is_active"]:
        return
    end = valid_to or datetime.now(UTC)
    await repository.update(
        session, tenant_id, memory_id, {"is_active": False, "valid_to": current["valid_to"] or end}
    )
    await repository.add_history(
        session, tenant_id, memory_id, action, old=current["content"], reason=reason, cause=cause
    )


async def restore(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    memory_id: int,
    *,
    cause: dict[str, Any],
    reason: str | None,
) -> None:
    """Make an inactive memory active again (its validity end is cleared)."""
    current = await repository.get(session, tenant_id, memory_id, lock=True)
    if current is None:
        raise NotFound("no such memory")
    await repository.update(session, tenant_id, memory_id, {"is_active": True, "valid_to": None})
    await repository.add_history(
        session, tenant_id, memory_id, "restore", new=current["content"], reason=reason, cause=cause
    )


async def hard_delete(
    session: AsyncSession, tenant_id: uuid.UUID, memory_id: int, *, cause: dict[str, Any]
) -> None:
    """Delete for real: the row and its vector go; the history keeps only that it happened."""
    if await repository.get(session, tenant_id, memory_id, lock=True) is None:
        raise NotFound("no such memory")
    await repository.delete(session, tenant_id, memory_id)
    await repository.scrub_history(session, tenant_id, memory_id)
    await repository.add_history(session, tenant_id, memory_id, "delete", cause=cause)


async def set_day_summary(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    group_id: str,
    day: date,
    content: str,
    vector: np.ndarray[Any, Any],
    cause: dict[str, Any],
) -> int:
    """The group's rolling SUMMARY memory of a day: created, or rewritten with history."""
    current = await repository.summary_of_day(session, tenant_id, group_id, day)
    if current is None:
        memory_id = await repository.insert(
            session,
            tenant_id,
            {
                "scope": "GROUP",
                "user_id": None,
                "group_id": group_id,
                "category": "SUMMARY",
                "content": check_content(content),
                "embedding": vector,
                "confidence": 0.6,
                "importance": 0.4,
                "summary_day": day,
            },
        )
        await repository.add_history(session, tenant_id, memory_id, "add", new=content, cause=cause)
        return memory_id
    await change(
        session,
        tenant_id,
        current["id"],
        cause=cause,
        reason="rolling summary of the day",
        content=content,
        vector=vector,
    )
    return int(current["id"])


async def drop_day_summary(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    group_id: str,
    day: date,
    cause: dict[str, Any],
) -> bool:
    """The group's SUMMARY memory of a day deleted, for a day that no longer has anything to
    say: a digest left as it was would say what the day's messages no longer do."""
    current = await repository.summary_of_day(session, tenant_id, group_id, day)
    if current is None:
        return False
    await hard_delete(session, tenant_id, int(current["id"]), cause=cause)
    return True


async def maintain(
    session: AsyncSession, tenant_id: uuid.UUID, settings: MemorySettings, now: datetime
) -> dict[str, int]:
    """Forgetting: end expired validity, decay unused importance, deactivate the faded."""
    cause = {"by": "maintenance"}
    expired = await repository.expire(session, tenant_id, now)
    for row in expired:
        await repository.add_history(
            session,
            tenant_id,
            row.id,
            "expire",
            old=row.content,
            reason="valid_to passed",
            cause=cause,
        )
    decayed = await repository.decay(
        session, tenant_id, settings.decay_factor, now - timedelta(days=settings.decay_after_days)
    )
    faded = await repository.fade(
        session,
        tenant_id,
        settings.forget_below_importance,
        now - timedelta(days=settings.forget_after_days),
        now,
    )
    for row in faded:
        await repository.add_history(
            session,
            tenant_id,
            row.id,
            "forget",
            old=row.content,
            reason="low importance, unused for long",
            cause=cause,
        )
    return {"expired": len(expired), "decayed": decayed, "forgotten": len(faded)}


async def consolidate(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation: Viewer,
    settings: MemorySettings,
    cause: dict[str, Any],
) -> int:
    """Merge near-duplicate active memories of each scope into the newest one (history kept)."""
    rows = await repository.vectors(
        session,
        tenant_id,
        where=and_(
            conversation.where(MEMORY), Memory.is_active.is_(True), Memory.category != "SUMMARY"
        ),
    )
    survivors: dict[tuple[Any, ...], list[tuple[int, str, np.ndarray[Any, Any]]]] = {}
    merged = 0
    for row in rows:  # newest first: the newest of a cluster survives
        vector = np.asarray(row["embedding"], dtype=np.float32)
        group = survivors.setdefault((row["scope"], row["user_id"], row["group_id"]), [])
        twin = next(
            (
                sid
                for sid, text, v in group
                if near_duplicate(
                    text, row["content"], float(v @ vector), settings.consolidate_threshold
                )
            ),
            None,
        )
        if twin is None:
            group.append((row["id"], row["content"], vector))
            continue
        await deactivate(
            session,
            tenant_id,
            row["id"],
            cause={**cause, "merged_into": twin},
            reason=f"merged into memory {twin}",
            action="consolidate",
        )
        merged += 1
    return merged
