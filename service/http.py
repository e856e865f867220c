"""HTTP plumbing shared by every route: request ids, JSON error bodies, common dependencies.

What a route needs of the process (the database, settings, providers) comes in by Litestar's
dependency injection under these names, provided by ``service.app``: ``db``, ``settings``,
``embedder``, ``reranker``, ``auth``, ``limiter``, ``tenant_limiter``, ``failed_auth``,
``readiness``.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from litestar import Litestar, Request, Response
from litestar.di import Provide
from litestar.enums import ScopeType
from litestar.exceptions import HTTPException, InternalServerException, ValidationException
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import ResponseSpec
from litestar.params import Dependency, Parameter
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send
from pydantic import BaseModel
from pydantic import ValidationError as ModelValidationError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeout
from sqlalchemy.ext.asyncio import AsyncSession

from service.audit.service import FailedAuthentications, client_address
from service.context import check_json
from service.db.engine import Database, translate_db_error
from service.db.types import BIGINT_MAX
from service.embedding import Embedder
from service.errors import (
    BadRequest,
    Invalid,
    MemoriaError,
    TooManyRequests,
    Unauthorized,
    Unavailable,
    field_of,
)
from service.guard import RateLimiter, admit
from service.llm.rerank import Reranker
from service.settings import Settings
from service.tenants.service import (
    ACTING_TENANT_HEADER,
    ADMIN_ACTOR,
    Authenticator,
    TenantContext,
    check_admin_token,
)

log = logging.getLogger("service.http")

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

# A row id in a path: a bigint, so a larger number is refused by name rather than by the driver.
RowId = Annotated[int, Parameter(ge=1, le=BIGINT_MAX)]


# The process's readiness: database reachable and migrations at head (200), with a detail.
Readiness = Callable[[], Awaitable[tuple[bool, str]]]

# The providers are protocols, which cannot be checked at run time: injected as they are.
EmbedderDependency = Annotated[Embedder, Dependency(skip_validation=True)]
RerankerDependency = Annotated[Reranker | None, Dependency(skip_validation=True)]


def request_id_middleware(app: ASGIApp) -> ASGIApp:
    """Give every request an id (the client's ``X-Request-ID`` if sane) and echo it back."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        given = ""
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                given = value.decode("latin-1")
                break
        request_id = given if _REQUEST_ID_RE.match(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, send_with_id)

    return middleware


def body_drain_middleware(limit: int) -> Callable[[ASGIApp], ASGIApp]:
    """An ASGI wrapper factory: before an error answer, read and discard what is left of the
    request's body.

    An oversized body is refused (413) without being read, as a refused key (401) is; a client
    that sends its whole body before reading the answer (Python's ``urllib``, ``curl -d @file``)
    would then write into a connection the server has given up on and see a broken pipe instead
    of the answer. Up to ``8 × limit`` bytes (at least 8 MiB) are drained first; beyond that the
    connection is dropped, as a body that large is no honest mistake.
    """
    cap = max(8 * limit, 8 * 2**20)

    def wrap(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP:
                await app(scope, receive, send)
                return
            ended = False

            def last(message: ReceiveMessage) -> bool:
                return message["type"] == "http.disconnect" or not message.get("more_body", False)

            async def tracked_receive() -> ReceiveMessage:
                nonlocal ended
                message = await receive()
                ended = ended or last(message)
                return message

            async def draining_send(message: Message) -> None:
                nonlocal ended
                if message["type"] == "http.response.start" and int(message["status"]) >= 400:
                    drained = 0
                    while not ended and drained <= cap:
                        rest = await receive()
                        body = rest.get("body", b"")
                        drained += len(body) if isinstance(body, bytes) else 0
                        ended = last(rest)
                await send(message)

            await app(scope, tracked_receive, draining_send)

        return middleware

    return wrap


class MemoriaRequest(Request[Any, Any, Any]):
    """A request whose JSON body is decodable, not too deep, and free of NUL characters.

    PostgreSQL text cannot hold NUL, so a NUL anywhere in a body is refused naming its field
    rather than half-stored or failing in the database.
    """

    async def json(self) -> Any:
        """The decoded body; 400 when it is not UTF-8 JSON, 422 naming a refused value."""
        try:
            value = await super().json()
        except UnicodeDecodeError:
            raise BadRequest("the body is not valid UTF-8", field="body") from None
        except RecursionError:
            raise BadRequest("the body is nested too deeply", field="body") from None
        check_json(value)
        return value


async def refuse_nul_parameters(request: Request[Any, Any, Any]) -> None:
    """Refuse a NUL character in a query or path parameter, naming the parameter."""
    for name, value in [*request.query_params.multi_items(), *request.path_params.items()]:
        if isinstance(value, str) and "\x00" in value:
            raise Invalid("text must not contain NUL characters", field=name)


def _request_id(request: Request[Any, Any, Any]) -> str:
    # Routing errors (404, 405) happen before the route's middleware ran: make an id here.
    state = request.scope.setdefault("state", {})
    if "request_id" not in state:
        state["request_id"] = uuid.uuid4().hex
        state["request_id_unsent"] = True
    return str(state["request_id"])


class FieldProblem(BaseModel):
    """One invalid value of a request."""

    field: str
    message: str | None


class ErrorBody(BaseModel):
    """The body of every error answer."""

    request_id: str
    status: int
    error: str
    message: str
    field: str | None = None
    errors: list[FieldProblem] | None = None


_ERROR_MEANINGS = {
    400: "the request cannot be parsed (e.g. the body is not JSON)",
    401: "missing, wrong or revoked credentials",
    403: "not allowed for this caller",
    404: "no such thing in this tenant",
    409: "conflicts with the current state",
    413: "the body is over the size limit",
    422: "a value is invalid; field names it",
    429: "too busy; retry after Retry-After seconds",
    503: "the database is unavailable; retry after Retry-After seconds",
}


def errors(*codes: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error answers of a route, all with the one error body."""
    return {
        code: ResponseSpec(
            data_container=ErrorBody, description=_ERROR_MEANINGS[code], generate_examples=False
        )
        for code in sorted(codes)
    }


def document_errors(app: Litestar) -> None:
    """Add the error answers routes share to the document; a route declares its own others.

    Every authenticated route answers 401 and may meet a busy or unreachable database; a
    route with input may refuse it (400, 422), a route with a body also for its size (413).
    """
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            if not isinstance(handler, HTTPRouteHandler):
                continue
            dependencies = handler.resolve_dependencies()
            if not {"tenant", "admin"} & dependencies.keys():
                continue
            codes = {401, 429, 503}
            inputs = handler.parsed_fn_signature.parameters.keys() - dependencies.keys()
            if inputs - {"request", "self"}:
                codes |= {400, 422}
            if "data" in inputs:
                codes.add(413)
            handler.responses = {**errors(*codes), **(handler.responses or {})}


def error_response(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    """The one exception handler: every error becomes a JSON body with status and message."""
    # An error raised while the request's transaction closes (a translated database error)
    # reaches here wrapped by Litestar's dependency cleanup.
    while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, InternalServerException):
        exc = _refused_body(exc) or exc
    if isinstance(exc, SQLAlchemyTimeout):
        exc = Unavailable("the database is busy (no free connection); retry shortly")
    if isinstance(exc, DBAPIError | OSError) and not isinstance(exc, MemoriaError):
        translated = (
            translate_db_error(exc)
            if isinstance(exc, DBAPIError)
            else Unavailable("the database is unreachable; retry shortly")
        )
        if isinstance(translated, MemoriaError):
            exc = translated
    request_id = _request_id(request)
    body: dict[str, Any] = {"request_id": request_id}
    headers: dict[str, str] = {}
    if isinstance(exc, MemoriaError):
        status = exc.status_code
        body.update(status=status, error=exc.code, message=exc.message)
        if exc.field:
            body["field"] = exc.field
        if isinstance(exc, TooManyRequests | Unavailable):
            headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    elif isinstance(exc, ValidationException):
        status = 422
        body.update(status=status, error="invalid")
        problems = exc.extra if isinstance(exc.extra, list) else []
        if problems and isinstance(problems[0], dict):
            first = problems[0]
            body["field"] = _field_name(first.get("key"))
            body["message"] = f"{body['field']}: {first.get('message', 'invalid value')}"
            body["errors"] = [
                {"field": _field_name(p.get("key")), "message": p.get("message")}
                for p in problems
                if isinstance(p, dict)
            ]
        else:
            body["message"] = str(exc.detail)
            if "JSON" in str(exc.detail) or "decode" in str(exc.detail).lower():
                status = body["status"] = 400
                body["error"] = "bad_request"
    elif isinstance(exc, HTTPException):
        status = exc.status_code
        body.update(status=status, error=_http_code(status), message=str(exc.detail))
        if status == 413:
            body.update(field="body", message=_too_large(request))
        if status == 404 and b"%2f" in bytes(request.scope.get("raw_path") or b"").lower():
            # The router sees the decoded path, where an id's slash splits the id.
            body.update(field="path", message="no such route: ids cannot contain '/' (%2F)")
        if exc.headers:
            headers.update(exc.headers)
    else:
        status = 500
        body.update(
            status=500,
            error="internal_error",
            message=f"internal error; quote request id {request_id} when reporting it",
        )
    # A server error is logged whatever raised it: an unexpected exception, a MemoriaError
    # of status 500 or an HTTPException of 5xx. Not a database that is busy or down: that
    # 503 says so to the client, who retries, and would bury the log in an outage.
    if status >= 500 and not isinstance(exc, Unavailable):
        log.error("unhandled error, answered %d (request_id=%s)", status, request_id, exc_info=exc)
    if request.scope["state"].get("request_id_unsent"):
        headers["X-Request-ID"] = request_id
    return Response(content=body, status_code=status, headers=headers)


def _refused_body(exc: InternalServerException) -> ValidationException | None:
    """The body's refusal that Litestar took for a server error, if that is what ``exc`` is.

    Litestar reports a body's invalid field under the field's own name (``tenant``, not
    ``data.tenant``) and counts a name it also provides to the routes (``tenant``,
    ``session``, ``settings``, ``db``) as its own failure: a bot's stray ``"session": …``
    answered 500. Routes are given their dependencies as made, so a model's validation error
    under the signature can only be the body's.
    """
    cause = exc.__cause__
    while cause is not None and not isinstance(cause, ModelValidationError):
        cause = cause.__cause__
    if cause is None:
        return None
    problems = [
        {"key": field_of(error), "message": error["msg"]}
        for error in cause.errors(include_input=False)
    ]
    return ValidationException(detail="the body is invalid", extra=problems)


def _too_large(request: Request[Any, Any, Any]) -> str:
    settings: Settings = request.app.state.settings
    limit = settings.max_body_bytes
    size = request.headers.get("content-length", "")
    sent = f" of {int(size):,} bytes" if size.isdigit() else ""
    return (
        f"the body{sent} is over the limit of {limit:,} bytes ({limit / 2**20:.3g} MiB);"
        " send less at a time (e.g. fewer messages a batch)"
    )


def _field_name(key: Any) -> str:
    text = str(key or "body")
    return text.removeprefix("data.") if text != "data" else "body"


def _http_code(status: int) -> str:
    return {
        400: "bad_request",
        401: "unauthorized",
        403: "forbidden",
        404: "not_found",
        405: "method_not_allowed",
        413: "payload_too_large",
        429: "too_many_requests",
    }.get(status, "error")


async def provide_tenant(
    request: Request[Any, Any, Any],
    auth: Authenticator,
    limiter: RateLimiter,
    tenant_limiter: RateLimiter,
    failed_auth: FailedAuthentications,
) -> TenantContext:
    """The caller's tenant: ``Authorization: Bearer <key>``, or the admin token with the
    tenant named in ``X-Memoria-Tenant``."""
    authorization = request.headers.get("authorization")
    acting = request.headers.get(ACTING_TENANT_HEADER)
    state = request.scope.setdefault("state", {})
    client = client_address(request.scope)
    try:
        if acting is not None:
            context = await auth.acting_admin(authorization, acting)
        else:
            context = await auth.authenticate(authorization)
    except Unauthorized:
        failed_auth.failed(client)
        raise
    # The audit trail's actor: the identity that was checked, never a header's text.
    state["actor"] = ADMIN_ACTOR if acting is not None else context.key_prefix
    state["tenant_id"] = str(context.tenant_id)
    # Each key has its rate, and the tenant one for all its keys (up to max_keys_per_tenant).
    tenant = str(context.tenant_id)
    admit((limiter, context.key_prefix or tenant), (tenant_limiter, tenant))
    return context


async def provide_session(tenant: TenantContext, db: Database) -> AsyncIterator[AsyncSession]:
    """The request's one transaction, confined to the caller's tenant; commits on success."""
    async with db.tenant(tenant.tenant_id, durable=not tenant.fast_ack) as session:
        yield session


async def provide_read_session(
    tenant: TenantContext, read_db: Database
) -> AsyncIterator[AsyncSession]:
    """A read route's transaction: read-only, on the read replica when one is configured
    (``MEMORIA_READ_DATABASE_URL``), confined to the caller's tenant as ``provide_session`` is.

    A replica lags the primary by its replication delay, so a route that must see a write of
    its own request, or one the client just made and reads back by id, keeps ``session``.
    """
    async with read_db.tenant(tenant.tenant_id, read_only=True) as session:
        yield session


def reads() -> dict[str, Provide]:
    """A read route's dependencies: its ``session`` is ``provide_read_session``'s."""
    return {"session": Provide(provide_read_session)}


async def provide_admin(
    request: Request[Any, Any, Any], settings: Settings, failed_auth: FailedAuthentications
) -> None:
    """Admit only the admin token."""
    client = client_address(request.scope)
    try:
        check_admin_token(request.headers.get("authorization"), settings)
    except Unauthorized:
        failed_auth.failed(client)
        raise
    request.scope.setdefault("state", {})["actor"] = ADMIN_ACTOR


async def provide_system_session(admin: None, db: Database) -> AsyncIterator[AsyncSession]:
    """A transaction as the owning role (admin routes only), opened once the token passed.

    Depending on ``admin`` orders the two: unordered, Litestar resolves them side by side, and
    a refused token cancelled a transaction half-opened, whose abandoned context managers the
    event loop later failed to close ("aclose(): asynchronous generator is already running").
    """
    async with db.system() as session:
        yield session
