"""Erasure of a person, a group or a tenant: their rows go, others' mentions of them are
redacted, a tombstone remains.

A person's rows are found by their id in id columns (sender, user, creator, assignee, the
profiles of the person and of their memberships, the rows that reference those), compared for
equality. Another person's statement that names them is kept and loses the name (see
``redaction``); it is never deleted, and nothing is matched by a pattern built from an id or a
name, so a name like "is", "2", "%" or "tags" touches nobody else's data.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.embedding import Embedder
from service.exports import repository as exports
from service.privacy import keys
from service.privacy.people import Person, find_person, names_filter
from service.profiles import repository as profiles
from service.profiles.consolidate import digest
from service.profiles.document import parse
from service.queue import repository as jobs
from service.retrieval.terms import terms, to_tsvector_literal

# Columns of a job's payload (and of rows quoted in it) that name a person by id.
PERSON_FIELDS = ("sender_id", "user_id", "creator_id", "assignee_id")


def _rowcount(result: Any) -> int:
    return int(getattr(result, "rowcount", 0) or 0)


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


# What is the person's own, by id. :u the id, :pk their private conversation.
_OWN: list[tuple[str, str]] = [
    (
        "messages",
        "DELETE FROM messages WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u"
        " OR conversation_key = :pk)",
    ),
    ("conversations", "DELETE FROM conversations WHERE tenant_id = :t AND conversation_key = :pk"),
    (
        "events",
        "DELETE FROM events WHERE tenant_id = :t AND (user_id = :u OR sender_id = :u"
        " OR conversation_key = :pk)",
    ),
    (
        "memos",
        "DELETE FROM memos WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u"
        " OR conversation_key = :pk)",
    ),
    (
        "memory_history",
        "DELETE FROM memory_history WHERE tenant_id = :t AND memory_id IN"
        " (SELECT id FROM memories WHERE tenant_id = :t AND user_id = :u)",
    ),
    ("memories", "DELETE FROM memories WHERE tenant_id = :t AND user_id = :u"),
    # The person's profile and their member profiles; their revisions go with them (cascade).
    (
        "profiles",
        "DELETE FROM profiles WHERE tenant_id = :t AND entity_id = :u"
        " AND entity_type IN ('user', 'member')",
    ),
    (
        "todos",
        "DELETE FROM todos WHERE tenant_id = :t AND (creator_id = :u OR assignee_id = :u"
        " OR user_id = :u OR conversation_key = :pk)",
    ),
    # Their hand-overs, their private chat's jobs, an export or erasure of them.
    ("jobs", jobs.DELETE_JOBS_OF_PERSON),
]


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
    """Erase a person: their rows, and their names in others' statements.

    ``spare_job``: the erasure's own job, which scrubs its payload itself.
    """
    person = await find_person(session, tenant_id, user_id)
    key = await keys.secret(session)
    subject = keys.keyed_hash(key, tenant_id, "user", user_id)
    p = {"t": tenant_id, "u": user_id, "pk": person.private_key, "spare": spare_job or 0}
    counts: dict[str, int] = {}
    # Copies first: an export is matched by what it holds before that is deleted.
    counts["exports"] = await exports.erase(
        session, tenant_id, subject, user_id, person.needles, PERSON_FIELDS
    )
    for name, sql in _OWN:
        counts[name] = _rowcount(await session.execute(text(sql), p))
    if person.redactor:
        await _redact_mentions(session, tenant_id, person, embedder, keep, counts)
    counts["audit_log"] = await _forget_targets(session, tenant_id, user_id)
    await _tombstone(session, tenant_id, "user", subject, requested_by, counts)
    return counts


async def _redact_mentions(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    person: Person,
    embedder: Embedder,
    keep: int,
    counts: dict[str, int],
) -> None:
    """Others' statements in the person's conversations lose the person's names."""
    redactor = person.redactor
    scope = {
        "t": tenant_id,
        "keys": person.conversations,
        "groups": person.groups,
        "peers": person.peers,
        "needles": person.needles,
    }

    async def rows(sql: str) -> list[Any]:
        return list(await session.execute(text(sql), scope))

    # Messages: the vector and terms are cleared; the embedding job makes them again from
    # the redacted text.
    for row in await rows(
        "SELECT conversation_key, message_id, text FROM messages WHERE tenant_id = :t"
        f" AND conversation_key = ANY(:keys) AND {names_filter('text')}"
    ):
        if redactor.mentions(row.text):
            await session.execute(
                text(
                    "UPDATE messages SET text = :body, embedding = NULL, lexical = ''::tsvector"
                    " WHERE tenant_id = :t AND conversation_key = :k AND message_id = :id"
                ),
                {
                    "t": tenant_id,
                    "k": row.conversation_key,
                    "id": row.message_id,
                    "body": redactor.text(row.text),
                },
            )
            _count(counts, "messages_redacted")
    # Events: text, source and metadata; searchable again at once (vector, terms).
    changed_events: list[dict[str, Any]] = []
    for row in await rows(
        "SELECT id, text, source_text, metadata FROM events WHERE tenant_id = :t"
        " AND conversation_key = ANY(:keys) AND ("
        f"{names_filter('text')} OR {names_filter('source_text')}"
        f" OR {names_filter('metadata::text')})"
    ):
        new = {
            "text": redactor.text(row.text),
            "source_text": redactor.text(row.source_text) if row.source_text else row.source_text,
            "metadata": redactor.json(row.metadata),
        }
        if (new["text"], new["source_text"], new["metadata"]) != (
            row.text,
            row.source_text,
            row.metadata,
        ):
            changed_events.append({"id": row.id, **new, "text_changed": new["text"] != row.text})
    vectors = iter(
        await embedder.passages([e["text"] for e in changed_events if e["text_changed"]])
        if any(e["text_changed"] for e in changed_events)
        else []
    )
    for event in changed_events:
        params = {
            "t": tenant_id,
            "id": event["id"],
            "text": event["text"],
            "source": event["source_text"],
            "meta": json.dumps(event["metadata"], ensure_ascii=False),
        }
        if event["text_changed"]:
            vector = next(vectors)
            await session.execute(
                text(
                    """
                    WITH written AS (
                        UPDATE events SET text = :text, source_text = :source,
                               metadata = CAST(:meta AS jsonb), embedding = :vector,
                               lexical = CAST(:lexical AS tsvector), updated_at = now()
                        WHERE tenant_id = :t AND id = :id
                        RETURNING tenant_id, id, embedding
                    )
                    UPDATE event_vectors AS v
                    SET embedding = CAST(l2_normalize(w.embedding) AS halfvec)
                    FROM written AS w WHERE v.tenant_id = w.tenant_id AND v.event_id = w.id
                    """
                ),
                {**params, "vector": vector, "lexical": to_tsvector_literal(terms(event["text"]))},
            )
        else:
            await session.execute(
                text(
                    "UPDATE events SET source_text = :source, metadata = CAST(:meta AS jsonb),"
                    " updated_at = now() WHERE tenant_id = :t AND id = :id"
                ),
                params,
            )
        _count(counts, "events_redacted")
    for row in await rows(
        "SELECT id, memo FROM memos WHERE tenant_id = :t AND conversation_key = ANY(:keys)"
        f" AND {names_filter('memo')}"
    ):
        if redactor.mentions(row.memo):
            await session.execute(
                text("UPDATE memos SET memo = :memo WHERE tenant_id = :t AND id = :id"),
                {"t": tenant_id, "id": row.id, "memo": redactor.text(row.memo)},
            )
            _count(counts, "memos_redacted")
    for row in await rows(
        "SELECT id, description, evidence FROM todos WHERE tenant_id = :t"
        f" AND conversation_key = ANY(:keys) AND ({names_filter('description')}"
        f" OR {names_filter('evidence::text')})"
    ):
        description, evidence = redactor.text(row.description), redactor.json(row.evidence)
        if (description, evidence) != (row.description, row.evidence):
            await session.execute(
                text(
                    "UPDATE todos SET description = :d, evidence = CAST(:e AS jsonb)"
                    " WHERE tenant_id = :t AND id = :id"
                ),
                {
                    "t": tenant_id,
                    "id": row.id,
                    "d": description,
                    "e": json.dumps(evidence, ensure_ascii=False),
                },
            )
            _count(counts, "todos_redacted")
    await _redact_memories(session, tenant_id, person, embedder, counts, rows)
    await _redact_profiles(session, tenant_id, person, embedder, keep, counts, rows)
    await _redact_jobs(session, tenant_id, person, counts)


