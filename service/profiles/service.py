"""Profile rules: validated writes with revisions, rollback, and merging new facts in."""

from __future__ import annotations

import difflib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.embedding import Embedder
from service.errors import Conflict, Invalid, NotFound
from service.profiles import repository
from service.profiles.document import Profile, ProfileKey, parse, render
from service.retrieval.terms import compact

RECORD_HEADING = "## 记录"
_TITLES = {"user": "# 用户侧写", "group": "# 群侧写", "member": "# 成员侧写"}
NEAR_DUPLICATE = 0.9


@dataclass(frozen=True)
class Fact:
    """A new fact for a profile: an absolute statement, when it was learned, from where."""

    text: str
    day: str  # YYYY-MM-DD, local
    event_id: str | None = None


def key_of(entity_type: str, entity_id: str, group_id: str | None = None) -> ProfileKey:
    """A profile key from the API's path parts, checked."""
    if entity_type not in ("user", "group", "member"):
        raise Invalid("entity_type is user, group or member", field="entity_type")
    if not entity_id or len(entity_id) > 128:
        raise Invalid("an id is 1..128 characters", field="entity_id")
    if entity_type == "member" and not group_id:
        raise Invalid("a member profile needs group_id", field="group_id")
    return ProfileKey(entity_type, entity_id, group_id if entity_type == "member" else None)


def load(row: dict[str, Any]) -> Profile:
    """The parsed profile of a stored row (stored documents are always valid)."""
    return parse(row["document"])


async def save(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    document: str,
    key: ProfileKey,
    embedder: Embedder,
    *,
    expected: int | None,
    replaced_by: dict[str, Any],
    keep: int,
) -> int:
    """Validate and store a document exactly as given; ``Conflict`` if the version moved."""
    profile = parse(document, expected=key)
    [vector] = await embedder.passages([profile.body])
    version = await repository.write(
        session,
        tenant_id,
        profile,
        document,
        vector,
        expected=expected,
        replaced_by=replaced_by,
        keep=keep,
    )
    if version is None:
        raise Conflict("the profile changed meanwhile; read it again and retry")
    return version


async def rollback(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    key: ProfileKey,
    version: int,
    embedder: Embedder,
    *,
    cause: dict[str, Any],
    keep: int,
) -> int:
    """Make a kept revision's text current again (recorded as a new change)."""
    current = await repository.get(session, tenant_id, key)
    if current is None:
        raise NotFound(f"no profile of {key.describe()}")
    if version == current["version"]:
        return int(current["version"])
    kept = {r["version"]: r for r in await repository.revisions(session, tenant_id, key)}
    if version not in kept:
        raise NotFound(f"revision {version} is not kept (kept: {sorted(kept)})")
    return await save(
        session,
        tenant_id,
        kept[version]["document"],
        key,
        embedder,
        expected=current["version"],
        replaced_by={**cause, "by": "rollback", "to_version": version},
        keep=keep,
    )


# ---------------------------------------------------------------- merging facts


def is_duplicate(fact: str, known: list[str]) -> bool:
    """Exact or near-duplicate (≥ 90 % similar once spacing and punctuation are ignored)."""
    target = compact(fact)
    for line in known:
        other = compact(line)
        if target == other or target in other:
            return True
        if difflib.SequenceMatcher(None, target, other).ratio() >= NEAR_DUPLICATE:
            return True
    return False


def merge_facts(
    current: Profile | None,
    key: ProfileKey,
    name: str,
    facts: list[Fact],
    moment: datetime,
) -> Profile | None:
    """The offline merge: facts appended to a dated list, duplicates skipped (None: nothing new)."""
    body = current.body.rstrip() if current else f"{_TITLES[key.entity_type]}\n"
    known = [line for line in body.splitlines() if line.strip()]
    added = []
    for fact in facts:
        if not is_duplicate(fact.text, known):
            line = f"- {fact.day}: {fact.text}"
            known.append(line)
            added.append(line)
    if not added:
        return None
    if RECORD_HEADING not in body:
        body = f"{body}\n\n{RECORD_HEADING}\n"
    body = body.rstrip() + "\n" + "\n".join(added)
    return Profile(
        key=key,
        name=current.name if current else name,
        tags=list(current.tags) if current else [],
        updated_at=moment,
        source_event_id=next((f.event_id for f in reversed(facts) if f.event_id), None),
        body=body,
        extra=dict(current.extra) if current else {},
    )


def renamed(current: Profile, name: str, moment: datetime) -> Profile | None:
    """The same profile under a new display name, or None if the name is unchanged."""
    if not name or current.name == name:
        return None
    return Profile(
        key=current.key,
        name=name,
        tags=current.tags,
        updated_at=moment,
        source_event_id=current.source_event_id,
        body=current.body,
        extra=current.extra,
    )


Merge = Callable[[Profile | None, int | None], Awaitable[Profile | None]]


async def apply_merge(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    key: ProfileKey,
    merge: Merge,
    embedder: Embedder,
    *,
    cause: dict[str, Any],
    keep: int,
    attempts: int = 5,
) -> int | None:
    """Read, merge, compare-and-swap; on a lost race re-read and merge again.

    ``merge`` gets the current profile and version (or None, None) and returns the new
    profile (or None: no change).
    Returns the new version, or None when nothing changed.
    """
    for attempt in range(attempts):
        # Optimistic first; after a lost race the row is locked, so the next try must win
        # (a hot profile — a busy member of a busy group — would otherwise keep losing).
        row = await repository.get(session, tenant_id, key, lock=attempt > 0)
        current = load(row) if row else None
        merged = await merge(current, row["version"] if row else None)
        if merged is None:
            return None
        document = render(merged)
        [vector] = await embedder.passages([merged.body])
        version = await repository.write(
            session,
            tenant_id,
            merged,
            document,
            vector,
            expected=row["version"] if row else None,
            replaced_by=cause,
            keep=keep,
        )
        if version is not None:
            return version
    raise Conflict(f"the profile of {key.describe()} kept changing; giving up this merge")
