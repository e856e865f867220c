"""Rules for tenants and keys: key format and hashing, authentication, per-tenant settings."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import ValidationError
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import DEFAULT_TIMEZONE
from service.db.engine import Database
from service.errors import Conflict, Invalid, NotFound, Unauthorized, field_of
from service.privacy.service import Erasure, erase_tenant_now_or_later, tenant_erasure
from service.settings import QuerySettings, Settings
from service.tenants import bots, budget, repository
from service.tenants.models import ApiKey, Tenant
from service.tenants.schemas import CreatedKey, KeyInfo, SettingsUpdate, TenantInfo
from service.todos.webhook import check_url

PII_POLICIES = ("store", "mask", "drop")
ERASED_POLICIES = ("accept", "flag", "refuse")
# The header with which the admin token names the tenant it acts within on ``/v1`` routes.
ACTING_TENANT_HEADER = "X-Memoria-Tenant"
# How a change made with the admin token names its author (where a key's prefix would be).
ADMIN_ACTOR = "admin"
KEY_PREFIX_RE = re.compile(r"^mk_[a-z0-9]{10}$")
KEY_RE = re.compile(r"^(mk_[a-z0-9]{10})_([A-Za-z0-9_-]{43})$")
_PREFIX_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def new_key() -> tuple[str, str, bytes]:
    """A fresh key: (full key shown once, visible prefix, SHA-256 stored)."""
    prefix = "mk_" + "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(10))
    key = f"{prefix}_{secrets.token_urlsafe(32)}"
    return key, prefix, hash_key(key)


def hash_key(key: str) -> bytes:
    """Keys carry 256 random bits, so one SHA-256 is enough (no slow KDF needed)."""
    return hashlib.sha256(key.encode()).digest()


def key_info(key: ApiKey) -> KeyInfo:
    """The listable view of a key."""
    return KeyInfo(
        id=key.id,
        tenant_id=key.tenant_id,
        name=key.name,
        prefix=key.prefix,
        created_at=key.created_at,
        last_used_at=key.last_used_at,
        revoked_at=key.revoked_at,
    )


def tenant_info(tenant: Tenant) -> TenantInfo:
    """The admin view of a tenant."""
    return TenantInfo(
        id=tenant.id, name=tenant.name, settings=tenant.settings, created_at=tenant.created_at
    )


def validate_overrides(overrides: dict[str, Any], defaults: Settings) -> dict[str, Any]:
    """Check a tenant's settings overrides against the settings model; return them cleaned."""
    allowed = {
        "cognitive",
        "query",
        "timezone",
        "fast_ack",
        "bot",
        "webhook_url",
        "persona",
        "pii_policy",
        "erased_policy",
        budget.SETTING,
        bots.SECTION,
    }
    unknown = set(overrides) - allowed
    if unknown:
        name = sorted(unknown)[0]
        raise Invalid(f"unknown settings section {name!r}", field=f"settings.{name}")
    cleaned: dict[str, Any] = {}
    cognitive = overrides.get("cognitive")
    if cognitive is not None:
        if not isinstance(cognitive, dict) or set(cognitive) - {"enabled"}:
            raise Invalid(
                "only cognitive.enabled can be set per tenant", field="settings.cognitive"
            )
        if "enabled" in cognitive:
            if not isinstance(cognitive["enabled"], bool):
                raise Invalid("must be true or false", field="settings.cognitive.enabled")
            cleaned["cognitive"] = {"enabled": cognitive["enabled"]}
    if "timezone" in overrides:
        zone = overrides["timezone"]
        try:
            ZoneInfo(str(zone))
        except (ZoneInfoNotFoundError, ValueError):
            raise Invalid(f"unknown IANA timezone {zone!r}", field="settings.timezone") from None
        cleaned["timezone"] = str(zone)
    if "fast_ack" in overrides:
        if not isinstance(overrides["fast_ack"], bool):
            raise Invalid("must be true or false", field="settings.fast_ack")
        cleaned["fast_ack"] = overrides["fast_ack"]
    for name, choices in (("pii_policy", PII_POLICIES), ("erased_policy", ERASED_POLICIES)):
        if name in overrides:
            if overrides[name] not in choices:
                raise Invalid(f"one of {', '.join(choices)}", field=f"settings.{name}")
            cleaned[name] = overrides[name]
    if budget.SETTING in overrides:
        calls = overrides[budget.SETTING]
        if (
            not isinstance(calls, int)
            or isinstance(calls, bool)
            or not 1 <= calls <= budget.MAX_CALLS_PER_MINUTE
        ):
            raise Invalid(
                f"a whole number of LLM calls from 1 to {budget.MAX_CALLS_PER_MINUTE}",
                field=f"settings.{budget.SETTING}",
            )
        cleaned[budget.SETTING] = calls
    if "persona" in overrides:
        cleaned["persona"] = bots.check_persona(overrides["persona"], "settings.persona")
    if "webhook_url" in overrides:
        url = overrides["webhook_url"]
        if url not in (None, "") and (
            not isinstance(url, str) or not re.match(r"^https?://[^\s]+$", url) or len(url) > 2000
        ):
            raise Invalid("an http(s) URL, or empty to switch it off", field="settings.webhook_url")
        if url:
            check_url(url, allow_private=defaults.webhook_allow_private)
        cleaned["webhook_url"] = url or ""
    if "bot" in overrides:
        bot = overrides["bot"]
        if (
            not isinstance(bot, dict)
            or set(bot) - {"id", "name"}
            or not all(isinstance(v, str) and len(v) <= 200 for v in bot.values())
        ):
            raise Invalid("bot takes string id and name", field="settings.bot")
        cleaned["bot"] = dict(bot)
    query = overrides.get("query")
    if query is not None:
        if not isinstance(query, dict):
            raise Invalid("must be an object", field="settings.query")
        try:
            QuerySettings.model_validate({**defaults.cognitive.query.model_dump(), **query})
        except ValidationError as exc:
            error = exc.errors()[0]
            raise Invalid(error["msg"], field=field_of(error, "settings.query")) from exc
        cleaned["query"] = dict(query)
    if bots.SECTION in overrides:
        tenant_query = QuerySettings.model_validate(
            {**defaults.cognitive.query.model_dump(), **cleaned.get("query", {})}
        )
        cleaned[bots.SECTION] = bots.validate(
            overrides[bots.SECTION], tenant_query, defaults.max_bots_per_tenant
        )
    return cleaned


