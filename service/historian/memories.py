"""Retrieve-Compare-Act (seed 003 §6): new information against the memories already held.

The historian retrieves the active memories of the conversation's scopes nearest to the new
information, shows them to the LLM with their ids, and lets it call ``add_memory``,
``update_memory``, ``delete_memory`` and the todo tools. Every call is validated (ids must be
among those shown, scopes must be the conversation's, content must be absolute); refusals go
back to the model with the reason. Without an LLM every observation becomes an ``add``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, tzinfo
from typing import Any

import numpy as np
from sqlalchemy import and_
from sqlalchemy.ext.asyncio import AsyncSession

from service.embedding import Embedder
from service.errors import Invalid
from service.historian.gate import gate
from service.historian.profiles import about_the_group, shared
from service.llm import ChatModel
from service.memories import repository
from service.memories import service as memories
from service.memories.models import CATEGORIES, SCOPES, Memory
from service.memories.repository import ScopeFilter
from service.privacy import pii
from service.settings import Settings
from service.todos import repository as todos

_PREFERENCE = re.compile(
    r"喜欢|偏好|不喜欢|讨厌|希望|想要|别再|不要|请叫|叫我|称呼|"
    r"\b(?:prefers?|likes?|loves?|hates?|dislikes?|don't|do not|wants? to be called|"
    r"call (?:him|her|me))\b",
    re.I,
)
_PROFILE = re.compile(
    r"是一名|是个|是一位|职业|工作|住在|来自|名字|昵称|年龄|岁|MBTI|"
    r"\b(?:works? as|is an?|lives? in|comes? from|name is|nickname|years old)\b",
    re.I,
)
_REMINDER = re.compile(r"提醒|remind|别忘了|记得要?|\bdon't forget\b", re.I)
_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})(?:\s*(\d{1,2}:\d{2}))?")


def guess_category(text: str) -> str:
    """The offline category: PREFERENCE, PROFILE or FACT by wording."""
    if _PREFERENCE.search(text):
        return "PREFERENCE"
    if _PROFILE.search(text):
        return "PROFILE"
    return "FACT"


def private_scope(text: str, original: str) -> str:
    """The scope of a fact told in a private chat: PRIVATE, unless the person says it may be
    known elsewhere and it is not sensitive (health, ids, contact data), then GLOBAL."""
    if (shared(original) or shared(text)) and not pii.sensitive(text):
        return "GLOBAL"
    return "PRIVATE"


def reminder_time(text: str, zone: tzinfo, default_hour: int) -> datetime | None:
    """The first absolute date (and time) in a rewritten text, as the trigger time."""
    match = _DATE.search(text)
    if match is None:
        return None
    day = date.fromisoformat(match.group(1))
    if match.group(2):
        hour, minute = (int(x) for x in match.group(2).split(":"))
        return datetime.combine(day, time(hour % 24, minute % 60), zone)
    return datetime.combine(day, time(default_hour), zone)


@dataclass
class Conversation:
    """Where new information comes from, and which scopes it may write."""

    key: str
    request_type: str
    group_id: str | None
    group_name: str | None
    speaker_id: str | None  # the person a first-hand observation is about (end jobs)
    speaker_name: str | None
    participants: dict[str, str | None]  # user id → name: whom memories may be bound to
    moment: datetime
    # Item index → who said it, where one batch holds several people (the message stream).
    speakers: dict[int, str] = field(default_factory=dict)

    @property
    def filter(self) -> ScopeFilter:
        """What this conversation may read and write."""
        if self.request_type == "private":
            return ScopeFilter(None, self.speaker_id, ("PRIVATE", "GLOBAL"))
        return ScopeFilter(self.group_id, None)

    def bind(self, scope: str, user_id: str | None) -> tuple[str | None, str | None]:
        """(user_id, group_id) of a new memory of ``scope`` about ``user_id``."""
        if scope == "GROUP":
            return None, self.group_id
        who = user_id or self.speaker_id
        if scope in ("GLOBAL", "PRIVATE"):
            return who, None
        return who, self.group_id


@dataclass
class Operation:
    """A validated change to apply when the job finishes."""

    tool: str
    args: dict[str, Any]


@dataclass
class Plan:
    """What the step decided, and what it refused."""

    operations: list[Operation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    calls: int = 0


def _tool(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


TOOLS = [
    _tool(
        "add_memory",
        "全新的事实、偏好或画像，且现有记忆中没有冲突的旧记忆时使用。Add a new memory.",
        {
            "content": {"type": "string", "description": "一句独立、绝对的陈述"},
            "scope": {"type": "string", "enum": list(SCOPES)},
            "category": {"type": "string", "enum": list(CATEGORIES)},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "user_id": {"type": "string", "description": "whom it is about (default: the speaker)"},
        },
        ["content", "scope", "category"],
    ),
    _tool(
        "update_memory",
        "信息纠正、补充或改变现有记忆时使用；memory_id 必须来自【现有记忆】。",
        {
            "memory_id": {"type": "integer"},
            "new_content": {"type": "string"},
            "reason": {"type": "string"},
        },
        ["memory_id", "new_content", "reason"],
    ),
    _tool(
        "delete_memory",
        "记忆不再成立（计划取消、事实过时、用户要求遗忘）时使用；记忆会失效但保留历史。",
        {"memory_id": {"type": "integer"}, "reason": {"type": "string"}},
        ["memory_id", "reason"],
    ),
    _tool(
        "add_todo",
        "需要在将来提醒或完成的事（如“明天提醒大家提交周报”）。",
        {
            "description": {"type": "string"},
            "trigger_time": {"type": "string", "description": "ISO 8601 with offset, or empty"},
            "assignee_id": {"type": "string"},
        },
        ["description"],
    ),
    _tool(
        "complete_todo",
        "待办已完成。",
        {"todo_id": {"type": "integer"}},
        ["todo_id"],
    ),
    _tool(
        "cancel_todo",
        "待办取消了。",
        {"todo_id": {"type": "integer"}},
        ["todo_id"],
    ),
]

SUMMARY_TOOL = _tool(
    "write_summary",
    "本群某一天讨论内容的一句话摘要（如“2026-03-01 群里主要讨论了 Koin 依赖注入”）。",
    {"day": {"type": "string", "description": "YYYY-MM-DD"}, "content": {"type": "string"}},
    ["day", "content"],
)

_SYSTEM = """你是一个专业的群聊记忆管理员。根据最新信息，通过调用工具维护长期记忆数据库。
You maintain the long-term memory of a chat bot by calling tools.

