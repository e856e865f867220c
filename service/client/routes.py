"""Every ``/v1`` route, defined once as a ``Call`` builder and sent by either client."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import datetime
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from pydantic import BaseModel

from service.client.errors import MemoriaAPIError
from service.client.requests import (
    BinaryWriter,
    Call,
    as_request,
    context_dict,
    job_call,
    json_body,
    parse_dict,
    parse_many,
    parse_nothing,
    parse_one,
    parse_streamed,
    parse_tool_content,
    profile_path,
    query_params,
    row_id,
    segment,
    tool_arguments,
    tool_call_parts,
)
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
from service.tenants.schemas import (
    BotSettings,
    BotSettingsUpdate,
    CreatedKey,
    EffectiveSettings,
    KeyInfo,
    SettingsUpdate,
)
from service.todos.schemas import TodoCreate, TodoInfo, TodoPatch

T = TypeVar("T")
P = ParamSpec("P")


class AsyncRunner(Protocol):
    """What ``MemoriaClient`` is to a route: it awaits a call."""

    def _run(self, call: Call[T]) -> Coroutine[Any, Any, T]: ...


class SyncRunner(Protocol):
    """What ``SyncMemoriaClient`` is to a route: it runs a call and blocks."""

    def _run(self, call: Call[T]) -> T: ...


# Errors that a model can act on (wrong arguments, unknown tool, not allowed): ``tool_call``
# hands them back as the tool's content instead of raising.
MODEL_ERRORS = frozenset({400, 403, 404, 409, 422})


class route(Generic[P, T]):
    """A route defined once in ``Routes`` and run by either client.

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
    def __get__(self, client: AsyncRunner, owner: type[Any]) -> Callable[P, Awaitable[T]]: ...
    @overload
    def __get__(self, client: SyncRunner, owner: type[Any]) -> Callable[P, T]: ...

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


