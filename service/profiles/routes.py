"""``/v1/profiles``: read, revisions, rollback, operator replace, search."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, get, post, put
from litestar.params import Parameter
from sqlalchemy.ext.asyncio import AsyncSession

from service.embedding import Embedder
from service.errors import Invalid
from service.http import EmbedderDependency, errors, reads
from service.profiles import service
from service.profiles.document import ProfileKey
from service.profiles.schemas import (
    ProfileHit,
    ProfileInfo,
    ProfileReplace,
    ProfileSearch,
    RevisionInfo,
    Rollback,
)
from service.settings import Settings
from service.tenants.service import TenantContext

# A page of revisions, as the other lists page: ``limit``, and the last version seen as
# ``before`` for the next (a revision's text is up to 20,000 characters, and a tenant may keep
# a thousand of them).
RevisionLimit = Annotated[int, Parameter(ge=1, le=500)]
RevisionCursor = Annotated[
    int | None,
    Parameter(ge=1, le=2**31 - 1, description="a version: the revisions older than it"),
]


def _info(row: dict[str, Any]) -> ProfileInfo:
    return ProfileInfo(**{k: row[k] for k in ProfileInfo.model_fields})


class ProfileController(Controller):
    """Profiles of users, groups and members of groups."""

    path = "/v1/profiles"
    tags = ["profiles"]

    async def _read(
        self, session: AsyncSession, tenant: TenantContext, key: ProfileKey
    ) -> ProfileInfo:
        return _info(await service.get(session, tenant.tenant_id, key))

    async def _revisions(
        self,
        session: AsyncSession,
        tenant: TenantContext,
        key: ProfileKey,
        limit: int,
        before: int | None,
    ) -> list[RevisionInfo]:
        rows = await service.revisions(session, tenant.tenant_id, key, limit, before)
        return [RevisionInfo(**r) for r in rows]

    async def _rollback(
        self,
        session: AsyncSession,
        tenant: TenantContext,
        embedder: Embedder,
        settings: Settings,
        key: ProfileKey,
        data: Rollback,
    ) -> ProfileInfo:
        await service.rollback(
            session,
            tenant.tenant_id,
            key,
            data.version,
            embedder,
            cause={"key_prefix": tenant.key_prefix},
            keep=settings.cognitive.profile.revision_keep,
        )
        return await self._read(session, tenant, key)

    async def _replace(
        self,
        session: AsyncSession,
        tenant: TenantContext,
        embedder: Embedder,
        settings: Settings,
        key: ProfileKey,
        data: ProfileReplace,
        if_match: str | None,
    ) -> ProfileInfo:
        await service.replace_by_hand(
            session,
            tenant,
            key,
            data.document,
            embedder,
            expected=_if_match(if_match),
            keep=settings.cognitive.profile.revision_keep,
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
        rows = await service.of_conversation(session, tenant.tenant_id, group_id, user_id, limit)
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
        self,
        tenant: TenantContext,
        session: AsyncSession,
        group_id: str,
        user_id: str,
        limit: RevisionLimit = 50,
        before: RevisionCursor = None,
    ) -> list[RevisionInfo]:
        """The kept previous texts, newest first (``before``: a version, for the next page)."""
        key = service.key_of("member", user_id, group_id)
        return await self._revisions(session, tenant, key, limit, before)

    @post(
        "/member/{group_id:str}/{user_id:str}/rollback", status_code=200, responses=errors(404, 409)
    )
    async def member_rollback(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        embedder: EmbedderDependency,
        settings: Settings,
        group_id: str,
        user_id: str,
        data: Rollback,
    ) -> ProfileInfo:
        """Make a kept revision current again."""
        key = service.key_of("member", user_id, group_id)
        return await self._rollback(session, tenant, embedder, settings, key, data)

    @put("/member/{group_id:str}/{user_id:str}", responses=errors(409))
    async def member_replace(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        embedder: EmbedderDependency,
        settings: Settings,
        group_id: str,
        user_id: str,
        data: ProfileReplace,
        request: Request[Any, Any, Any],
    ) -> ProfileInfo:
        """Replace by hand (``If-Match: <version>`` for optimistic concurrency)."""
        key = service.key_of("member", user_id, group_id)
        if_match = request.headers.get("if-match")
        return await self._replace(session, tenant, embedder, settings, key, data, if_match)

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
        self,
        tenant: TenantContext,
        session: AsyncSession,
        entity_type: str,
        entity_id: str,
        limit: RevisionLimit = 50,
        before: RevisionCursor = None,
    ) -> list[RevisionInfo]:
        """The kept previous texts, newest first (``before``: a version, for the next page)."""
        key = _plain_key(entity_type, entity_id)
        return await self._revisions(session, tenant, key, limit, before)

    @post(
        "/{entity_type:str}/{entity_id:str}/rollback", status_code=200, responses=errors(404, 409)
    )
    async def rollback(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        embedder: EmbedderDependency,
        settings: Settings,
        entity_type: str,
        entity_id: str,
        data: Rollback,
    ) -> ProfileInfo:
        """Make a kept revision current again."""
        key = _plain_key(entity_type, entity_id)
        return await self._rollback(session, tenant, embedder, settings, key, data)

    @put("/{entity_type:str}/{entity_id:str}", responses=errors(409))
    async def replace(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        embedder: EmbedderDependency,
        settings: Settings,
        entity_type: str,
        entity_id: str,
        data: ProfileReplace,
        request: Request[Any, Any, Any],
    ) -> ProfileInfo:
        """Replace by hand (``If-Match: <version>`` for optimistic concurrency)."""
        key = _plain_key(entity_type, entity_id)
        if_match = request.headers.get("if-match")
        return await self._replace(session, tenant, embedder, settings, key, data, if_match)

    @post("/search", status_code=200, dependencies=reads())
    async def search(
        self,
        tenant: TenantContext,
        session: AsyncSession,
        embedder: EmbedderDependency,
        data: ProfileSearch,
    ) -> list[ProfileHit]:
        """Profiles by meaning; member profiles only within the given group; with ``context``,
        only what that conversation may see (as ``cognitive_search_profiles``)."""
        vector = await embedder.query(data.query)
        q = tenant.for_bot(data.context.bot_id if data.context else None).query
        rows = await service.search(
            session,
            tenant.tenant_id,
            data,
            vector,
            default_top_k=q.profile_top_k,
            allow_cross=q.allow_cross_group_tools,
            calibration=embedder.calibration,
            lexical_weight=q.lexical_weight,
        )
        return [
            ProfileHit(
                **{**{k: r[k] for k in ProfileHit.model_fields}, "score": round(r["relevance"], 4)}
            )
            for r in rows
        ]


def _plain_key(entity_type: str, entity_id: str) -> ProfileKey:
    if entity_type == "member":
        raise Invalid(
            "member profiles live at /v1/profiles/member/{group_id}/{user_id}", field="entity_type"
        )
    return service.key_of(entity_type, entity_id)


def _if_match(value: str | None) -> int | None:
    if value is None:
        return None
    value = value.strip().strip('"').removeprefix("W/").strip('"')
    # ASCII digits only ("²" is a digit to str.isdigit, not to int), no more than a version
    # (an int4) holds.
    if not (value.isascii() and value.isdigit() and len(value) <= 10):
        raise Invalid("If-Match carries the profile version, a number", field="If-Match")
    return int(value)
