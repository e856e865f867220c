"""``/v1/profiles``: read, revisions, rollback, operator replace, search."""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get, post, put
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import scope_of
from service.errors import Conflict, Invalid, NotFound
from service.http import errors, reads, runtime
from service.profiles import repository, service
from service.profiles.document import ProfileKey
from service.profiles.schemas import (
    ProfileHit,
    ProfileInfo,
    ProfileReplace,
    ProfileSearch,
    RevisionInfo,
    Rollback,
)
from service.tenants.service import TenantContext


def _info(row: dict[str, Any]) -> ProfileInfo:
    return ProfileInfo(**{k: row[k] for k in ProfileInfo.model_fields})


class ProfileController(Controller):
    """Profiles of users, groups and members of groups."""

    path = "/v1/profiles"
    tags = ["profiles"]

    async def _read(
        self, session: AsyncSession, tenant: TenantContext, key: ProfileKey
    ) -> ProfileInfo:
        row = await repository.get(session, tenant.tenant_id, key)
        if row is None:
            raise NotFound(f"no profile of {key.describe()}")
        return _info(row)

    async def _revisions(
        self, session: AsyncSession, tenant: TenantContext, key: ProfileKey
    ) -> list[RevisionInfo]:
        await self._read(session, tenant, key)
        return [
            RevisionInfo(**r) for r in await repository.revisions(session, tenant.tenant_id, key)
        ]

    async def _rollback(
        self,
        request: Request[Any, Any, Any],
        session: AsyncSession,
        tenant: TenantContext,
        key: ProfileKey,
        data: Rollback,
    ) -> ProfileInfo:
        rt = runtime(request)
        await service.rollback(
            session,
            tenant.tenant_id,
            key,
            data.version,
            rt.embedder,
            cause={"key_prefix": tenant.key_prefix},
            keep=rt.settings.cognitive.profile.revision_keep,
        )
        return await self._read(session, tenant, key)

    async def _replace(
        self,
        request: Request[Any, Any, Any],
        session: AsyncSession,
        tenant: TenantContext,
        key: ProfileKey,
        data: ProfileReplace,
    ) -> ProfileInfo:
        rt = runtime(request)
        current = await repository.get(session, tenant.tenant_id, key)
        expected = _if_match(request)
        if current is not None and expected is not None and expected != current["version"]:
            raise Conflict(f"the profile is at version {current['version']}, not {expected}")
        if current is None and expected not in (None, 0):
            raise Conflict("the profile does not exist yet (use If-Match: 0 or none)")
        service.check_personal(key, data.document, tenant.pii_policy)
        await service.save(
            session,
            tenant.tenant_id,
            data.document,
            key,
            rt.embedder,
            expected=current["version"] if current else None,
            replaced_by={"by": "api", "key_prefix": tenant.key_prefix},
            keep=rt.settings.cognitive.profile.revision_keep,
        )
        return await self._read(session, tenant, key)

    @get("/", dependencies=reads())
    async def list_profiles(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        group_id: str | None = Parameter(default=None, max_length=128),
        user_id: str | None = Parameter(default=None, max_length=128),
        limit: int = Parameter(default=100, ge=1, le=500),
    ) -> list[ProfileInfo]:
        """A conversation's profiles: a group's (``group_id``) with its members', or a person's."""
        scope_of(group_id, user_id)
        rows = await repository.of_conversation(
            session, tenant.tenant_id, group_id or None, user_id or None, limit
        )
        return [_info(r) for r in rows]

    @get("/member/{group_id:str}/{user_id:str}", responses=errors(404), dependencies=reads())
    async def get_member(
        self, tenant: TenantContext, session: AsyncSession, group_id: str, user_id: str
    ) -> ProfileInfo:
        """How one group knows one person."""
        return await self._read(session, tenant, service.key_of("member", user_id, group_id))

    @get(
        "/member/{group_id:str}/{user_id:str}/revisions",
        responses=errors(404),
        dependencies=reads(),
    )
    async def member_revisions(
        self, tenant: TenantContext, session: AsyncSession, group_id: str, user_id: str
    ) -> list[RevisionInfo]:
        """The kept previous texts, newest first."""
        return await self._revisions(session, tenant, service.key_of("member", user_id, group_id))

    @post(
        "/member/{group_id:str}/{user_id:str}/rollback", status_code=200, responses=errors(404, 409)
    )
    async def member_rollback(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        group_id: str,
        user_id: str,
        data: Rollback,
    ) -> ProfileInfo:
        """Make a kept revision current again."""
        key = service.key_of("member", user_id, group_id)
        return await self._rollback(request, session, tenant, key, data)

    @put("/member/{group_id:str}/{user_id:str}", responses=errors(409))
    async def member_replace(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        group_id: str,
        user_id: str,
        data: ProfileReplace,
    ) -> ProfileInfo:
        """Replace by hand (``If-Match: <version>`` for optimistic concurrency)."""
        key = service.key_of("member", user_id, group_id)
        return await self._replace(request, session, tenant, key, data)

    @get("/{entity_type:str}/{entity_id:str}", responses=errors(404), dependencies=reads())
    async def get_profile(
        self, tenant: TenantContext, session: AsyncSession, entity_type: str, entity_id: str
    ) -> ProfileInfo:
        """A user's or a group's profile."""
        return await self._read(session, tenant, _plain_key(entity_type, entity_id))

    @get(
        "/{entity_type:str}/{entity_id:str}/revisions",
        responses=errors(404),
        dependencies=reads(),
    )
    async def revisions(
        self, tenant: TenantContext, session: AsyncSession, entity_type: str, entity_id: str
    ) -> list[RevisionInfo]:
        """The kept previous texts, newest first."""
        return await self._revisions(session, tenant, _plain_key(entity_type, entity_id))

    @post(
        "/{entity_type:str}/{entity_id:str}/rollback", status_code=200, responses=errors(404, 409)
    )
    async def rollback(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        entity_type: str,
        entity_id: str,
        data: Rollback,
    ) -> ProfileInfo:
        """Make a kept revision current again."""
        key = _plain_key(entity_type, entity_id)
        return await self._rollback(request, session, tenant, key, data)

    @put("/{entity_type:str}/{entity_id:str}", responses=errors(409))
    async def replace(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        entity_type: str,
        entity_id: str,
        data: ProfileReplace,
    ) -> ProfileInfo:
        """Replace by hand (``If-Match: <version>`` for optimistic concurrency)."""
        key = _plain_key(entity_type, entity_id)
        return await self._replace(request, session, tenant, key, data)

    @post("/search", status_code=200, dependencies=reads())
    async def search(
        self,
        request: Request[Any, Any, Any],
        tenant: TenantContext,
        session: AsyncSession,
        data: ProfileSearch,
    ) -> list[ProfileHit]:
        """Profiles by meaning; member profiles only within the given group; with ``context``,
        only what that conversation may see (as ``cognitive_search_profiles``)."""
        vector = await runtime(request).embedder.query(data.query)
        rows = await service.search(
            session,
            tenant.tenant_id,
            data,
            vector,
            default_top_k=tenant.query.profile_top_k,
            allow_cross=tenant.query.allow_cross_group_tools,
        )
        return [ProfileHit(**{k: r[k] for k in ProfileHit.model_fields}) for r in rows]


def _plain_key(entity_type: str, entity_id: str) -> ProfileKey:
    if entity_type == "member":
        raise Invalid(
            "member profiles live at /v1/profiles/member/{group_id}/{user_id}", field="entity_type"
        )
    return service.key_of(entity_type, entity_id)


def _if_match(request: Request[Any, Any, Any]) -> int | None:
    value = request.headers.get("if-match")
    if value is None:
        return None
    value = value.strip().strip('"').removeprefix("W/").strip('"')
    if not value.isdigit():
        raise Invalid("If-Match carries the profile version, a number", field="If-Match")
    return int(value)
