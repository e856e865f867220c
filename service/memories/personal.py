"""What memories and their history hold of people: how a subject's memories are found,
exported, erased and redacted (see ``service.db.registry``)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text

from service.db.registry import PersonalTable, Redaction, names_filter
from service.memories.models import EMBEDDED as _MEMORY_TEXT

# Their groups' memories, and the group-less (global) memories of people they spoke with.
_IN_SCOPE = "(group_id = ANY(:groups) OR (group_id IS NULL AND user_id = ANY(:peers)))"


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
