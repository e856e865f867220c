"""Running Alembic from inside the service (``memoria migrate``, ``serve`` at start, tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text

from service.db.engine import Database
from service.settings import Settings

_ROOT = Path(__file__).resolve().parents[2]


def alembic_config(url: str, settings: Settings) -> Config:
    """An Alembic config bound to ``url`` and to the deployment's embedding dimension."""
    ini = _ROOT / "alembic.ini"
    if not ini.is_file():
        ini = Path.cwd() / "alembic.ini"
    config = Config(str(ini))
    config.set_main_option("script_location", str(ini.parent / "alembic"))
    config.attributes["url"] = url
    config.attributes["skip_logging"] = True
    config.attributes["embedding_dim"] = settings.models.embedding.dimensions
    config.attributes["embedding_model"] = settings.models.embedding.model_name
    return config


def shipped_revisions(config: Config) -> tuple[str | None, frozenset[str]]:
    """The newest migration this code ships, and all of them (one read of the scripts)."""
    scripts = ScriptDirectory.from_config(config)
    return scripts.get_current_head(), frozenset(s.revision for s in scripts.walk_revisions())


def upgrade_to_head(url: str, settings: Settings) -> None:
    """Apply every pending migration (blocking; runs its own event loop)."""
    command.upgrade(alembic_config(url, settings), "head")


async def upgrade_to_head_async(url: str, settings: Settings) -> None:
    """Apply pending migrations from async code (Alembic runs in a thread with its own loop)."""
    await asyncio.to_thread(upgrade_to_head, url, settings)


async def current_revision(db: Database) -> str | None:
    """The revision the database is at, or None before the first migration."""
    async with db.system() as session:
        exists = await session.execute(text("SELECT to_regclass('public.alembic_version')"))
        if exists.scalar_one() is None:
            return None
        result = await session.execute(text("SELECT version_num FROM alembic_version"))
        return result.scalar_one_or_none()
