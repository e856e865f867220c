"""The bot's memory tools as OpenAI function definitions, and their execution.

A bot hands its LLM these definitions and forwards whatever the LLM calls to
``POST /v1/tools/call``; no glue code is needed on the bot's side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import ConversationContext, check_json
from service.db.engine import Database
from service.embedding import Embedder
from service.ends.schemas import OLDER_END_NAMES, EndRequest
from service.ends.service import accept_end
from service.errors import Invalid, NotFound, field_of
from service.llm.rerank import Reranker
from service.memories import service as memory_rules
from service.memories.schemas import MemorySearch
from service.profiles import service as profile_rules
from service.profiles.schemas import ProfileLookup, ProfileSearch
from service.recall.schemas import EventSearch
from service.recall.service import Reader, conversation_scope
from service.settings import Settings
from service.tenants.service import TenantContext


@dataclass(frozen=True)
class Tool:
    """One memory tool: the schema of the REST route it mirrors, and which of that schema's
    fields the model gives (the others are the call's conversation).

    The arguments are read by that schema, and the definition the model sees is cut from that
    schema's JSON schema, so a default, a limit or an older name cannot differ between
    ``POST /v1/tools/call`` and the REST route.
    """

    name: str
    description: str
    schema: type[BaseModel]
    arguments: tuple[str, ...]
    # Names the schema still reads but no longer advertises.
    older_names: tuple[str, ...] = ()

    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments: the schema's own, for these fields only."""
        full = self.schema.model_json_schema()
        definitions = full.get("$defs", {})
        properties = {k: _inline(full["properties"][k], definitions) for k in self.arguments}
        required = [k for k in full.get("required", []) if k in self.arguments]
        return {"type": "object", "properties": properties, "required": required}

    def definition(self) -> dict[str, Any]:
        """The OpenAI function-calling definition."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters(),
            },
        }

    def check_names(self, arguments: dict[str, Any]) -> None:
        """Refuse, by name, an argument the model may not give (the conversation's fields)."""
        for key in arguments:
            if key not in self.arguments and key not in self.older_names:
                raise Invalid(
                    f"{self.name} takes no argument {key!r} (it takes "
                    f"{', '.join(self.arguments)}); the conversation is the call's context",
                    field=f"arguments.{key}",
                )


def _inline(schema: Any, definitions: dict[str, Any]) -> Any:
    """``schema`` with every ``$ref`` to ``definitions`` replaced by what it names."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            named = _inline(definitions[ref.removeprefix("#/$defs/")], definitions)
            return {**named, **{k: v for k, v in schema.items() if k != "$ref"}}
        return {k: _inline(v, definitions) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_inline(v, definitions) for v in schema]
    return schema


TOOLS = (
    Tool(
        "cognitive_search_events",
        "搜索历史事件记忆，用于回忆之前发生过的事情（支持时间范围硬过滤 + 时间衰减加权排序） / "
        "Search past events to recall what happened (hard time-range filter, recency-weighted)",
        EventSearch,
        ("query", "target_user_id", "target_group_id", "top_k", "time_from", "time_to"),
        ("user_id", "group_id"),
    ),
    Tool(
        "cognitive_get_profile",
        "获取指定用户、群聊或群成员的侧写 / "
        "Get the profile of a user, a group, or a member of the current group",
        ProfileLookup,
        ("entity_type", "entity_id"),
    ),
    Tool(
        "cognitive_search_profiles",
        "语义搜索用户/群聊侧写，用于查找具有特定特征的用户或群 / "
        "Search profiles by meaning, to find people or groups with some trait",
        ProfileSearch,
        ("query", "entity_type", "group_id", "top_k", "min_relevance"),
    ),
    Tool(
        "cognitive_search_memories",
        "搜索当前会话可见的长期记忆（偏好、事实、画像、摘要） / "
        "Search the long-term memories visible in this conversation",
        MemorySearch,
        ("query", "categories", "top_k", "min_relevance"),
    ),
    Tool(
        "end",
        "结束本轮对话并交给记忆系统：memo 记录本轮做了什么（短句，可空）；"
        "observations 是针对当前新消息提取的新事实（0..N 条，可空） / "
        "End the turn and hand it to memory: memo = what you did this turn (short, may be "
        "empty); observations = new facts about people or the group from the new messages "
        "(0..N, may be empty)",
        EndRequest,
        ("memo", "observations", "shareable", "force"),
        OLDER_END_NAMES,
    ),
)
BY_NAME = {tool.name: tool for tool in TOOLS}
DEFINITIONS = [tool.definition() for tool in TOOLS]


def normalize(name: str) -> str:
    """``cognitive.search_events`` and ``cognitive_search_events`` name the same tool."""
    return name.strip().replace(".", "_")


async def call(
    name: str,
    arguments: dict[str, Any] | str,
    context: dict[str, Any] | None,
    *,
    session: AsyncSession,
    db: Database,
    tenant: TenantContext,
    embedder: Embedder,
    settings: Settings,
    reranker: Reranker | None = None,
) -> Any:
    """Execute one tool call within the caller's conversation.

    A call is checked like the REST route it mirrors: its arguments by the same schema (an
    unknown or malformed argument is a 422 naming it), its reach by the same rules. The
    conversation is the call's ``context`` only: the model's arguments cannot name another.
    """
    tool = normalize(name)
    if tool not in BY_NAME:
        raise NotFound(f"no tool named {name!r}; GET /v1/tools lists them")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            raise Invalid("arguments are not valid JSON", field="arguments") from None
        check_json(arguments, "arguments")
    if not isinstance(arguments, dict):
        raise Invalid("arguments must be an object", field="arguments")
    if not context:
        raise Invalid("a tool call needs the conversation context", field="context")
    conversation = _context(context)
    tenant = tenant.for_bot(conversation.bot_id)
    BY_NAME[tool].check_names(arguments)
    allow_cross = tenant.query.allow_cross_group_tools
    if tool == "cognitive_search_events":
        request = _validate(EventSearch, {**arguments, "context": conversation})
        reader = Reader(embedder, reranker, db)
        return (await reader.search_events(session, tenant, request)).model_dump(mode="json")
    if tool == "end":
        request = _end_request(conversation, arguments)
        return (await accept_end(db, tenant, request, settings)).model_dump(mode="json")
    if tool == "cognitive_get_profile":
        lookup: ProfileLookup = _validate(ProfileLookup, arguments)
        key = await profile_rules.visible_key(
            session, tenant.tenant_id, conversation, lookup, allow_cross=allow_cross
        )
        row = await profile_rules.find(session, tenant.tenant_id, key)
        if row is None:
            return {
                "found": False,
                "entity_type": lookup.entity_type,
                "entity_id": lookup.entity_id,
            }
        return {
            "found": True,
            "name": row["name"],
            "tags": row["tags"],
            "document": row["document"],
        }
    if tool == "cognitive_search_profiles":
        search: ProfileSearch = _validate(ProfileSearch, {**arguments, "context": conversation})
        rows = await profile_rules.search(
            session,
            tenant.tenant_id,
            search,
            await embedder.query(search.query),
            default_top_k=tenant.query.profile_top_k,
            allow_cross=allow_cross,
            calibration=embedder.calibration,
            lexical_weight=tenant.query.lexical_weight,
        )
        return [
            {
                "entity_type": r["entity_type"],
                "entity_id": r["entity_id"],
                "group_id": r["group_id"],
                "name": r["name"],
                "body": r["body"],
                "score": round(r["relevance"], 4),
            }
            for r in rows
        ]
    wanted: MemorySearch = _validate(MemorySearch, arguments)
    _, scope, _ = conversation_scope(conversation)
    found = await memory_rules.search_in_scope(
        session,
        tenant.tenant_id,
        scope,
        await embedder.query(wanted.query),
        # The tenant's default for tool calls, unless the model asked for a number.
        limit=wanted.top_k
        if "top_k" in wanted.model_fields_set
        else tenant.query.tool_default_top_k,
        categories=wanted.categories,
        calibration=embedder.calibration,
        min_relevance=wanted.min_relevance,
    )
    return [
        {
            "id": r["id"],
            "scope": r["scope"],
            "category": r["category"],
            "content": r["content"],
            "score": round(r["relevance"], 4),
        }
        for r in found
    ]


def _end_request(conversation: ConversationContext, arguments: dict[str, Any]) -> EndRequest:
    """``POST /v1/end``'s request for the call's conversation and the model's turn; an error
    is named under ``arguments`` when it is about the model's fields."""
    given = {**conversation.model_dump(mode="json", exclude_none=True), **arguments}
    try:
        return EndRequest.model_validate(given)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = error["loc"]
        ours = not loc or loc[0] in arguments or loc[0] in BY_NAME["end"].arguments
        where = "arguments" if ours else "context"
        raise Invalid(error["msg"], field=field_of(error, where)) from None


def _context(value: dict[str, Any]) -> ConversationContext:
    result: ConversationContext = _validate(ConversationContext, value, "context")
    return result


def _validate(model: Any, data: dict[str, Any], prefix: str = "arguments") -> Any:
    """A model from data, or ``Invalid`` naming the field under ``prefix``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise Invalid(error["msg"], field=field_of(error, prefix)) from None
