"""Re-embedding runs and their progress: no person's data (see ``service.db.registry``)."""

from __future__ import annotations

from service.db.registry import PersonalTable

_RUN = "the deployment's embedding model settings"

REEMBED_RUNS = PersonalTable(
    table="reembed_runs",
    not_personal={
        "provider": _RUN,
        "model_name": _RUN,
        "api_url": _RUN,
        "previous_model": _RUN,
        "status": "a code from a fixed set",
    },
    tenant_erase=False,
    tenant_export=False,
)

# Deleted with its tenant (cascade).
REEMBED_PROGRESS = PersonalTable(
    table="reembed_progress",
    not_personal={
        "table_name": "the name of a table with vectors",
        "cursor": "the primary key a pass has reached",
    },
    tenant_erase=False,
    tenant_export=False,
)

TABLES = (REEMBED_RUNS, REEMBED_PROGRESS)
