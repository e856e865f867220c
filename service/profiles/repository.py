"""SQL of profiles: compare-and-swap writes that keep the replaced text as a revision."""

from __future__ import annotations

import json
import uuid
from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.rows import dicts
from service.profiles.document import Profile, ProfileKey

_COLUMNS = """profile_key, entity_type, entity_id, group_id, name, tags, document, body,
              source_event_id, version, updated_at, created_at, modified_at,
              embedding IS NOT NULL AS embedded"""

_GET = text(f"SELECT {_COLUMNS} FROM profiles WHERE tenant_id = :tenant_id AND profile_key = :key")


_GET_LOCKED = text(
    f"SELECT {_COLUMNS} FROM profiles WHERE tenant_id = :tenant_id AND profile_key = :key"
    " FOR UPDATE"
)


async def get(
    session: AsyncSession, tenant_id: uuid.UUID, key: ProfileKey, *, lock: bool = False
) -> dict[str, Any] | None:
    """The current profile row, or None (``lock``: held until the transaction ends)."""
    query = _GET_LOCKED if lock else _GET
    row = (await session.execute(query, {"tenant_id": tenant_id, "key": key.key})).first()
    return dict(row._mapping) if row is not None else None


_GET_MANY = text(
    f"SELECT {_COLUMNS} FROM profiles"
    " WHERE tenant_id = :tenant_id AND profile_key = ANY(CAST(:keys AS text[]))"
)
# Locked in the order of their keys, so that two transactions locking overlapping sets wait
# for each other instead of deadlocking.
_GET_MANY_LOCKED = text(
    f"SELECT {_COLUMNS} FROM profiles"
    " WHERE tenant_id = :tenant_id AND profile_key = ANY(CAST(:keys AS text[]))"
    " ORDER BY profile_key FOR UPDATE"
)


async def get_many(
    session: AsyncSession, tenant_id: uuid.UUID, keys: list[ProfileKey], *, lock: bool = False
) -> dict[str, dict[str, Any]]:
    """The current rows of these profiles by key (``ProfileKey.key``); missing ones absent
    (``lock``: held until the transaction ends)."""
    if not keys:
        return {}
    params = {"tenant_id": tenant_id, "keys": sorted({key.key for key in keys})}
    rows = dicts(await session.execute(_GET_MANY_LOCKED if lock else _GET_MANY, params))
    return {str(row["profile_key"]): row for row in rows}


_INSERT = text(
    """
    INSERT INTO profiles (tenant_id, profile_key, entity_type, entity_id, group_id, name, tags,
                          document, body, source_event_id, version, embedding, updated_at)
    VALUES (:tenant_id, :key, :entity_type, :entity_id, :group_id, :name, CAST(:tags AS jsonb),
            :document, :body, :source_event_id, 1, :embedding, :updated_at)
    ON CONFLICT (tenant_id, profile_key) DO NOTHING
    RETURNING version
    """
)

# Compare-and-swap: lock the row only if it is still at :expected (else someone else won).
_LOCK = text(
    """
    SELECT document FROM profiles
    WHERE tenant_id = :tenant_id AND profile_key = :key AND version = :expected
    FOR UPDATE
    """
)

# The replaced text becomes a revision in the same transaction as the change.
_KEEP = text(
    """
    INSERT INTO profile_revisions (tenant_id, profile_key, version, document, replaced_by)
    VALUES (:tenant_id, :key, :expected, :old_document, CAST(:replaced_by AS jsonb))
    """
)

_SWAP_SQL = """
    UPDATE profiles SET name = :name, tags = CAST(:tags AS jsonb), document = :document,
                        body = :body, source_event_id = :source_event_id,
                        version = version + 1, {embedding}
                        updated_at = :updated_at, modified_at = now()
    WHERE tenant_id = :tenant_id AND profile_key = :key AND version = :expected
    RETURNING version
    """
_SWAP = text(_SWAP_SQL.format(embedding="embedding = :embedding,"))
# A change that leaves the embedded digest as it was keeps the stored vector.
_SWAP_KEEP_VECTOR = text(_SWAP_SQL.format(embedding=""))

# Keep the newest :keep revisions of a profile.
_PRUNE = text(
    """
    DELETE FROM profile_revisions
    WHERE tenant_id = :tenant_id AND profile_key = :key AND version NOT IN (
        SELECT version FROM profile_revisions
        WHERE tenant_id = :tenant_id AND profile_key = :key
        ORDER BY version DESC LIMIT :keep
    )
    """
)


def _params(
    tenant_id: uuid.UUID, profile: Profile, document: str, embedding: np.ndarray[Any, Any] | None
) -> dict[str, Any]:
    return {
        "tenant_id": tenant_id,
        "key": profile.key.key,
        "entity_type": profile.key.entity_type,
        "entity_id": profile.key.entity_id,
        "group_id": profile.key.group_id,
        "name": profile.name[:200],
        "tags": json.dumps(profile.tags, ensure_ascii=False),
        "document": document,
        "body": profile.body,
        "source_event_id": profile.source_event_id,
        "embedding": embedding,
        "updated_at": profile.updated_at,
    }


async def write(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    profile: Profile,
    document: str,
    embedding: np.ndarray[Any, Any] | None,
    *,
    expected: int | None,
    replaced_by: dict[str, Any],
    keep: int,
    keep_vector: bool = False,
) -> int | None:
    """Create (expected None) or swap (expected = current version); the new version, or None
    when someone else got there first. ``keep_vector``: the swap leaves the vector as it is."""
    params = _params(tenant_id, profile, document, embedding)
    if expected is None:
        created = (await session.execute(_INSERT, params)).scalar_one_or_none()
        return int(created) if created is not None else None
    key = {"tenant_id": tenant_id, "key": profile.key.key, "expected": expected}
    old = (await session.execute(_LOCK, key)).scalar_one_or_none()
    if old is None:
        return None
    await session.execute(
        _KEEP,
        {**key, "old_document": old, "replaced_by": json.dumps(replaced_by, ensure_ascii=False)},
    )
    swap = _SWAP_KEEP_VECTOR if keep_vector else _SWAP
    if keep_vector:
        del params["embedding"]
    version = (await session.execute(swap, {**params, "expected": expected})).scalar_one()
    await session.execute(_PRUNE, {"tenant_id": tenant_id, "key": profile.key.key, "keep": keep})
    return int(version)


