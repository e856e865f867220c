"""Python clients of the Memoria HTTP API: ``MemoriaClient`` (async) and ``SyncMemoriaClient``.

Both have the same methods, one per ``/v1`` route, typed with the API's own pydantic models::

    async with MemoriaClient("http://127.0.0.1:8080", api_key="mk_…") as memoria:
        context = await memoria.context(conversation, message="明天提醒我开会")
        ...
        await memoria.end(conversation, memo="约好了明天的提醒")

Request methods take the request model, a mapping of its fields, or keyword fields (merged
over the first two), so one conversation dict serves ``context``, ``end`` and ``tool_call``.
An error answer raises ``MemoriaAPIError``; 429 and 503 are retried with exponential backoff
and jitter, honouring ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, Self, TypeVar, overload
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from service.context import ConversationContext
from service.ends.schemas import EndAccepted, EndRequest, MemoInfo
from service.events.schemas import EventInfo, EventPage
from service.memories.schemas import (
    ForgetRequest,
    ForgetResult,
    HistoryEntry,
    MemoryCreate,
    MemoryCreated,
    MemoryHit,
    MemoryInfo,
    MemoryPatch,
    MemorySearch,
)
from service.messages.schemas import (
    MessageBatch,
    MessageSearch,
    MessageSearchResult,
    MessagesStored,
)
from service.profiles.schemas import ProfileHit, ProfileInfo, ProfileSearch, RevisionInfo
from service.queue.schemas import JobInfo, JobPage
from service.recall.schemas import (
    ContextRequest,
    ContextResponse,
    EventSearch,
    EventSearchResult,
    Persona,
    ToolResult,
)
from service.tenants.schemas import CreatedKey, EffectiveSettings, KeyInfo, SettingsUpdate
from service.todos.schemas import TodoInfo, TodoPatch

__all__ = ["MemoriaAPIError", "MemoriaClient", "SyncMemoriaClient"]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
P = ParamSpec("P")

USER_AGENT = "memoria-client/0.1"
RETRY_STATUSES = frozenset({429, 503})
# Errors that a model can act on (wrong arguments, unknown tool, not allowed): ``tool_call``
# hands them back as the tool's content instead of raising.
MODEL_ERRORS = frozenset({400, 403, 404, 409, 422})


class MemoriaAPIError(Exception):
    """An error answer of the API: its status, error code, message, offending field, request id."""

    def __init__(
        self,
        status: int,
        error: str,
        message: str,
        field: str | None = None,
        request_id: str | None = None,
        *,
        retry_after: float | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(f"{status} {error}: {message}" + (f" (field {field})" if field else ""))
        self.status = status
        self.error = error
        self.message = message
        self.field = field
        self.request_id = request_id
        self.retry_after = retry_after
        self.body = body

    @classmethod
    def from_response(cls, response: httpx.Response) -> MemoriaAPIError:
        """The error an answer carries (JSON error body, or whatever a proxy sent)."""
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        request_id = response.headers.get("x-request-id")
        retry_after = retry_after_seconds(response.headers.get("retry-after"))
        if isinstance(body, dict) and "error" in body:
            return cls(
                response.status_code,
                str(body["error"]),
                str(body.get("message") or body["error"]),
                body.get("field"),
                body.get("request_id") or request_id,
                retry_after=retry_after,
                body=body,
            )
        text = response.text.strip()[:500] or response.reason_phrase
        return cls(
            response.status_code,
            f"http_{response.status_code}",
            text,
            None,
            request_id,
            retry_after=retry_after,
            body=body,
        )

    @classmethod
    def invalid(cls, field: str, message: str, errors: list[dict[str, Any]] | None = None) -> Self:
        """A bad argument, refused here before anything is sent: the 422 the service would give
        (``request_id`` is None, as no request was made)."""
        body = {"status": 422, "error": "invalid", "message": message, "field": field}
        if errors:
            body["errors"] = errors
        return cls(422, "invalid", message, field, None, body=body)

    def as_tool_content(self) -> str:
        """The error as a tool message, so the model can correct its call."""
        detail = {"error": self.error, "message": self.message}
        if self.field:
            detail["field"] = self.field
        return json.dumps(detail, ensure_ascii=False)


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - datetime.now(UTC)).total_seconds())


class BinaryWriter(Protocol):
    """Where an export is streamed: an open binary file, ``io.BytesIO()``, a socket file…"""

    def write(self, data: bytes, /) -> object: ...


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request, described independently of how (async or sync) it is sent."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    body: Any = None
    headers: dict[str, str] | None = None
    sink: BinaryWriter | None = None  # stream the answer's bytes here instead of parsing
    recover: Callable[[MemoriaAPIError], T] | None = None  # an error turned into a result


class route(Generic[P, T]):
    """A route defined once in ``_Routes`` and run by either client.

    Read from a ``MemoriaClient`` it is a coroutine method; from a ``SyncMemoriaClient`` a plain
    one, with the same parameters and docstring.
    """

    def __init__(self, build: Callable[Concatenate[Any, P], Call[T]]) -> None:
        self._build = build
        self.__doc__ = build.__doc__
        self.__wrapped__ = build

    @overload
    def __get__(self, client: None, owner: type[Any]) -> route[P, T]: ...
    @overload
    def __get__(self, client: MemoriaClient, owner: type[Any]) -> Callable[P, Awaitable[T]]: ...
    @overload
    def __get__(self, client: SyncMemoriaClient, owner: type[Any]) -> Callable[P, T]: ...

    def __get__(self, client: Any, owner: type[Any]) -> Any:
        if client is None:
            return self
        build = self._build

        @functools.wraps(build)
        def bound(*args: P.args, **kwargs: P.kwargs) -> Any:
            return client._run(build(client, *args, **kwargs))

        # inspect.signature() then shows the route's parameters without ``self``.
        bound.__wrapped__ = build.__get__(client)
        return bound


def _request(
    model: type[M], request: BaseModel | Mapping[str, Any] | None, fields: Mapping[str, Any]
) -> M:
    """The request model from a model, a mapping and/or keyword fields (the latter win)."""
    if isinstance(request, model) and not fields:
        return request
    data: dict[str, Any] = {}
    if isinstance(request, BaseModel):
        # Another model (a turn's ContextRequest passed to ``end``) gives what they share: the
        # service refuses fields it does not know.
        dumped = request.model_dump(exclude_unset=True)
        data.update(dumped if isinstance(request, model) else _known(model, dumped))
    elif request is not None:
        data.update(request)
    data.update(fields)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _refused(model, exc) from None


def _refused(model: type[BaseModel], exc: ValidationError) -> MemoriaAPIError:
    """A request model's validation error as the service's 422, naming the first bad field."""
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        message = str(error["msg"]).removeprefix("Value error, ")
        field = ".".join(str(part) for part in error["loc"])
        if not field:
            # A rule across fields ("group_id is required when …") names its field first.
            first_word = message.split(" ", 1)[0]
            field = first_word if first_word in model.model_fields else "body"
        problems.append({"field": field, "message": message})
    first = problems[0] if problems else {"field": "body", "message": str(exc)}
    field, message = first["field"], first["message"]
    said = message if message.startswith(field) else f"{field}: {message}"
    return MemoriaAPIError.invalid(field, said, problems)


def _known(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    names = set(model.model_fields)
    names |= {f.alias for f in model.model_fields.values() if f.alias}
    return {k: v for k, v in data.items() if k in names}


def _json(model: BaseModel, *keep: str) -> dict[str, Any]:
    """The fields the caller set (a PATCH must not send the others), plus ``keep``."""
    body = model.model_dump(mode="json", exclude_unset=True)
    for name in keep:
        body[name] = getattr(model, name)
    return body


def _one(model: type[M]) -> Callable[[httpx.Response], M]:
    return lambda response: model.model_validate_json(response.content)


def _many(model: type[M]) -> Callable[[httpx.Response], list[M]]:
    adapter = TypeAdapter(list[model])  # type: ignore[valid-type]
    return lambda response: list(adapter.validate_json(response.content))


def _dict(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    return dict(body) if isinstance(body, dict) else {"result": body}


def _nothing(response: httpx.Response) -> None:
    return None


def _query(**values: Any) -> dict[str, Any]:
    """Query parameters, without the unset ones (booleans as the API spells them)."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, datetime):
            value = value.isoformat()
        out[name] = value
    return out


