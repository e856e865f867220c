"""Export and erasure of a person or a group: everything the tenant holds, and then nothing.

A person is found by id (``user_id``, ``sender_id``, ``creator_id``, …) and by mention: their
id or one of their display names inside any text or JSON column. Matching uses word-bounded
regular expressions so that erasing 10001 does not touch 100012.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import Database
from service.embedding import Embedder
from service.exports import repository as exports
from service.profiles import service as profile_service
from service.profiles.document import parse

ERASED = "[已删除用户]"
MIN_NAME = 2


def subject_hash(tenant_id: uuid.UUID, kind: str, subject: str) -> str:
    """The tombstone's key: a salted hash, so the subject cannot be read back."""
    return hashlib.sha256(f"{tenant_id}:{kind}:{subject}".encode()).hexdigest()


def mention_pattern(tokens: list[str]) -> str:
    """A POSIX regex matching any token as a whole word (ids and Latin names) or as is (CJK)."""
    parts = []
    for token in sorted(set(tokens), key=len, reverse=True):
        escaped = re.sub(r"([.^$*+?()\[\]{}|\\-])", r"\\\1", token)
        if re.fullmatch(r"[0-9A-Za-z_ .'-]+", token):
            parts.append(f"(^|[^0-9A-Za-z_]){escaped}([^0-9A-Za-z_]|$)")
        else:
            parts.append(escaped)
    return "|".join(parts) if parts else "(?!)"


async def names_of(session: AsyncSession, tenant_id: uuid.UUID, user_id: str) -> list[str]:
    """The display names a person went by (messages, profiles, memos' senders)."""
    rows = await session.execute(
        text(
            """
            SELECT DISTINCT sender_name AS name FROM messages
            WHERE tenant_id = :t AND sender_id = :u AND sender_name IS NOT NULL
            UNION
            SELECT DISTINCT name FROM profiles
            WHERE tenant_id = :t AND entity_id = :u AND entity_type IN ('user', 'member')
            """
        ),
        {"t": tenant_id, "u": user_id},
    )
    return [r.name for r in rows if r.name and len(r.name) >= MIN_NAME and r.name != user_id]


# ---------------------------------------------------------------- export