async def _redact_memories(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    person: Person,
    embedder: Embedder,
    counts: dict[str, int],
    rows: Any,
) -> None:
    """Memories of the person's groups and of the people they spoke with, and the history of
    those memories."""
    redactor = person.redactor
    # Their groups' memories, and the group-less (global) memories of people they spoke with.
    in_scope = "(group_id = ANY(:groups) OR (group_id IS NULL AND user_id = ANY(:peers)))"
    changed = []
    for row in await rows(
        f"SELECT id, content, evidence FROM memories WHERE tenant_id = :t AND {in_scope}"
        f" AND ({names_filter('content')} OR {names_filter('evidence::text')})"
    ):
        content, evidence = redactor.text(row.content), redactor.json(row.evidence)
        if (content, evidence) != (row.content, row.evidence):
            changed.append((row, content, evidence))
    moved = [c for c in changed if c[1] != c[0].content]
    vectors = iter(await embedder.passages([c[1] for c in moved]) if moved else [])
    for row, content, evidence in changed:
        params: dict[str, Any] = {
            "t": tenant_id,
            "id": row.id,
            "c": content,
            "e": json.dumps(evidence, ensure_ascii=False),
        }
        vector = ", embedding = :v" if content != row.content else ""
        if vector:
            params["v"] = next(vectors)
        await session.execute(
            text(
                f"UPDATE memories SET content = :c, evidence = CAST(:e AS jsonb){vector}"
                " WHERE tenant_id = :t AND id = :id"
            ),
            params,
        )
        _count(counts, "memories_redacted")
    for row in await rows(
        "SELECT id, old_content, new_content, reason, cause FROM memory_history"
        " WHERE tenant_id = :t AND memory_id IN"
        f" (SELECT id FROM memories WHERE tenant_id = :t AND {in_scope})"
        f" AND ({names_filter('old_content')} OR {names_filter('new_content')}"
        f" OR {names_filter('reason')} OR {names_filter('cause::text')})"
    ):
        new = (
            redactor.json(row.old_content),
            redactor.json(row.new_content),
            redactor.json(row.reason),
            redactor.json(row.cause),
        )
        if new != (row.old_content, row.new_content, row.reason, row.cause):
            await session.execute(
                text(
                    "UPDATE memory_history SET old_content = :o, new_content = :n, reason = :r,"
                    " cause = CAST(:c AS jsonb) WHERE tenant_id = :t AND id = :id"
                ),
                {
                    "t": tenant_id,
                    "id": row.id,
                    "o": new[0],
                    "n": new[1],
                    "r": new[2],
                    "c": json.dumps(new[3], ensure_ascii=False) if new[3] is not None else None,
                },
            )
            _count(counts, "memory_history_redacted")


