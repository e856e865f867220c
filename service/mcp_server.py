"""``memoria mcp``: the bot's memory tools over the Model Context Protocol, for one tenant key.

Every tool forwards to the HTTP API through ``MemoriaClient``, within a conversation given as
tool arguments (``group_id``, ``user_id``, ``sender_id``) or by the server's defaults
(``--group-id`` …). The read tools run through ``POST /v1/tools/call``, so an MCP agent sees
exactly what a bot's OpenAI tool calls see, with the same hard filters.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import httpx
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field
from starlette.types import ASGIApp, Receive, Scope, Send

from service.client import MemoriaAPIError, MemoriaClient

T = TypeVar("T")

INSTRUCTIONS = (
    "Long-term memory of a chat bot. Look things up with search_memories, search_events, "
    "get_profile and search_profiles; record a durable fact with add_memory; at the end of a "
    "turn call end with what you did (memo) and what you learned (observations). Every tool "
    "works within one conversation: a group (group_id) or a private chat (user_id)."
)

GroupId = Annotated[
    str | None,
    Field(
        description="the group chat; default: the server's --group-id "
        "(an empty string: no group, a private chat)"
    ),
]
UserId = Annotated[
    str | None,
    Field(description="the person the bot is serving; default: the server's --user-id"),
]
SenderId = Annotated[
    str | None,
    Field(description="who sent the current message; default: the server's --sender-id or user_id"),
]
TopK = Annotated[int | None, Field(default=None, ge=1, le=200, description="how many results")]


@dataclass(frozen=True)
class Conversation:
    """The server's default conversation; a tool's arguments override each part."""

    group_id: str | None = None
    user_id: str | None = None
    sender_id: str | None = None
    bot_id: str | None = None
    bot_name: str | None = None

    def context(
        self, group_id: str | None, user_id: str | None, sender_id: str | None
    ) -> dict[str, Any]:
        """The conversation context of one call (as ``POST /v1/tools/call`` takes it)."""
        group = self.group_id if group_id is None else group_id
        user = user_id or self.user_id
        sender = sender_id or self.sender_id or user
        context: dict[str, Any] = {"bot_id": self.bot_id, "bot_name": self.bot_name}
        if group:
            context.update(request_type="group", group_id=group, user_id=user, sender_id=sender)
        elif user or sender:
            context.update(request_type="private", user_id=user or sender, sender_id=sender)
        else:
            raise ToolError(
                "no conversation: pass group_id or user_id, "
                "or start the server with --group-id / --user-id"
            )
        return {k: v for k, v in context.items() if v}


def build_server(client: MemoriaClient, defaults: Conversation) -> MCPServer:
    """An MCP server whose tools forward to the Memoria API through ``client``."""
    server: MCPServer = MCPServer(
        "memoria", instructions=INSTRUCTIONS, version="0.1.0", log_level="WARNING"
    )

    async def forward(name: str, arguments: dict[str, Any], context: dict[str, Any]) -> str:
        given = {k: v for k, v in arguments.items() if v is not None}
        result = await _api(client.call_tool(name, given, context))
        return result.content

    @server.tool(
        description="Search past events of this conversation by meaning, optionally within a "
        "time range (ISO 8601); recent events rank higher. / 搜索历史事件记忆"
    )
    async def search_events(
        query: Annotated[str, Field(description="what to recall")],
        time_from: Annotated[str | None, Field(description="ISO 8601 start")] = None,
        time_to: Annotated[str | None, Field(description="ISO 8601 end")] = None,
        target_user_id: Annotated[str | None, Field(description="only events of this user")] = None,
        top_k: TopK = None,
        group_id: GroupId = None,
        user_id: UserId = None,
        sender_id: SenderId = None,
    ) -> str:
        arguments = {
            "query": query,
            "time_from": time_from,
            "time_to": time_to,
            "target_user_id": target_user_id,
            "top_k": top_k,
        }
        context = defaults.context(group_id, user_id, sender_id)
        return await forward("cognitive_search_events", arguments, context)

    @server.tool(
        description="The profile of a user, of the current group, or of a member of the "
        "current group (Markdown). / 获取用户、群聊或群成员的侧写"
    )
    async def get_profile(
        entity_type: Annotated[Literal["user", "group", "member"], Field(description="whose")],
        entity_id: Annotated[str, Field(description="the user id or the group id")],
        group_id: GroupId = None,
        user_id: UserId = None,
        sender_id: SenderId = None,
    ) -> str:
        arguments = {"entity_type": entity_type, "entity_id": entity_id}
        context = defaults.context(group_id, user_id, sender_id)
        return await forward("cognitive_get_profile", arguments, context)

    @server.tool(
        description="Find profiles (people, groups) by meaning, e.g. a trait or an interest. "
        "/ 语义搜索侧写"
    )
    async def search_profiles(
        query: Annotated[str, Field(description="what to look for")],
        entity_type: Annotated[
            Literal["user", "group", "member"] | None, Field(description="only this kind")
        ] = None,
        top_k: TopK = None,
        group_id: GroupId = None,
        user_id: UserId = None,
        sender_id: SenderId = None,
    ) -> str:
        arguments = {"query": query, "entity_type": entity_type, "top_k": top_k}
        context = defaults.context(group_id, user_id, sender_id)
        return await forward("cognitive_search_profiles", arguments, context)

    @server.tool(
        description="Search the long-term memories visible in this conversation (preferences, "
        "facts, profile traits, summaries). / 搜索当前会话可见的长期记忆"
    )
    async def search_memories(
        query: Annotated[str, Field(description="what to look for")],
        categories: Annotated[
            list[Literal["PROFILE", "PREFERENCE", "FACT", "SUMMARY"]] | None,
            Field(description="only these categories"),
        ] = None,
        top_k: TopK = None,
        group_id: GroupId = None,
        user_id: UserId = None,
        sender_id: SenderId = None,
    ) -> str:
        arguments = {"query": query, "categories": categories, "top_k": top_k}
        context = defaults.context(group_id, user_id, sender_id)
        return await forward("cognitive_search_memories", arguments, context)

    @server.tool(
        description="Remember one durable fact, stated absolutely (names and dates, no 'I', "
        "'tomorrow' or 'here'). Scope: MEMBER_IN_GROUP (the person, in this group; the default "
        "in a group), GROUP (the group itself), PRIVATE (the person, in this private chat only; "
        "the default there), GLOBAL (the person everywhere: only what they let be known, never "
        "health, ids or contact data). / 记住一条长期记忆"
    )
    async def add_memory(
        content: Annotated[str, Field(min_length=1, max_length=2000, description="the fact")],
        scope: Annotated[
            Literal["GLOBAL", "PRIVATE", "GROUP", "MEMBER_IN_GROUP"] | None,
            Field(description="whom the memory is bound to (see above)"),
        ] = None,
        category: Annotated[
            Literal["PROFILE", "PREFERENCE", "FACT", "SUMMARY"], Field(description="its kind")
        ] = "FACT",
        group_id: GroupId = None,
        user_id: UserId = None,
        sender_id: SenderId = None,
    ) -> str:
        context = defaults.context(group_id, user_id, sender_id)
        group = context.get("group_id")
        person = context.get("sender_id") or context.get("user_id")
        chosen = scope or (
            "MEMBER_IN_GROUP" if group and person else "GROUP" if group else "PRIVATE"
        )
        if chosen == "PRIVATE" and group:
            raise ToolError("a PRIVATE memory belongs to a private chat, not a group")
        if chosen not in ("GLOBAL", "PRIVATE") and not group:
            raise ToolError(f"a {chosen} memory needs a group conversation")
        if chosen != "GROUP" and not person:
            raise ToolError(f"a {chosen} memory needs the person (user_id or sender_id)")
        created = await _api(
            client.add_memory(
                scope=chosen,
                group_id=group if chosen not in ("GLOBAL", "PRIVATE") else None,
                user_id=person if chosen != "GROUP" else None,
                category=category,
                content=content,
                reason="mcp add_memory",
            )
        )
        return json.dumps(
            {
                "id": created.id,
                "scope": created.scope,
                "category": created.category,
                "content": created.content,
                "duplicate": created.duplicate,
            },
            ensure_ascii=False,
        )

    @server.tool(
        description="End the turn and hand it to memory: memo = what you did this turn (short, "
        "may be empty); observations = new facts about people or the group, one sentence each. "
        "/ 结束本轮对话并交给记忆系统"
    )
    async def end(
        memo: Annotated[str, Field(max_length=4000, description="what you did this turn")] = "",
        observations: Annotated[
            list[str] | None, Field(description="new facts, one sentence each")
        ] = None,
        force: Annotated[bool, Field(description="store even if relative words remain")] = False,
        group_id: GroupId = None,
        user_id: UserId = None,
        sender_id: SenderId = None,
    ) -> str:
        context = defaults.context(group_id, user_id, sender_id)
        accepted = await _api(
            client.end(context, memo=memo, observations=observations or [], force=force)
        )
        return accepted.model_dump_json(
            include={"enqueued", "job_id", "event_ids", "memo_recorded", "duplicate", "warnings"}
        )

    return server


async def _api(call: Awaitable[T]) -> T:
    """Await one API call; its failure becomes a tool error the model can read."""
    try:
        return await call
    except MemoriaAPIError as exc:
        raise ToolError(str(exc)) from exc
    except httpx.HTTPError as exc:
        raise ToolError(f"the Memoria API did not answer: {type(exc).__name__}") from exc


def require_token(app: ASGIApp, token: str) -> ASGIApp:
    """``app`` answering only requests that carry ``Authorization: Bearer <token>``.

    Over HTTP the tools act with the tenant's key for any conversation: without this, any
    process that can reach the port (every local user, a web page through the browser) could
    use them.
    """
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b'Bearer realm="memoria-mcp"'),
                        ],
                    }
                )
                body = b'{"error": "Authorization: Bearer <the token memoria mcp printed>"}'
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


async def serve(
    api_url: str,
    api_key: str,
    defaults: Conversation,
    *,
    transport: Literal["stdio", "http"] = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
) -> None:
    """Serve the tools over stdio, or streamable HTTP at ``http://host:port/mcp`` to clients
    presenting ``token`` as a bearer token."""
    async with MemoriaClient(api_url, api_key) as client:
        server = build_server(client, defaults)
        if transport == "stdio":
            await server.run_stdio_async()
            return
        if not token:
            raise ValueError("the HTTP transport needs a client token")
        app = require_token(server.streamable_http_app(host=host), token)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning")
        await uvicorn.Server(config).serve()
