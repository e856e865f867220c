"""What one conversation knows stays there: unambiguous member profile keys, PRIVATE memories.

Member profile keys were ``member:<group>:<user>`` with both ids as given, so member X:Y of
group C and member Y:C of group X had one key (ids with ':' are common). They become
``member:<group>:<user>`` with '%' and ':' percent-escaped in each id
(``service.profiles.document.key_part``); the kept revisions move with their profile.
User and group keys hold one id after their first ':' and keep their form.

A PRIVATE memory is bound to a user like a GLOBAL one, but is read only in that user's private
chat: what a person says in private no longer reaches every group they are in. The GLOBAL
memories already learned in a private chat become PRIVATE.

Revision ID: 0013
Revises: 0012_erasure
Create Date: 2026-11-25 10:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012_erasure"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FK = "fk_profile_revisions_tenant_id_profile_key_profiles"


def _escaped(column: str) -> str:
    return f"replace(replace({column}, '%', '%25'), ':', '%3A')"


def _rekey(new_key: str, old_key: str) -> None:
    """Give every member profile the key ``new_key`` where its key is ``old_key`` (both SQL
    over the profile row ``p``); its revisions follow it."""
    # The revisions point at their profile by key: the constraint is dropped while both move.
    op.drop_constraint(_FK, "profile_revisions", type_="foreignkey")
    op.execute(
        f"""
        UPDATE profile_revisions r SET profile_key = {new_key}
        FROM profiles p
        WHERE p.tenant_id = r.tenant_id AND p.profile_key = r.profile_key
          AND p.entity_type = 'member'
          AND r.profile_key = {old_key}
        """
    )
    op.execute(
        f"""
        UPDATE profiles p SET profile_key = {new_key}
        WHERE p.entity_type = 'member' AND p.profile_key = {old_key}
        """
    )
    op.create_foreign_key(
        _FK,
        "profile_revisions",
        "profiles",
        ["tenant_id", "profile_key"],
        ["tenant_id", "profile_key"],
        ondelete="CASCADE",
    )


# Both over the profile row ``p``.
_PLAIN = "'member:' || p.group_id || ':' || p.entity_id"
_ESCAPED = f"'member:' || {_escaped('p.group_id')} || ':' || {_escaped('p.entity_id')}"


def _ids(name: str) -> str:
    """The ids listed under ``name`` in a memory's evidence (none when it is not a list)."""
    listed = f"m.evidence -> '{name}'"
    return (
        f"SELECT jsonb_array_elements_text(CASE WHEN jsonb_typeof({listed}) = 'array'"
        f" THEN {listed} ELSE '[]'::jsonb END)"
    )


# GLOBAL memories learned in a private chat (their evidence is a private chat's events or
# messages) were read in every group: they become what such a memory is now.
_PRIVATE_ORIGIN = f"""
    UPDATE memories m SET scope = 'PRIVATE'
    WHERE m.scope = 'GLOBAL'
      AND (EXISTS (SELECT 1 FROM events e
                   WHERE e.tenant_id = m.tenant_id AND e.request_type = 'private'
                     AND e.id IN ({_ids("event_ids")}))
           OR EXISTS (SELECT 1 FROM messages g
                      WHERE g.tenant_id = m.tenant_id AND g.conversation_key = 'p:' || m.user_id
                        AND g.message_id IN ({_ids("message_ids")})))
    """


def upgrade() -> None:
    _rekey(_ESCAPED, _PLAIN)
    op.drop_constraint(op.f("ck_memories_scope"), "memories", type_="check")
    op.drop_constraint(op.f("ck_memories_scope_binding"), "memories", type_="check")
    op.create_check_constraint(
        op.f("ck_memories_scope"),
        "memories",
        "scope IN ('GLOBAL', 'PRIVATE', 'GROUP', 'MEMBER_IN_GROUP')",
    )
    op.create_check_constraint(
        op.f("ck_memories_scope_binding"),
        "memories",
        "(scope IN ('GLOBAL', 'PRIVATE') AND user_id IS NOT NULL AND group_id IS NULL)"
        " OR (scope = 'GROUP' AND group_id IS NOT NULL AND user_id IS NULL)"
        " OR (scope = 'MEMBER_IN_GROUP' AND group_id IS NOT NULL AND user_id IS NOT NULL)",
    )
    op.execute(_PRIVATE_ORIGIN)


def downgrade() -> None:
    # A private memory was what a GLOBAL one used to be: bound to the user alone.
    op.execute("UPDATE memories SET scope = 'GLOBAL' WHERE scope = 'PRIVATE'")
    op.drop_constraint(op.f("ck_memories_scope"), "memories", type_="check")
    op.drop_constraint(op.f("ck_memories_scope_binding"), "memories", type_="check")
    op.create_check_constraint(
        op.f("ck_memories_scope"), "memories", "scope IN ('GLOBAL', 'GROUP', 'MEMBER_IN_GROUP')"
    )
    op.create_check_constraint(
        op.f("ck_memories_scope_binding"),
        "memories",
        "(scope = 'GLOBAL' AND user_id IS NOT NULL AND group_id IS NULL)"
        " OR (scope = 'GROUP' AND group_id IS NOT NULL AND user_id IS NULL)"
        " OR (scope = 'MEMBER_IN_GROUP' AND group_id IS NOT NULL AND user_id IS NOT NULL)",
    )
    _rekey(_PLAIN, _ESCAPED)
