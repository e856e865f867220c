"""What todos hold of people: how a subject's todos are found, exported, erased and
redacted (see ``service.db.registry``)."""

from __future__ import annotations

import json

from sqlalchemy import text

from service.db.registry import PersonalTable, Redaction, names_filter


async def redact_todos(r: Redaction) -> None:
    """Others' todos in the person's conversations lose the person's names in their
    description and evidence."""
    for row in await r.rows(
        "SELECT id, conversation_key, description, evidence FROM todos WHERE tenant_id = :t"
        f" AND conversation_key = ANY(:keys) AND ({names_filter('description')}"
        f" OR {names_filter('evidence::text')})"
    ):
        redactor = r.redactor_in(row.conversation_key)
        description, evidence = redactor.text(row.description), redactor.json(row.evidence)
        if (description, evidence) != (row.description, row.evidence):
            await r.session.execute(
                text(
                    "UPDATE todos SET description = :d, evidence = CAST(:e AS jsonb)"
                    " WHERE tenant_id = :t AND id = :id"
                ),
                {
                    "t": r.tenant_id,
                    "id": row.id,
                    "d": description,
                    "e": json.dumps(evidence, ensure_ascii=False),
                },
            )
            r.count("todos_redacted")


TODOS = PersonalTable(
    table="todos",
    ids=("conversation_key", "group_id", "user_id", "creator_id", "assignee_id"),
    personal=("description", "evidence"),
    not_personal={"status": "a code from a fixed set"},
    erase_user=(
        (
            "todos",
            "DELETE FROM todos WHERE tenant_id = :t AND (creator_id = :u OR assignee_id = :u"
            " OR user_id = :u OR conversation_key = :pk)",
        ),
    ),
    erase_group=(("todos", "DELETE FROM todos WHERE tenant_id = :t AND conversation_key = :k"),),
    redact=redact_todos,
    export_user=f"""
           SELECT id, group_id, user_id, creator_id, assignee_id, description, trigger_time,
                  status, created_at, completed_at,
                  (creator_id = :u OR assignee_id = :u OR user_id = :u
                   OR conversation_key = :pk) AS own
           FROM todos
           WHERE tenant_id = :t
             AND (creator_id = :u OR assignee_id = :u OR user_id = :u OR conversation_key = :pk
                  OR (conversation_key = ANY(:keys) AND {names_filter("description")}))
           ORDER BY id""",
    export_group="SELECT id, creator_id, assignee_id, description, trigger_time, status FROM todos"
    " WHERE tenant_id = :t AND conversation_key = :k ORDER BY id",
    conversations=(
        "SELECT conversation_key AS key FROM todos"
        " WHERE tenant_id = :t AND (creator_id = :u OR assignee_id = :u OR user_id = :u)",
    ),
)

TABLES = (TODOS,)