async def _redact_profiles(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    person: Person,
    embedder: Embedder,
    keep: int,
    counts: dict[str, int],
    rows: Any,
) -> None:
    """The profiles of the person's groups, of fellow members and of the people they spoke
    with: a new version without the name, and their kept revisions redacted too."""
    redactor = person.redactor
    in_scope = (
        "((entity_type = 'group' AND entity_id = ANY(:groups))"
        " OR (entity_type = 'member' AND group_id = ANY(:groups))"
        " OR (entity_type = 'user' AND entity_id = ANY(:peers)))"
    )
    for row in await rows(
        f"SELECT profile_key, document, version FROM profiles WHERE tenant_id = :t AND {in_scope}"
        f" AND {names_filter('document')}"
    ):
        if not redactor.mentions(row.document):
            continue
        # The front matter is rebuilt by the renderer from the parsed profile, never edited
        # as text: a name that looks like YAML cannot break it.
        document = redactor.document(row.document)
        if document == row.document:
            continue  # the name was only a YAML key or the like: nothing of theirs to remove
        profile = redactor.profile(parse(row.document, max_chars=None))
        [vector] = await embedder.passages([digest(profile.body)])
        version = await profiles.write(
            session,
            tenant_id,
            profile,
            document,
            vector,
            expected=row.version,
            replaced_by={"by": "erasure"},
            keep=keep,
        )
        if version is not None:
            _count(counts, "profiles_redacted")
    for row in await rows(
        "SELECT profile_key, version, document FROM profile_revisions WHERE tenant_id = :t"
        " AND profile_key IN (SELECT profile_key FROM profiles"
        f" WHERE tenant_id = :t AND {in_scope}) AND {names_filter('document')}"
    ):
        document = redactor.document(row.document)
        if document != row.document:
            await session.execute(
                text(
                    "UPDATE profile_revisions SET document = :d"
                    " WHERE tenant_id = :t AND profile_key = :k AND version = :v"
                ),
                {"t": tenant_id, "k": row.profile_key, "v": row.version, "d": document},
            )
            _count(counts, "profile_revisions_redacted")


