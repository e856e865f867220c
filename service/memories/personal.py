"""What memories and their history hold of people: how a subject's memories are found,
exported, erased, redacted and, for the digests made of their words, made again (see
``service.db.registry``)."""

from __future__ import annotations

import json
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import text

from service.context import DEFAULT_TIMEZONE, conversation_key
from service.db.registry import PersonalTable, Rebuilding, Redaction, names_filter
from service.memories import repository
from service.memories.digest import day_summary, said_in
from service.memories.models import EMBEDDED as _MEMORY_TEXT
from service.messages import service as messages
from service.tenants.service import find as find_tenant

# Their groups' memories, and the group-less (global) memories of people they spoke with.
_IN_SCOPE = "(group_id = ANY(:groups) OR (group_id IS NULL AND user_id = ANY(:peers)))"


async def _zone(r: Rebuilding) -> ZoneInfo:
    # A digest's day is a local day of the tenant's, as the historian counted it.
    tenant = await find_tenant(r.session, r.tenant_id)
    name = (tenant.settings or {}).get("timezone") if tenant is not None else None
    return ZoneInfo(name or DEFAULT_TIMEZONE)


# Memories made from the person's own turns or messages (their evidence names one): they go
# with the person, as the events and messages they were made from do. A memory's messages
# are those of its conversation (message ids are unique per conversation only). Day digests,
# made of everyone's words, are made again instead (``rebuild_digests``).
_DERIVED = """
    SELECT id FROM memories AS m
    WHERE m.tenant_id = :t AND m.summary_day IS NULL
      AND (m.evidence -> 'event_ids' ?| ARRAY(
             SELECT id FROM events
             WHERE tenant_id = :t AND (user_id = :u OR sender_id = :u OR conversation_key = :pk))
           OR EXISTS (
             SELECT 1 FROM messages AS g
             WHERE g.tenant_id = :t AND (g.sender_id = :u OR g.conversation_key = :pk)
               AND g.conversation_key = CASE WHEN m.group_id IS NOT NULL
                                             THEN 'g:' || m.group_id ELSE 'p:' || m.user_id END
               AND m.evidence -> 'message_ids' ? g.message_id))
"""


async def erase_derived(r: Rebuilding) -> None:
    """Every memory whose evidence names the person's events or messages, with its history."""
    params = {
        "t": r.tenant_id,
        "u": r.person_id,
        "pk": conversation_key("private", None, r.person_id),
    }
    for row in (await r.session.execute(text(_DERIVED), params)).all():
        await repository.erase(r.session, r.tenant_id, int(row.id))
        r.count("memories_derived_erased")


async def rebuild_user(r: Rebuilding) -> None:
    """The person's memories by provenance: those made of their words alone go, the day
    digests made of several people's are made again without them."""
    await erase_derived(r)
    await rebuild_digests(r)


async def rebuild_digests(r: Rebuilding) -> None:
    """Each group's day digest of a day the person spoke in that group is made again of the
    others' messages of the day (deleted, history and all, where none remain); its history
    keeps that it changed, not what it said."""
    zone = await _zone(r)
    remade: list[tuple[int, str]] = []
    for group_id, day in await messages.group_days(r.session, r.tenant_id, r.person_id, zone.key):
        digest = await repository.summary_of_day(r.session, r.tenant_id, group_id, day)
        if digest is None:
            continue
        key = conversation_key("group", group_id, None)
        said = said_in(
            await messages.said_on_day(r.session, r.tenant_id, key, day, zone, without=r.person_id)
        )
        name = await messages.group_name(r.session, r.tenant_id, key)
        content = day_summary(day, said, name)
        if content is None:
            await repository.erase(r.session, r.tenant_id, digest["id"])
            r.count("memories_emptied")
            continue
        remade.append((int(digest["id"]), content))
    vectors = await r.embedder.passages([content for _, content in remade]) if remade else []
    for (memory_id, content), vector in zip(remade, vectors, strict=True):
        await repository.update(
            r.session, r.tenant_id, memory_id, {"content": content, "embedding": vector}
        )
        # Every version the history holds was made of the person's words too.
        await repository.scrub_history(r.session, r.tenant_id, memory_id)
        await repository.add_history(
            r.session,
            r.tenant_id,
            memory_id,
            "rebuild",
            new=content,
            reason="made again without an erased person's messages",
            cause={"by": "erasure"},
        )
        r.count("memories_rebuilt")


def _redactor(r: Redaction, group_id: str | None) -> Any:
    """A group's memory is its conversation's; a peer's global memory is of none."""
    return r.redactor_in(f"g:{group_id}") if group_id is not None else r.redactor