1. 分析新信息与【现有记忆】之间的关系。
2. 全新信息调用 add_memory；与现有记忆冲突或是状态更新，调用 update_memory（必须使用对应的 ID）；
   计划取消或事实失效，调用 delete_memory（必须使用对应的 ID）。
   细微的语义变化（如称呼变化）也是更新。
3. 内容必须是独立、绝对的陈述：写出人名和 ID、绝对日期，不用代词和相对时间。
4. 作用域 scope：群里得知的信息默认 GROUP（关于整个群）或 MEMBER_IN_GROUP（关于某人在本群）。
   私聊里得知的信息默认 PRIVATE（只在这个私聊可见）；只有用户明确说可以让别处知道、且不敏感时
   才用 GLOBAL。健康、证件号、联系方式等敏感信息永远不写 GLOBAL。
5. 将来要提醒或要做的事用 add_todo（trigger_time 用绝对时间）；对话说明待办完成或取消时用
   complete_todo / cancel_todo。
6. 没有值得记的就不调用任何工具。Call nothing if nothing is worth remembering."""


@dataclass
class MemoryKeeper:
    """The Retrieve-Compare-Act step of one job."""

    embedder: Embedder
    llm: ChatModel | None
    settings: Settings

    async def retrieve(
        self,
        session: AsyncSession,
        tenant_id: Any,
        conversation: Conversation,
        vectors: list[np.ndarray[Any, Any]],
    ) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
        """The active memories nearest to each new item (this conversation's scopes only),
        and the conversation's pending todos."""
        found: dict[int, dict[str, Any]] = {}
        active = and_(conversation.filter.where(), Memory.is_active.is_(True))
        for vector in vectors:
            for row in await repository.nearest(
                session,
                tenant_id,
                vector,
                where=active,
                limit=self.settings.cognitive.memory.retrieve_top_k,
            ):
                found.setdefault(int(row["id"]), row)
        pending = await todos.listing(
            session,
            tenant_id,
            status="PENDING",
            conversation_key=conversation.key,
            due_before=None,
            limit=50,
        )
        return found, pending

    async def decide(
        self,
        conversation: Conversation,
        items: list[tuple[str, str]],
        known: dict[int, dict[str, Any]],
        pending: list[dict[str, Any]],
        *,
        summaries: bool = False,
    ) -> Plan:
        """What to change: the LLM's validated tool calls, or one add per item offline.

        ``items`` are (absolute text, original text) pairs.
        """
        if self.llm is None:
            return self._offline(conversation, items)
        return await self._llm(conversation, items, known, pending, summaries)

    def _offline(self, conversation: Conversation, items: list[tuple[str, str]]) -> Plan:
        plan = Plan()
        settings = self.settings.cognitive.memory
        for index, (text, original) in enumerate(items):
            if gate(text):
                plan.notes.append(f"not remembered (still relative): {text}")
                continue
            if _REMINDER.search(original):
                trigger = reminder_time(
                    text, conversation.moment.tzinfo or _utc(), settings.todo_default_hour
                )
                plan.operations.append(
                    Operation(
                        "add_todo",
                        {
                            "description": text,
                            "trigger_time": trigger.isoformat() if trigger else None,
                            "assignee_id": None,
                            "item": index,
                        },
                    )
                )
                continue
            # The fact is about who said it: in a batch of several people's messages, the
            # sender of its message (not the group, where everyone would read it).
            in_group = conversation.request_type == "group"
            who = (
                conversation.speakers.get(index) if in_group else None
            ) or conversation.speaker_id
            if conversation.request_type == "private":
                scope = private_scope(text, original)
            else:
                scope = "GROUP" if about_the_group(text) else "MEMBER_IN_GROUP"
            if scope != "GROUP" and not who:
                scope = "GROUP" if conversation.group_id else scope
            plan.operations.append(
                Operation(
                    "add_memory",
                    {
                        "content": text,
                        "scope": scope,
                        "category": guess_category(original),
                        "confidence": 0.6,
                        "user_id": who if scope != "GROUP" else None,
                        "item": index,
                    },
                )
            )
        return plan

    async def _llm(
        self,
        conversation: Conversation,
        items: list[tuple[str, str]],
        known: dict[int, dict[str, Any]],
        pending: list[dict[str, Any]],
        summaries: bool,
    ) -> Plan:
        assert self.llm is not None
        plan = Plan()
        tools = [*TOOLS, SUMMARY_TOOL] if summaries else list(TOOLS)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": _prompt(conversation, items, known, pending)},
        ]
        todo_ids = {int(t["id"]) for t in pending}
        sharing = any(shared(original) for _, original in items)
        for _ in range(self.settings.cognitive.memory.max_tool_turns):
            result = await self.llm.chat(
                messages, tools=tools, tool_choice="auto", purpose="historian_memory"
            )
            plan.calls += 1
            if not result.tool_calls:
                break
            messages.append(result.as_message())
            refused = 0
            for call in result.tool_calls:
                try:
                    operation = self._validate(
                        call.name, call.arguments, conversation, known, todo_ids, sharing
                    )
                except Invalid as exc:
                    refused += 1
                    reply = f"refused: {exc.message}"
                    plan.notes.append(f"{call.name}: {reply}")
                else:
                    plan.operations.append(operation)
                    reply = "ok"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": reply})
            if not refused:
                break  # everything was accepted: no second turn needed
        return plan

    def _validate(
        self,
        name: str,
        args: dict[str, Any] | None,
        conversation: Conversation,
        known: dict[int, dict[str, Any]],
        todo_ids: set[int],
        sharing: bool = False,
    ) -> Operation:
        if args is None:
            raise Invalid("the arguments are not valid JSON")
        if name == "add_memory":
            content = _absolute(args.get("content"), "content")
            scope = str(args.get("scope", "")).upper()
            if scope not in SCOPES:
                raise Invalid(f"scope must be one of {', '.join(SCOPES)}")
            category = str(args.get("category", "FACT")).upper()
            if category not in CATEGORIES:
                raise Invalid(f"category must be one of {', '.join(CATEGORIES)}")
            user_id = args.get("user_id")
            user_id = str(user_id) if user_id not in (None, "") else None
            group_arg = args.get("group_id")
            if group_arg not in (None, "") and str(group_arg) != conversation.group_id:
                raise Invalid(f"this conversation cannot write memories of group {group_arg}")
            if user_id is not None and user_id not in conversation.participants:
                raise Invalid(f"user {user_id} is not part of this conversation")
            bound_user, bound_group = conversation.bind(scope, user_id)
            if not conversation.filter.allows(scope, bound_group, bound_user):
                raise Invalid(f"a {conversation.request_type} chat cannot write {scope} memories")
            if scope == "GLOBAL" and conversation.request_type == "private" and not sharing:
                raise Invalid(
                    "what is said in a private chat stays PRIVATE unless the person says it may "
                    "be known elsewhere"
                )
            if scope == "GLOBAL" and pii.sensitive(content):
                raise Invalid(
                    "a GLOBAL memory is read in every group; health, id and contact data stay "
                    "PRIVATE or MEMBER_IN_GROUP"
                )
            confidence = _number(args.get("confidence", 0.7))
            return Operation(
                name,
                {
                    "content": content,
                    "scope": scope,
                    "category": category,
                    "confidence": confidence,
                    "user_id": bound_user,
                },
            )
        if name in ("update_memory", "delete_memory"):
            memory_id = _integer(args.get("memory_id"))
            if memory_id not in known:
                raise Invalid(
                    f"memory {memory_id} is not among the existing memories shown; use one of "
                    f"{sorted(known)} or add_memory"
                )
            reason = str(args.get("reason") or "")[:500]
            if name == "update_memory":
                content = _absolute(args.get("new_content"), "new_content")
                return Operation(
                    name, {"memory_id": memory_id, "new_content": content, "reason": reason}
                )
            return Operation(name, {"memory_id": memory_id, "reason": reason})
        if name == "add_todo":
            description = _absolute(args.get("description"), "description")
            trigger = args.get("trigger_time")
            when = None
            if trigger not in (None, ""):
                try:
                    when = datetime.fromisoformat(str(trigger))
                except ValueError:
                    raise Invalid("trigger_time must be an ISO 8601 time") from None
                if when.tzinfo is None:
                    when = when.replace(tzinfo=conversation.moment.tzinfo)
            assignee = args.get("assignee_id")
            return Operation(
                name,
                {
                    "description": description,
                    "trigger_time": when.isoformat() if when else None,
                    "assignee_id": str(assignee) if assignee not in (None, "") else None,
                },
            )
        if name in ("complete_todo", "cancel_todo"):
            todo_id = _integer(args.get("todo_id"))
            if todo_id not in todo_ids:
                raise Invalid(f"todo {todo_id} is not among the pending todos shown")
            return Operation(name, {"todo_id": todo_id})
        if name == "write_summary":
            try:
                day = date.fromisoformat(str(args.get("day")))
            except ValueError:
                raise Invalid("day must be YYYY-MM-DD") from None
            content = _absolute(args.get("content"), "content")
            return Operation(name, {"day": day.isoformat(), "content": content})
        raise Invalid(f"unknown tool {name}")

    async def apply(
        self,
        session: AsyncSession,
        tenant_id: Any,
        conversation: Conversation,
        plan: Plan,
        cause: dict[str, Any],
        evidence: dict[str, Any],
        item_evidence: list[dict[str, Any]] | None = None,
    ) -> dict[str, int]:
        """Apply the plan in the caller's transaction; each change with its history row.

        ``item_evidence``: where each item came from, for operations made from one item.
        """
        settings = self.settings.cognitive.memory
        texts = [
            op.args.get("content") or op.args.get("new_content")
            for op in plan.operations
            if op.tool in ("add_memory", "update_memory", "write_summary")
        ]
        vectors = iter(await self.embedder.passages([t for t in texts if t]))
        counts: Counter[str] = Counter()
        for op in plan.operations:
            args = op.args
            source = evidence
            if item_evidence is not None and isinstance(args.get("item"), int):
                source = item_evidence[args["item"]]
            try:
                if (
                    op.tool == "add_memory"
                    and args["scope"] == "GLOBAL"
                    and pii.sensitive(args["content"])
                ):
                    # Sensitive facts never go to GLOBAL: they stay where they were said, with
                    # the member in a group, in the private chat otherwise.
                    private = conversation.group_id is None
                    args = {**args, "scope": "PRIVATE" if private else "MEMBER_IN_GROUP"}
                    plan.notes.append(f"add_memory: sensitive, kept as {args['scope']}")
                if op.tool == "add_memory":
                    user_id, group_id = conversation.bind(args["scope"], args.get("user_id"))
                    _, created = await memories.add(
                        session,
                        tenant_id,
                        scope=args["scope"],
                        user_id=user_id,
                        group_id=group_id,
                        category=args["category"],
                        content=args["content"],
                        vector=next(vectors),
                        settings=settings,
                        cause=cause,
                        confidence=float(args.get("confidence") or 0.5),
                        valid_from=conversation.moment,
                        evidence=source,
                    )
                    counts["added" if created else "duplicates"] += 1
                elif op.tool == "update_memory":
                    await memories.change(
                        session,
                        tenant_id,
                        args["memory_id"],
                        cause=cause,
                        reason=args.get("reason"),
                        content=args["new_content"],
                        vector=next(vectors),
                    )
                    counts["updated"] += 1
                elif op.tool == "delete_memory":
                    await memories.deactivate(
                        session,
                        tenant_id,
                        args["memory_id"],
                        cause=cause,
                        reason=args.get("reason"),
                        valid_to=conversation.moment,
                    )
                    counts["deactivated"] += 1
                elif op.tool == "write_summary":
                    assert conversation.group_id is not None
                    await memories.set_day_summary(
                        session,
                        tenant_id,
                        conversation.group_id,
                        date.fromisoformat(args["day"]),
                        args["content"],
                        next(vectors),
                        cause,
                    )
                    counts["summaries"] += 1
                elif op.tool == "add_todo":
                    when = args.get("trigger_time")
                    await todos.insert(
                        session,
                        tenant_id,
                        {
                            "conversation_key": conversation.key,
                            "group_id": conversation.group_id,
                            "user_id": conversation.speaker_id
                            if conversation.request_type == "private"
                            else None,
                            "creator_id": conversation.speaker_id,
                            "assignee_id": args.get("assignee_id"),
                            "description": args["description"],
                            "trigger_time": datetime.fromisoformat(when) if when else None,
                            "evidence": source,
                        },
                    )
                    counts["todos_added"] += 1
                elif op.tool in ("complete_todo", "cancel_todo"):
                    status = "COMPLETED" if op.tool == "complete_todo" else "CANCELLED"
                    await todos.update(session, tenant_id, args["todo_id"], {"status": status})
                    counts[f"todos_{status.lower()}"] += 1
            except Invalid as exc:
                plan.notes.append(f"{op.tool}: skipped at apply: {exc.message}")
        return dict(counts)


