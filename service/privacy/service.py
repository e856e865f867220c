"""Export of a person or a group: everything the tenant holds about them.

A person's rows are found by their id in id columns (see ``people``); rows of others that
name them are found in the conversations they took part in, by the names known to be theirs
(see ``redaction``): the same rows that an erasure deletes or redacts. Erasure itself is in
``erasure``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import Database
from service.embedding import Embedder
from service.privacy.erasure import (
    TENANT_TABLES,
    count_user_rows,
    erase_group,
    erase_tenant,
    erase_user,
    was_erased,
)
from service.privacy.keys import subject_hash
from service.privacy.people import find_person
from service.privacy.people import names_filter as _names
from service.queue import repository as jobs
from service.queue.payloads import EraseUserPayload
from service.settings import Settings

__all__ = [
    "ERASE_USER_JOB",
    "TENANT_TABLES",
    "UserErasure",
    "count_export_rows",
    "count_user_rows",
    "document_parts",
    "erase_group",
    "erase_tenant",
    "erase_user",
    "erase_user_now_or_later",
    "export_stream",
    "export_tenant",
    "subject_hash",
    "tenant_parts",
    "was_erased",
]

ERASE_USER_JOB = "privacy.erase_user"

# ---------------------------------------------------------------- erasure


@dataclass(frozen=True)
class UserErasure:
    """A person's erasure: done (``counts``), or handed to a job (``job_id``)."""

    counts: dict[str, int] | None = None
    job_id: int | None = None


async def erase_user_now_or_later(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    user_id: str,
    embedder: Embedder,
    settings: Settings,
    *,
    requested_by: str | None,
) -> UserErasure:
    """Erase a person in the caller's transaction, or, past ``privacy_sync_limit`` rows,
    enqueue the erasure as a job in it."""
    if await count_user_rows(session, tenant_id, user_id) > settings.privacy_sync_limit:
        job_id, _ = await jobs.enqueue(
            session,
            tenant_id,
            ERASE_USER_JOB,
            EraseUserPayload(user_id=user_id, requested_by=requested_by),
            max_attempts=settings.cognitive.queue.max_attempts,
        )
        return UserErasure(job_id=job_id)
    counts = await erase_user(
        session,
        tenant_id,
        user_id,
        embedder,
        requested_by=requested_by,
        keep=settings.cognitive.profile.revision_keep,
    )
    return UserErasure(counts=counts)


# ---------------------------------------------------------------- export


_IN_SCOPE_PROFILES = (
    "((entity_type = 'group' AND entity_id = ANY(:groups))"
    " OR (entity_type = 'member' AND group_id = ANY(:groups))"
    " OR (entity_type = 'user' AND entity_id = ANY(:peers)))"
)
_OWN_PROFILES = "entity_id = :u AND entity_type IN ('user', 'member')"