async def _redact_jobs(
    session: AsyncSession, tenant_id: uuid.UUID, person: Person, counts: dict[str, int]
) -> None:
    """Jobs of the person's conversations: others' hand-overs keep their payload, without the
    person's name and without the person's own messages quoted in them."""
    redactor = person.redactor
    uid = person.id

    def owned(item: dict[str, Any]) -> bool:
        return any(item.get(f) == uid for f in PERSON_FIELDS)

    for row in await jobs.jobs_of_conversations(
        session, tenant_id, person.groups, person.conversations
    ):
        payload = redactor.json(row.payload, owned)
        result = redactor.json(row.result, owned)
        error = redactor.text(row.last_error) if row.last_error else row.last_error
        if (payload, result, error) != (row.payload, row.result, row.last_error):
            await jobs.rewrite(session, tenant_id, row.id, payload, result, error)
            _count(counts, "jobs_redacted")


async def _forget_targets(session: AsyncSession, tenant_id: uuid.UUID, user_id: str) -> int:
    """Audit entries keep what was done; an id of the person among their targets goes."""
    result = await session.execute(
        text(
            """
            UPDATE audit_log AS a
            SET targets = (SELECT COALESCE(jsonb_object_agg(k, v), '{}'::jsonb)
                           FROM jsonb_each(a.targets) AS e(k, v)
                           WHERE v <> to_jsonb(CAST(:u AS text)))
            WHERE a.tenant_id = :t
              AND EXISTS (SELECT 1 FROM jsonb_each(a.targets) AS e(k, v)
                          WHERE v = to_jsonb(CAST(:u AS text)))
            """
        ),
        {"t": tenant_id, "u": user_id},
    )
    return _rowcount(result)


def _count(counts: dict[str, int], name: str) -> None:
    counts[name] = counts.get(name, 0) + 1


async def erase_group(
    session: AsyncSession, tenant_id: uuid.UUID, group_id: str, *, requested_by: str | None
) -> dict[str, int]:
    """Erase a group: its conversation, events, memos, memories, profiles, todos, jobs."""
    p = {"t": tenant_id, "g": group_id, "k": f"g:{group_id}"}
    subject = await keys.subject_hash(session, tenant_id, "group", group_id)
    counts: dict[str, int] = {
        "exports": await exports.erase(session, tenant_id, subject, group_id, [], ("group_id",))
    }
    statements = {
        "messages": "DELETE FROM messages WHERE tenant_id = :t AND conversation_key = :k",
        "conversations": "DELETE FROM conversations WHERE tenant_id = :t AND conversation_key = :k",
        "events": "DELETE FROM events WHERE tenant_id = :t AND conversation_key = :k",
        "memos": "DELETE FROM memos WHERE tenant_id = :t AND conversation_key = :k",
        "memory_history": "DELETE FROM memory_history WHERE tenant_id = :t AND memory_id IN"
        " (SELECT id FROM memories WHERE tenant_id = :t AND group_id = :g)",
        "memories": "DELETE FROM memories WHERE tenant_id = :t AND group_id = :g",
        "profiles": "DELETE FROM profiles WHERE tenant_id = :t AND ((entity_type = 'group'"
        " AND entity_id = :g) OR (entity_type = 'member' AND group_id = :g))",
        "todos": "DELETE FROM todos WHERE tenant_id = :t AND conversation_key = :k",
        "jobs": jobs.DELETE_JOBS_OF_GROUP,
    }
    for name, sql in statements.items():
        counts[name] = _rowcount(await session.execute(text(sql), p))
    await _tombstone(session, tenant_id, "group", subject, requested_by, counts)
    return counts


async def _tombstone(
    session: AsyncSession,
    tenant_id: uuid.UUID,
    kind: str,
    subject_hash: str,
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
            "hash": subject_hash,
            "by": requested_by,
            "counts": json.dumps(counts),
        },
    )


async def was_erased(session: AsyncSession, tenant_id: uuid.UUID, user_ids: list[str]) -> set[str]:
    """Which of these people were erased before (by their tombstones)."""
    wanted = {u for u in user_ids if u}
    if not wanted:
        return set()
    key = await keys.secret(session)
    hashes = {keys.keyed_hash(key, tenant_id, "user", u): u for u in wanted}
    rows = await session.execute(
        text(
            "SELECT subject_hash FROM erasures"
            " WHERE tenant_id = :t AND kind = 'user' AND subject_hash = ANY(:h)"
        ),
        {"t": tenant_id, "h": list(hashes)},
    )
    return {hashes[r.subject_hash] for r in rows}


# Tenant tables, parents before children (the order of a whole-tenant export too).
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
        counts[table] = _rowcount(result)
    gone = await session.execute(text("DELETE FROM tenants WHERE id = :t"), {"t": tenant_id})
    if not _rowcount(gone):
        return None
    subject = await keys.subject_hash(session, tenant_id, "tenant", str(tenant_id))
    await _tombstone(session, tenant_id, "tenant", subject, "admin", counts)
    return counts
