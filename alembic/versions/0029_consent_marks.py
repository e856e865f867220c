"""Consent is recorded on the item: no memory is GLOBAL for what its words said.

A GLOBAL memory is read in every conversation of its person. Until now the historian made one
from a private chat's fact when its words seemed to consent ("可以告诉大家" – also found in
"千万不要告诉大家"), and from a group's fact whenever its model chose GLOBAL. Consent is now an
explicit mark on the observation, which no stored memory has. So each GLOBAL memory made from
the conversations (its evidence names their events or messages) becomes the narrowest
visibility its sources fit: PRIVATE when learned in the person's private chat, MEMBER_IN_GROUP
of the group it was learned in otherwise, and PRIVATE where its sources are gone (where it
was learned cannot be told). A GLOBAL memory with no such evidence was written as GLOBAL
through the API, an explicit act, and stays.

Revision ID: 0029_consent_marks
Revises: 0028_profile_keys
Create Date: 2026-12-01 21:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0029_consent_marks"
down_revision: str | None = "0028_profile_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ids(name: str) -> str:
    """The ids listed under ``name`` in a memory's evidence (none when it is not a list)."""
    listed = f"m.evidence -> '{name}'"
    return (
        f"SELECT jsonb_array_elements_text(CASE WHEN jsonb_typeof({listed}) = 'array'"
        f" THEN {listed} ELSE '[]'::jsonb END)"
    )


# Learned in the person's private chat: its events, or its messages.
_PRIVATE_ORIGIN = f"""
    UPDATE memories m SET scope = 'PRIVATE'
    WHERE m.scope = 'GLOBAL'
      AND (EXISTS (SELECT 1 FROM events e
                   WHERE e.tenant_id = m.tenant_id AND e.conversation_key = 'p:' || m.user_id
                     AND e.id IN ({_ids("event_ids")}))
           OR EXISTS (SELECT 1 FROM messages g
                      WHERE g.tenant_id = m.tenant_id AND g.conversation_key = 'p:' || m.user_id
                        AND g.message_id IN ({_ids("message_ids")})))
    """

# Learned in a group: the group of its events, else of its messages the person sent there
# (the first by id where they name several): the person within that group.
_GROUPS = f"""
    SELECT e.group_id FROM events e
    WHERE e.tenant_id = m.tenant_id AND e.request_type = 'group' AND e.group_id IS NOT NULL
      AND e.id IN ({_ids("event_ids")})
    UNION ALL
    SELECT g.group_id FROM messages g
    WHERE g.tenant_id = m.tenant_id AND g.request_type = 'group' AND g.group_id IS NOT NULL
      AND g.sender_id = m.user_id AND g.message_id IN ({_ids("message_ids")})
    """
_GROUP_ORIGIN = f"""
    UPDATE memories m SET scope = 'MEMBER_IN_GROUP',
                          group_id = (SELECT min(group_id) FROM ({_GROUPS}) AS origin)
    WHERE m.scope = 'GLOBAL' AND m.summary_day IS NULL AND EXISTS ({_GROUPS})
    """


# Made from the conversations, but their sources are gone (erased, or never kept): where it
# was learned cannot be told, and the narrowest visibility its person has is their own chat.
_LOST_ORIGIN = f"""
    UPDATE memories m SET scope = 'PRIVATE'
    WHERE m.scope = 'GLOBAL'
      AND (EXISTS ({_ids("event_ids")}) OR EXISTS ({_ids("message_ids")}))
    """


def upgrade() -> None:
    op.execute(_PRIVATE_ORIGIN)
    op.execute(_GROUP_ORIGIN)
    op.execute(_LOST_ORIGIN)


def downgrade() -> None:
    # Nothing to undo: what was narrowed stays as narrow, which the older release reads too.
    pass
