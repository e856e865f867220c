"""A tenant's own row, its API keys and its budget: no person's data (see
``service.db.registry``)."""

from __future__ import annotations

from service.db.registry import PersonalTable

TENANTS = PersonalTable(
    table="tenants",
    not_personal={
        "name": "the tenant's name (an organisation's, set by an operator)",
        "settings": "the tenant's configuration",
    },
    tenant_key="id",
    # The tenant's bot takes part in every conversation: its name, spoken to, is the bot's.
    namesakes=(
        "SELECT btrim(settings -> 'bot' ->> 'name') AS name, k AS key"
        " FROM tenants, unnest(CAST(:keys AS text[])) AS k"
        " WHERE id = :t AND btrim(settings -> 'bot' ->> 'name') = ANY(:names)",
    ),
)

API_KEYS = PersonalTable(
    table="api_keys",
    not_personal={
        "name": "a label an operator gives a key",
        "prefix": "the key's public prefix",
    },
    hidden=("key_hash",),
)

# How many model calls the tenant's jobs made in the current minute: counts, no one's data.
LLM_BUDGETS = PersonalTable(table="llm_budgets")

TABLES = (TENANTS, API_KEYS, LLM_BUDGETS)
