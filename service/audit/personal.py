"""The audit log keeps what was done; an erased person's or group's id among an entry's
targets goes (see ``service.db.registry``)."""

from __future__ import annotations

from service.db.registry import PERSON_FIELDS, PersonalTable

# The targets that name a person: a path's person id (``{user_id}``), and a profile's
# ``{entity_id}`` unless the profile is a group's. No other target is compared with the id, so
# a memory, todo or job numbered as a person is called ("42"), or a profile kind spelt like
# one ("user"), keeps its place in the trail.
_PERSON_KEYS = ", ".join(f"'{name}'" for name in PERSON_FIELDS)
_PERSON_TARGET = (
    f"(e.k IN ({_PERSON_KEYS})"
    " OR (e.k = 'entity_id' AND a.targets ->> 'entity_type' IS DISTINCT FROM 'group'))"
    " AND e.v = to_jsonb(CAST(:u AS text))"
)
# The targets that name a group: a member's ``{group_id}``, a group profile's ``{entity_id}``.
_GROUP_TARGET = (
    "(e.k = 'group_id' OR (e.k = 'entity_id' AND a.targets ->> 'entity_type' = 'group'))"
    " AND e.v = to_jsonb(CAST(:g AS text))"
)


def _scrub(target: str) -> str:
    """An UPDATE that takes the ``target`` pairs out of the tenant's entries' targets."""
    return f"""
            UPDATE audit_log AS a
            SET targets = (SELECT COALESCE(jsonb_object_agg(e.k, e.v), '{{}}'::jsonb)
                           FROM jsonb_each(a.targets) AS e(k, v)
                           WHERE NOT ({target}))
            WHERE a.tenant_id = :t
              AND EXISTS (SELECT 1 FROM jsonb_each(a.targets) AS e(k, v) WHERE {target})
            """


AUDIT_LOG = PersonalTable(
    table="audit_log",
    ids=("targets",),
    not_personal={
        "actor": "the prefix of the API key that acted, or 'admin'",
        "method": "an HTTP method",
        "route": "the route's path template",
        "outcome": "a code from a fixed set",
        "request_id": "the request's correlation id",
    },
    erase_user=(("audit_log", _scrub(_PERSON_TARGET)),),
    erase_group=(("audit_log", _scrub(_GROUP_TARGET)),),
)

TABLES = (AUDIT_LOG,)
