"""Alembic environment: async engine, URL and embedding dimension from the service's settings."""

from __future__ import annotations

import asyncio
import logging
from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from service.db.types import compare_type
from service.models import metadata

config = context.config
if config.config_file_name is not None and not config.attributes.get("skip_logging"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)
log = logging.getLogger("alembic.env")


def _url() -> str:
    url = config.attributes.get("url")
    if url:
        return str(url)
    from service.db.engine import resolve_database_url
    from service.settings import load_settings

    settings = load_settings()
    config.attributes.setdefault("embedding_dim", settings.models.embedding.dimensions)
    config.attributes.setdefault("embedding_model", settings.models.embedding.model_name)
    return resolve_database_url(settings)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        compare_type=compare_type,
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()
    # On a Citus coordinator, lay out whatever the migrations made (idempotent; no-op without
    # Citus). Its own transaction, after the chain, so every migration stays as it is.
    from service.db.citus import distribute_schema

    if connection.in_transaction():
        distribute_schema(connection)
    else:
        with connection.begin():
            distribute_schema(connection)


async def _run_async() -> None:
    engine = create_async_engine(_url())
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
    else:
        asyncio.run(_run_async())
