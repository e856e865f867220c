"""The tombstones of erasures: a keyed hash and counts, no person's data (see
``service.db.registry``). They outlive a tenant's erasure; a tenant's export has them."""

from __future__ import annotations

from service.db.registry import PersonalTable

ERASURES = PersonalTable(
    table="erasures",
    not_personal={
        "kind": "a code from a fixed set",
        "subject_hash": "a keyed hash of the subject's id",
        "requested_by": "the prefix of the API key that asked for it, or 'admin'",
        "counts": "row counts per table",
    },
    tenant_erase=False,
)

TABLES = (ERASURES,)
