"""Keyed hashes for erasure tombstones and audit subjects; who created an export.

A tombstone's hash used to be a plain SHA-256 of ``<tenant>:<kind>:<id>``: anyone holding a
dump could recover the id by hashing candidates. From here on it is an HMAC under a server
secret, generated now (unless the operator configures one) and kept in ``memoria_meta``.
Tombstones written before cannot be rekeyed (their ids are gone), so they stay as they were.

Revision ID: 0012_erasure
Revises: 0010
Create Date: 2026-12-01 10:00:00.000000
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_erasure"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.get_bind().execute(
        sa.text(
            "INSERT INTO memoria_meta (key, value) VALUES ('privacy_secret', :value)"
            " ON CONFLICT (key) DO NOTHING"
        ),
        {"value": secrets.token_hex(32)},
    )
    # The key prefix (or "admin") that asked for the export: only it may fetch the result.
    op.add_column("exports", sa.Column("requested_by", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("exports", "requested_by")
    op.execute("DELETE FROM memoria_meta WHERE key = 'privacy_secret'")
