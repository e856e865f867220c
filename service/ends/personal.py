"""What memos (the notes of a hand-over) hold of people: how a subject's memos are found,
exported, erased and redacted (see ``service.db.registry``)."""

from __future__ import annotations

from sqlalchemy import text

from service.db.registry import PersonalTable, Redaction, names_filter


async def redact_memos(r: Redaction) -> None:
    """Others' memos in the person's conversations lose the person's names."""
    for row in await r.rows(
        "SELECT id, memo FROM memos WHERE tenant_id = :t AND conversation_key = ANY(:keys)"
        f" AND {names_filter('memo')}"
    ):
        if r.redactor.mentions(row.memo):
            await r.session.execute(
                text("UPDATE memos SET memo = :memo WHERE tenant_id = :t AND id = :id"),
                {"t": r.tenant_id, "id": row.id, "memo": r.redactor.text(row.memo)},
            )
            r.count("memos_redacted")


MEMOS = PersonalTable(
    table="memos",
    ids=("conversation_key", "group_id", "user_id", "sender_id"),
    personal=("memo",),
    not_personal={
        "request_id": "the client's id of a request",
        "request_type": "a code from a fixed set",
    },
    erase_user=(
        (
            "memos",
            "DELETE FROM memos WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u"
            " OR conversation_key = :pk)",
        ),
    ),
    erase_group=(("memos", "DELETE FROM memos WHERE tenant_id = :t AND conversation_key = :k"),),
    redact=redact_memos,
    export_user=f"""
           SELECT request_id, end_seq, conversation_key, group_id, user_id, sender_id, memo,
                  said_at, (sender_id = :u OR user_id = :u OR conversation_key = :pk) AS own
           FROM memos
           WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u OR conversation_key = :pk
                                     OR (conversation_key = ANY(:keys) AND {names_filter("memo")}))
           ORDER BY said_at""",
    export_group="SELECT request_id, end_seq, sender_id, memo, said_at FROM memos"
    " WHERE tenant_id = :t AND conversation_key = :k ORDER BY said_at",
    conversations=(
        "SELECT conversation_key AS key FROM memos"
        " WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u)",
    ),
    peers=(
        "SELECT sender_id AS id FROM memos"
        " WHERE tenant_id = :t AND conversation_key = ANY(:keys) AND sender_id <> :u",
    ),
)

TABLES = (MEMOS,)