@dataclass(frozen=True)
class TenantContext:
    """Who is calling: the tenant, the key, and the settings in force for them."""

    tenant_id: uuid.UUID
    tenant_name: str
    key_id: uuid.UUID | None
    key_prefix: str | None
    overrides: dict[str, Any] = field(default_factory=dict)
    defaults: Settings | None = None
    # The bot whose settings are layered over the tenant's (see ``for_bot``); None: the
    # tenant's own.
    bot_id: str | None = None

    @classmethod
    def of(
        cls,
        tenant: Tenant,
        settings: Settings,
        *,
        key: ApiKey | None = None,
        actor: str | None = None,
    ) -> TenantContext:
        """A tenant's context, called with ``key``, or by ``actor`` without one."""
        return cls(
            tenant_id=tenant.id,
            tenant_name=tenant.name,
            key_id=key.id if key else None,
            key_prefix=key.prefix if key else actor,
            overrides=dict(tenant.settings or {}),
            defaults=settings,
        )

    def for_bot(self, bot_id: str | None) -> TenantContext:
        """The tenant as its bot ``bot_id`` (the tenant's default bot when None) calls it:
        that bot's persona and query settings over the tenant's, the tenant's alone for a bot
        with none. Settings only: what is read and written stays the tenant's, shared by its
        bots."""
        chosen = bot_id or self.bot.get("id")
        if chosen not in self.overrides.get(bots.SECTION, {}):
            chosen = None
        return self if chosen == self.bot_id else replace(self, bot_id=chosen)

    @property
    def bot_layer(self) -> dict[str, Any]:
        """The overrides of the bot this context is for (``for_bot``); empty for none."""
        if self.bot_id is None:
            return {}
        return dict(self.overrides.get(bots.SECTION, {}).get(self.bot_id) or {})

    @property
    def query(self) -> QuerySettings:
        """Query settings: deployment defaults, this tenant's overrides, then its bot's."""
        base = self.defaults.cognitive.query if self.defaults else QuerySettings()
        merged = {**base.model_dump(), **self.overrides.get("query", {})}
        tenant = QuerySettings.model_validate(merged)
        layer = self.bot_layer.get("query")
        return bots.layered(tenant, layer) if layer else tenant

    @property
    def persona(self) -> str | None:
        """The persona injected first every turn: the bot's when it has one (an empty one:
        none), else the tenant's."""
        layer = self.bot_layer
        text = layer["persona"] if "persona" in layer else self.overrides.get("persona")
        return str(text) if text else None

    @property
    def timezone(self) -> str:
        """The tenant's default timezone for calls that name none."""
        return str(self.overrides.get("timezone") or DEFAULT_TIMEZONE)

    @property
    def fast_ack(self) -> bool:
        """Opt-in: commit this tenant's writes without waiting for the disk flush."""
        return bool(self.overrides.get("fast_ack", False))

    @property
    def pii_policy(self) -> str:
        """What happens to personal data in observations and messages: store, mask, drop."""
        return str(self.overrides.get("pii_policy", "store"))

    @property
    def erased_policy(self) -> str:
        """Data about an erased person arriving later: accept, flag, or refuse."""
        return str(self.overrides.get("erased_policy", "accept"))

    @property
    def bot(self) -> dict[str, str]:
        """The bot's default id and name, for calls that name none."""
        return dict(self.overrides.get("bot") or {})

    @property
    def cognitive_enabled(self) -> bool:
        """The per-tenant ``cognitive.enabled`` switch (deployment default when unset)."""
        default = self.defaults.cognitive.enabled if self.defaults else True
        return bool(self.overrides.get("cognitive", {}).get("enabled", default))


