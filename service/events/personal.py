"""What events hold of people: how a subject's events are found, exported, erased and
redacted (see ``service.db.registry``); their vectors' half-precision copies go with them."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text

from service.db.registry import PersonalTable, Redaction, names_filter
from service.events.models import EMBEDDED as _EVENT_TEXT
from service.events.vectors import DERIVED
from service.retrieval.terms import terms, to_tsvector_literal

_ID = "a code from a fixed set"


async def redact_events(r: Redaction) -> None:
    """Others' events in the person's conversations lose the person's names in their text,
    source and metadata; searchable again at once (vector, terms; a flood's copies stay
    unindexed and out of the scan)."""
    changed: list[dict[str, Any]] = []
    for row in await r.rows(
        "SELECT id, conversation_key, text, source_text, metadata FROM events WHERE tenant_id = :t"
        " AND conversation_key = ANY(:keys) AND ("
        f"{names_filter('text')} OR {names_filter('source_text')}"
        f" OR {names_filter('metadata::text')})"
    ):
        redactor = r.redactor_in(row.conversation_key)
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
            changed.append({"id": row.id, **new, "text_changed": new["text"] != row.text})
    vectors = iter(
        await r.embedder.passages([e["text"] for e in changed if e["text_changed"]])
        if any(e["text_changed"] for e in changed)
        else []
    )
    for event in changed:
        params = {
            "t": r.tenant_id,
            "id": event["id"],
            "text": event["text"],
            "source": event["source_text"],
            "meta": json.dumps(event["metadata"], ensure_ascii=False),
        }
        if event["text_changed"]:
            vector = next(vectors)
            await r.session.execute(
                text(
                    """
                    WITH written AS (
                        UPDATE events SET text = :text, source_text = :source,
                               metadata = CAST(:meta AS jsonb), embedding = :vector,
                               -- A flood's copy stays one (left unindexed: a text naming
                               -- someone has words, so only a copy has none indexed).
                               lexical = CASE WHEN length(lexical) = 0 THEN lexical
                                              ELSE CAST(:lexical AS tsvector) END,
                               updated_at = now()
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
            await r.session.execute(
                text(
                    "UPDATE events SET source_text = :source, metadata = CAST(:meta AS jsonb),"
                    " updated_at = now() WHERE tenant_id = :t AND id = :id"
                ),
                params,
            )
        r.count("events_redacted")


EVENTS = PersonalTable(
    table="events",
    ids=("conversation_key", "group_id", "user_id", "sender_id"),
    personal=("text", "source_text", "metadata", "location_abs", "embedding"),
    not_personal={
        "id": "the event's id, made of the request's id and a sequence number",
        "request_id": "the client's id of a request",
        "request_type": _ID,
        "kind": _ID,
        "perspective": _ID,
        "timezone": "a time zone name the event's time is read in",
        "warnings": "codes of what absolutizing the text could not settle",
        "message_ids": "ids of the messages the event was made from",
    },
    erase_user=(
        (
            "events",
            "DELETE FROM events WHERE tenant_id = :t AND (user_id = :u OR sender_id = :u"
            " OR conversation_key = :pk)",
        ),
    ),
    erase_group=(("events", "DELETE FROM events WHERE tenant_id = :t AND conversation_key = :k"),),
    redact=redact_events,
    export_user=f"""
           SELECT id, conversation_key, request_type, group_id, user_id, sender_id, kind, text,
                  source_text, is_absolute, occurred_at, timezone, location_abs, metadata,
                  (user_id = :u OR sender_id = :u OR conversation_key = :pk) AS own
           FROM events
           WHERE tenant_id = :t
             AND (user_id = :u OR sender_id = :u OR conversation_key = :pk
                  OR (conversation_key = ANY(:keys)
                      AND ({names_filter("text")} OR {names_filter("source_text")}
                           OR {names_filter("metadata::text")})))
           ORDER BY occurred_at""",
    export_group="""
           SELECT id, sender_id, kind, text, source_text, is_absolute, occurred_at, metadata
           FROM events WHERE tenant_id = :t AND conversation_key = :k ORDER BY occurred_at""",
    size_user="SELECT count(*) FROM events WHERE tenant_id = :t AND sender_id = :u",
    size_group="SELECT count(*) FROM events WHERE tenant_id = :t AND conversation_key = :k",
    size_tenant="SELECT count(*) FROM events WHERE tenant_id = :t",
    conversations=(
        "SELECT conversation_key AS key FROM events"
        " WHERE tenant_id = :t AND (sender_id = :u OR user_id = :u)",
    ),
    peers=(
        "SELECT sender_id AS id FROM events"
        " WHERE tenant_id = :t AND conversation_key = ANY(:keys) AND sender_id <> :u",
    ),
)

# Copies of the events' vectors, deleted with their events (cascade), never exported.
EVENT_VECTORS = PersonalTable(
    table="event_vectors",
    ids=("conversation_key",),
    personal=("embedding",),
    not_personal={"event_id": "the id of the event the vector is copied from"},
    tenant_erase=False,
    tenant_export=False,
)

TABLES = (EVENTS, EVENT_VECTORS)
EMBEDDED = (_EVENT_TEXT,)
__all__ = ["DERIVED", "EMBEDDED", "TABLES"]
