"""The audit log keeps what was done; an erased person's id among an entry's targets goes
(see ``service.db.registry``)."""

from __future__ import annotations

from service.db.registry import PersonalTable

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
    erase_user=(
        (
            "audit_log",
            """
            UPDATE audit_log AS a
            SET targets = (SELECT COALESCE(jsonb_object_agg(k, v), '{}'::jsonb)
                           FROM jsonb_each(a.targets) AS e(k, v)
                           WHERE v <> to_jsonb(CAST(:u AS text)))
            WHERE a.tenant_id = :t
              AND EXISTS (SELECT 1 FROM jsonb_each(a.targets) AS e(k, v)
                          WHERE v = to_jsonb(CAST(:u AS text)))
            """,
        ),
    ),
)

TABLES = (AUDIT_LOG,)
