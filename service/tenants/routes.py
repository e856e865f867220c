"""HTTP routes: the admin API (tenants, keys) and a tenant's own keys and settings."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from litestar import Controller, Response, delete, get, patch, post, put
from litestar.di import Provide
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from service.http import errors, provide_admin, provide_system_session
from service.privacy.routes import ERASED_LATER, erased
from service.settings import Settings
from service.tenants import bots, service
from service.tenants.schemas import (
    BotSettings,
    BotSettingsUpdate,
    CreatedKey,
    CreatedTenant,
    EffectiveSettings,
    KeyCreate,
    KeyInfo,
    SettingsUpdate,
    TenantCreate,
    TenantInfo,
    TenantUpdate,
)
from service.tenants.service import Authenticator, TenantContext


class AdminController(Controller):
    """``/admin``: tenants and their keys, behind ``MEMORIA_ADMIN_TOKEN``."""

    path = "/admin/tenants"
    tags = ["admin"]
    dependencies = {
        "admin": Provide(provide_admin),
        "session": Provide(provide_system_session),
    }

    @post("/", status_code=201)
    async def create_tenant(
        self,
        admin: None,
        session: AsyncSession,
        settings: Settings,
        data: TenantCreate,
    ) -> CreatedTenant:
        """Create a tenant; the answer holds its id and a first API key (shown once)."""
        tenant, key = await service.create_tenant(session, data.name, data.settings, settings)
        return CreatedTenant(
            tenant_id=tenant.id, api_key=key, **service.tenant_info(tenant).model_dump()
        )

    @get("/", responses=errors(404))
    async def list_tenants(
        self,
        admin: None,
        session: AsyncSession,
        limit: int = Parameter(default=100, ge=1, le=500),
        after: Annotated[
            uuid.UUID | None, Parameter(description="a tenant's id: the tenants made after it")
        ] = None,
    ) -> list[TenantInfo]:
        """The tenants, oldest first, a page at a time (``after``: the last one's id, for
        the next page)."""
        return await service.list_page(session, limit, after)

    @get("/{tenant_id:uuid}", responses=errors(404))
    async def get_tenant(
        self, admin: None, session: AsyncSession, tenant_id: uuid.UUID
    ) -> TenantInfo:
        """One tenant, and the job erasing it while one does (``erasure_job_id``)."""
        return await service.describe(session, tenant_id)

    @patch("/{tenant_id:uuid}", responses=errors(404, 409))
    async def update_tenant(
        self,
        admin: None,
        session: AsyncSession,
        auth: Authenticator,
        settings: Settings,
        tenant_id: uuid.UUID,
        data: TenantUpdate,
    ) -> TenantInfo:
        """Rename a tenant or replace its settings overrides (in force at once); 409 while
        it is being erased."""
        return await service.update(session, auth, tenant_id, data.name, data.settings, settings)

    @delete("/{tenant_id:uuid}", status_code=200, responses={**errors(404), **ERASED_LATER})
    async def erase_tenant(
        self,
        admin: None,
        session: AsyncSession,
        auth: Authenticator,
        settings: Settings,
        tenant_id: uuid.UUID,
    ) -> Response[dict[str, Any]]:
        """Erase a tenant and all its data, keys included (a tombstone remains): 200 with a
        receipt of counts, or, when large, 202 with the job that erases it (its keys are
        refused at once, no key can be made while it runs, and asking again answers with the
        same job, run again if it failed; the tenant answers 404 here once it is gone)."""
        erasure = await service.erase(session, auth, tenant_id, settings)
        return erased("tenant", erasure, f"/admin/tenants/{tenant_id}")

    @post("/{tenant_id:uuid}/keys", status_code=201, responses=errors(404, 409))
    async def create_key(
        self,
        admin: None,
        session: AsyncSession,
        settings: Settings,
        tenant_id: uuid.UUID,
        data: KeyCreate | None = None,
    ) -> CreatedKey:
        """A new key for the tenant (shown once); 409 past the tenant's cap of keys, or
        while it is being erased."""
        return await service.create_key(session, tenant_id, data.name if data else "", settings)

    @get("/{tenant_id:uuid}/keys", responses=errors(404))
    async def list_keys(
        self, admin: None, session: AsyncSession, tenant_id: uuid.UUID
    ) -> list[KeyInfo]:
        """The tenant's keys, without secrets."""
        return await service.list_keys(session, tenant_id)

    @delete("/{tenant_id:uuid}/keys/{key_id:uuid}", status_code=200, responses=errors(404))
    async def revoke_key(
        self,
        admin: None,
        session: AsyncSession,
        auth: Authenticator,
        tenant_id: uuid.UUID,
        key_id: uuid.UUID,
    ) -> KeyInfo:
        """Revoke a key; it gets 401 from then on."""
        return await service.revoke_key(session, auth, tenant_id, key_id)


