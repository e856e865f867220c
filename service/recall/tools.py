"""The bot's memory tools as OpenAI function definitions, and their execution.

A bot hands its LLM these definitions and forwards whatever the LLM calls to
``POST /v1/tools/call``; no glue code is needed on the bot's side.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from service.context import ConversationContext, check_json
from service.db.engine import Database
from service.embedding import Embedder
from service.ends.schemas import EndRequest
from service.ends.service import accept_end
from service.errors import Invalid, NotFound, field_of
from service.llm.rerank import Reranker
from service.memories import service as memory_rules
from service.profiles import service as profile_rules
from service.profiles.schemas import ProfileLookup, ProfileSearch
from service.recall.schemas import EndArguments, EventSearch, MemoryArguments
from service.recall.service import Reader, conversation_scope
from service.settings import Settings
from service.tenants.service import TenantContext


def _function(
    name: str, zh: str, en: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{zh} / {en}",
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def _p(kind: str, zh: str, en: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": f"{zh} / {en}", **extra}


DEFINITIONS = [
    _function(
        "cognitive_search_events",
        "搜索历史事件记忆，用于回忆之前发生过的事情（支持时间范围硬过滤 + 时间衰减加权排序）",
        "Search past events to recall what happened (hard time-range filter, recency-weighted)",
        {
            "query": _p("string", "搜索关键词或语义描述", "keywords or a description"),
            "target_user_id": _p("string", "限定用户 ID", "only events of this user"),
            "target_group_id": _p("string", "限定群 ID", "only events of this group"),
            "top_k": _p("integer", "返回条数", "how many results", minimum=1, maximum=200),
            "time_from": _p("string", "起始时间（ISO 格式）", "start time, ISO 8601"),
            "time_to": _p("string", "截止时间（ISO 格式）", "end time, ISO 8601"),
        },
        ["query"],
    ),
    _function(
        "cognitive_get_profile",
        "获取指定用户、群聊或群成员的侧写",
        "Get the profile of a user, a group, or a member of the current group",
        {
            "entity_type": _p(
                "string",
                "user、group 或 member",
                "user, group or member",
                enum=["user", "group", "member"],
            ),
            "entity_id": _p("string", "用户 ID 或群 ID", "user id or group id"),
        },
        ["entity_type", "entity_id"],
    ),
    _function(
        "cognitive_search_profiles",
        "语义搜索用户/群聊侧写，用于查找具有特定特征的用户或群",
        "Search profiles by meaning, to find people or groups with some trait",
        {
            "query": _p("string", "搜索关键词", "what to look for"),
            "entity_type": _p(
                "string", "限定类型", "only this kind", enum=["user", "group", "member"]
            ),
            "top_k": _p(
                "integer",
                "返回条数（默认 8）",
                "how many results (default 8)",
                minimum=1,
                maximum=200,
            ),
        },
        ["query"],
    ),
    _function(
        "cognitive_search_memories",
        "搜索当前会话可见的长期记忆（偏好、事实、画像、摘要）",
        "Search the long-term memories visible in this conversation",
        {
            "query": _p("string", "搜索内容", "what to look for"),
            "categories": {
                "type": "array",
                "items": {"type": "string", "enum": ["PROFILE", "PREFERENCE", "FACT", "SUMMARY"]},
                "description": "限定类别 / only these categories",
            },
            "top_k": _p("integer", "返回条数", "how many results", minimum=1, maximum=200),
        },
        ["query"],
    ),
    _function(
        "end",
        "结束本轮对话并交给记忆系统：memo 记录本轮做了什么（短句，可空）；"
        "observations 是针对当前新消息提取的新事实（0..N 条，可空）",
        "End the turn and hand it to memory: memo = what you did this turn (short, may be "
        "empty); observations = new facts about people or the group from the new messages "
        "(0..N, may be empty)",
        {
            "memo": _p("string", "本轮做了什么", "what you did this turn"),
            "observations": {
                "type": "array",
                "items": {"type": "string"},
                "description": "新观察到的事实，每条一句 / new facts, one sentence each",
            },
            "shareable": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0},
                "description": (
                    "本人明确同意让别处知道的 observations 序号（从 0 起）；其余只留在本会话 / "
                    "numbers (from 0) of the observations the person explicitly lets be known "
                    "beyond this chat; every other one stays where it was said"
                ),
            },
            "force": _p(
                "boolean", "即使仍有相对词也直接入库", "store even if relative words remain"
            ),
        },
        [],
    ),
]
_NAMES = {d["function"]["name"] for d in DEFINITIONS}


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
    if tool not in _NAMES:
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
    allow_cross = tenant.query.allow_cross_group_tools
    if tool == "cognitive_search_events":
        _no_context(arguments)
        request = _validate(EventSearch, {**arguments, "context": conversation})
        reader = Reader(embedder, reranker, db)
        return (await reader.search_events(session, tenant, request)).model_dump(mode="json")
    if tool == "end":
        turn: EndArguments = _validate(EndArguments, arguments)
        request = _validate(
            EndRequest,
            {**conversation.model_dump(mode="json", exclude_none=True), **turn.model_dump()},
            "context",
        )
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
        _no_context(arguments)
        search: ProfileSearch = _validate(ProfileSearch, {**arguments, "context": conversation})
        rows = await profile_rules.search(
            session,
            tenant.tenant_id,
            search,
            await embedder.query(search.query),
            default_top_k=tenant.query.profile_top_k,
            allow_cross=allow_cross,
        )
        return [
            {
                "entity_type": r["entity_type"],
                "entity_id": r["entity_id"],
                "group_id": r["group_id"],
                "name": r["name"],
                "body": r["body"],
                "score": round(float(r["score"]), 4),
            }
            for r in rows
        ]
    wanted: MemoryArguments = _validate(MemoryArguments, arguments)
    _, scope, _ = conversation_scope(conversation)
    found = await memory_rules.search_in_scope(
        session,
        tenant.tenant_id,
        scope,
        await embedder.query(wanted.query),
        limit=wanted.top_k or tenant.query.tool_default_top_k,
        categories=wanted.categories,
    )
    return [
        {
            "id": r["id"],
            "scope": r["scope"],
            "category": r["category"],
            "content": r["content"],
            "score": round(float(r["score"]), 4),
        }
        for r in found
    ]


def _no_context(arguments: dict[str, Any]) -> None:
    """The model cannot name the conversation: that is the call's ``context``."""
    if "context" in arguments:
        raise Invalid(
            "the conversation comes from the call's context, not from the arguments",
            field="arguments.context",
        )


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
