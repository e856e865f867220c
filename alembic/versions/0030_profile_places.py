"""A user profile the historian wrote goes to the person's private profile.

A user profile is read in every conversation of its person. Before consent was recorded on
each item, the historian filled it from whatever a private chat said when its words sounded
like consent, and from group turns. A profile keeps only its last source event, so which of
its lines came from where cannot be told: the narrowest place that fits them all is the
person's own private chat. So every user profile the historian wrote to (it has a source
event) becomes the person's private profile, or is added to the private profile they already
have; its kept revisions go with it. A user profile written only through the API (no source
event) stays: the tenant put it there.

Revision ID: 0030_profile_places
Revises: 0029_consent_marks
Create Date: 2026-12-02 00:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0030_profile_places"
down_revision: str | None = "0029_consent_marks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WRITTEN = "u.entity_type = 'user' AND u.source_event_id IS NOT NULL"
_PRIVATE_OF_U = (
    "p.tenant_id = u.tenant_id AND p.entity_type = 'private' AND p.entity_id = u.entity_id"
)
# The front matter names the kind on its own line; the body is left as it was written.
_AS_PRIVATE = (
    "regexp_replace({0}, '^(---[ \\t]*\\n(?:[^\\n]*\\n)*?)entity_type:[^\\n]*\\n',"
    " E'\\\\1entity_type: \"private\"\\n')"
)

# A private profile exists: the user profile's body is added to it, line by line as written.
_ADD_TO_PRIVATE = f"""
    UPDATE profiles p
    SET body = rtrim(p.body, E'\\n') || E'\\n' || u.body,
        document = rtrim(p.document, E'\\n') || E'\\n' || rtrim(u.body, E'\\n') || E'\\n',
        modified_at = now()
    FROM profiles u
    WHERE {_WRITTEN} AND {_PRIVATE_OF_U}
    """

# None exists: the user profile becomes it, and its revisions move with it.
_BECOME_PRIVATE = f"""
    INSERT INTO profiles (tenant_id, profile_key, entity_type, entity_id, group_id, name, tags,
                          document, body, source_event_id, version, embedding, updated_at,
                          created_at, modified_at)
    SELECT u.tenant_id, 'private:' || u.entity_id, 'private', u.entity_id, NULL, u.name, u.tags,
           {_AS_PRIVATE.format("u.document")}, u.body, u.source_event_id, u.version,
           u.embedding, u.updated_at, u.created_at, now()
    FROM profiles u
    WHERE {_WRITTEN} AND NOT EXISTS (SELECT 1 FROM profiles p WHERE {_PRIVATE_OF_U})
    """
_MOVE_REVISIONS = f"""
    UPDATE profile_revisions r
    SET profile_key = 'private:' || u.entity_id, document = {_AS_PRIVATE.format("r.document")}
    FROM profiles u
    WHERE r.tenant_id = u.tenant_id AND r.profile_key = u.profile_key AND {_WRITTEN}
      AND EXISTS (SELECT 1 FROM profiles p WHERE {_PRIVATE_OF_U} AND p.version = u.version
                  AND p.document = {_AS_PRIVATE.format("u.document")})
    """
_DROP_USER = "DELETE FROM profiles u WHERE " + _WRITTEN


def upgrade() -> None:
    op.execute(_ADD_TO_PRIVATE)
    op.execute(_BECOME_PRIVATE)
    op.execute(_MOVE_REVISIONS)
    op.execute(_DROP_USER)


def downgrade() -> None:
    # Nothing to undo: what was narrowed stays as narrow, which the older release reads too.
    pass