# Each section: the person's own rows (``own``), and others' rows in their conversations that
# may name them (kept only if they do). :u the id, :pk their private conversation.
_USER_SECTIONS: list[tuple[str, str]] = [
    (
        "messages",
        f"""SELECT conversation_key, message_id, request_type, group_id, user_id, sender_id,
                  sender_name, text, sent_at, created_at,
                  (sender_id = :u OR user_id = :u OR conversation_key = :pk) AS own
           FROM messages
           WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u OR conversation_key = :pk
                                     OR (conversation_key = ANY(:keys) AND {_names("text")}))
           ORDER BY sent_at""",
    ),
    (
        "events",
        f"""SELECT id, conversation_key, request_type, group_id, user_id, sender_id, kind, text,
                  source_text, is_absolute, occurred_at, timezone, location_abs, metadata,
                  (user_id = :u OR sender_id = :u OR conversation_key = :pk) AS own
           FROM events
           WHERE tenant_id = :t
             AND (user_id = :u OR sender_id = :u OR conversation_key = :pk
                  OR (conversation_key = ANY(:keys)
                      AND ({_names("text")} OR {_names("source_text")}
                           OR {_names("metadata::text")})))
           ORDER BY occurred_at""",
    ),
    (
        "memos",
        f"""SELECT request_id, end_seq, conversation_key, group_id, user_id, sender_id, memo,
                  said_at, (sender_id = :u OR user_id = :u OR conversation_key = :pk) AS own
           FROM memos
           WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u OR conversation_key = :pk
                                     OR (conversation_key = ANY(:keys) AND {_names("memo")}))
           ORDER BY said_at""",
    ),
    (
        "memories",
        f"""SELECT id, scope, user_id, group_id, category, content, confidence, importance,
                  valid_from, valid_to, is_active, last_used_at, evidence, created_at,
                  updated_at, (user_id = :u) AS own
           FROM memories
           WHERE tenant_id = :t
             AND (user_id = :u OR ((group_id = ANY(:groups)
                                    OR (group_id IS NULL AND user_id = ANY(:peers)))
                                   AND {_names("content")}))
           ORDER BY id""",
    ),
    (
        "memory_history",
        f"""SELECT h.memory_id, h.action, h.old_content, h.new_content, h.reason, h.cause,
                  h.created_at, (m.user_id = :u) AS own
           FROM memory_history AS h
           JOIN memories AS m ON m.tenant_id = h.tenant_id AND m.id = h.memory_id
           WHERE h.tenant_id = :t
             AND (m.user_id = :u
                  OR ((m.group_id = ANY(:groups)
                       OR (m.group_id IS NULL AND m.user_id = ANY(:peers)))
                      AND ({_names("h.old_content")}
                           OR {_names("h.new_content")})))
           ORDER BY h.id""",
    ),
    (
        "profiles",
        f"""SELECT entity_type, entity_id, group_id, name, tags, document, version, updated_at,
                  ({_OWN_PROFILES}) AS own
           FROM profiles
           WHERE tenant_id = :t
             AND ({_OWN_PROFILES} OR ({_IN_SCOPE_PROFILES} AND {_names("document")}))
           ORDER BY profile_key""",
    ),
    (
        "profile_revisions",
        f"""SELECT r.profile_key, r.version, r.document, r.replaced_by, r.created_at,
                  (p.entity_id = :u AND p.entity_type IN ('user', 'member')) AS own
           FROM profile_revisions AS r
           JOIN profiles AS p ON p.tenant_id = r.tenant_id AND p.profile_key = r.profile_key
           WHERE r.tenant_id = :t
             AND ((p.entity_id = :u AND p.entity_type IN ('user', 'member'))
                  OR ((
                      (p.entity_type = 'group' AND p.entity_id = ANY(:groups))
                      OR (p.entity_type = 'member' AND p.group_id = ANY(:groups))
                      OR (p.entity_type = 'user' AND p.entity_id = ANY(:peers)))
                      AND {_names("r.document")}))
           ORDER BY r.profile_key, r.version""",
    ),
    (
        "todos",
        f"""SELECT id, group_id, user_id, creator_id, assignee_id, description, trigger_time,
                  status, created_at, completed_at,
                  (creator_id = :u OR assignee_id = :u OR user_id = :u
                   OR conversation_key = :pk) AS own
           FROM todos
           WHERE tenant_id = :t
             AND (creator_id = :u OR assignee_id = :u OR user_id = :u OR conversation_key = :pk
                  OR (conversation_key = ANY(:keys) AND {_names("description")}))
           ORDER BY id""",
    ),
    (
        "jobs",
        f"""SELECT id, kind, status, attempts, payload, last_error, created_at,
                  (payload -> 'context' ->> 'sender_id' = :u
                   OR payload -> 'context' ->> 'user_id' = :u
                   OR payload ->> 'conversation_key' = :pk) AS own
           FROM jobs
           WHERE tenant_id = :t AND status IN ('queued', 'running', 'failed') AND id <> :spare
             AND (payload -> 'context' ->> 'sender_id' = :u
                  OR payload -> 'context' ->> 'user_id' = :u
                  OR payload ->> 'conversation_key' = :pk
                  OR ((payload -> 'context' ->> 'group_id' = ANY(:groups)
                       OR payload ->> 'conversation_key' = ANY(:keys))
                      AND {_names("payload::text")}))
           ORDER BY id""",
    ),
]

_GROUP_SECTIONS: list[tuple[str, str]] = [
    ("conversation", "SELECT * FROM conversations WHERE tenant_id = :t AND conversation_key = :k"),
    (
        "messages",
        """SELECT message_id, sender_id, sender_name, text, sent_at FROM messages
           WHERE tenant_id = :t AND conversation_key = :k ORDER BY sent_at""",
    ),
    (
        "events",
        """SELECT id, sender_id, kind, text, source_text, is_absolute, occurred_at, metadata
           FROM events WHERE tenant_id = :t AND conversation_key = :k ORDER BY occurred_at""",
    ),
    (
        "memos",
        "SELECT request_id, end_seq, sender_id, memo, said_at FROM memos"
        " WHERE tenant_id = :t AND conversation_key = :k ORDER BY said_at",
    ),
    (
        "memories",
        """SELECT id, scope, user_id, category, content, is_active, valid_from, valid_to,
                  created_at FROM memories WHERE tenant_id = :t AND group_id = :g ORDER BY id""",
    ),
    (
        "profiles",
        """SELECT entity_type, entity_id, name, tags, document, version FROM profiles
           WHERE tenant_id = :t AND ((entity_type = 'group' AND entity_id = :g)
                                     OR (entity_type = 'member' AND group_id = :g))
           ORDER BY profile_key""",
    ),
    (
        "profile_revisions",
        """SELECT r.profile_key, r.version, r.document, r.replaced_by, r.created_at
           FROM profile_revisions AS r
           JOIN profiles AS p ON p.tenant_id = r.tenant_id AND p.profile_key = r.profile_key
           WHERE r.tenant_id = :t AND ((p.entity_type = 'group' AND p.entity_id = :g)
                                       OR (p.entity_type = 'member' AND p.group_id = :g))
           ORDER BY r.profile_key, r.version""",
    ),
    (
        "todos",
        "SELECT id, creator_id, assignee_id, description, trigger_time, status FROM todos"
        " WHERE tenant_id = :t AND conversation_key = :k ORDER BY id",
    ),
]


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


