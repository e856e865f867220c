"""Profile rules: validated writes with revisions, rollback, and merging new facts in."""

from __future__ import annotations

import difflib
import math
import re
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from service import pii
from service.context import ConversationContext, scope_of
from service.embedding import Embedder
from service.embedding.base import Calibration, Vector
from service.errors import Conflict, Forbidden, Invalid, NotFound
from service.profiles import repository
from service.profiles.consolidate import Body, digest
from service.profiles.document import ENTITY_TYPES, Profile, ProfileKey, parse, render
from service.profiles.schemas import ProfileLookup, ProfileSearch
from service.retrieval.terms import MAX_QUERY_TERMS, compact, query_terms, terms
from service.tenants.service import TenantContext
from service.visibility import Viewer, of_profile

_TITLES = {
    "user": "# 用户侧写",
    "group": "# 群侧写",
    "member": "# 成员侧写",
    "private": "# 私聊侧写",
}
NEAR_DUPLICATE = 0.9
_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class Fact:
    """A new fact for a profile: an absolute statement, when it was learned, from where."""

    text: str
    day: str  # YYYY-MM-DD, local
    event_id: str | None = None
    shareable: bool = False  # the person lets it be known beyond the chat it was said in
    # The standing fact it states (工作, 居住地 …), where the sentence's structure said so: a
    # newer one of the kind replaces the older one.
    kind: str | None = None


def key_of(entity_type: str, entity_id: str, group_id: str | None = None) -> ProfileKey:
    """A profile key from the API's path parts, checked."""
    if entity_type not in ENTITY_TYPES:
        raise Invalid("entity_type is user, group, member or private", field="entity_type")
    if not entity_id or len(entity_id) > 128:
        raise Invalid("an id is 1..128 characters", field="entity_id")
    if entity_type == "member" and not group_id:
        raise Invalid("a member profile needs group_id", field="group_id")
    return ProfileKey(entity_type, entity_id, group_id if entity_type == "member" else None)


def check_personal(key: ProfileKey, document: str, policy: str) -> None:
    """``Invalid`` for a user profile holding sensitive data (health, ids, contact data: it is
    read in every group the person is in), or any profile holding personal data the tenant's
    policy does not store."""
    body = parse(document, expected=key).body
    kinds = pii.sensitive(body)
    if key.entity_type == "user" and kinds:
        raise Invalid(
            f"a user profile is read in every group; it must not hold {', '.join(kinds)}",
            field="document",
        )
    found = sorted({f.kind for f in pii.find(body)})
    if found and policy != "store":
        raise Invalid(
            f"the tenant's policy ({policy}) keeps no personal data ({', '.join(found)})",
            field="document",
        )


async def find(
    session: AsyncSession, tenant_id: uuid.UUID, key: ProfileKey
) -> dict[str, Any] | None:
    """A profile's current row, or None."""
    return await repository.get(session, tenant_id, key)


async def find_many(
    session: AsyncSession, tenant_id: uuid.UUID, keys: list[ProfileKey]
) -> dict[str, dict[str, Any]]:
    """The current rows of these profiles by key (``ProfileKey.key``); missing ones absent."""
    return await repository.get_many(session, tenant_id, keys)


async def get(session: AsyncSession, tenant_id: uuid.UUID, key: ProfileKey) -> dict[str, Any]:
    """A profile's current row; ``NotFound`` when there is none."""
    row = await find(session, tenant_id, key)
    if row is None:
        raise NotFound(f"no profile of {key.describe()}")
    return row


async def revisions(
    session: AsyncSession, tenant_id: uuid.UUID, key: ProfileKey, limit: int, before: int | None
) -> list[dict[str, Any]]:
    """A page of a profile's kept previous texts, newest first (``before``: a version, for
    the next page); ``NotFound`` when there is no profile."""
    await get(session, tenant_id, key)
    return await repository.revisions(session, tenant_id, key, limit, before)


async def is_kept(
    session: AsyncSession, tenant_id: uuid.UUID, key: ProfileKey, document: str
) -> bool:
    """Whether ``document`` is one of the profile's kept previous texts."""
    return await repository.is_kept(session, tenant_id, key, document)


async def of_conversation(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    group_id: str | None,
    user_id: str | None,
    limit: int,
) -> list[dict[str, Any]]:
    """A conversation's profiles: a group's with its members', or a person's."""
    scope_of(group_id, user_id)
    return await repository.of_conversation(
        session, tenant_id, group_id or None, user_id or None, limit
    )