async def tenant_context(
    session: AsyncSession, tenant_id: uuid.UUID, settings: Settings
) -> TenantContext:
    """The settings in force for a tenant outside any request (the command line's imports)."""
    tenant = await repository.get_tenant(session, tenant_id)
    if tenant is None:
        raise NotFound(f"no tenant {tenant_id}")
    return TenantContext.of(tenant, settings)


class Authenticator:
    """Checks bearer keys; caches good keys briefly so a request costs no extra round trip.

    Revocation through this process clears its cache at once; elsewhere (the CLI, another
    replica) it takes effect within ``auth_cache_seconds``. Keys not used within that time
    are swept out, at most once a period, so keys used once (a tenant minting thousands, each
    entry with its tenant's settings) are not held until the process stops.
    """

    def __init__(self, db: Database, settings: Settings) -> None:
        self._db = db
        self._settings = settings
        self._ttl = settings.auth_cache_seconds
        self._cache: dict[bytes, tuple[float, TenantContext]] = {}
        self._next_sweep = 0.0

    async def authenticate(self, authorization: str | None) -> TenantContext:
        """The tenant of ``Authorization: Bearer <key>``, or ``Unauthorized``."""
        key = _bearer(authorization)
        match = KEY_RE.match(key)
        if match is None:
            raise Unauthorized("malformed API key")
        digest = hash_key(key)
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            context = cached[1]
        else:
            context = await self._lookup(match.group(1), digest)
            if self._ttl > 0:
                self._remember(digest, context, now)
        if context.key_id is not None:
            # Written to the primary in the background: authenticating writes nothing.
            self._db.last_use.record("api_keys", context.tenant_id, [context.key_id])
        return context

    async def acting_admin(self, authorization: str | None, tenant: str) -> TenantContext:
        """The admin token acting within one tenant (named by ``X-Memoria-Tenant``).

        The admin can already mint a key for any tenant; this spares the operator's console
        from leaving such keys behind. Changes made this way are recorded as by ``admin``.
        ``Conflict`` while a job erases the tenant, as for a new key: its keys are revoked.
        """
        check_admin_token(authorization, self._settings)
        try:
            tenant_id = uuid.UUID(tenant.strip())
        except ValueError:
            raise Invalid("not a tenant id", field=ACTING_TENANT_HEADER) from None
        async with self._db.system() as session:
            row = await repository.get_tenant(session, tenant_id)
            if row is None:
                raise NotFound("no such tenant", field=ACTING_TENANT_HEADER)
            erasing = await tenant_erasure(session, tenant_id)
            if erasing is not None:
                raise Conflict(f"the tenant is being erased (job {erasing[0]})")
            return TenantContext.of(row, self._settings, actor=ADMIN_ACTOR)

    async def _lookup(self, prefix: str, digest: bytes) -> TenantContext:
        async with self._db.system() as session:
            for key in await repository.keys_by_prefix(session, prefix):
                # Compare digests in constant time so a near-miss is not measurably faster.
                if hmac.compare_digest(key.key_hash, digest) and key.revoked_at is None:
                    tenant = await repository.get_tenant(session, key.tenant_id)
                    if tenant is None:
                        break
                    return TenantContext.of(tenant, self._settings, key=key)
        raise Unauthorized("unknown or revoked API key")

    def _remember(self, digest: bytes, context: TenantContext, now: float) -> None:
        self._cache[digest] = (now + self._ttl, context)
        if now >= self._next_sweep:
            self._cache = {d: entry for d, entry in self._cache.items() if entry[0] > now}
            self._next_sweep = now + self._ttl

    def forget(self, tenant_id: uuid.UUID | None = None, *, at: AsyncSession | None = None) -> None:
        """Drop cached keys (of one tenant, or all) after a revocation or settings change;
        with ``at``, the transaction making that change, once more when it commits: a request
        checked meanwhile read the state before it, and would keep it cached."""
        self._drop(tenant_id)
        if at is not None:
            event.listen(
                at.sync_session, "after_commit", lambda _: self._drop(tenant_id), once=True
            )

    def _drop(self, tenant_id: uuid.UUID | None) -> None:
        if tenant_id is None:
            self._cache.clear()
            return
        for digest, (_, context) in list(self._cache.items()):
            if context.tenant_id == tenant_id:
                self._cache.pop(digest, None)

    async def flush_usage(self) -> None:
        """Write the keys' (and memories') last-used times gathered since the previous flush."""
        await self._db.last_use.flush()


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized("missing Authorization header (expected: Bearer <API key>)")
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise Unauthorized("malformed Authorization header (expected: Bearer <API key>)")
    return credentials.strip()