class Routes:
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
        body = as_request(EndRequest, request, fields)
        # The request id goes out even when generated here: a retried call is then a duplicate
        # the service recognizes, not a second job.
        return Call("POST", "/v1/end", parse_one(EndAccepted), body=json_body(body, "request_id"))

    @route
    def memos(
        self, *, group_id: str | None = None, user_id: str | None = None, limit: int | None = None
    ) -> Call[list[MemoInfo]]:
        """A conversation's memo log, newest first."""
        params = query_params(group_id=group_id, user_id=user_id, limit=limit)
        return Call("GET", "/v1/memos", parse_many(MemoInfo), params=params)

    @route
    def store_messages(
        self, batch: MessageBatch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[MessagesStored]:
        """Archive a batch of raw chat messages (duplicates are ignored)."""
        body = json_body(as_request(MessageBatch, batch, fields))
        return Call("POST", "/v1/messages", parse_one(MessagesStored), body=body)

    @route
    def search_messages(
        self, search: MessageSearch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[MessageSearchResult]:
        """One conversation's archived messages nearest in meaning to ``query``."""
        body = json_body(as_request(MessageSearch, search, fields))
        return Call("POST", "/v1/messages/search", parse_one(MessageSearchResult), body=body)

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
        params = query_params(group_id=group_id, user_id=user_id, limit=limit, before=before)
        return Call("GET", "/v1/events", parse_one(EventPage), params=params)

    @route
    def get_event(self, event_id: str) -> Call[EventInfo]:
        """One event."""
        return Call("GET", f"/v1/events/{segment(event_id)}", parse_one(EventInfo))

    @route
    def search_events(
        self, search: EventSearch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[EventSearchResult]:
        """Events by meaning and time (``cognitive.search_events``)."""
        body = json_body(as_request(EventSearch, search, fields))
        return Call("POST", "/v1/events/search", parse_one(EventSearchResult), body=body)

    @route
    def context(
        self,
        request: ContextRequest | BaseModel | Mapping[str, Any] | None = None,
        /,
        **fields: Any,
    ) -> Call[ContextResponse]:
        """The memory context to inject this turn, with its ready ``prompt`` block."""
        body = json_body(as_request(ContextRequest, request, fields))
        return Call("POST", "/v1/context", parse_one(ContextResponse), body=body)

    # -- profiles -------------------------------------------------------------------------

    @route
    def get_profile(
        self, entity_type: str, entity_id: str, *, group_id: str | None = None
    ) -> Call[ProfileInfo]:
        """A ``user``'s or ``group``'s profile, or a ``member``'s (with ``group_id``)."""
        return Call("GET", profile_path(entity_type, entity_id, group_id), parse_one(ProfileInfo))

    @route
    def profile_revisions(
        self,
        entity_type: str,
        entity_id: str,
        *,
        group_id: str | None = None,
        limit: int | None = None,
        before: int | None = None,
    ) -> Call[list[RevisionInfo]]:
        """A profile's kept previous texts, newest first (``before``: a version, for the next
        page)."""
        path = profile_path(entity_type, entity_id, group_id) + "/revisions"
        params = query_params(limit=limit, before=before)
        return Call("GET", path, parse_many(RevisionInfo), params=params)

    @route
    def rollback_profile(
        self, entity_type: str, entity_id: str, version: int, *, group_id: str | None = None
    ) -> Call[ProfileInfo]:
        """Make a kept revision of a profile current again."""
        path = profile_path(entity_type, entity_id, group_id) + "/rollback"
        return Call("POST", path, parse_one(ProfileInfo), body={"version": version})

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
        path = profile_path(entity_type, entity_id, group_id)
        return Call(
            "PUT", path, parse_one(ProfileInfo), body={"document": document}, headers=headers
        )

    @route
    def search_profiles(
        self, search: ProfileSearch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[list[ProfileHit]]:
        """Profiles by meaning (member profiles only within ``group_id``)."""
        body = json_body(as_request(ProfileSearch, search, fields))
        return Call("POST", "/v1/profiles/search", parse_many(ProfileHit), body=body)

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
        params = query_params(
            scope=scope,
            user_id=user_id,
            group_id=group_id,
            category=category,
            active=active,
            limit=limit,
            before=before,
        )
        return Call("GET", "/v1/memories", parse_many(MemoryInfo), params=params)

    @route
    def add_memory(
        self, memory: MemoryCreate | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[MemoryCreated]:
        """Add a memory; an active duplicate in the same scope comes back with ``duplicate``."""
        body = json_body(as_request(MemoryCreate, memory, fields))
        return Call("POST", "/v1/memories", parse_one(MemoryCreated), body=body)

    @route
    def get_memory(self, memory_id: int) -> Call[MemoryInfo]:
        """One memory."""
        return Call("GET", f"/v1/memories/{row_id(memory_id, 'memory_id')}", parse_one(MemoryInfo))

    @route
    def update_memory(
        self, memory_id: int, patch: MemoryPatch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[MemoryInfo]:
        """Change a memory; the old content stays in its history."""
        body = json_body(as_request(MemoryPatch, patch, fields))
        return Call(
            "PATCH",
            f"/v1/memories/{row_id(memory_id, 'memory_id')}",
            parse_one(MemoryInfo),
            body=body,
        )

    @route
    def delete_memory(self, memory_id: int) -> Call[None]:
        """Delete a memory for real (its history keeps only that it was deleted)."""
        return Call("DELETE", f"/v1/memories/{row_id(memory_id, 'memory_id')}", parse_nothing)

    @route
    def memory_history(
        self, memory_id: int, *, limit: int | None = None, after: int | None = None
    ) -> Call[list[HistoryEntry]]:
        """A memory's changes, oldest first, a page at a time (``after``: the last entry's
        id, for the next page)."""
        return Call(
            "GET",
            f"/v1/memories/{row_id(memory_id, 'memory_id')}/history",
            parse_many(HistoryEntry),
            params=query_params(limit=limit, after=after),
        )

    @route
    def search_memories(
        self, search: MemorySearch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[list[MemoryHit]]:
        """Memories nearest in meaning, only within the conversation's scopes."""
        body = json_body(as_request(MemorySearch, search, fields))
        return Call("POST", "/v1/memories/search", parse_many(MemoryHit), body=body)

    @route
    def forget_memories(
        self, forget: ForgetRequest | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[ForgetResult]:
        """Forget by ids, category or query: deactivate (default) or delete."""
        body = json_body(as_request(ForgetRequest, forget, fields))
        return Call("POST", "/v1/memories/forget", parse_one(ForgetResult), body=body)

    # -- todos ----------------------------------------------------------------------------

    @route
    def add_todo(
        self, todo: TodoCreate | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[TodoInfo]:
        """Add a pending todo to the conversation the context names."""
        body = json_body(as_request(TodoCreate, todo, fields))
        return Call("POST", "/v1/todos", parse_one(TodoInfo), body=body)

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
        params = query_params(
            status=status, group_id=group_id, user_id=user_id, due_before=due_before, limit=limit
        )
        return Call("GET", "/v1/todos", parse_many(TodoInfo), params=params)

    @route
    def due_todos(
        self, *, group_id: str | None = None, user_id: str | None = None
    ) -> Call[list[TodoInfo]]:
        """Pending todos whose time has come."""
        params = query_params(group_id=group_id, user_id=user_id)
        return Call("GET", "/v1/todos/due", parse_many(TodoInfo), params=params)

    @route
    def update_todo(
        self, todo_id: int, patch: TodoPatch | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[TodoInfo]:
        """Complete, cancel, reopen, reschedule or reassign a todo."""
        body = json_body(as_request(TodoPatch, patch, fields))
        return Call(
            "PATCH", f"/v1/todos/{row_id(todo_id, 'todo_id')}", parse_one(TodoInfo), body=body
        )

    # -- jobs, settings, keys, tenant, persona --------------------------------------------

    @route
    def list_jobs(
        self, *, status: str | None = None, before: int | None = None, limit: int | None = None
    ) -> Call[JobPage]:
        """This tenant's jobs, newest first."""
        params = query_params(status=status, before=before, limit=limit)
        return Call("GET", "/v1/jobs", parse_one(JobPage), params=params)

    @route
    def get_job(self, job_id: int) -> Call[JobInfo]:
        """One job."""
        return job_call(job_id)

    @route
    def retry_job(self, job_id: int) -> Call[JobInfo]:
        """Queue a failed job again."""
        return Call("POST", f"/v1/jobs/{row_id(job_id, 'job_id')}/retry", parse_one(JobInfo))

    @route
    def get_settings(self) -> Call[EffectiveSettings]:
        """The settings in force for this tenant."""
        return Call("GET", "/v1/settings", parse_one(EffectiveSettings))

    @route
    def update_settings(
        self, update: SettingsUpdate | Mapping[str, Any] | None = None, /, **fields: Any
    ) -> Call[EffectiveSettings]:
        """Change this tenant's overrides; a ``None`` query key restores its default."""
        body = json_body(as_request(SettingsUpdate, update, fields))
        return Call("PATCH", "/v1/settings", parse_one(EffectiveSettings), body=body)

    @route
    def list_bots(self) -> Call[list[BotSettings]]:
        """The bots with settings of their own, each as in force."""
        return Call("GET", "/v1/bots", parse_many(BotSettings))

    @route
    def get_bot_settings(self, bot_id: str) -> Call[BotSettings]:
        """The settings in force for one bot (the tenant's where it has none of its own)."""
        return Call("GET", f"/v1/bots/{segment(bot_id)}/settings", parse_one(BotSettings))

    @route
    def put_bot_settings(
        self,
        bot_id: str,
        update: BotSettingsUpdate | Mapping[str, Any] | None = None,
        /,
        **fields: Any,
    ) -> Call[BotSettings]:
        """Set one bot's persona and query settings over the tenant's, replacing its own."""
        body = json_body(as_request(BotSettingsUpdate, update, fields))
        path = f"/v1/bots/{segment(bot_id)}/settings"
        return Call("PUT", path, parse_one(BotSettings), body=body)

    @route
    def delete_bot_settings(self, bot_id: str) -> Call[BotSettings]:
        """Remove one bot's own settings: it gets the tenant's."""
        return Call("DELETE", f"/v1/bots/{segment(bot_id)}/settings", parse_one(BotSettings))

    @route
    def list_keys(self) -> Call[list[KeyInfo]]:
        """This tenant's keys, without secrets."""
        return Call("GET", "/v1/keys", parse_many(KeyInfo))

    @route
    def create_key(self, name: str = "") -> Call[CreatedKey]:
        """Another key for this tenant (its secret is shown only in this answer)."""
        return Call("POST", "/v1/keys", parse_one(CreatedKey), body={"name": name})

    @route
    def revoke_key(self, key_id: uuid.UUID | str) -> Call[KeyInfo]:
        """Revoke one of this tenant's keys."""
        return Call("DELETE", f"/v1/keys/{segment(key_id)}", parse_one(KeyInfo))

    @route
    def tenant(self) -> Call[dict[str, Any]]:
        """The tenant this key belongs to: ``tenant_id``, ``name``, ``key_prefix``."""
        return Call("GET", "/v1/tenant", parse_dict)

    @route
    def get_persona(self) -> Call[Persona]:
        """The persona block (404 when none is set)."""
        return Call("GET", "/v1/persona", parse_one(Persona))

    @route
    def put_persona(self, text: str) -> Call[Persona]:
        """Set the persona: the bot's character and boundary rules."""
        return Call("PUT", "/v1/persona", parse_one(Persona), body={"text": text})

    @route
    def delete_persona(self) -> Call[None]:
        """Remove the persona."""
        return Call("DELETE", "/v1/persona", parse_nothing)

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
        body = {
            "name": name,
            "arguments": tool_arguments(arguments),
            "context": context_dict(context),
        }
        return Call("POST", "/v1/tools/call", parse_one(ToolResult), body=body)

    @route
    def tool_call(
        self, tool_call: Any, context: ConversationContext | Mapping[str, Any] | None = None
    ) -> Call[str]:
        """Run an OpenAI tool call; returns the content of the tool message for the model.

        ``tool_call`` is the SDK's object (``.function.name`` / ``.function.arguments``) or a
        dict of that shape. An error the model can act on (bad arguments, unknown tool, not
        allowed) comes back as content too; others raise ``MemoriaAPIError``.
        """
        name, arguments = tool_call_parts(tool_call)
        body = {
            "name": name,
            "arguments": tool_arguments(arguments),
            "context": context_dict(context),
        }

        def recover(error: MemoriaAPIError) -> str:
            if error.status not in MODEL_ERRORS:
                raise error
            return error.as_tool_content()

        return Call("POST", "/v1/tools/call", parse_tool_content, body=body, recover=recover)

    # -- privacy --------------------------------------------------------------------------

    @route
    def export_user(self, user_id: str, out: BinaryWriter) -> Call[int]:
        """Stream everything held about a person (one JSON document) into ``out``.

        ``out`` is a binary file-like (``io.BytesIO()`` for bytes); returns the bytes written.
        A large export is written by a job first: the call waits for it, then streams it.
        """
        return Call("GET", f"/v1/users/{segment(user_id)}/export", parse_streamed, sink=out)

    @route
    def export_group(self, group_id: str, out: BinaryWriter) -> Call[int]:
        """Stream everything held about a group (one JSON document) into ``out``."""
        return Call("GET", f"/v1/groups/{segment(group_id)}/export", parse_streamed, sink=out)

    @route
    def erase_user(self, user_id: str) -> Call[dict[str, Any]]:
        """Erase a person: a receipt of counts, or ``job_id``/``status_url`` when large."""
        return Call("DELETE", f"/v1/users/{segment(user_id)}", parse_dict)

    @route
    def erase_group(self, group_id: str) -> Call[dict[str, Any]]:
        """Erase a group and everything of it: a receipt of counts, or ``job_id``/``status_url``
        when large."""
        return Call("DELETE", f"/v1/groups/{segment(group_id)}", parse_dict)