async def replace_by_hand(
    session: AsyncSession,
    tenant: TenantContext,
    key: ProfileKey,
    document: str,
    embedder: Embedder,
    *,
    expected: int | None,
    keep: int,
) -> None:
    """An operator's replacement of a profile; ``expected``: the version they last read
    (``If-Match``; 0 for a profile that must not exist yet), else ``Conflict``."""
    current = await find(session, tenant.tenant_id, key)
    if current is not None and expected is not None and expected != current["version"]:
        raise Conflict(f"the profile is at version {current['version']}, not {expected}")
    if current is None and expected not in (None, 0):
        raise Conflict("the profile does not exist yet (use If-Match: 0 or none)")
    check_personal(key, document, tenant.pii_policy)
    await save(
        session,
        tenant.tenant_id,
        document,
        key,
        embedder,
        expected=current["version"] if current else None,
        replaced_by={"by": "api", "key_prefix": tenant.key_prefix},
        keep=keep,
    )


async def restore_history(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    key: ProfileKey,
    versions: list[tuple[Profile, str, dict[str, Any]]],
    vector: Vector,
    *,
    keep: int,
) -> None:
    """Write a new profile's history as it was elsewhere (an import): each (parsed profile,
    its document, its origin) in order, the last one current with ``vector`` (older texts are
    not searched, so they need none); ``keep`` of them stay as revisions. ``Conflict`` if the
    profile appeared meanwhile."""
    version: int | None = None
    for n, (profile, document, origin) in enumerate(versions):
        version = await repository.write(
            session,
            tenant_id,
            profile,
            document,
            vector if n == len(versions) - 1 else None,
            expected=version,
            replaced_by=origin,
            keep=keep,
        )
        if version is None:
            raise Conflict(f"the profile of {key.describe()} appeared meanwhile")


def load(row: dict[str, Any]) -> Profile:
    """The parsed profile of a stored row (stored documents are always valid; one stored
    before today's cap still loads, so that the next merge can compact it)."""
    return parse(row["document"], stored=True)


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
    [vector] = await embedder.passages([digest(profile.body)])
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
    kept = await repository.revision(session, tenant_id, key, version)
    if kept is None:
        raise NotFound(f"revision {version} is not kept (the revisions list names those that are)")
    return await save(
        session,
        tenant_id,
        kept["document"],
        key,
        embedder,
        expected=current["version"],
        replaced_by={**cause, "by": "rollback", "to_version": version},
        keep=keep,
    )


# ---------------------------------------------------------------- merging facts


def is_duplicate(fact: str, known: list[str]) -> bool:
    """Exact or near-duplicate: ≥ 90 % similar once spacing and punctuation are ignored,
    with the same numbers (one digit apart is another date, another amount)."""
    target = compact(fact)
    numbers = _NUMBER.findall(target)
    for line in known:
        other = compact(line)
        if target == other or target in other:
            return True
        if (
            _NUMBER.findall(other) == numbers
            and difflib.SequenceMatcher(None, target, other).ratio() >= NEAR_DUPLICATE
        ):
            return True
    return False