def check_admin_token(authorization: str | None, settings: Settings) -> None:
    """Let the request through only with the configured admin token."""
    if settings.admin_token is None:
        raise Unauthorized("the admin API is disabled: set MEMORIA_ADMIN_TOKEN to enable it")
    token = _bearer(authorization)
    expected = settings.admin_token.get_secret_value()
    if not hmac.compare_digest(token.encode(), expected.encode()):
        raise Unauthorized("wrong admin token")


async def create_tenant(
    session: AsyncSession, name: str, overrides: dict[str, Any], settings: Settings
) -> tuple[Tenant, CreatedKey]:
    """A new tenant and its first API key."""
    tenant = await repository.insert_tenant(session, name, validate_overrides(overrides, settings))
    return tenant, await create_key(session, tenant.id, "first key", settings)


async def create_key(
    session: AsyncSession, tenant_id: uuid.UUID, name: str, settings: Settings
) -> CreatedKey:
    """A new key for a tenant; the secret appears only in this answer. ``Conflict`` past
    ``max_keys_per_tenant`` unrevoked keys: each key has a rate limit of its own, so keys
    without end would be a rate without end. Of its revoked keys, the tenant keeps as many,
    the last revoked: made and revoked in a loop, keys filled the table (and the tenant's
    list of keys) for the 30 days revoked keys are kept otherwise."""
    await _open_to_change(session, tenant_id)
    if await repository.count_active_keys(session, tenant_id) >= settings.max_keys_per_tenant:
        raise Conflict(
            f"a tenant holds at most {settings.max_keys_per_tenant} unrevoked keys;"
            " revoke one first"
        )
    await repository.forget_revoked_beyond(session, tenant_id, settings.max_keys_per_tenant)
    key, prefix, digest = new_key()
    row = await repository.insert_key(session, tenant_id, name, prefix, digest)
    return CreatedKey(key=key, **key_info(row).model_dump())


async def _open_to_change(session: AsyncSession, tenant_id: uuid.UUID) -> Tenant:
    """The tenant, its row locked to the end of the transaction (an erasure locks it first):
    ``NotFound`` when there is none, ``Conflict`` while a job erases it (a key made then would
    work until the job's end, and what it wrote would be erased with the rest)."""
    tenant = await repository.get_tenant(session, tenant_id, lock=True)
    if tenant is None:
        raise NotFound("no such tenant")
    erasing = await tenant_erasure(session, tenant_id)
    if erasing is not None:
        raise Conflict(f"the tenant is being erased (job {erasing[0]})")
    return tenant