def day_summary(day: date, texts: list[str], group_name: str | None) -> str | None:
    """The offline summary of a group's day: its most repeated words (no LLM)."""
    counts: Counter[str] = Counter()
    for text in texts:
        seen: set[str] = set()
        for term in _terms(text):
            if term not in seen:
                counts[term] += 1
                seen.add(term)
    top: list[str] = []
    for term, n in counts.most_common(20):
        if n < 2 or len(top) == 5:
            break
        # "湖划" out of "西湖划船": the seam between two words already chosen is no word.
        seam = (
            len(term) == 2
            and any(t.endswith(term[0]) for t in top)
            and any(t.startswith(term[1]) for t in top)
        )
        if not seam:
            top.append(term)
    where = f"群「{group_name}」" if group_name else "群里"
    if not top:
        return f"{day.isoformat()} {where}有 {len(texts)} 条消息，话题零散"
    return f"{day.isoformat()} {where}主要讨论了：{'、'.join(top)}（{len(texts)} 条消息）"


_STOP_CHARS = set(
    "的了是我你他她它在有和就不都也很这那吗呢吧啊哦嗯呀么个一上下人们到说要会去来还没么好把被给让"
)
_EN_STOP = {
    "the",
    "and",
    "for",
    "that",
    "this",
    "with",
    "have",
    "just",
    "what",
    "your",
    "you",
    "are",
    "was",
    "but",
    "not",
    "all",
    "can",
    "will",
    "they",
    "about",
    "from",
    "there",
    "been",
    "would",
}


