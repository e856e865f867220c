"""What messages and conversations hold of people: how a subject's rows are found,
exported, erased and redacted (see ``service.db.registry``)."""

from __future__ import annotations

from pgvector import Vector
from sqlalchemy import text

from service.db.registry import PersonalTable, Redaction, names_filter
from service.messages.models import EMBEDDED as _MESSAGE_TEXT
from service.messages.models import passage_text
from service.messages.vectors import DERIVED
from service.retrieval.terms import terms, to_tsvector_literal

_ID = "a code from a fixed set"


async def redact_messages(r: Redaction) -> None:
    """Others' messages in the person's conversations lose the person's names, and get the
    redacted text's terms (but a flood's copies, which stay unindexed) and vector at once
    (as the other aggregates' rows do): left for
    the embedding job, which nothing queues here, a quiet group's message stayed without a
    vector until its next message came."""
    changed = [
        (row, r.redactor_in(row.conversation_key).text(row.text))
        for row in await r.rows(
            "SELECT conversation_key, message_id, sender_name, text FROM messages"
            f" WHERE tenant_id = :t AND conversation_key = ANY(:keys) AND {names_filter('text')}"
        )
        if r.redactor_in(row.conversation_key).mentions(row.text)
    ]
    if not changed:
        return
    vectors = await r.embedder.passages(
        [passage_text(row.sender_name, body) for row, body in changed]
    )
    for (row, body), vector in zip(changed, vectors, strict=True):
        await r.session.execute(
            text(
                "UPDATE messages SET text = :body, embedding = CAST(:vector AS vector),"
                # A flood's copy stays one (its words indexed in another copy, redacted too).
                " lexical = CASE WHEN flood_copy THEN lexical"
                " ELSE CAST(:lexical AS tsvector) END"
                " WHERE tenant_id = :t AND conversation_key = :k AND message_id = :id"
            ),
            {
                "t": r.tenant_id,
                "k": row.conversation_key,
                "id": row.message_id,
                "body": body,
                "vector": Vector(vector),
                "lexical": to_tsvector_literal(terms(body)),
            },
        )
        r.count("messages_redacted")


CONVERSATIONS = PersonalTable(
    table="conversations",
    ids=("conversation_key", "group_id", "user_id"),
    personal=("group_name",),
    not_personal={"request_type": _ID},
    erase_user=(
        (
            "conversations",
            "DELETE FROM conversations WHERE tenant_id = :t AND conversation_key = :pk",
        ),
    ),
    erase_group=(
        (
            "conversations",
            "DELETE FROM conversations WHERE tenant_id = :t AND conversation_key = :k",
        ),
    ),
    export_group="SELECT * FROM conversations WHERE tenant_id = :t AND conversation_key = :k",
    export_section="conversation",
    # A group named like the person: the name in its texts may be the group's.
    namesakes=(
        "SELECT btrim(group_name) AS name, conversation_key AS key FROM conversations"
        " WHERE tenant_id = :t AND conversation_key = ANY(:keys)"
        " AND btrim(group_name) = ANY(:names)",
    ),
)

MESSAGES = PersonalTable(
    table="messages",
    ids=("conversation_key", "group_id", "user_id", "sender_id"),
    personal=("sender_name", "text", "embedding", "embedding_half"),
    not_personal={"message_id": "the client's id of a message", "request_type": _ID},
    erase_user=(
        (
            "messages",
            "DELETE FROM messages WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u"
            " OR conversation_key = :pk)",
        ),
    ),
    erase_group=(
        ("messages", "DELETE FROM messages WHERE tenant_id = :t AND conversation_key = :k"),
    ),
    redact=redact_messages,
    export_user=f"""
           SELECT conversation_key, message_id, request_type, group_id, user_id, sender_id,
                  sender_name, text, sent_at, created_at,
                  (sender_id = :u OR user_id = :u OR conversation_key = :pk) AS own
           FROM messages
           WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u OR conversation_key = :pk
                                     OR (conversation_key = ANY(:keys) AND {names_filter("text")}))
           ORDER BY sent_at""",
    export_group="""
           SELECT message_id, sender_id, sender_name, text, sent_at FROM messages
           WHERE tenant_id = :t AND conversation_key = :k ORDER BY sent_at""",
    size_user="SELECT count(*) FROM messages WHERE tenant_id = :t AND sender_id = :u",
    size_group="SELECT count(*) FROM messages WHERE tenant_id = :t AND conversation_key = :k",
    size_tenant="SELECT count(*) FROM messages WHERE tenant_id = :t",
    own_names=(
        "SELECT sender_name AS name FROM messages"
        " WHERE tenant_id = :t AND sender_id = :u AND sender_name IS NOT NULL",
    ),
    # Someone else who speaks in the conversation under the name.
    namesakes=(
        "SELECT btrim(sender_name) AS name, conversation_key AS key FROM messages"
        " WHERE tenant_id = :t AND conversation_key = ANY(:keys)"
        " AND btrim(sender_name) = ANY(:names) AND sender_id IS DISTINCT FROM :u",
    ),
    conversations=(
        "SELECT conversation_key AS key FROM messages WHERE tenant_id = :t AND sender_id = :u",
    ),
    peers=(
        "SELECT sender_id AS id FROM messages"
        " WHERE tenant_id = :t AND conversation_key = ANY(:keys) AND sender_id <> :u",
    ),
)

TABLES = (CONVERSATIONS, MESSAGES)
EMBEDDED = (_MESSAGE_TEXT,)
__all__ = ["DERIVED", "EMBEDDED", "TABLES"]
