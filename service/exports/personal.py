"""Exports are copies of people's data: an erased subject's exports go, and so does any
other export that holds a row of theirs or names them (see ``service.db.registry``)."""

from __future__ import annotations

from service.db.registry import Erasing, PersonalTable
from service.exports import repository


async def erase_exports(e: Erasing) -> int:
    """Delete the subject's exports and the exports holding their rows or names."""
    return await repository.erase(
        e.session, e.tenant_id, e.subject_hash, e.subject, e.names, e.id_fields
    )


# Copies first: an export is matched by what it holds before that is deleted. Its chunks go
# with it (cascade). Exports are not themselves exported.
EXPORTS = PersonalTable(
    table="exports",
    not_personal={
        "kind": "a code from a fixed set",
        "subject_hash": "a keyed hash of the subject's id",
        "manifest": "row counts per table",
        "requested_by": "the prefix of the API key that asked for it",
    },
    erase_copies=erase_exports,
    tenant_export=False,
)

EXPORT_CHUNKS = PersonalTable(
    table="export_chunks",
    personal=("data",),
    tenant_erase=False,
    tenant_export=False,
)

TABLES = (EXPORTS, EXPORT_CHUNKS)