async def _locked(session: AsyncSession, tenant_id: uuid.UUID) -> Tenant:
    """The tenant, its row locked to the end of the transaction: its settings are one JSON
    document, and two changes read side by side (the persona, one bot's settings) would each
    write it back without the other's."""
    tenant = await repository.get_tenant(session, tenant_id, lock=True)
    if tenant is None:
        raise NotFound("no such tenant")
    return tenant


async def prune_revoked_keys(session: AsyncSession, retention_days: float) -> int:
    """Forget every tenant's keys revoked more than ``retention_days`` ago; returns how many."""
    return await repository.prune_revoked_keys(session, retention_days)


async def revoke_by_prefix(session: AsyncSession, prefix: str) -> KeyInfo:
    """Revoke the one key with this visible prefix (the CLI's way of naming a key)."""
    if not KEY_PREFIX_RE.match(prefix):
        raise Invalid("a key prefix looks like mk_xxxxxxxxxx", field="prefix")
    keys = await repository.keys_by_prefix(session, prefix)
    if not keys:
        raise NotFound(f"no key with prefix {prefix}")
    if len(keys) > 1:
        raise Invalid(f"prefix {prefix} is ambiguous; revoke by tenant and id", field="prefix")
    revoked = await repository.revoke_key(session, keys[0].tenant_id, keys[0].id)
    assert revoked is not None
    return key_info(revoked)


# ---------------------------------------------------------------- the admin's and a tenant's API


async def find(session: AsyncSession, tenant_id: uuid.UUID) -> Tenant | None:
    """One tenant, or None."""
    return await repository.get_tenant(session, tenant_id)


async def get(session: AsyncSession, tenant_id: uuid.UUID) -> Tenant:
    """One tenant; ``NotFound`` when there is none by that id."""
    tenant = await find(session, tenant_id)
    if tenant is None:
        raise NotFound("no such tenant")
    return tenant


async def describe(session: AsyncSession, tenant_id: uuid.UUID) -> TenantInfo:
    """One tenant with the job erasing it, if one is; ``NotFound`` when there is none."""
    info = tenant_info(await get(session, tenant_id))
    erasing = await tenant_erasure(session, tenant_id)
    info.erasure_job_id = erasing[0] if erasing is not None else None
    return info


async def list_page(
    session: AsyncSession, limit: int, after: uuid.UUID | None = None
) -> list[TenantInfo]:
    """``limit`` tenants, oldest first, after the tenant ``after`` (its id: the last of the
    page before). ``NotFound`` naming ``after`` when there is no such tenant (erased since)."""
    last = None
    if after is not None:
        last = await repository.get_tenant(session, after)
        if last is None:
            raise NotFound("no such tenant: the page after it cannot be told", field="after")
    return [tenant_info(t) for t in await repository.list_tenants(session, limit, last)]


async def list_all(session: AsyncSession, page: int = 500) -> AsyncIterator[TenantInfo]:
    """Every tenant, oldest first, read ``page`` at a time (each page after the last row of
    the one before, as read: one erased meanwhile breaks nothing)."""
    last = None
    while True:
        tenants = await repository.list_tenants(session, page, last)
        for tenant in tenants:
            yield tenant_info(tenant)
        if len(tenants) < page:
            return
        last = tenants[-1]


async def update(
    session: AsyncSession,
    auth: Authenticator,
    tenant_id: uuid.UUID,
    name: str | None,
    overrides: dict[str, Any] | None,
    settings: Settings,
) -> TenantInfo:
    """Rename a tenant or replace its settings overrides, in force at once; ``Conflict``
    while it is being erased."""
    tenant = await _open_to_change(session, tenant_id)
    if name is not None:
        tenant.name = name
    if overrides is not None:
        tenant.settings = validate_overrides(overrides, settings)
    await session.flush()
    auth.forget(tenant_id, at=session)
    return tenant_info(tenant)


