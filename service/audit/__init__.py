"""The audit trail: who did what through the API, and every refused access."""
