"""The declarative base shared by every table, with deterministic constraint names."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, MetaData, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Base class of all ORM tables."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def created_at_column() -> Mapped[datetime]:
    """A ``timestamptz`` set by the database at insert."""
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


# Tables that are not owned by a tenant; every other table must lead its keys with tenant_id.
GLOBAL_TABLES = frozenset({"tenants", "memoria_meta", "alembic_version", "reembed_runs"})
