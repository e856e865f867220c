"""Database infrastructure: the engine, tenant-scoped sessions, the embedded server, migrations."""
