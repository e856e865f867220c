"""Deployment facts fixed when the schema was created (the embedding dimension, …)."""

from __future__ import annotations

from sqlalchemy import String, Text, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Mapped, mapped_column

from service.db.base import Base
from service.errors import ConfigurationError


class MemoriaMeta(Base):
    """A key/value row about the deployment, not about any tenant."""

    __tablename__ = "memoria_meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text, nullable=False)


async def read_meta(session: AsyncSession, key: str) -> str | None:
    """One deployment fact, or None."""
    result = await session.execute(select(MemoriaMeta.value).where(MemoriaMeta.key == key))
    return result.scalar_one_or_none()


async def check_embedding_dimension(session: AsyncSession, dimension: int, model: str) -> None:
    """Refuse to start when the embedder's dimension differs from the schema's."""
    stored = await read_meta(session, "embedding_dim")
    if stored is not None and int(stored) != dimension:
        stored_model = await read_meta(session, "embedding_model") or "unknown"
        raise ConfigurationError(
            f"the embedding model {model!r} makes {dimension}-dimensional vectors, but this "
            f"database was created for {stored}-dimensional vectors (model {stored_model!r}). "
            f"Configure a {stored}-dimensional model, or convert the stored vectors with "
            f"`memoria reembed --model {model}`."
        )