async def count_export_rows(
    session: AsyncSession, tenant_id: uuid.UUID, kind: str, subject: str
) -> int:
    """A quick size of an export, from indexed ids only: decides between streaming it now and
    writing it by a job."""
    if kind == "user":
        return await count_user_rows(session, tenant_id, subject)
    if kind == "group":
        sql = """
            SELECT (SELECT count(*) FROM messages WHERE tenant_id = :t AND conversation_key = :k)
                 + (SELECT count(*) FROM events WHERE tenant_id = :t AND conversation_key = :k)
            """
    else:
        sql = """
            SELECT (SELECT count(*) FROM messages WHERE tenant_id = :t)
                 + (SELECT count(*) FROM events WHERE tenant_id = :t)
                 + (SELECT count(*) FROM memories WHERE tenant_id = :t)
            """
    result = await session.execute(text(sql), {"t": tenant_id, "k": f"g:{subject}"})
    return int(result.scalar_one())


async def document_parts(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    subject: str,
    counts: dict[str, int],
    *,
    spare_job: int = 0,
) -> AsyncIterator[str]:
    """One JSON document, written section by section from server-side cursors (a large
    export never sits in memory), ending with a manifest of counts. Each piece holds whole
    rows. ``counts`` is filled as the sections are written; ``spare_job``: the export's own
    job, which is not part of what is exported."""
    person = None
    if kind == "user":
        person = await find_person(session, tenant_id, subject)
        params: dict[str, Any] = {
            "t": tenant_id,
            "u": subject,
            "pk": person.private_key,
            "keys": person.conversations,
            "groups": person.groups,
            "peers": person.peers,
            "needles": person.needles,
            "spare": spare_job,
        }
        sections = _USER_SECTIONS
    else:
        params = {"t": tenant_id, "g": subject, "k": f"g:{subject}"}
        sections = _GROUP_SECTIONS
    head = {"subject": {"kind": kind, "id": subject}, "generated_at": datetime.now(UTC)}
    yield _json(head)[:-1]
    for name, query in sections:
        yield f', "{name}": ['
        count = 0
        result = await session.stream(text(query), params)
        async for row in result:
            data = dict(row._mapping)
            if person is not None:
                # Another's row is in the export only if it names the person for certain.
                own = data.pop("own")
                if not own and not any(person.redactor.mentions(v) for v in _strings(data)):
                    continue
            yield (", " if count else "") + _json(data)
            count += 1
        yield "]"
        counts[name] = count
    manifest = {"counts": counts, "note": "embeddings are derived from the texts and omitted"}
    yield f', "manifest": {_json(manifest)}}}'


async def export_stream(
    db: Database, tenant_id: uuid.UUID, kind: str, subject: str
) -> AsyncIterator[bytes]:
    """A person's or a group's document, streamed from one tenant transaction."""
    async with db.tenant(tenant_id) as session:
        async for part in document_parts(session, tenant_id, kind, subject, {}):
            yield part.encode()


# Vectors (and, during a re-embedding, their shadow copies) are derived from the texts.
_HIDDEN_COLUMNS = {"embedding", "embedding_next", "key_hash"}


async def tenant_parts(
    session: AsyncSession, tenant_id: uuid.UUID, counts: dict[str, int]
) -> AsyncIterator[str]:
    """The whole tenant as NDJSON: one line per row, ``{"table": …, "row": …}``; ``counts``
    gets the rows per table."""
    tenant = (
        await session.execute(
            text("SELECT id, name, settings, created_at FROM tenants WHERE id = :t"),
            {"t": tenant_id},
        )
    ).first()
    if tenant is not None:
        yield _json({"table": "tenants", "row": dict(tenant._mapping)}) + "\n"
        counts["tenants"] = 1
    for table in TENANT_TABLES:
        result = await session.stream(
            text(f"SELECT * FROM {table} WHERE tenant_id = :t"), {"t": tenant_id}
        )
        count = 0
        async for row in result:
            data = {k: v for k, v in row._mapping.items() if k not in _HIDDEN_COLUMNS}
            yield _json({"table": table, "row": data}) + "\n"
            count += 1
        counts[table] = count


async def export_tenant(db: Database, tenant_id: uuid.UUID) -> AsyncIterator[bytes]:
    """The whole tenant as NDJSON, streamed from one tenant transaction."""
    async with db.tenant(tenant_id) as session:
        async for part in tenant_parts(session, tenant_id, {}):
            yield part.encode()