_REVISIONS = text(
    """
    SELECT version, document, replaced_by, created_at FROM profile_revisions
    WHERE tenant_id = :tenant_id AND profile_key = :key
      AND (CAST(:before AS integer) IS NULL OR version < :before)
    ORDER BY version DESC
    LIMIT :limit
    """
)


async def revisions(
    session: AsyncSession, tenant_id: uuid.UUID, key: ProfileKey, limit: int, before: int | None
) -> list[dict[str, Any]]:
    """The kept previous texts, newest first: ``limit`` of them older than version ``before``."""
    rows = await session.execute(
        _REVISIONS, {"tenant_id": tenant_id, "key": key.key, "limit": limit, "before": before}
    )
    return dicts(rows)


_REVISION = text(
    """
    SELECT version, document, replaced_by, created_at FROM profile_revisions
    WHERE tenant_id = :tenant_id AND profile_key = :key AND version = :version
    """
)


async def revision(
    session: AsyncSession, tenant_id: uuid.UUID, key: ProfileKey, version: int
) -> dict[str, Any] | None:
    """One kept previous text, or None."""
    params = {"tenant_id": tenant_id, "key": key.key, "version": version}
    rows = dicts(await session.execute(_REVISION, params))
    return rows[0] if rows else None


_KEPT_TEXT = text(
    """
    SELECT EXISTS (
        SELECT 1 FROM profile_revisions
        WHERE tenant_id = :tenant_id AND profile_key = :key AND document = :document
    )
    """
)


async def is_kept(
    session: AsyncSession, tenant_id: uuid.UUID, key: ProfileKey, document: str
) -> bool:
    """Whether ``document`` is one of the profile's kept previous texts."""
    params = {"tenant_id": tenant_id, "key": key.key, "document": document}
    return bool((await session.execute(_KEPT_TEXT, params)).scalar_one())


# A conversation's profiles: a group's own and its members', or a person's (private chat).
_CONVERSATION = text(
    f"""
    SELECT {_COLUMNS} FROM profiles
    WHERE tenant_id = :tenant_id
      AND ((CAST(:group_id AS text) IS NOT NULL
            AND (profile_key = 'group:' || :group_id
                 OR (entity_type = 'member' AND group_id = :group_id)))
           OR (CAST(:user_id AS text) IS NOT NULL AND profile_key = 'user:' || :user_id))
    ORDER BY entity_type = 'member', entity_type, entity_id
    LIMIT :limit
    """
)


async def of_conversation(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    group_id: str | None,
    user_id: str | None,
    limit: int,
) -> list[dict[str, Any]]:
    """The profiles of a group (its own, then its members') or of a person."""
    params = {"tenant_id": tenant_id, "group_id": group_id, "user_id": user_id, "limit": limit}
    return dicts(await session.execute(_CONVERSATION, params))


_SEARCH = text(
    f"""
    SELECT {_COLUMNS}, 1 - (embedding <=> :query) AS score FROM profiles p
    WHERE tenant_id = :tenant_id AND embedding IS NOT NULL
      AND (CAST(:entity_type AS text) IS NULL OR entity_type = :entity_type)
      AND (entity_type <> 'member' OR group_id = :group_id)
      AND (CAST(:group_id AS text) IS NULL OR entity_type = 'user' OR group_id = :group_id
           OR (entity_type = 'group' AND entity_id = :group_id))
      -- A conversation's reach: no other group's profile, and of users only its own person
      -- and (in a group) the group's members.
      AND (NOT :scoped OR CAST(:group_id AS text) IS NOT NULL OR entity_type = 'user')
      AND (NOT :scoped OR entity_type <> 'user' OR entity_id = :person
           OR (CAST(:group_id AS text) IS NOT NULL AND EXISTS (
                 SELECT 1 FROM profiles m
                 WHERE m.tenant_id = p.tenant_id AND m.entity_type = 'member'
                   AND m.group_id = :group_id AND m.entity_id = p.entity_id)))
      -- A private profile is read in its person's own private chat and nowhere else, whatever
      -- the tenant lets cross; the tenant's own search without a conversation names the kind.
      AND (entity_type <> 'private' OR entity_id = :private_of
           OR (NOT :contextual AND CAST(:entity_type AS text) = 'private'))
    ORDER BY embedding <=> :query
    LIMIT :limit
    """
)


async def search(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    query: np.ndarray[Any, Any],
    entity_type: str | None,
    group_id: str | None,
    limit: int,
    *,
    person: str | None = None,
    scoped: bool = False,
    contextual: bool = False,
    private_of: str | None = None,
) -> list[dict[str, Any]]:
    """Profiles nearest in meaning; member profiles only of the given group. ``scoped``: only
    what a conversation (``group_id`` or none, and its ``person``) may see. ``contextual``: a
    conversation asks, and sees a private profile only if it is the private chat of
    ``private_of``."""
    params = {
        "tenant_id": tenant_id,
        "query": query,
        "entity_type": entity_type,
        "group_id": group_id,
        "limit": limit,
        "person": person,
        "scoped": scoped,
        "contextual": contextual,
        "private_of": private_of,
    }
    return dicts(await session.execute(_SEARCH, params))
