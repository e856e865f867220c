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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import httpx
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, InputRequiredResult, TextContent
from pydantic import Field
from starlette.types import ASGIApp, Receive, Scope, Send

from service.client import MemoriaAPIError, MemoriaClient
from service.recall import tools

T = TypeVar("T")

INSTRUCTIONS = (
    "Long-term memory of a chat bot. Look things up with search_memories, search_events, "
    "get_profile and search_profiles; record a durable fact with add_memory; at the end of a "
    "turn call end with what you did (memo) and what you learned (observations). Every tool "
    "works within the one conversation this server was started for (a group or a private "
    "chat); no argument names another."
)


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._forwarded: dict[str, tuple[Forward, tuple[str, ...]]] = {}

    def forward(self, name: str, api_name: str, description: str, forward: Forward) -> None:
        """Offer the API's tool ``api_name`` as ``name``: its schema listed, its arguments
        sent on as given, for the API to read by that same schema."""

        async def listed() -> str:  # never called: ``call_tool`` forwards
            raise NotImplementedError

        self.add_tool(listed, name=name, description=description, structured_output=False)
        registered = self._tool_manager.get_tool(name)
        assert registered is not None
        registered.parameters = forwarded_parameters(api_name)
        # An older name is read as the API reads it, unless it names a conversation.
        older = tools.BY_NAME[api_name].older_names
        self._forwarded[name] = (
            forward,
            tuple(n for n in older if n not in ("group_id", "user_id")),
        )

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        """Call a tool by name, its arguments first checked against its declared ones."""
        tool = self._tool_manager.get_tool(name)
        forward, older = self._forwarded.get(name, (None, ()))
        if tool is not None:
            declared = tool.parameters.get("properties", {})
            unknown = sorted(set(arguments) - set(declared) - set(older))
            if unknown:
                raise ToolError(
                    f"{name} takes no argument {', '.join(unknown)} (it takes "
                    f"{', '.join(declared) or 'none'}): the conversation is the one this "
                    "server was started for, and no argument can name another"
                )
        if forward is not None:
            return CallToolResult(content=[TextContent(type="text", text=await forward(arguments))])
        return await super().call_tool(name, arguments, context)


# The tools a model calls through ``POST /v1/tools/call``, under their MCP names. Their
# arguments are that route's (one schema for every surface), less those that name a group:
# the conversation is the one the server was started for.
FORWARDED = {
    "search_events": (
        "cognitive_search_events",
        "Search past events of this conversation by meaning, optionally within a time range "
        "(ISO 8601); recent events rank higher. / 搜索历史事件记忆",
    ),
    "get_profile": (
        "cognitive_get_profile",
        "The profile of a user, of the current group, or of a member of the current group "
        "(Markdown). / 获取用户、群聊或群成员的侧写",
    ),
    "search_profiles": (
        "cognitive_search_profiles",
        "Find profiles (people, groups) by meaning, e.g. a trait or an interest. / 语义搜索侧写",
    ),
    "search_memories": (
        "cognitive_search_memories",
        "Search the long-term memories visible in this conversation (preferences, facts, "
        "profile traits, summaries). / 搜索当前会话可见的长期记忆",
    ),
    "end": (
        "end",
        "End the turn and hand it to memory: memo = what you did this turn (short, may be "
        "empty); observations = new facts about people or the group, one sentence each. "
        "/ 结束本轮对话并交给记忆系统",
    ),
}
NAMES_A_GROUP = ("group_id", "target_group_id")


def forwarded_parameters(api_name: str) -> dict[str, Any]:
    """The JSON schema an MCP client sees for a forwarded tool: the API's, less the
    arguments that name a group."""
    parameters = tools.BY_NAME[api_name].parameters()
    properties = parameters["properties"]
    return {
        **parameters,
        "properties": {k: v for k, v in properties.items() if k not in NAMES_A_GROUP},
        "required": [k for k in parameters["required"] if k not in NAMES_A_GROUP],
    }


Forward = Callable[[dict[str, Any]], Awaitable[str]]


def _forwarder(client: MemoriaClient, api_name: str, context: dict[str, Any]) -> Forward:
    async def forward(arguments: dict[str, Any]) -> str:
        given = {k: v for k, v in arguments.items() if v is not None}
        result = await _api(client.call_tool(api_name, given, context))
        return result.content

    return forward


def build_server(client: MemoriaClient, conversation: Conversation) -> MCPServer:
    """An MCP server whose tools forward to the Memoria API through ``client``, every call
    within ``conversation``."""
    context = conversation.context()
    server = BoundServer("memoria", instructions=INSTRUCTIONS, version="0.1.0", log_level="WARNING")
    for name, (api_name, description) in FORWARDED.items():
        server.forward(name, api_name, description, _forwarder(client, api_name, context))

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