# Each section: what the tenant holds about the person. :u is the id, :p the mention regex.
_USER_SECTIONS: list[tuple[str, str]] = [
    (
        "messages",
        """SELECT conversation_key, message_id, request_type, group_id, user_id, sender_id,
                  sender_name, text, sent_at, created_at FROM messages
           WHERE tenant_id = :t AND (sender_id = :u OR conversation_key = 'p:' || :u
                                     OR text ~ :p)
           ORDER BY sent_at""",
    ),
    (
        "events",
        """SELECT id, conversation_key, request_type, group_id, user_id, sender_id, kind, text,
                  source_text, is_absolute, occurred_at, timezone, location_abs, metadata
           FROM events
           WHERE tenant_id = :t AND (user_id = :u OR sender_id = :u OR text ~ :p
                                     OR source_text ~ :p)
           ORDER BY occurred_at""",
    ),
    (
        "memos",
        """SELECT request_id, end_seq, conversation_key, group_id, user_id, sender_id, memo, said_at
           FROM memos
           WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u OR memo ~ :p)
           ORDER BY said_at""",
    ),
    (
        "memories",
        """SELECT id, scope, user_id, group_id, category, content, confidence, importance,
                  valid_from, valid_to, is_active, last_used_at, evidence, created_at, updated_at
           FROM memories WHERE tenant_id = :t AND (user_id = :u OR content ~ :p)
           ORDER BY id""",
    ),
    (
        "memory_history",
        """SELECT h.memory_id, h.action, h.old_content, h.new_content, h.reason, h.cause,
                  h.created_at
           FROM memory_history AS h
           WHERE h.tenant_id = :t AND (h.memory_id IN (SELECT id FROM memories
                                                      WHERE tenant_id = :t AND user_id = :u)
                                       OR h.old_content ~ :p OR h.new_content ~ :p)
           ORDER BY h.id""",
    ),
    (
        "profiles",
        """SELECT entity_type, entity_id, group_id, name, tags, document, version, updated_at
           FROM profiles
           WHERE tenant_id = :t AND (entity_id = :u AND entity_type IN ('user', 'member')
                                     OR document ~ :p)
           ORDER BY profile_key""",
    ),
    (
        "profile_revisions",
        """SELECT r.profile_key, r.version, r.document, r.replaced_by, r.created_at
           FROM profile_revisions AS r
           WHERE r.tenant_id = :t AND (r.profile_key = 'user:' || :u
                                       OR r.profile_key LIKE 'member:%:' || :u
                                       OR r.document ~ :p)
           ORDER BY r.profile_key, r.version""",
    ),
    (
        "todos",
        """SELECT id, group_id, user_id, creator_id, assignee_id, description, trigger_time,
                  status, created_at, completed_at
           FROM todos
           WHERE tenant_id = :t AND (creator_id = :u OR assignee_id = :u OR user_id = :u
                                     OR description ~ :p)
           ORDER BY id""",
    ),
    (
        "jobs",
        """SELECT id, kind, status, attempts, payload, last_error, created_at FROM jobs
           WHERE tenant_id = :t AND status IN ('queued', 'running', 'failed') AND id <> :spare
             AND (payload::text ~ :p OR COALESCE(last_error, '') ~ :p)
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
           WHERE tenant_id = :t AND (profile_key = 'group:' || :g OR group_id = :g)
           ORDER BY profile_key""",
    ),
    (
        "profile_revisions",
        """SELECT profile_key, version, document, replaced_by, created_at FROM profile_revisions
           WHERE tenant_id = :t AND (profile_key = 'group:' || :g
                                     OR profile_key LIKE 'member:' || :g || ':%')
           ORDER BY profile_key, version""",
    ),
    (
        "todos",
        "SELECT id, creator_id, assignee_id, description, trigger_time, status FROM todos"
        " WHERE tenant_id = :t AND conversation_key = :k ORDER BY id",
    ),
]


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
    if kind == "user":
        tokens = [subject, *await names_of(session, tenant_id, subject)]
        params: dict[str, Any] = {
            "t": tenant_id,
            "u": subject,
            "p": mention_pattern(tokens),
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
            yield (", " if count else "") + _json(dict(row._mapping))
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


# Tenant tables, parents before children for a readable NDJSON dump.
TENANT_TABLES = [
    "conversations",
    "messages",
    "memos",
    "events",
    "profiles",
    "profile_revisions",
    "memories",
    "memory_history",
    "todos",
    "jobs",
    "api_keys",
    "erasures",
    "audit_log",
]
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


# ---------------------------------------------------------------- erasure


async def count_user_rows(session: AsyncSession, tenant_id: uuid.UUID, user_id: str) -> int:
    """A quick size of a person's data: decides between erasing now and as a job."""
    result = await session.execute(
        text(
            """
            SELECT (SELECT count(*) FROM messages WHERE tenant_id = :t AND sender_id = :u)
                 + (SELECT count(*) FROM events WHERE tenant_id = :t AND sender_id = :u)
            """
        ),
        {"t": tenant_id, "u": user_id},
    )
    return int(result.scalar_one())


async def erase_user(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    user_id: str,
    embedder: Embedder,
    *,
    requested_by: str | None,
    keep: int,
    spare_job: int | None = None,
) -> dict[str, int]:
    """Erase a person: their rows, rows naming them, and their name in others' texts.

    ``spare_job``: the erasure's own job, which scrubs its payload itself.
    """
    tokens = [user_id, *await names_of(session, tenant_id, user_id)]
    pattern = mention_pattern(tokens)
    p = {"t": tenant_id, "u": user_id, "p": pattern, "spare": spare_job or 0}
    counts: dict[str, int] = {}

    async def run(name: str, sql: str, params: dict[str, Any] | None = None) -> None:
        result = await session.execute(text(sql), params or p)
        counts[name] = counts.get(name, 0) + int(getattr(result, "rowcount", 0) or 0)

    await run(
        "messages",
        "DELETE FROM messages WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u"
        " OR conversation_key = 'p:' || :u)",
    )
    # Others' messages that name the person keep their words but lose the person.
    await _redact(
        session,
        "messages",
        "text",
        p,
        tokens,
        counts,
        extra="embedding = NULL, lexical = ''::tsvector",
    )
    await run(
        "conversations",
        "DELETE FROM conversations WHERE tenant_id = :t AND conversation_key = 'p:' || :u",
    )
    await run(
        "events",
        "DELETE FROM events WHERE tenant_id = :t AND (user_id = :u OR sender_id = :u"
        " OR conversation_key = 'p:' || :u OR text ~ :p OR source_text ~ :p"
        " OR metadata::text ~ :p)",
    )
    await run(
        "memos",
        "DELETE FROM memos WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u"
        " OR conversation_key = 'p:' || :u OR memo ~ :p)",
    )
    doomed = [
        r.id
        for r in await session.execute(
            text(
                "SELECT id FROM memories WHERE tenant_id = :t"
                " AND (user_id = :u OR content ~ :p OR evidence::text ~ :p)"
            ),
            p,
        )
    ]
    await run(
        "memories",
        "DELETE FROM memories WHERE tenant_id = :t AND id = ANY(:ids)",
        {"t": tenant_id, "ids": doomed},
    )
    await run(
        "memory_history",
        "DELETE FROM memory_history WHERE tenant_id = :t AND (memory_id = ANY(:ids)"
        " OR old_content ~ :p OR new_content ~ :p OR reason ~ :p OR cause::text ~ :p)",
        {**p, "ids": doomed},
    )
    await run(
        "profiles",
        "DELETE FROM profiles WHERE tenant_id = :t AND entity_id = :u"
        " AND entity_type IN ('user', 'member')",
    )
    counts["profiles"] += await _rewrite_profiles(
        session, tenant_id, pattern, tokens, embedder, keep
    )
    await _redact(session, "profile_revisions", "document", p, tokens, counts)
    await run(
        "todos",
        "DELETE FROM todos WHERE tenant_id = :t AND (creator_id = :u OR assignee_id = :u"
        " OR user_id = :u OR conversation_key = 'p:' || :u OR description ~ :p"
        " OR evidence::text ~ :p)",
    )
    await run(
        "jobs",
        "DELETE FROM jobs WHERE tenant_id = :t AND id <> :spare AND (payload::text ~ :p"
        " OR COALESCE(result::text, '') ~ :p OR COALESCE(last_error, '') ~ :p)",
    )
    await run(
        "audit_log",
        "UPDATE audit_log SET targets = '{}'::jsonb WHERE tenant_id = :t AND targets::text ~ :p",
    )
    # Exports are copies: the person's own, and any other that names them, go too.
    counts["exports"] = await exports.erase(
        session, tenant_id, subject_hash(tenant_id, "user", user_id), pattern
    )
    await _tombstone(session, tenant_id, "user", user_id, requested_by, counts)
    return counts


async def erase_group(
    session: AsyncSession, tenant_id: uuid.UUID, group_id: str, *, requested_by: str | None
) -> dict[str, int]:
    """Erase a group: its conversation, events, memos, memories, profiles, todos, jobs."""
    pattern = mention_pattern([group_id])
    p = {"t": tenant_id, "g": group_id, "k": f"g:{group_id}", "p": pattern}
    counts: dict[str, int] = {}
    statements = {
        "messages": "DELETE FROM messages WHERE tenant_id = :t AND conversation_key = :k",
        "conversations": "DELETE FROM conversations WHERE tenant_id = :t AND conversation_key = :k",
        "events": "DELETE FROM events WHERE tenant_id = :t AND conversation_key = :k",
        "memos": "DELETE FROM memos WHERE tenant_id = :t AND conversation_key = :k",
        "memory_history": "DELETE FROM memory_history WHERE tenant_id = :t AND memory_id IN"
        " (SELECT id FROM memories WHERE tenant_id = :t AND group_id = :g)",
        "memories": "DELETE FROM memories WHERE tenant_id = :t AND group_id = :g",
        "profiles": "DELETE FROM profiles WHERE tenant_id = :t AND (profile_key = 'group:' || :g"
        " OR group_id = :g)",
        "todos": "DELETE FROM todos WHERE tenant_id = :t AND conversation_key = :k",
        "jobs": "DELETE FROM jobs WHERE tenant_id = :t AND (payload::text ~ :p"
        " OR COALESCE(result::text, '') ~ :p)",
    }
    for name, sql in statements.items():
        result = await session.execute(text(sql), p)
        counts[name] = int(getattr(result, "rowcount", 0) or 0)
    counts["exports"] = await exports.erase(
        session, tenant_id, subject_hash(tenant_id, "group", group_id), pattern
    )
    await _tombstone(session, tenant_id, "group", group_id, requested_by, counts)
    return counts


async def _redact(
    session: AsyncSession,
    table: str,
    column: str,
    params: dict[str, Any],
    tokens: list[str],
    counts: dict[str, int],
    extra: str | None = None,
) -> None:
    """Replace every mention in a text column by the erased marker."""
    rows = list(
        await session.execute(
            text(
                f"SELECT ctid::text AS ref, {column} AS body FROM {table}"
                f" WHERE tenant_id = :t AND {column} ~ :p"
            ),
            params,
        )
    )
    for row in rows:
        body = _scrub(row.body, tokens)
        sets = f"{column} = :body" + (f", {extra}" if extra else "")
        await session.execute(
            text(f"UPDATE {table} SET {sets} WHERE tenant_id = :t AND ctid = :ref"),
            {
                "t": params["t"],
                "body": body,
                "ref": tuple(int(x) for x in row.ref.strip("()").split(",")),
            },
        )
    if rows:
        counts[f"{table}_redacted"] = counts.get(f"{table}_redacted", 0) + len(rows)


def _scrub(body: str, tokens: list[str]) -> str:
    for token in sorted(set(tokens), key=len, reverse=True):
        if re.fullmatch(r"[0-9A-Za-z_ .'-]+", token):
            body = re.sub(rf"(?<![0-9A-Za-z_]){re.escape(token)}(?![0-9A-Za-z_])", ERASED, body)
        else:
            body = body.replace(token, ERASED)
    return body


async def _rewrite_profiles(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    pattern: str,
    tokens: list[str],
    embedder: Embedder,
    keep: int,
) -> int:
    """Other profiles naming the person lose the name through a new revision."""
    rows = list(
        await session.execute(
            text(
                "SELECT profile_key, document, version FROM profiles"
                " WHERE tenant_id = :t AND document ~ :p"
            ),
            {"t": tenant_id, "p": pattern},
        )
    )
    for row in rows:
        document = _scrub(row.document, tokens)
        key = parse(row.document).key
        await profile_service.save(
            session,
            tenant_id,
            document,
            key,
            embedder,
            expected=row.version,
            replaced_by={"by": "erasure"},
            keep=keep,
        )
    return len(rows)


async def _tombstone(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    subject: str,
    requested_by: str | None,
    counts: dict[str, int],
) -> None:
    await session.execute(
        text(
            "INSERT INTO erasures (tenant_id, kind, subject_hash, requested_by, counts)"
            " VALUES (:t, :kind, :hash, :by, CAST(:counts AS jsonb))"
        ),
        {
            "t": tenant_id,
            "kind": kind,
            "hash": subject_hash(tenant_id, kind, subject),
            "by": requested_by,
            "counts": json.dumps(counts),
        },
    )


async def was_erased(session: AsyncSession, tenant_id: uuid.UUID, user_ids: list[str]) -> set[str]:
    """Which of these people were erased before (by their tombstones)."""
    if not user_ids:
        return set()
    hashes = {subject_hash(tenant_id, "user", u): u for u in set(user_ids)}
    rows = await session.execute(
        text(
            "SELECT subject_hash FROM erasures"
            " WHERE tenant_id = :t AND kind = 'user' AND subject_hash = ANY(:h)"
        ),
        {"t": tenant_id, "h": list(hashes)},
    )
    return {hashes[r.subject_hash] for r in rows}


async def erase_tenant(session: AsyncSession, tenant_id: uuid.UUID) -> dict[str, int] | None:
    """Delete a tenant and all its data (keys included); a tombstone remains. None: no such
    tenant."""
    counts: dict[str, int] = {}
    for table in ("exports", *TENANT_TABLES):  # an export's chunks go with it (cascade)
        if table == "erasures":
            continue
        result = await session.execute(
            text(f"DELETE FROM {table} WHERE tenant_id = :t"), {"t": tenant_id}
        )
        counts[table] = int(getattr(result, "rowcount", 0) or 0)
    gone = await session.execute(text("DELETE FROM tenants WHERE id = :t"), {"t": tenant_id})
    if not getattr(gone, "rowcount", 0):
        return None
    await _tombstone(session, tenant_id, "tenant", str(tenant_id), "admin", counts)
    return counts