def merge_facts(
    current: Profile | None,
    key: ProfileKey,
    name: str,
    facts: list[Fact],
    moment: datetime,
) -> Profile | None:
    """The offline merge: each new fact consolidated into the body (a repeat is skipped, a
    standing fact replaces the older one of its kind, old records fold), the body kept in
    budget. None: nothing new."""
    text = current.body if current else f"{_TITLES[key.entity_type]}\n"
    body = Body.read(text)
    known = body.known_lines()
    added = False
    for fact in facts:
        if not is_duplicate(fact.text, known):
            body.add(fact.day, fact.text, fact.kind)
            known.append(fact.text)
            added = True
    if not added:
        return None
    subject = current.name if current else name
    body.compact(subject)
    return Profile(
        key=key,
        name=subject,
        tags=list(current.tags) if current else [],
        updated_at=moment,
        source_event_id=next((f.event_id for f in reversed(facts) if f.event_id), None),
        body=body.render(),
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
        # The vector is of the body's digest, which most facts leave as it was: then the
        # stored vector stays and the embedder is not called at all.
        text = digest(merged.body)
        if row is not None and row["embedded"] and digest(row["body"]) == text:
            vector = None
        else:
            [vector] = await embedder.passages([text])
        version = await repository.write(
            session,
            tenant_id,
            merged,
            document,
            vector,
            expected=row["version"] if row else None,
            replaced_by=cause,
            keep=keep,
            keep_vector=vector is None and row is not None,
        )
        if version is not None:
            return version
    raise Conflict(f"the profile of {key.describe()} kept changing; giving up this merge")


@dataclass
class _Planned:
    """A merged profile waiting for its write (``apply_merges``)."""

    key: ProfileKey
    merge: Merge
    cause: dict[str, Any]
    row: dict[str, Any] | None
    merged: Profile
    digest: str
    embed: bool


async def apply_merges(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    merges: list[tuple[ProfileKey, Merge, dict[str, Any]]],
    embedder: Embedder,
    *,
    keep: int,
) -> dict[str, int | None]:
    """``apply_merge`` for several profiles (key, merge, cause), one key once: one read for
    all of them, one embedder call for every changed digest, then one locking read of those
    that change (merged again if they moved since, their new digests embedded then). The
    embedding is done before the lock, so that other jobs writing the same profiles do not
    wait for it. Returns the new version (None: unchanged) by key."""
    keys = [key for key, _, _ in merges]
    rows = await repository.get_many(session, tenant_id, keys)
    versions: dict[str, int | None] = {key.key: None for key in keys}
    planned = [
        p for key, merge, cause in merges if (p := await _plan(key, merge, cause, rows)) is not None
    ]
    embedded = await _embedded({}, planned, embedder)
    if planned:
        # Lock what is about to change; a profile written meanwhile is merged again on the
        # newer text, so that the swap below cannot lose its race.
        locked = await repository.get_many(session, tenant_id, [p.key for p in planned], lock=True)
        moved = [
            p
            for p in planned
            if (locked.get(p.key.key) or {}).get("version") != (p.row or {}).get("version")
        ]
        for p in moved:
            planned.remove(p)
            again = await _plan(p.key, p.merge, p.cause, locked)
            if again is not None:
                planned.append(again)
        if moved:
            embedded = await _embedded(embedded, planned, embedder)
    planned.sort(key=lambda p: p.key.key)
    for p in planned:
        vector = embedded[p.digest] if p.embed else None
        version = await repository.write(
            session,
            tenant_id,
            p.merged,
            render(p.merged),
            vector,
            expected=p.row["version"] if p.row else None,
            replaced_by=p.cause,
            keep=keep,
            keep_vector=vector is None and p.row is not None,
        )
        if version is None:  # created meanwhile: read it again (locked) and merge again
            version = await apply_merge(
                session, tenant_id, p.key, p.merge, embedder, cause=p.cause, keep=keep
            )
        versions[p.key.key] = version
    return versions


async def _embedded(
    known: dict[str, Vector], planned: list[_Planned], embedder: Embedder
) -> dict[str, Vector]:
    """``known`` with the vectors of the planned digests that need one, in one call."""
    missing = list(dict.fromkeys(p.digest for p in planned if p.embed and p.digest not in known))
    if missing:
        known = {**known, **dict(zip(missing, await embedder.passages(missing), strict=True))}
    return known


async def _plan(
    key: ProfileKey, merge: Merge, cause: dict[str, Any], rows: dict[str, dict[str, Any]]
) -> _Planned | None:
    """A profile's merge on its row in ``rows``; None when it leaves the profile as it is."""
    row = rows.get(key.key)
    merged = await merge(load(row) if row else None, row["version"] if row else None)
    if merged is None:
        return None
    text = digest(merged.body)
    embed = not (row is not None and row["embedded"] and digest(row["body"]) == text)
    return _Planned(key, merge, cause, row, merged, text, embed)


def people_of(conversation: ConversationContext) -> set[str]:
    """The people a conversation is with: the private chat's user, or a group call's sender
    and the user it serves."""
    if conversation.request_type == "private":
        return {conversation.private_user}
    return {p for p in (conversation.sender_id, conversation.user_id) if p}


async def visible_key(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    conversation: ConversationContext,
    lookup: ProfileLookup,
    *,
    allow_cross: bool,
) -> ProfileKey:
    """The key of the profile ``lookup`` names, if ``conversation`` may read it: its own
    group's, that group's members', and the user profiles of its own people and (in a group)
    of the group's members. ``allow_cross`` (a tenant setting) lifts the limit."""
    viewer = Viewer.of(conversation)
    group = viewer.group_id
    if lookup.entity_type == "member":
        if group is None:
            raise Invalid("member profiles exist only in a group", field="arguments.entity_type")
        return key_of("member", lookup.entity_id, group)  # only members of this group
    key = key_of(lookup.entity_type, lookup.entity_id)
    if allow_cross:
        return key
    if lookup.entity_type == "group":
        if not viewer.sees(of_profile("group", lookup.entity_id)):
            raise Forbidden("this conversation may read only its own group's profile")
        return key
    # A user profile is shown wherever its person is: their own conversations (a group call
    # serves its sender and its user), and a group they are a member of.
    if lookup.entity_id in people_of(conversation):
        return key
    member = key_of("member", lookup.entity_id, group) if group else None
    if member is not None and await repository.get(session, tenant_id, member) is not None:
        return key
    raise Forbidden(
        "this conversation may read only the user profiles of its own people"
        + (" and of its group's members" if group else "")
    )


async def search(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    request: ProfileSearch,
    vector: np.ndarray[Any, Any],
    *,
    default_top_k: int,
    allow_cross: bool,
    calibration: Calibration = Calibration(),  # noqa: B008 (frozen, shared safely)
    lexical_weight: float = 0.5,
) -> list[dict[str, Any]]:
    """``POST /v1/profiles/search`` and ``cognitive_search_profiles``: within the reach of
    the request's conversation when it names one (unless ``allow_cross``), best first by
    ``relevance`` (``ranked``), at least ``min_relevance`` when the request sets it."""
    top_k = request.top_k or default_top_k
    pool = top_k * PROFILE_POOL
    context = request.context
    if context is None:
        rows = await repository.search(
            session, tenant_id, vector, request.entity_type, request.group_id, pool
        )
    else:
        reach = Viewer.of(context).profile_reach()
        if request.group_id and request.group_id != reach["group_id"] and not allow_cross:
            raise Forbidden("this conversation may search only its own group", field="group_id")
        rows = await repository.search(
            session,
            tenant_id,
            vector,
            request.entity_type,
            # Lifted, the limit leaves the conversation's group too: the tenant's whole reach.
            request.group_id or (None if allow_cross else reach["group_id"]),
            pool,
            person=reach["person"],
            scoped=not allow_cross,
            contextual=True,
            private_of=reach["private_of"],
        )
    found = ranked(rows, request.query, calibration, lexical_weight)
    if request.min_relevance is not None:
        found = [r for r in found if r["relevance"] >= request.min_relevance]
    return found[:top_k]


# A search reads this many times its top_k nearest profiles to rank them by their lines too.
PROFILE_POOL = 3


def ranked(
    rows: list[dict[str, Any]], query: str, calibration: Calibration, lexical_weight: float
) -> list[dict[str, Any]]:
    """The profiles best first by ``relevance``: the body's similarity on the embedder's
    calibrated scale (the scale events and memories are ranked on), with the lexical
    evidence of its best line closing ``lexical_weight`` of the gap to 1, as an event's.

    A profile's vector is of its whole body: one line that answers the question ("养了一只
    猫") is a small part of it, and two people's profiles of a group read alike, so the
    whole-body cosine alone ranked a person without a cat above the one with it. The best
    line's share of the query's terms (each weighed by how few of the candidates hold it)
    tells them apart."""
    words = set(query_terms(query, MAX_QUERY_TERMS))
    lines = [[set(terms(line)) for line in str(r["body"]).splitlines()] for r in rows]
    held = Counter(w for profile in lines for w in words if any(w in line for line in profile))
    # A term no candidate holds weighs as one held by a single one: a query whose rarest
    # words match nowhere gains little from a common one that does.
    weight = {w: math.log(1 + len(rows) / max(held[w], 1)) for w in words}
    total = sum(weight.values())
    for row, profile in zip(rows, lines, strict=True):
        sim = float(calibration.similarity(float(row["score"])))
        best = max((sum(weight[w] for w in line & weight.keys()) for line in profile), default=0)
        lex = best / total if total > 0 else 0.0
        row["relevance"] = sim + lexical_weight * lex * (1.0 - sim) if sim < 1 else sim
    return sorted(rows, key=lambda r: -r["relevance"])