def _row_id(value: object, field: str) -> int:
    """A row id argument as the integer the path needs (a bad one refused like the service)."""
    try:
        number: int = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise MemoriaAPIError.invalid(field, f"{field}: not an integer id: {value!r}") from None
    if number < 1:
        raise MemoriaAPIError.invalid(field, f"{field}: ids start at 1")
    return number


def _seg(value: object) -> str:
    """One path segment, escaped (ids are the bot's, and may hold anything)."""
    return quote(str(value), safe="")


def _profile_path(entity_type: str, entity_id: str, group_id: str | None) -> str:
    if entity_type == "member":
        if not group_id:
            raise MemoriaAPIError.invalid("group_id", "group_id: a member profile needs group_id")
        return f"/v1/profiles/member/{_seg(group_id)}/{_seg(entity_id)}"
    return f"/v1/profiles/{_seg(entity_type)}/{_seg(entity_id)}"


def _context_dict(context: BaseModel | Mapping[str, Any] | None) -> dict[str, Any] | None:
    if context is None:
        return None
    if isinstance(context, BaseModel):
        return context.model_dump(mode="json", exclude_none=True)
    return dict(context)


def _arguments(value: Any) -> Any:
    """A tool call's arguments as sent: the model's JSON text as is (the service parses and
    judges it), a mapping as a dict."""
    if value is None:
        return {}
    return dict(value) if isinstance(value, Mapping) else value