async def erase(
    session: AsyncSession, auth: Authenticator, tenant_id: uuid.UUID, settings: Settings
) -> Erasure:
    """Erase a tenant and all its data, keys included (a tombstone remains); a large tenant
    by a job, its keys revoked at once so that nothing new arrives while it runs (and no key
    is made meanwhile: the tenant's row is locked first, as a new key locks it). Asked again
    while the job runs, the answer is the same job."""
    if await repository.get_tenant(session, tenant_id, lock=True) is None:
        raise NotFound("no such tenant")
    erasure = await erase_tenant_now_or_later(session, tenant_id, settings)
    if erasure.job_id is not None:
        await repository.revoke_keys(session, tenant_id)
    auth.forget(tenant_id, at=session)
    return erasure


async def list_keys(session: AsyncSession, tenant_id: uuid.UUID) -> list[KeyInfo]:
    """A tenant's keys, without secrets; ``NotFound`` when there is no such tenant."""
    await get(session, tenant_id)
    return [key_info(k) for k in await repository.list_keys(session, tenant_id)]


async def revoke_key(
    session: AsyncSession, auth: Authenticator, tenant_id: uuid.UUID, key_id: uuid.UUID
) -> KeyInfo:
    """Revoke one of a tenant's keys; it is refused from then on."""
    key = await repository.revoke_key(session, tenant_id, key_id)
    if key is None:
        raise NotFound("no such key")
    auth.forget(tenant_id, at=session)
    return key_info(key)


async def update_settings(
    session: AsyncSession,
    auth: Authenticator,
    tenant: TenantContext,
    data: SettingsUpdate,
    settings: Settings,
) -> TenantContext:
    """``PATCH /v1/settings``: merge the given overrides into the tenant's (``None`` for a
    query key restores its default); returns the tenant as it is now."""
    row = await _locked(session, tenant.tenant_id)
    overrides: dict[str, Any] = dict(row.settings or {})
    if data.cognitive_enabled is not None:
        overrides["cognitive"] = {"enabled": data.cognitive_enabled}
    if data.query is not None:
        query = {**overrides.get("query", {}), **data.query}
        overrides["query"] = {k: v for k, v in query.items() if v is not None}
    for name in ("timezone", "fast_ack", "bot", "webhook_url", "pii_policy", "erased_policy"):
        if getattr(data, name) is not None:
            overrides[name] = getattr(data, name)
    row.settings = validate_overrides(overrides, settings)
    await session.flush()
    auth.forget(tenant.tenant_id, at=session)
    return TenantContext(
        tenant_id=tenant.tenant_id,
        tenant_name=tenant.tenant_name,
        key_id=tenant.key_id,
        key_prefix=tenant.key_prefix,
        overrides=row.settings,
        defaults=settings,
    )


async def set_persona(
    session: AsyncSession, auth: Authenticator, tenant_id: uuid.UUID, text: str | None
) -> None:
    """Set the tenant's persona (its bot's character and rules), or remove it (``None``)."""
    row = await _locked(session, tenant_id)
    overrides = dict(row.settings or {})
    if text is None:
        overrides.pop("persona", None)
    else:
        overrides["persona"] = text
    row.settings = overrides
    await session.flush()
    auth.forget(tenant_id, at=session)


def bot_settings(tenant: TenantContext) -> dict[str, dict[str, Any]]:
    """The tenant's bots with settings of their own: bot id → its overrides."""
    return dict(tenant.overrides.get(bots.SECTION) or {})


async def set_bot(
    session: AsyncSession,
    auth: Authenticator,
    tenant_id: uuid.UUID,
    bot_id: str,
    layer: dict[str, Any] | None,
    settings: Settings,
) -> TenantContext:
    """Replace one bot's overrides (``None``: remove them, the bot gets the tenant's), checked
    with the rest of the tenant's settings; in force at once. The tenant's row is locked, so
    bots configured side by side do not overwrite each other."""
    bots.check_bot_id(bot_id, "bot_id")
    row = await _open_to_change(session, tenant_id)
    overrides: dict[str, Any] = dict(row.settings or {})
    configured = dict(overrides.get(bots.SECTION) or {})
    if layer is None:
        configured.pop(bot_id, None)
    else:
        configured[bot_id] = layer
    if configured:
        overrides[bots.SECTION] = configured
    else:
        overrides.pop(bots.SECTION, None)
    row.settings = validate_overrides(overrides, settings)
    await session.flush()
    auth.forget(tenant_id, at=session)
    return TenantContext.of(row, settings).for_bot(bot_id)
