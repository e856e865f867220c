"""Reading a conversation's events (the historian writes them)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import checked_moment, scope_of
from service.errors import Invalid, NotFound
from service.events import repository
from service.events.schemas import EventInfo, EventPage
from service.retrieval import floods


def page_cursor(value: str) -> tuple[datetime, str]:
    """``before`` of a page: an ISO time, or a page's ``next_before`` (``time|event id``)."""
    moment, _, event_id = value.partition("|")
    try:
        at = datetime.fromisoformat(moment.replace(" ", "+"))
    except ValueError:
        raise Invalid("not an ISO 8601 time or a page cursor", field="before") from None
    if at.tzinfo is None:
        raise Invalid("the time needs a UTC offset", field="before")
    checked_moment(at, "before")
    return at, event_id


async def page(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    group_id: str | None,
    user_id: str | None,
    limit: int,
    before: str | None,
) -> EventPage:
    """Events of one group or one private chat, newest first, a page at a time."""
    key = scope_of(group_id, user_id)
    cursor = page_cursor(before) if before else None
    rows = await repository.list_events(session, tenant_id, key, limit, cursor)
    events = [EventInfo(**row) for row in rows]
    last = events[-1] if len(events) == limit else None
    next_before = f"{last.occurred_at.isoformat()}|{last.id}" if last else None
    return EventPage(events=events, next_before=next_before)


async def get(session: AsyncSession, tenant_id: uuid.UUID, event_id: str) -> EventInfo:
    """One event; ``NotFound`` when the tenant has none by that id."""
    row = await repository.get_event(session, tenant_id, event_id)
    if row is None:
        raise NotFound("no such event")
    return EventInfo(**row)


# ---------------------------------------------------------------- writes and ranked reads
# The historian and the importer write events through ``store``; the event ranking
# (service.recall.ranking) reads candidates through the rest, always within the tenant and
# the conversations it names: the hard filter of every event read.


async def store(session: AsyncSession, rows: list[dict[str, Any]]) -> None:
    """Write events (insert, or replace those of the same id), in the caller's transaction,
    one copy of each flood indexed for words and searched by meaning (``copies``)."""
    rows = [{**row, "lexical": repository.lexical_of(row["text"])} for row in rows]
    worded = [row for row in rows if row["lexical"]]
    for tenant_id in {row["tenant_id"] for row in rows}:
        await copies(session, tenant_id, [row for row in rows if row["tenant_id"] == tenant_id])
    # The new rows left unindexed: a flood's copies (a row without words is searched still).
    unindexed = {row["id"] for row in worded if not row["lexical"]}
    await repository.upsert_events(session, rows, unindexed)


async def copies(session: AsyncSession, tenant_id: uuid.UUID, rows: list[dict[str, Any]]) -> None:
    """Index the words of one copy of each flood (``service.retrieval.floods``) among the
    new ``rows`` and the conversations' latest stored events: the new copies left unindexed
    get an empty ``lexical``, the stored ones lose theirs and their place in the nearest
    events' scan (``repository.unindex``). A row replacing a stored event (a job run again)
    takes its place."""
    told = {row["id"]: row for row in rows if row.get("sender_id") is not None and row["lexical"]}
    if not told:
        return
    replaced = {row["id"] for row in rows}
    stored = await repository.said_lately(
        session,
        tenant_id,
        sorted({row["conversation_key"] for row in told.values()}),
        [row["occurred_at"] for row in told.values()],
    )
    found = [
        floods.Copy(
            s.conversation_key,
            s.sender_id,
            s.occurred_at,
            floods.digest(s.text),
            (0, s.id),
            s.id,
            s.indexed,
        )
        for s in stored
        if s.id not in replaced
    ]
    found += floods.new_copies(told.values(), "occurred_at")
    await repository.unindex(session, tenant_id, floods.unindexed(found))


async def nearest(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_keys: list[str],
    vector: np.ndarray[Any, Any],
    limit: int,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
    skipped: Sequence[float] = (),
) -> list[dict[str, Any]]:
    """The ``limit`` events of these conversations nearest in meaning, nearest first, none
    at a distance (``approx``) in ``skipped``."""
    return await repository.nearest_events(
        session, tenant_id, conversation_keys, vector, limit, time_from, time_to, skipped
    )


async def said_at(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_keys: list[str],
    vector: np.ndarray[Any, Any],
    approx: Sequence[float],
    limit: int,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
) -> list[dict[str, Any]]:
    """The nearest ``limit`` statements (one sender's words on one day) among the events at
    these distances (``approx``), one copy each."""
    return await repository.said_at(
        session, tenant_id, conversation_keys, vector, approx, limit, time_from, time_to
    )


async def nearest_told_by(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_keys: list[str],
    sender_id: str,
    vector: np.ndarray[Any, Any],
    limit: int,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
) -> list[dict[str, Any]]:
    """The ``limit`` events ``sender_id`` told in these conversations nearest in meaning
    (among their latest), nearest first."""
    return await repository.nearest_told_by(
        session, tenant_id, conversation_keys, sender_id, vector, limit, time_from, time_to
    )


async def lexical(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation_keys: list[str],
    query_terms: list[str],
    limit: int,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
    *,
    skipped: Sequence[float] = (),
    said_at: Sequence[float] = (),
) -> list[dict[str, Any]]:
    """The ``limit`` events of these conversations best matching the terms by BM25, the terms
    common to a large share of all events left out where every match cannot be scored; a
    flood read past with ``skipped`` and ``said_at`` (see ``lexical_events``)."""
    return await repository.lexical_events(
        session,
        tenant_id,
        conversation_keys,
        query_terms,
        limit,
        time_from,
        time_to,
        common=await repository.common_terms(session),
        skipped=skipped,
        said_at=said_at,
    )


async def by_ids(
    session: AsyncSession, tenant_id: uuid.UUID, event_ids: list[str]
) -> dict[str, dict[str, Any]]:
    """Events by id (with their vectors), the ones found."""
    return await repository.events_by_ids(session, tenant_id, event_ids)


async def neighbours(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    event_ids: list[str],
    vector: np.ndarray[Any, Any],
    reach: int,
    time_from: datetime | None = None,
    time_to: datetime | None = None,
    *,
    terms: list[str] | None = None,
) -> list[dict[str, Any]]:
    """The events told within ``reach`` before and after each of ``event_ids`` in its own
    conversation, with their similarity to ``vector`` and which of ``terms`` they hold."""
    return await repository.neighbour_events(
        session, tenant_id, event_ids, vector, reach, time_from, time_to, terms=terms
    )
