"""API shapes for tenants, keys and per-tenant settings."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class TenantCreate(BaseModel):
    """``POST /admin/tenants``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    settings: dict[str, Any] = Field(default_factory=dict)


class TenantUpdate(BaseModel):
    """``PATCH /admin/tenants/{id}``."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, min_length=1, max_length=200)
    settings: dict[str, Any] | None = None


class KeyCreate(BaseModel):
    """``POST …/keys``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=200)


class KeyInfo(BaseModel):
    """An API key as listed: never the secret."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class CreatedKey(KeyInfo):
    """A key just created: the only time its secret is shown."""

    key: str


class TenantInfo(BaseModel):
    """A tenant as the admin API shows it."""

    id: uuid.UUID
    name: str
    settings: dict[str, Any]
    created_at: datetime
    erasure_job_id: int | None = Field(
        None,
        description="the job erasing the tenant, while it is not done (one tenant shown alone)",
    )


class CreatedTenant(TenantInfo):
    """``POST /admin/tenants`` answer: the tenant and its first key."""

    tenant_id: uuid.UUID
    api_key: CreatedKey


class SettingsUpdate(BaseModel):
    """``PATCH /v1/settings``: overrides of the query settings and the cognitive switch."""

    model_config = ConfigDict(extra="forbid")

    cognitive_enabled: bool | None = None
    query: dict[str, Any] | None = None
    timezone: str | None = Field(default=None, description="default IANA timezone of calls")
    fast_ack: bool | None = Field(
        default=None,
        description="commit without waiting for the disk flush (may lose the last fraction of "
        "a second of writes if the database server crashes; never corrupts)",
    )
    bot: dict[str, str] | None = Field(default=None, description='{"id": …, "name": …}')
    pii_policy: Literal["store", "mask", "drop"] | None = Field(
        default=None, description="personal data in observations and messages"
    )
    erased_policy: Literal["accept", "flag", "refuse"] | None = Field(
        default=None, description="data about an erased person arriving later"
    )
    webhook_url: str | None = Field(
        default=None, description="receives due todos (POST, retried); empty string: off"
    )


class EffectiveSettings(BaseModel):
    """The settings in force for a tenant: deployment defaults with its overrides applied."""

    tenant_id: uuid.UUID
    cognitive_enabled: bool
    timezone: str
    fast_ack: bool
    query: dict[str, Any]
    overrides: dict[str, Any]


class BotSettingsUpdate(BaseModel):
    """``PUT /v1/bots/{bot_id}/settings``: the bot's own overrides, replacing any it had."""

    model_config = ConfigDict(extra="forbid")

    persona: str | None = Field(
        default=None,
        description="the bot's persona (at most 20,000 characters); absent: the tenant's; "
        "empty: none",
    )
    query: dict[str, Any] | None = Field(
        default=None,
        description="query settings over the tenant's; allow_cross_group_tools may only be "
        "turned off",
    )


class BotSettings(BaseModel):
    """The settings in force for one bot of the tenant: the tenant's with the bot's on top."""

    tenant_id: uuid.UUID
    bot_id: str
    configured: bool = Field(description="whether the bot has overrides of its own")
    persona: str | None
    query: dict[str, Any]
    overrides: dict[str, Any] = Field(description="the bot's own overrides")
