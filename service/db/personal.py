"""The deployment's own tables: no person's data (see ``service.db.registry``)."""

from __future__ import annotations

from service.db.registry import PersonalTable

MEMORIA_META = PersonalTable(
    table="memoria_meta",
    not_personal={
        "key": "a setting of the deployment",
        "value": "its value (the embedding model, the erasure key)",
    },
    tenant_erase=False,
    tenant_export=False,
)

ALEMBIC_VERSION = PersonalTable(
    table="alembic_version",
    not_personal={"version_num": "the schema's migration"},
    tenant_erase=False,
    tenant_export=False,
)

TABLES = (MEMORIA_META, ALEMBIC_VERSION)
