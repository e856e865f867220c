"""HTTP routes: the admin API (tenants, keys) and a tenant's own keys and settings."""

from __future__ import annotations

import uuid
from typing import Any

from litestar import Controller, Request, delete, get, patch, post
from litestar.di import Provide
from sqlalchemy.ext.asyncio import AsyncSession

from service.errors import NotFound
from service.http import errors, provide_admin, provide_system_session, runtime
from service.tenants import repository, service
from service.tenants.schemas import (
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
from service.tenants.service import TenantContext


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
        request: Request[Any, Any, Any],
        admin: None,
        session: AsyncSession,
        data: TenantCreate,
    ) -> CreatedTenant:
        """Create a tenant; the answer holds its id and a first API key (shown once)."""
        tenant, key = await service.create_tenant(
            session, data.name, data.settings, runtime(request).settings
        )
        return CreatedTenant(
            tenant_id=tenant.id, api_key=key, **service.tenant_info(tenant).model_dump()
        )

    @get("/")
    async def list_tenants(self, admin: None, session: AsyncSession) -> list[TenantInfo]:
        """Every tenant."""
        return [service.tenant_info(t) for t in await repository.list_tenants(session)]

    @get("/{tenant_id:uuid}", responses=errors(404))
    async def get_tenant(
        self, admin: None, session: AsyncSession, tenant_id: uuid.UUID
    ) -> TenantInfo:
        """One tenant."""
        tenant = await repository.get_tenant(session, tenant_id)
        if tenant is None:
            raise NotFound("no such tenant")
        return service.tenant_info(tenant)

    @patch("/{tenant_id:uuid}", responses=errors(404))
    async def update_tenant(
        self,
        request: Request[Any, Any, Any],
        admin: None,
        session: AsyncSession,
        tenant_id: uuid.UUID,
        data: TenantUpdate,
    ) -> TenantInfo:
        """Rename a tenant or replace its settings overrides (in force at once)."""
        tenant = await repository.get_tenant(session, tenant_id)
        if tenant is None:
            raise NotFound("no such tenant")
        if data.name is not None:
            tenant.name = data.name
        if data.settings is not None:
            tenant.settings = service.validate_overrides(data.settings, runtime(request).settings)
        await session.flush()
        runtime(request).auth.forget(tenant_id)
        return service.tenant_info(tenant)

    @delete("/{tenant_id:uuid}", status_code=200, responses=errors(404))
    async def erase_tenant(
        self,
        request: Request[Any, Any, Any],
        admin: None,
        session: AsyncSession,
        tenant_id: uuid.UUID,
    ) -> dict[str, Any]:
        """Erase a tenant and all its data, keys included (a tombstone remains)."""
        from service.privacy.service import erase_tenant

        counts = await erase_tenant(session, tenant_id)
        if counts is None:
            raise NotFound("no such tenant")
        runtime(request).auth.forget(tenant_id)
        return {"erased": "tenant", "counts": counts}

    @post("/{tenant_id:uuid}/keys", status_code=201, responses=errors(404))
    async def create_key(
        self,
        admin: None,
        session: AsyncSession,
        tenant_id: uuid.UUID,
        data: KeyCreate | None = None,
    ) -> CreatedKey:
        """A new key for the tenant (shown once)."""
        return await service.create_key(session, tenant_id, data.name if data else "")

    @get("/{tenant_id:uuid}/keys", responses=errors(404))
    async def list_keys(
        self, admin: None, session: AsyncSession, tenant_id: uuid.UUID
    ) -> list[KeyInfo]:
        """The tenant's keys, without secrets."""
        if await repository.get_tenant(session, tenant_id) is None:
            raise NotFound("no such tenant")
        return [service.key_info(k) for k in await repository.list_keys(session, tenant_id)]

    @delete("/{tenant_id:uuid}/keys/{key_id:uuid}", status_code=200, responses=errors(404))
    async def revoke_key(
        self,
        request: Request[Any, Any, Any],
        admin: None,
        session: AsyncSession,
        tenant_id: uuid.UUID,
        key_id: uuid.UUID,
    ) -> KeyInfo:
        """Revoke a key; it gets 401 from then on."""
        key = await repository.revoke_key(session, tenant_id, key_id)
        if key is None:
            raise NotFound("no such key")
        runtime(request).auth.forget(tenant_id)
        return service.key_info(key)


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
        return [service.key_info(k) for k in await repository.list_keys(session, tenant.tenant_id)]

    @post("/keys", status_code=201)
    async def create_key(
        self, tenant: TenantContext, session: AsyncSession, data: KeyCreate | None = None
    ) -> CreatedKey:
        """Another key for this tenant (shown once)."""
        return await service.create_key(session, tenant.tenant_id, data.name if data else "")

    @delete("/keys/{key_id:uuid}", status_code=200, responses=errors(404))
    async def revoke_key(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        key_id: uuid.UUID,
    ) -> KeyInfo:
        """Revoke one of this tenant's keys."""
        key = await repository.revoke_key(session, tenant.tenant_id, key_id)
        if key is None:
            raise NotFound("no such key")
        runtime(request).auth.forget(tenant.tenant_id)
        return service.key_info(key)

    @get("/settings")
    async def get_settings(self, tenant: TenantContext) -> EffectiveSettings:
        """The settings in force for this tenant."""
        return _effective(tenant)

    @patch("/settings")
    async def update_settings(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        data: SettingsUpdate,
    ) -> EffectiveSettings:
        """Change this tenant's overrides; ``null`` for a query key restores the default."""
        row = await repository.get_tenant(session, tenant.tenant_id)
        if row is None:
            raise NotFound("no such tenant")
        overrides: dict[str, Any] = dict(row.settings or {})
        if data.cognitive_enabled is not None:
            overrides["cognitive"] = {"enabled": data.cognitive_enabled}
        if data.query is not None:
            query = {**overrides.get("query", {}), **data.query}
            overrides["query"] = {k: v for k, v in query.items() if v is not None}
        if data.timezone is not None:
            overrides["timezone"] = data.timezone
        if data.fast_ack is not None:
            overrides["fast_ack"] = data.fast_ack
        if data.bot is not None:
            overrides["bot"] = data.bot
        if data.webhook_url is not None:
            overrides["webhook_url"] = data.webhook_url
        for name in ("pii_policy", "erased_policy"):
            if getattr(data, name) is not None:
                overrides[name] = getattr(data, name)
        settings = runtime(request).settings
        row.settings = service.validate_overrides(overrides, settings)
        await session.flush()
        runtime(request).auth.forget(tenant.tenant_id)
        return _effective(
            TenantContext(
                tenant_id=tenant.tenant_id,
                tenant_name=tenant.tenant_name,
                key_id=tenant.key_id,
                key_prefix=tenant.key_prefix,
                overrides=row.settings,
                defaults=settings,
            )
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
