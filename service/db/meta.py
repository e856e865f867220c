"""Deployment facts fixed when the schema was created (the embedding dimension, …)."""

from __future__ import annotations

from sqlalchemy import String, Text, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base


class MemoriaMeta(Base):
    """A key/value row about the deployment, not about any tenant."""

    __tablename__ = "memoria_meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text, nullable=False)


async def read_meta(session: AsyncSession, key: str) -> str | None:
    """One deployment fact, or None."""
    result = await session.execute(select(MemoriaMeta.value).where(MemoriaMeta.key == key))
    return result.scalar_one_or_none()