class TenantController(Controller):
    """``/v1``: the calling tenant itself, its keys and its settings."""

    path = "/v1"
    tags = ["tenant"]

    @get("/tenant")
    async def whoami(self, tenant: TenantContext) -> dict[str, Any]:
        """The tenant this key belongs to."""
        return {
            "tenant_id": str(tenant.tenant_id),
            "name": tenant.tenant_name,
            "key_prefix": tenant.key_prefix,
        }

    @get("/keys")
    async def list_keys(self, tenant: TenantContext, session: AsyncSession) -> list[KeyInfo]:
        """This tenant's keys, without secrets."""
        return await service.list_keys(session, tenant.tenant_id)

    @post("/keys", status_code=201, responses=errors(409))
    async def create_key(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        settings: Settings,
        data: KeyCreate | None = None,
    ) -> CreatedKey:
        """Another key for this tenant (shown once)."""
        name = data.name if data else ""
        return await service.create_key(session, tenant.tenant_id, name, settings)

    @delete("/keys/{key_id:uuid}", status_code=200, responses=errors(404))
    async def revoke_key(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        auth: Authenticator,
        key_id: uuid.UUID,
    ) -> KeyInfo:
        """Revoke one of this tenant's keys."""
        return await service.revoke_key(session, auth, tenant.tenant_id, key_id)

    @get("/settings")
    async def get_settings(self, tenant: TenantContext) -> EffectiveSettings:
        """The settings in force for this tenant."""
        return _effective(tenant)

    @patch("/settings")
    async def update_settings(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        auth: Authenticator,
        settings: Settings,
        data: SettingsUpdate,
    ) -> EffectiveSettings:
        """Change this tenant's overrides; ``null`` for a query key restores the default."""
        return _effective(await service.update_settings(session, auth, tenant, data, settings))


class BotController(Controller):
    """``/v1/bots``: settings of the tenant's bots, each over the tenant's own. What the bots
    remember stays the tenant's, shared by all of them."""

    path = "/v1/bots"
    tags = ["tenant"]

    @get("/")
    async def list_bots(self, tenant: TenantContext) -> list[BotSettings]:
        """The bots with settings of their own, by id."""
        configured = service.bot_settings(tenant)
        return [_bot(tenant.for_bot(bot_id), bot_id) for bot_id in sorted(configured)]

    @get("/{bot_id:str}/settings")
    async def get_bot_settings(self, tenant: TenantContext, bot_id: str) -> BotSettings:
        """The settings in force for this bot: the tenant's where it has none of its own."""
        bots.check_bot_id(bot_id, "bot_id")
        return _bot(tenant.for_bot(bot_id), bot_id)

    @put("/{bot_id:str}/settings", responses=errors(409))
    async def put_bot_settings(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        auth: Authenticator,
        settings: Settings,
        bot_id: str,
        data: BotSettingsUpdate,
    ) -> BotSettings:
        """Set this bot's persona and query settings over the tenant's (replacing those it
        had), in force from the next request; 422 naming the field of a bad value."""
        layer = data.model_dump(exclude_none=True)
        bot = await service.set_bot(session, auth, tenant.tenant_id, bot_id, layer, settings)
        return _bot(bot, bot_id)

    @delete("/{bot_id:str}/settings", status_code=200, responses=errors(409))
    async def delete_bot_settings(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        auth: Authenticator,
        settings: Settings,
        bot_id: str,
    ) -> BotSettings:
        """Remove this bot's own settings: it gets the tenant's from the next request."""
        bot = await service.set_bot(session, auth, tenant.tenant_id, bot_id, None, settings)
        return _bot(bot, bot_id)


def _bot(tenant: TenantContext, bot_id: str) -> BotSettings:
    return BotSettings(
        tenant_id=tenant.tenant_id,
        bot_id=bot_id,
        configured=tenant.bot_id == bot_id,
        persona=tenant.persona,
        query=tenant.query.model_dump(),
        overrides=tenant.bot_layer,
    )


def _effective(tenant: TenantContext) -> EffectiveSettings:
    return EffectiveSettings(
        tenant_id=tenant.tenant_id,
        cognitive_enabled=tenant.cognitive_enabled,
        timezone=tenant.timezone,
        fast_ack=tenant.fast_ack,
        query=tenant.query.model_dump(),
        overrides=tenant.overrides,
    )
