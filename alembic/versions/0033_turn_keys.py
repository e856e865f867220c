"""A turn is its conversation's: request ids are deduplicated per conversation, not per tenant.

``/v1/end`` made one job per (tenant, request_id, end_seq), and named the turn's events
``<request_id>:<end_seq>…``: the same request id in another group or private chat (platform
message ids repeat across groups and bots) was answered 202 ``duplicate`` with the first
chat's event ids, and its turn was stored nowhere. A turn is now keyed by its conversation:
the job's dedupe key is ``end:<g|p>:<group or user>:<request_id>:<end_seq>`` (the ids
escaped, '%' and ':'), the memo log is unique per (conversation, request_id, end_seq), and a
new turn's events are named ``<g|p>:<group or user>:<request_id>:<end_seq>.<n>`` (``.memo``
for the bot's action), which no id made before ends like, so the events stored before keep
their ids and are read by them as before.

Each receipt (and each hand-over job still kept) gets its conversation's key: from its job's
payload, else from the conversation of the events its answer names, else from the memo of
its turn. A receipt none of these places tells is dropped: nothing of its turn is left to
repeat. Receipts also get the request's fingerprint (a digest of the call), empty for those
made before, with which a repeat of a key with another call is refused.

The columns holding event ids and dedupe keys are widened for the longer keys (a varchar's
limit is raised without rewriting the table or its indexes).

Revision ID: 0033_turn_keys
Revises: 0032_llm_budgets
Create Date: 2026-12-02 00:30:00.000000
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0033_turn_keys"
down_revision: str | None = "0032_llm_budgets"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WIDENED = (
    ("events", "id"),
    ("event_vectors", "event_id"),
    ("profiles", "source_event_id"),
    ("jobs", "dedupe_key"),
    ("job_receipts", "dedupe_key"),
)
OLD_WIDTH = {"dedupe_key": 400}


def _esc(sql: str) -> str:
    """An id as one part of a key (SQL): '%' and ':' percent-escaped."""
    return f"replace(replace({sql}, '%', '%25'), ':', '%3A')"


def _unesc(sql: str) -> str:
    """The id one part of a key escapes (SQL)."""
    return f"replace(replace({sql}, '%3A', ':'), '%25', '%')"


def esc(value: str) -> str:
    """An id as one part of a key: '%' and ':' percent-escaped."""
    return value.replace("%", "%25").replace(":", "%3A")


# A hand-over job's key, from its payload: its conversation (a group, or the user of a
# private chat: user_id, else sender_id), request id and end_seq. NULL if one is missing.
_GROUP = "(payload -> 'context' ->> 'group_id')"
_USER = (
    "COALESCE(NULLIF(payload -> 'context' ->> 'user_id', ''), payload -> 'context' ->> 'sender_id')"
)
_KEY_OF_PAYLOAD = f"""
    'end:' || CASE WHEN payload -> 'context' ->> 'request_type' = 'group'
                   THEN 'g:' || {_esc(_GROUP)} ELSE 'p:' || {_esc(_USER)} END
    || ':' || {_esc("(payload ->> 'request_id')")} || ':' || (payload ->> 'end_seq')"""

# Keys being moved are marked with a leading '~' (no key starts so) until all are moved, so
# that no moved key meets one not moved yet on a unique index.
_RECEIPTS_OF_JOBS = f"""
    UPDATE job_receipts r SET dedupe_key = '~' || k.key
    FROM (SELECT tenant_id, id, dedupe_key, {_KEY_OF_PAYLOAD} AS key FROM jobs
          WHERE kind = 'historian.end' AND dedupe_key LIKE 'end:%') AS k
    WHERE r.tenant_id = k.tenant_id AND r.job_id = k.id AND r.dedupe_key = k.dedupe_key
      AND k.key IS NOT NULL
    """
_JOBS = f"""
    UPDATE jobs SET dedupe_key = '~' || {_KEY_OF_PAYLOAD}
    WHERE kind = 'historian.end' AND dedupe_key LIKE 'end:%' AND ({_KEY_OF_PAYLOAD}) IS NOT NULL
    """
_UNMARK = "UPDATE {table} SET dedupe_key = substr(dedupe_key, 2) WHERE dedupe_key LIKE '~end:%'"

_LEFT = sa.text(
    "SELECT tenant_id, dedupe_key, answer FROM job_receipts WHERE dedupe_key LIKE 'end:%'"
    " ORDER BY tenant_id, dedupe_key LIMIT 2000"
)
_EVENTS = sa.text("SELECT id, conversation_key FROM events WHERE tenant_id = :t AND id = ANY(:ids)")
_MEMOS = sa.text(
    "SELECT request_id, end_seq, conversation_key FROM memos"
    " WHERE tenant_id = :t AND request_id = ANY(:rids)"
)
_MOVE = sa.text(
    "UPDATE job_receipts SET dedupe_key = :new WHERE tenant_id = :t AND dedupe_key = :old"
)
_DROP = sa.text("DELETE FROM job_receipts WHERE tenant_id = :t AND dedupe_key = :old")


def _turn(legacy_key: str) -> tuple[str, int] | None:
    """(request_id, end_seq) of a key ``end:<request_id>:<end_seq>``."""
    request_id, _, seq = legacy_key.removeprefix("end:").rpartition(":")
    return (request_id, int(seq)) if request_id and seq.isdigit() else None


def _first_id(answer: Any) -> str | None:
    """The first event id a receipt's answer lists."""
    if isinstance(answer, list) and answer and isinstance(answer[0], str):
        return answer[0]
    return None


