"""Keyed hashes that name a person, a group or a tenant without revealing them.

Tombstones (``erasures``), exports and audit entries name their subject by hash only. A plain
hash of ``<tenant>:user:<id>`` can be reversed by hashing every plausible id (ids are short
numbers), so the hash is an HMAC under a server secret: the operator's ``privacy_secret``, or
the one generated at migration and kept in ``memoria_meta``.

The configured secret is process-wide rather than passed along: hashes are taken deep in the
audit trail, the queue's handlers and the importer, and every one of them must use the same
key as every other process of the deployment.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from service.settings import Settings

META_KEY = "privacy_secret"

_configured: bytes | None = None
# The stored secret per database (tests run many databases in one process).
_stored: dict[str, bytes] = {}


def configure(settings: Settings) -> None:
    """Use the operator's secret from now on (or, when unset, the stored one)."""
    global _configured
    given = settings.privacy_secret
    _configured = given.get_secret_value().encode() if given is not None else None


async def secret(session: AsyncSession) -> bytes:
    """The key of this deployment's subject hashes."""
    if _configured is not None:
        return _configured
    where = str(session.sync_session.get_bind().engine.url)
    cached = _stored.get(where)
    if cached is not None:
        return cached
    value = (
        await session.execute(
            text("SELECT value FROM memoria_meta WHERE key = :key"), {"key": META_KEY}
        )
    ).scalar_one_or_none()
    if value is None:
        raise RuntimeError("no privacy secret in memoria_meta: run `memoria migrate`")
    _stored[where] = str(value).encode()
    return _stored[where]


def keyed_hash(key: bytes, tenant_id: uuid.UUID, kind: str, subject: str) -> str:
    """HMAC-SHA256 of the subject within its tenant and kind, as 64 hex digits."""
    message = f"{tenant_id}:{kind}:{subject}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


async def contributors(
    session: AsyncSession, tenant_id: uuid.UUID, people: list[str | None]
) -> list[str]:
    """The keyed hashes of the people a derived text is made of (sorted, once each): how a
    profile's revision names them, so an erasure finds what they brought and no id is kept."""
    key = await secret(session)
    return sorted({keyed_hash(key, tenant_id, "user", p) for p in people if p})


async def subject_hash(session: AsyncSession, tenant_id: uuid.UUID, kind: str, subject: str) -> str:
    """The keyed hash that names ``subject`` in tombstones, exports and the audit trail."""
    return keyed_hash(await secret(session), tenant_id, kind, subject)
