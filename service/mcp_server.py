"""``memoria mcp``: the bot's memory tools over the Model Context Protocol, for one tenant key.

A server serves one conversation, fixed when it starts (``--group-id``, ``--user-id``,
``--sender-id``, ``--bot-id``): every tool forwards to the HTTP API through ``MemoriaClient``
within it, and no tool argument can name another, as with ``POST /v1/tools/call``, where the
conversation is the caller's context and never the model's arguments. The read tools run
through that route, so an MCP agent sees exactly what a bot's OpenAI tool calls see, with the
same hard filters.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import httpx
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, InputRequiredResult
from pydantic import Field
from starlette.types import ASGIApp, Receive, Scope, Send

from service.client import MemoriaAPIError, MemoriaClient

T = TypeVar("T")

INSTRUCTIONS = (
    "Long-term memory of a chat bot. Look things up with search_memories, search_events, "
    "get_profile and search_profiles; record a durable fact with add_memory; at the end of a "
    "turn call end with what you did (memo) and what you learned (observations). Every tool "
    "works within the one conversation this server was started for (a group or a private "
    "chat); no argument names another."
)

TopK = Annotated[int | None, Field(default=None, ge=1, le=200, description="how many results")]


NO_CONVERSATION = (
    "memoria mcp serves one conversation: start it with --group-id GROUP (a group chat) "
    "or --user-id USER (a private chat with that person)"
)


@dataclass(frozen=True)
class Conversation:
    """The one conversation a server serves, from its start flags."""

    group_id: str | None = None
    user_id: str | None = None
    sender_id: str | None = None
    bot_id: str | None = None
    bot_name: str | None = None

    def context(self) -> dict[str, Any]:
        """The conversation context of every call (as ``POST /v1/tools/call`` takes it).

        Raises ``ValueError`` when the flags name no conversation: the model is never the one
        to choose it.
        """
        user = self.user_id
        sender = self.sender_id or user
        context: dict[str, Any] = {"bot_id": self.bot_id, "bot_name": self.bot_name}
        if self.group_id:
            context.update(
                request_type="group", group_id=self.group_id, user_id=user, sender_id=sender
            )
        elif user or sender:
            context.update(request_type="private", user_id=user or sender, sender_id=sender)
        else:
            raise ValueError(NO_CONVERSATION)
        return {k: v for k, v in context.items() if v}


class BoundServer(MCPServer[Any]):
    """An MCP server that refuses an argument its tool does not declare.

    The SDK would drop it silently; the model would then take results of its own conversation
    for those of the group or person it tried to name.
    """

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        """Call a tool by name, its arguments first checked against its declared ones."""
        tool = self._tool_manager.get_tool(name)
        if tool is not None:
            declared = tool.parameters.get("properties", {})
            unknown = sorted(set(arguments) - set(declared))
            if unknown:
                raise ToolError(
                    f"{name} takes no argument {', '.join(unknown)} (it takes "
                    f"{', '.join(declared) or 'none'}): the conversation is the one this "
                    "server was started for, and no argument can name another"
                )
        return await super().call_tool(name, arguments, context)


def build_server(client: MemoriaClient, conversation: Conversation) -> MCPServer:
    """An MCP server whose tools forward to the Memoria API through ``client``, every call
    within ``conversation``."""
    context = conversation.context()
    server = BoundServer("memoria", instructions=INSTRUCTIONS, version="0.1.0", log_level="WARNING")

    async def forward(name: str, arguments: dict[str, Any]) -> str:
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
    ) -> str:
        arguments = {
            "query": query,
            "time_from": time_from,
            "time_to": time_to,
            "target_user_id": target_user_id,
            "top_k": top_k,
        }
        return await forward("cognitive_search_events", arguments)

    @server.tool(
        description="The profile of a user, of the current group, or of a member of the "
        "current group (Markdown). / 获取用户、群聊或群成员的侧写"
    )
    async def get_profile(
        entity_type: Annotated[Literal["user", "group", "member"], Field(description="whose")],
        entity_id: Annotated[str, Field(description="the user id or the group id")],
    ) -> str:
        arguments = {"entity_type": entity_type, "entity_id": entity_id}
        return await forward("cognitive_get_profile", arguments)

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
    ) -> str:
        arguments = {"query": query, "entity_type": entity_type, "top_k": top_k}
        return await forward("cognitive_search_profiles", arguments)

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
    ) -> str:
        arguments = {"query": query, "categories": categories, "top_k": top_k}
        return await forward("cognitive_search_memories", arguments)

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
    ) -> str:
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
            raise ToolError(
                f"a {chosen} memory needs the person: this server was started without "
                "--sender-id or --user-id"
            )
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
    ) -> str:
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

    Over HTTP the tools act with the tenant's key: without this, any process that can reach
    the port (every local user, a web page through the browser) could use them.
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
    conversation: Conversation,
    *,
    transport: Literal["stdio", "http"] = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
) -> None:
    """Serve the tools for ``conversation`` over stdio, or streamable HTTP at
    ``http://host:port/mcp`` to clients presenting ``token`` as a bearer token."""
    async with MemoriaClient(api_url, api_key) as client:
        server = build_server(client, conversation)
        if transport == "stdio":
            await server.run_stdio_async()
            return
        if not token:
            raise ValueError("the HTTP transport needs a client token")
        app = require_token(server.streamable_http_app(host=host), token)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning")
        await uvicorn.Server(config).serve()