def _conversations(
    bind: sa.Connection, tenant: uuid.UUID, receipts: list[tuple[str, Any]]
) -> dict[str, str]:
    """The conversation of each of a tenant's (key, answer) whose job is gone: its events',
    else its memo's (each was unique in the tenant by request_id and end_seq)."""
    found: dict[str, str] = {}
    ids = {key: first for key, answer in receipts if (first := _first_id(answer))}
    if ids:
        rows = bind.execute(_EVENTS, {"t": tenant, "ids": list(ids.values())})
        by_id = {row.id: row.conversation_key for row in rows}
        found = {key: by_id[i] for key, i in ids.items() if i in by_id}
    turns = {key: turn for key, _ in receipts if key not in found and (turn := _turn(key))}
    if turns:
        rids = list({rid for rid, _ in turns.values()})
        memos = {
            (row.request_id, row.end_seq): row.conversation_key
            for row in bind.execute(_MEMOS, {"t": tenant, "rids": rids})
        }
        found |= {key: memos[turn] for key, turn in turns.items() if turn in memos}
    return found


def _move_receipts_without_jobs(bind: sa.Connection) -> None:
    """Key the receipts whose job was pruned by the conversation their turn was stored in."""
    while rows := list(bind.execute(_LEFT)):
        tenants: dict[uuid.UUID, list[tuple[str, Any]]] = defaultdict(list)
        for row in rows:
            tenants[row.tenant_id].append((row.dedupe_key, row.answer))
        for tenant, receipts in tenants.items():
            found = _conversations(bind, tenant, receipts)
            for key, _ in receipts:
                turn = _turn(key)
                if key not in found or turn is None:
                    bind.execute(_DROP, {"t": tenant, "old": key})
                    continue
                kind, _, target = found[key].partition(":")
                new = f"~end:{kind}:{esc(target)}:{esc(turn[0])}:{turn[1]}"
                bind.execute(_MOVE, {"t": tenant, "old": key, "new": new})


def upgrade() -> None:
    for table, column in WIDENED:
        width = OLD_WIDTH.get(column, 300)
        op.alter_column(table, column, type_=sa.String(1000), existing_type=sa.String(width))
    # A column's new type drops its statistics, and autovacuum gathers them again only after
    # enough rows change: until then the busiest groups' reads are planned blind (the context
    # of a 5,000-event group took 113 ms instead of 32 after this revision, 50 once analysed).
    for table in dict.fromkeys(table for table, _ in WIDENED):
        op.execute(f"ANALYZE {table}")
    op.add_column("job_receipts", sa.Column("fingerprint", sa.String(64), nullable=True))
    op.create_unique_constraint(
        op.f("uq_memos_tenant_id_conversation_key_request_id_end_seq"),
        "memos",
        ["tenant_id", "conversation_key", "request_id", "end_seq"],
    )
    op.execute(_RECEIPTS_OF_JOBS)
    # Before the memos' old key goes: it finds a turn's memo by its request id.
    _move_receipts_without_jobs(op.get_bind())
    op.execute(_JOBS)
    op.execute(_UNMARK.format(table="job_receipts"))
    op.execute(_UNMARK.format(table="jobs"))
    op.drop_constraint(op.f("uq_memos_tenant_id_request_id_end_seq"), "memos", type_="unique")


# The older key of a conversation's: its request id (the fourth part, unescaped) and end_seq.
_LEGACY_KEY = f"""'end:' || {_unesc("split_part(dedupe_key, ':', 4)")}
    || ':' || split_part(dedupe_key, ':', 5)"""
_CONVERSATION_KEY = "dedupe_key ~ '^end:[gp]:[^:]*:[^:]*:[0-9]+$'"


_REPEATED_MEMOS = """
    SELECT count(*) FROM memos m WHERE EXISTS (
        SELECT FROM memos o WHERE o.tenant_id = m.tenant_id AND o.request_id = m.request_id
          AND o.end_seq = m.end_seq AND o.id < m.id)"""


def downgrade() -> None:
    # The older release keys a turn by its request id alone: of a turn kept in several
    # conversations, the first job and receipt keep the key, the later ones lose it.
    for table, order, unkey in (
        ("jobs", "id", "UPDATE jobs t SET dedupe_key = NULL FROM keyed k"),
        ("job_receipts", "job_id", "DELETE FROM job_receipts t USING keyed k"),
    ):
        op.execute(
            f"""
            WITH keyed AS (
                SELECT tenant_id, dedupe_key,
                       row_number() OVER (PARTITION BY tenant_id, {_LEGACY_KEY}
                                          ORDER BY {order}) AS nth
                FROM {table} WHERE {_CONVERSATION_KEY})
            {unkey}
            WHERE t.tenant_id = k.tenant_id AND t.dedupe_key = k.dedupe_key AND k.nth > 1
            """
        )
        op.execute(
            f"UPDATE {table} SET dedupe_key = '~' || {_LEGACY_KEY} WHERE {_CONVERSATION_KEY}"
        )
        op.execute(_UNMARK.format(table=table))
    repeated = op.get_bind().execute(sa.text(_REPEATED_MEMOS)).scalar_one()
    if repeated:
        # The older release holds one memo per request id; which of them to lose is not
        # the downgrade's to decide.
        raise RuntimeError(
            f"{repeated} memos share a request id and end_seq with one of another"
            " conversation: the older release cannot hold them; delete them to downgrade"
        )
    op.create_unique_constraint(
        op.f("uq_memos_tenant_id_request_id_end_seq"),
        "memos",
        ["tenant_id", "request_id", "end_seq"],
    )
    op.drop_constraint(
        op.f("uq_memos_tenant_id_conversation_key_request_id_end_seq"), "memos", type_="unique"
    )
    op.drop_column("job_receipts", "fingerprint")
    for table, column in WIDENED:
        width = OLD_WIDTH.get(column, 300)
        op.alter_column(table, column, type_=sa.String(width), existing_type=sa.String(1000))