def _terms(text: str) -> list[str]:
    terms = [
        w.lower() for w in re.findall(r"[A-Za-z][A-Za-z'-]{3,}", text) if w.lower() not in _EN_STOP
    ]
    for run in re.findall(r"[\u4e00-\u9fff]+", text):
        terms.extend(
            run[i : i + 2]
            for i in range(len(run) - 1)
            if run[i] not in _STOP_CHARS and run[i + 1] not in _STOP_CHARS
        )
    return terms


def _prompt(
    conversation: Conversation,
    items: list[tuple[str, str]],
    known: dict[int, dict[str, Any]],
    pending: list[dict[str, Any]],
) -> str:
    lines = [f"当前时间 Now: {conversation.moment:%Y-%m-%d %H:%M %z}"]
    if conversation.request_type == "group":
        lines.append(
            f"会话 Conversation: 群 {conversation.group_name or ''}({conversation.group_id})"
        )
    else:
        lines.append("会话 Conversation: 私聊 private chat (PRIVATE; GLOBAL only if shared)")
    people = [f"{name or '?'}({uid})" for uid, name in conversation.participants.items()]
    lines.append("参与者 Participants: " + ", ".join(people))
    if conversation.speaker_id:
        lines.append(
            "说话人 Speaker (default user_id): "
            f"{conversation.speaker_name or ''}({conversation.speaker_id})"
        )
    lines.append("【现有记忆】Existing memories:")
    for memory_id, row in sorted(known.items()):
        lines.append(f"[ID: {memory_id}] ({row['scope']}, {row['category']}) {row['content']}")
    if not known:
        lines.append("(none)")
    lines.append("【待办】Pending todos:")
    for todo in pending:
        when = todo["trigger_time"].isoformat() if todo["trigger_time"] else "untimed"
        lines.append(f"[TODO: {todo['id']}] {todo['description']} ({when})")
    if not pending:
        lines.append("(none)")
    lines.append("【新信息】New information:")
    for text, original in items:
        lines.append(json.dumps({"text": text, "original": original}, ensure_ascii=False))
    return "\n".join(lines)


def _absolute(value: Any, name: str) -> str:
    text = memories.check_content(str(value or ""), field=name)
    hits = gate(text)
    if hits:
        words = ", ".join(h.text for h in hits)
        raise Invalid(f"{name} must be absolute; replace the relative words: {words}")
    return text


def _integer(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise Invalid(f"not an id: {value!r}") from None


def _number(value: Any) -> float:
    try:
        return min(max(float(value), 0.0), 1.0)
    except (TypeError, ValueError):
        return 0.7


def _utc() -> tzinfo:
    return UTC