async def redact_memories(r: Redaction) -> None:
    """Memories of the person's groups and of the people they spoke with lose the person's
    names (a new vector where the content changed), and so does the history of those
    memories."""
    changed = []
    for row in await r.rows(
        "SELECT id, group_id, content, evidence FROM memories"
        f" WHERE tenant_id = :t AND {_IN_SCOPE}"
        f" AND ({names_filter('content')} OR {names_filter('evidence::text')})"
    ):
        redactor = _redactor(r, row.group_id)
        content, evidence = redactor.text(row.content), redactor.json(row.evidence)
        if (content, evidence) != (row.content, row.evidence):
            changed.append((row, content, evidence))
    moved = [c for c in changed if c[1] != c[0].content]
    vectors = iter(await r.embedder.passages([c[1] for c in moved]) if moved else [])
    for row, content, evidence in changed:
        params: dict[str, Any] = {
            "t": r.tenant_id,
            "id": row.id,
            "c": content,
            "e": json.dumps(evidence, ensure_ascii=False),
        }
        vector = ", embedding = :v" if content != row.content else ""
        if vector:
            params["v"] = next(vectors)
        await r.session.execute(
            text(
                f"UPDATE memories SET content = :c, evidence = CAST(:e AS jsonb){vector}"
                " WHERE tenant_id = :t AND id = :id"
            ),
            params,
        )
        r.count("memories_redacted")
    for row in await r.rows(
        "SELECT h.id, m.group_id, h.old_content, h.new_content, h.reason, h.cause"
        " FROM memory_history AS h JOIN (SELECT id, group_id FROM memories"
        f" WHERE tenant_id = :t AND {_IN_SCOPE}) AS m ON m.id = h.memory_id"
        f" WHERE h.tenant_id = :t AND ({names_filter('h.old_content')}"
        f" OR {names_filter('h.new_content')} OR {names_filter('h.reason')}"
        f" OR {names_filter('h.cause::text')})"
    ):
        redactor = _redactor(r, row.group_id)
        new = (
            redactor.json(row.old_content),
            redactor.json(row.new_content),
            redactor.json(row.reason),
            redactor.json(row.cause),
        )
        if new != (row.old_content, row.new_content, row.reason, row.cause):
            await r.session.execute(
                text(
                    "UPDATE memory_history SET old_content = :o, new_content = :n, reason = :r,"
                    " cause = CAST(:c AS jsonb) WHERE tenant_id = :t AND id = :id"
                ),
                {
                    "t": r.tenant_id,
                    "id": row.id,
                    "o": new[0],
                    "n": new[1],
                    "r": new[2],
                    "c": json.dumps(new[3], ensure_ascii=False) if new[3] is not None else None,
                },
            )
            r.count("memory_history_redacted")


# A memory's history is found through its memory: both are deleted here, the history first.
MEMORIES = PersonalTable(
    table="memories",
    ids=("user_id", "group_id"),
    personal=("content", "evidence", "embedding"),
    not_personal={"scope": "a code from a fixed set", "category": "a code from a fixed set"},
    erase_user=(
        (
            "memory_history",
            "DELETE FROM memory_history WHERE tenant_id = :t AND memory_id IN"
            " (SELECT id FROM memories WHERE tenant_id = :t AND user_id = :u)",
        ),
        ("memories", "DELETE FROM memories WHERE tenant_id = :t AND user_id = :u"),
    ),
    erase_group=(
        (
            "memory_history",
            "DELETE FROM memory_history WHERE tenant_id = :t AND memory_id IN"
            " (SELECT id FROM memories WHERE tenant_id = :t AND group_id = :g)",
        ),
        ("memories", "DELETE FROM memories WHERE tenant_id = :t AND group_id = :g"),
    ),
    rebuild_user=rebuild_user,
    redact=redact_memories,
    export_user=f"""
           SELECT id, scope, user_id, group_id, category, content, confidence, importance,
                  valid_from, valid_to, is_active, last_used_at, evidence, created_at,
                  updated_at, (user_id = :u) AS own
           FROM memories
           WHERE tenant_id = :t
             AND (user_id = :u OR ((group_id = ANY(:groups)
                                    OR (group_id IS NULL AND user_id = ANY(:peers)))
                                   AND {names_filter("content")}))
           ORDER BY id""",
    export_group="""
           SELECT id, scope, user_id, category, content, is_active, valid_from, valid_to,
                  created_at FROM memories WHERE tenant_id = :t AND group_id = :g ORDER BY id""",
    size_tenant="SELECT count(*) FROM memories WHERE tenant_id = :t",
    conversations=(
        "SELECT 'g:' || group_id AS key FROM memories"
        " WHERE tenant_id = :t AND user_id = :u AND group_id IS NOT NULL",
    ),
)

# Deleted and redacted with its memory (above).
MEMORY_HISTORY = PersonalTable(
    table="memory_history",
    personal=("old_content", "new_content", "reason", "cause"),
    not_personal={"action": "a code from a fixed set"},
    export_user=f"""
           SELECT h.memory_id, h.action, h.old_content, h.new_content, h.reason, h.cause,
                  h.created_at, (m.user_id = :u) AS own
           FROM memory_history AS h
           JOIN memories AS m ON m.tenant_id = h.tenant_id AND m.id = h.memory_id
           WHERE h.tenant_id = :t
             AND (m.user_id = :u
                  OR ((m.group_id = ANY(:groups)
                       OR (m.group_id IS NULL AND m.user_id = ANY(:peers)))
                      AND ({names_filter("h.old_content")}
                           OR {names_filter("h.new_content")})))
           ORDER BY h.id""",
)

TABLES = (MEMORIES, MEMORY_HISTORY)
EMBEDDED = (_MEMORY_TEXT,)