def _tool_call_parts(tool_call: Any) -> tuple[str, Any]:
    """(name, arguments) of an OpenAI tool call: an SDK object or a dict of the same shape."""
    function = tool_call.get("function") if isinstance(tool_call, Mapping) else None
    if function is None and not isinstance(tool_call, Mapping):
        function = getattr(tool_call, "function", None)
    if function is None:  # a Responses API function_call item names them directly
        function = tool_call
    if isinstance(function, Mapping):
        name, arguments = function.get("name"), function.get("arguments")
    else:
        name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
    if not name:
        raise MemoriaAPIError.invalid("tool_call", "not a tool call: no function name")
    return str(name), arguments


def _tool_content(response: httpx.Response) -> str:
    return ToolResult.model_validate_json(response.content).content


class _Routes:
    """Every ``/v1`` route, once; ``MemoriaClient`` and ``SyncMemoriaClient`` send them."""

    # -- the write path -------------------------------------------------------------------

    @route
    def end(
        self,
        request: EndRequest | BaseModel | Mapping[str, Any] | None = None,
        /,
        **fields: Any,
    ) -> Call[EndAccepted]:
        """Hand over the turn: what the bot did (``memo``) and learned (``observations``)."""
        body = _request(EndRequest, request, fields)
        # The request id goes out even when generated here: a retried call is then a duplicate
        # the service recognizes, not a second job.
        return Call("POST", "/v1/end", _one(EndAccepted), body=_json(body, "request_id"))

    @route
    def memos(
        self, *, group_id: str | None = None, user_id: str | None = None, limit: int | None = None
    ) -> Call[list[MemoInfo]]:
        """A conversation's memo log, newest first."""
        params = _query(group_id=group_id, user_id=user_id, limit=limit)
        return Call("GET", "/v1/memos", _many(MemoInfo), params=params)

    @route
    def store_messages(
        self, batch: MessageBatch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[MessagesStored]:
        """Archive a batch of raw chat messages (duplicates are ignored)."""
        body = _json(_request(MessageBatch, batch, fields))
        return Call("POST", "/v1/messages", _one(MessagesStored), body=body)

    @route
    def search_messages(
        self, search: MessageSearch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[MessageSearchResult]:
        """One conversation's archived messages nearest in meaning to ``query``."""
        body = _json(_request(MessageSearch, search, fields))
        return Call("POST", "/v1/messages/search", _one(MessageSearchResult), body=body)

    # -- events and the read path ---------------------------------------------------------

    @route
    def list_events(
        self,
        *,
        group_id: str | None = None,
        user_id: str | None = None,
        limit: int | None = None,
        before: str | datetime | None = None,
    ) -> Call[EventPage]:
        """A conversation's events, newest first (``before``: a time or ``next_before``)."""
        params = _query(group_id=group_id, user_id=user_id, limit=limit, before=before)
        return Call("GET", "/v1/events", _one(EventPage), params=params)

    @route
    def get_event(self, event_id: str) -> Call[EventInfo]:
        """One event."""
        return Call("GET", f"/v1/events/{_seg(event_id)}", _one(EventInfo))

    @route
    def search_events(
        self, search: EventSearch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[EventSearchResult]:
        """Events by meaning and time (``cognitive.search_events``)."""
        body = _json(_request(EventSearch, search, fields))
        return Call("POST", "/v1/events/search", _one(EventSearchResult), body=body)

    @route
    def context(
        self,
        request: ContextRequest | BaseModel | Mapping[str, Any] | None = None,
        /,
        **fields: Any,
    ) -> Call[ContextResponse]:
        """The memory context to inject this turn, with its ready ``prompt`` block."""
        body = _json(_request(ContextRequest, request, fields))
        return Call("POST", "/v1/context", _one(ContextResponse), body=body)

    # -- profiles -------------------------------------------------------------------------

    @route
    def get_profile(
        self, entity_type: str, entity_id: str, *, group_id: str | None = None
    ) -> Call[ProfileInfo]:
        """A ``user``'s or ``group``'s profile, or a ``member``'s (with ``group_id``)."""
        return Call("GET", _profile_path(entity_type, entity_id, group_id), _one(ProfileInfo))

    @route
    def profile_revisions(
        self, entity_type: str, entity_id: str, *, group_id: str | None = None
    ) -> Call[list[RevisionInfo]]:
        """A profile's kept previous texts, newest first."""
        path = _profile_path(entity_type, entity_id, group_id) + "/revisions"
        return Call("GET", path, _many(RevisionInfo))

    @route
    def rollback_profile(
        self, entity_type: str, entity_id: str, version: int, *, group_id: str | None = None
    ) -> Call[ProfileInfo]:
        """Make a kept revision of a profile current again."""
        path = _profile_path(entity_type, entity_id, group_id) + "/rollback"
        return Call("POST", path, _one(ProfileInfo), body={"version": version})

    @route
    def put_profile(
        self,
        entity_type: str,
        entity_id: str,
        document: str,
        *,
        group_id: str | None = None,
        if_match: int | None = None,
    ) -> Call[ProfileInfo]:
        """Replace a profile's document (``if_match``: the version it must still be at)."""
        headers = {"If-Match": str(if_match)} if if_match is not None else None
        path = _profile_path(entity_type, entity_id, group_id)
        return Call("PUT", path, _one(ProfileInfo), body={"document": document}, headers=headers)

    @route
    def search_profiles(
        self, search: ProfileSearch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[list[ProfileHit]]:
        """Profiles by meaning (member profiles only within ``group_id``)."""
        body = _json(_request(ProfileSearch, search, fields))
        return Call("POST", "/v1/profiles/search", _many(ProfileHit), body=body)

    # -- memories -------------------------------------------------------------------------

    @route
    def list_memories(
        self,
        *,
        scope: str | None = None,
        user_id: str | None = None,
        group_id: str | None = None,
        category: str | None = None,
        active: bool | None = None,
        limit: int | None = None,
        before: int | None = None,
    ) -> Call[list[MemoryInfo]]:
        """Memories by exact filters, newest first (``before``: an id, for the next page)."""
        params = _query(
            scope=scope,
            user_id=user_id,
            group_id=group_id,
            category=category,
            active=active,
            limit=limit,
            before=before,
        )
        return Call("GET", "/v1/memories", _many(MemoryInfo), params=params)

    @route
    def add_memory(
        self, memory: MemoryCreate | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[MemoryCreated]:
        """Add a memory; an active duplicate in the same scope comes back with ``duplicate``."""
        body = _json(_request(MemoryCreate, memory, fields))
        return Call("POST", "/v1/memories", _one(MemoryCreated), body=body)

    @route
    def get_memory(self, memory_id: int) -> Call[MemoryInfo]:
        """One memory."""
        return Call("GET", f"/v1/memories/{_row_id(memory_id, 'memory_id')}", _one(MemoryInfo))

    @route
    def update_memory(
        self, memory_id: int, patch: MemoryPatch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[MemoryInfo]:
        """Change a memory; the old content stays in its history."""
        body = _json(_request(MemoryPatch, patch, fields))
        return Call(
            "PATCH", f"/v1/memories/{_row_id(memory_id, 'memory_id')}", _one(MemoryInfo), body=body
        )

    @route
    def delete_memory(self, memory_id: int) -> Call[None]:
        """Delete a memory for real (its history keeps only that it was deleted)."""
        return Call("DELETE", f"/v1/memories/{_row_id(memory_id, 'memory_id')}", _nothing)

    @route
    def memory_history(self, memory_id: int) -> Call[list[HistoryEntry]]:
        """Every change of a memory, oldest first."""
        return Call(
            "GET", f"/v1/memories/{_row_id(memory_id, 'memory_id')}/history", _many(HistoryEntry)
        )

    @route
    def search_memories(
        self, search: MemorySearch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[list[MemoryHit]]:
        """Memories nearest in meaning, only within the conversation's scopes."""
        body = _json(_request(MemorySearch, search, fields))
        return Call("POST", "/v1/memories/search", _many(MemoryHit), body=body)

    @route
    def forget_memories(
        self, forget: ForgetRequest | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[ForgetResult]:
        """Forget by ids, category or query: deactivate (default) or delete."""
        body = _json(_request(ForgetRequest, forget, fields))
        return Call("POST", "/v1/memories/forget", _one(ForgetResult), body=body)

    # -- todos ----------------------------------------------------------------------------

    @route
    def list_todos(
        self,
        *,
        status: str | None = None,
        group_id: str | None = None,
        user_id: str | None = None,
        due_before: datetime | None = None,
        limit: int | None = None,
    ) -> Call[list[TodoInfo]]:
        """Todos by status, conversation and due time."""
        params = _query(
            status=status, group_id=group_id, user_id=user_id, due_before=due_before, limit=limit
        )
        return Call("GET", "/v1/todos", _many(TodoInfo), params=params)

    @route
    def due_todos(
        self, *, group_id: str | None = None, user_id: str | None = None
    ) -> Call[list[TodoInfo]]:
        """Pending todos whose time has come."""
        params = _query(group_id=group_id, user_id=user_id)
        return Call("GET", "/v1/todos/due", _many(TodoInfo), params=params)

    @route
    def update_todo(
        self, todo_id: int, patch: TodoPatch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[TodoInfo]:
        """Complete, cancel, reopen, reschedule or reassign a todo."""
        body = _json(_request(TodoPatch, patch, fields))
        return Call("PATCH", f"/v1/todos/{_row_id(todo_id, 'todo_id')}", _one(TodoInfo), body=body)

    # -- jobs, settings, keys, tenant, persona --------------------------------------------

    @route
    def list_jobs(
        self, *, status: str | None = None, before: int | None = None, limit: int | None = None
    ) -> Call[JobPage]:
        """This tenant's jobs, newest first."""
        params = _query(status=status, before=before, limit=limit)
        return Call("GET", "/v1/jobs", _one(JobPage), params=params)

    @route
    def get_job(self, job_id: int) -> Call[JobInfo]:
        """One job."""
        return Call("GET", f"/v1/jobs/{_row_id(job_id, 'job_id')}", _one(JobInfo))

    @route
    def retry_job(self, job_id: int) -> Call[JobInfo]:
        """Queue a failed job again."""
        return Call("POST", f"/v1/jobs/{_row_id(job_id, 'job_id')}/retry", _one(JobInfo))

    @route
    def get_settings(self) -> Call[EffectiveSettings]:
        """The settings in force for this tenant."""
        return Call("GET", "/v1/settings", _one(EffectiveSettings))

    @route
    def update_settings(
        self, update: SettingsUpdate | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[EffectiveSettings]:
        """Change this tenant's overrides; a ``None`` query key restores its default."""
        body = _json(_request(SettingsUpdate, update, fields))
        return Call("PATCH", "/v1/settings", _one(EffectiveSettings), body=body)

    @route
    def list_keys(self) -> Call[list[KeyInfo]]:
        """This tenant's keys, without secrets."""
        return Call("GET", "/v1/keys", _many(KeyInfo))

    @route
    def create_key(self, name: str = "") -> Call[CreatedKey]:
        """Another key for this tenant (its secret is shown only in this answer)."""
        return Call("POST", "/v1/keys", _one(CreatedKey), body={"name": name})

    @route
    def revoke_key(self, key_id: uuid.UUID | str) -> Call[KeyInfo]:
        """Revoke one of this tenant's keys."""
        return Call("DELETE", f"/v1/keys/{_seg(key_id)}", _one(KeyInfo))

    @route
    def tenant(self) -> Call[dict[str, Any]]:
        """The tenant this key belongs to: ``tenant_id``, ``name``, ``key_prefix``."""
        return Call("GET", "/v1/tenant", _dict)

    @route
    def get_persona(self) -> Call[Persona]:
        """The persona block (404 when none is set)."""
        return Call("GET", "/v1/persona", _one(Persona))

    @route
    def put_persona(self, text: str) -> Call[Persona]:
        """Set the persona: the bot's character and boundary rules."""
        return Call("PUT", "/v1/persona", _one(Persona), body={"text": text})

    @route
    def delete_persona(self) -> Call[None]:
        """Remove the persona."""
        return Call("DELETE", "/v1/persona", _nothing)

    # -- the bot's tools ------------------------------------------------------------------

    @route
    def list_tools(self) -> Call[list[dict[str, Any]]]:
        """OpenAI function definitions of the memory tools and of ``end``."""
        return Call("GET", "/v1/tools", lambda response: list(response.json()))

    @route
    def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | str | None = None,
        context: BaseModel | Mapping[str, Any] | None = None,
    ) -> Call[ToolResult]:
        """Run one memory tool within a conversation."""
        body = {"name": name, "arguments": _arguments(arguments), "context": _context_dict(context)}
        return Call("POST", "/v1/tools/call", _one(ToolResult), body=body)

    @route
    def tool_call(
        self, tool_call: Any, context: ConversationContext | Mapping[str, Any] | None = None
    ) -> Call[str]:
        """Run an OpenAI tool call; returns the content of the tool message for the model.

        ``tool_call`` is the SDK's object (``.function.name`` / ``.function.arguments``) or a
        dict of that shape. An error the model can act on (bad arguments, unknown tool, not
        allowed) comes back as content too; others raise ``MemoriaAPIError``.
        """
        name, arguments = _tool_call_parts(tool_call)
        body = {"name": name, "arguments": _arguments(arguments), "context": _context_dict(context)}

        def recover(error: MemoriaAPIError) -> str:
            if error.status not in MODEL_ERRORS:
                raise error
            return error.as_tool_content()

        return Call("POST", "/v1/tools/call", _tool_content, body=body, recover=recover)

    # -- privacy --------------------------------------------------------------------------

    @route
    def export_user(self, user_id: str, out: BinaryWriter) -> Call[int]:
        """Stream everything held about a person (one JSON document) into ``out``.

        ``out`` is a binary file-like (``io.BytesIO()`` for bytes); returns the bytes written.
        A large export is written by a job first: the call waits for it, then streams it.
        """
        return Call("GET", f"/v1/users/{_seg(user_id)}/export", _streamed, sink=out)

    @route
    def export_group(self, group_id: str, out: BinaryWriter) -> Call[int]:
        """Stream everything held about a group (one JSON document) into ``out``."""
        return Call("GET", f"/v1/groups/{_seg(group_id)}/export", _streamed, sink=out)

    @route
    def erase_user(self, user_id: str) -> Call[dict[str, Any]]:
        """Erase a person: a receipt of counts, or ``job_id``/``status_url`` when large."""
        return Call("DELETE", f"/v1/users/{_seg(user_id)}", _dict)

    @route
    def erase_group(self, group_id: str) -> Call[dict[str, Any]]:
        """Erase a group and everything of it; a receipt of counts."""
        return Call("DELETE", f"/v1/groups/{_seg(group_id)}", _dict)


def _streamed(response: httpx.Response) -> int:
    return 0  # never called: a call with a sink returns the bytes it wrote


# How long an export call waits for the job writing a large export.
EXPORT_WAIT_SECONDS = 3600.0


def _export_failed(job: JobInfo, request_id: str) -> MemoriaAPIError:
    return MemoriaAPIError(
        409,
        "conflict",
        f"the export's job {job.id} failed: {job.last_error}",
        "export_id",
        request_id,
    )


@dataclass
class _Retry:
    """When to try a call again, and after how long."""

    max_retries: int
    base: float
    cap: float

    def delay(self, attempt: int, error: MemoriaAPIError | None) -> float | None:
        """Seconds to wait before try ``attempt + 1``, or ``None`` to give up."""
        if attempt >= self.max_retries:
            return None
        if error is not None and error.retry_after is not None:
            # The server said when; waiting longer than the cap is the caller's decision.
            return error.retry_after if error.retry_after <= self.cap else None
        # Full jitter: many bots shed by one overloaded service do not come back in step.
        return random.uniform(0, min(self.cap, self.base * 2**attempt))  # noqa: S311


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT}


def _send_headers(call: Call[Any], request_id: str) -> dict[str, str]:
    return {"X-Request-ID": request_id, **(call.headers or {})}


class MemoriaClient(_Routes):
    """The async client (``httpx.AsyncClient``); use it as ``async with``, or ``aclose()``."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | httpx.Timeout = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_retries: int = 3,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=_headers(api_key), timeout=timeout, transport=transport
        )
        self._retry = _Retry(max_retries, backoff_base, backoff_cap)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def wait_for_job(
        self, job_id: int, *, timeout: float = 60.0, interval: float = 0.2
    ) -> JobInfo:
        """Poll a job until it is ``done`` or ``failed``; ``TimeoutError`` past ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            job = await self.get_job(job_id)
            if job.status in ("done", "failed"):
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job.status} after {timeout}s")
            await asyncio.sleep(interval)

    async def _export_later(self, accepted: Any, call: Call[Any], request_id: str) -> int:
        """A large export: wait for its job, then stream what it wrote."""
        job = await self.wait_for_job(
            int(accepted["job_id"]), timeout=EXPORT_WAIT_SECONDS, interval=0.5
        )
        if job.status != "done":
            raise _export_failed(job, request_id)
        fetch = Call("GET", str(accepted["export_url"]), _streamed, sink=call.sink)
        return await self._once(fetch, request_id)

    async def _run(self, call: Call[T]) -> T:
        request_id = uuid.uuid4().hex
        attempt = 0
        while True:
            error: MemoriaAPIError | None = None
            try:
                return await self._once(call, request_id)
            except MemoriaAPIError as exc:
                if exc.status not in RETRY_STATUSES:
                    if call.recover is not None:
                        return call.recover(exc)
                    raise
                error = exc
            except (httpx.ConnectError, httpx.ConnectTimeout):
                # Nothing reached the service: safe to send again, whatever the method.
                if attempt >= self._retry.max_retries:
                    raise
            delay = self._retry.delay(attempt, error)
            if delay is None:
                assert error is not None
                raise error
            attempt += 1
            await asyncio.sleep(delay)

    async def _once(self, call: Call[T], request_id: str) -> T:
        request = self._http.build_request(
            call.method,
            call.path,
            params=call.params,
            json=call.body,
            headers=_send_headers(call, request_id),
        )
        response = await self._http.send(request, stream=True)
        try:
            if response.is_error:
                await response.aread()
                raise MemoriaAPIError.from_response(response)
            if call.sink is not None:
                if response.status_code == 202:  # large: written by a job first
                    await response.aread()
                    return await self._export_later(  # type: ignore[return-value]  # Call[int]
                        response.json(), call, request_id
                    )
                written = 0
                async for chunk in response.aiter_bytes():
                    call.sink.write(chunk)
                    written += len(chunk)
                return written  # type: ignore[return-value]  # Call[int] by construction
            await response.aread()
            return call.parse(response)
        finally:
            await response.aclose()


class SyncMemoriaClient(_Routes):
    """The blocking client (``httpx.Client``), for scripts and threads; ``with`` or ``close()``."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | httpx.Timeout = 30.0,
        transport: httpx.BaseTransport | None = None,
        max_retries: int = 3,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, headers=_headers(api_key), timeout=timeout, transport=transport
        )
        self._retry = _Retry(max_retries, backoff_base, backoff_cap)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def wait_for_job(self, job_id: int, *, timeout: float = 60.0, interval: float = 0.2) -> JobInfo:
        """Poll a job until it is ``done`` or ``failed``; ``TimeoutError`` past ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if job.status in ("done", "failed"):
                return job
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job.status} after {timeout}s")
            time.sleep(interval)

    def _export_later(self, accepted: Any, call: Call[Any], request_id: str) -> int:
        """A large export: wait for its job, then stream what it wrote."""
        job = self.wait_for_job(int(accepted["job_id"]), timeout=EXPORT_WAIT_SECONDS, interval=0.5)
        if job.status != "done":
            raise _export_failed(job, request_id)
        fetch = Call("GET", str(accepted["export_url"]), _streamed, sink=call.sink)
        return self._once(fetch, request_id)

    def _run(self, call: Call[T]) -> T:
        request_id = uuid.uuid4().hex
        attempt = 0
        while True:
            error: MemoriaAPIError | None = None
            try:
                return self._once(call, request_id)
            except MemoriaAPIError as exc:
                if exc.status not in RETRY_STATUSES:
                    if call.recover is not None:
                        return call.recover(exc)
                    raise
                error = exc
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if attempt >= self._retry.max_retries:
                    raise
            delay = self._retry.delay(attempt, error)
            if delay is None:
                assert error is not None
                raise error
            attempt += 1
            time.sleep(delay)

    def _once(self, call: Call[T], request_id: str) -> T:
        request = self._http.build_request(
            call.method,
            call.path,
            params=call.params,
            json=call.body,
            headers=_send_headers(call, request_id),
        )
        response = self._http.send(request, stream=True)
        try:
            if response.is_error:
                response.read()
                raise MemoriaAPIError.from_response(response)
            if call.sink is not None:
                if response.status_code == 202:  # large: written by a job first
                    response.read()
                    return self._export_later(  # type: ignore[return-value]  # Call[int]
                        response.json(), call, request_id
                    )
                written = 0
                for chunk in response.iter_bytes():
                    call.sink.write(chunk)
                    written += len(chunk)
                return written  # type: ignore[return-value]  # Call[int] by construction
            response.read()
            return call.parse(response)
        finally:
            response.close()
