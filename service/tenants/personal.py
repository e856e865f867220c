"""A tenant's own row and its API keys: no person's data (see ``service.db.registry``)."""

from __future__ import annotations

from service.db.registry import PersonalTable

TENANTS = PersonalTable(
    table="tenants",
    not_personal={
        "name": "the tenant's name (an organisation's, set by an operator)",
        "settings": "the tenant's configuration",
    },
    tenant_key="id",
)

API_KEYS = PersonalTable(
    table="api_keys",
    not_personal={
        "name": "a label an operator gives a key",
        "prefix": "the key's public prefix",
    },
    hidden=("key_hash",),
)

TABLES = (TENANTS, API_KEYS)
