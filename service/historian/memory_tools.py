"""The memory step's tools, one ``Tool`` each: its JSON schema for the model, how its
arguments are checked, and how an accepted call is applied.

``TOOLS`` (and ``SUMMARY_TOOL`` for group chats) are what the model is offered; ``REGISTRY``
finds the tool of a call by name, so the schemas and the dispatch cannot disagree.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.context import in_range
from service.errors import Invalid
from service.historian.conversation import Conversation, Operation
from service.historian.gate import gate
from service.historian.standing import slot_of
from service.memories import service as memories
from service.memories.models import CATEGORIES, SCOPES
from service.settings import MemorySettings
from service.todos import service as todos
from service.visibility import derive


@dataclass(frozen=True)
class Scene:
    """What a tool call is checked against: the conversation and what the model was shown."""

    conversation: Conversation
    known: dict[int, dict[str, Any]]  # memory id → the memory shown
    todo_ids: set[int]  # the pending todos shown
    # The tools the model was offered: a call of another one (write_summary in a private
    # chat, which has no group to summarize) is refused like an unknown tool.
    offered: frozenset[str] = field(default_factory=lambda: frozenset(t.name for t in TOOLS))


@dataclass
class Writing:
    """Where an accepted call is applied: the job's transaction and the change's provenance."""

    session: AsyncSession
    tenant_id: Any
    conversation: Conversation
    settings: MemorySettings
    cause: dict[str, Any]
    evidence: dict[str, Any]
    vector: Any = None  # the passage vector of the tool's ``embeds`` text
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Tool:
    """One memory tool: schema, argument check, and the change it makes."""

    name: str
    description: str
    properties: dict[str, Any]
    required: tuple[str, ...]
    check: Callable[[dict[str, Any], Scene], dict[str, Any]]  # raises ``Invalid``
    apply: Callable[[Writing, dict[str, Any]], Awaitable[str]]  # returns what it counts as
    embeds: str | None = None  # the argument whose text gets a vector before applying

    def schema(self) -> dict[str, Any]:
        """The OpenAI function definition the model is offered."""
        parameters = {"type": "object", "properties": self.properties, "required": [*self.required]}
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
            },
        }

    def validate(self, args: dict[str, Any], scene: Scene) -> Operation:
        """The call as an operation to apply when the job finishes, or ``Invalid``."""
        return Operation(self.name, self.check(args, scene))


def absolute(value: Any, name: str) -> str:
    """A text argument that must be an absolute statement (no relative words left)."""
    text = memories.check_content(str(value or ""), field=name)
    hits = gate(text)
    if hits:
        words = ", ".join(h.text for h in hits)
        raise Invalid(f"{name} must be absolute; replace the relative words: {words}")
    return text


def _integer(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # JSON's 1e999 is infinity
        raise Invalid(f"not an id: {value!r}") from None


def _number(value: Any) -> float:
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf if value > 0 else -math.inf
    except (TypeError, ValueError):
        return 0.7
    # NaN passes min and max as it is, and would be stored as the memory's confidence.
    return 0.7 if math.isnan(number) else min(max(number, 0.0), 1.0)


def _reason(value: Any) -> str:
    # Kept in the memory's history, whose text holds no NUL: one failed the job's write.
    return str(value or "").replace("\x00", "")[:500]


def _shown_memory(args: dict[str, Any], scene: Scene) -> int:
    memory_id = _integer(args.get("memory_id"))
    if memory_id not in scene.known:
        raise Invalid(
            f"memory {memory_id} is not among the existing memories shown; use one of "
            f"{sorted(scene.known)} or add_memory"
        )
    return memory_id


def _shown_todo(args: dict[str, Any], scene: Scene) -> dict[str, Any]:
    todo_id = _integer(args.get("todo_id"))
    if todo_id not in scene.todo_ids:
        raise Invalid(f"todo {todo_id} is not among the pending todos shown")
    return {"todo_id": todo_id}


def _participant(value: Any, scene: Scene, what: str) -> str | None:
    """A person id the model gave: one of the conversation's participants, or none given."""
    if value in (None, ""):
        return None
    person = str(value)
    if person not in scene.conversation.participants:
        # Not listed again: the prompt shows them, and an extraction may have hundreds.
        raise Invalid(f"{what} {person} is not part of this conversation; see Participants")
    return person


def _item_number(item: Any) -> int | None:
    """The number of the new item a call names, if it names one."""
    if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
        return item
    if isinstance(item, str) and item.strip().isdecimal() and len(item) < 10:
        return int(item)
    return None


def _check_global(content: str, item: Any, scene: Scene) -> int:
    """What a GLOBAL memory may say: it is read in every conversation of its person, so it
    is made only from an item the person marked shareable, named by the call, and never
    holds sensitive data. The item's number."""
    shareable = scene.conversation.shareable
    number = _item_number(item)
    if number is None or number not in shareable:
        marked = ", ".join(str(n) for n in sorted(shareable)) or "none"
        raise Invalid(
            "a GLOBAL memory is made only from a new item the person marked shareable, "
            f"named by item (marked: {marked}); what else is said stays where it was said"
        )
    person = scene.conversation.speaker_id
    if derive(scene.conversation.key, person, marked=True, text=content).scope != "GLOBAL":
        raise Invalid(
            "a GLOBAL memory is read in every group; health, id and contact data stay "
            "PRIVATE or MEMBER_IN_GROUP"
        )
    return number


# The new item a change is made from; a GLOBAL memory must name one marked shareable.
_ITEM = {
    "type": "integer",
    "minimum": 0,
    "description": "新信息的 item 序号 / the number of the new item it is made from",
}


# -- add_memory ---------------------------------------------------------------------------


def _check_add_memory(args: dict[str, Any], scene: Scene) -> dict[str, Any]:
    conversation = scene.conversation
    content = absolute(args.get("content"), "content")
    scope = str(args.get("scope", "")).upper()
    if scope not in SCOPES:
        raise Invalid(f"scope must be one of {', '.join(SCOPES)}")
    category = str(args.get("category", "FACT")).upper()
    if category not in CATEGORIES:
        raise Invalid(f"category must be one of {', '.join(CATEGORIES)}")
    group_arg = args.get("group_id")
    if group_arg not in (None, "") and str(group_arg) != conversation.group_id:
        raise Invalid(f"this conversation cannot write memories of group {group_arg}")
    user_id = _participant(args.get("user_id"), scene, "user")
    bound_user, bound_group = conversation.bind(scope, user_id)
    if not conversation.filter.allows(scope, bound_group, bound_user):
        raise Invalid(f"a {conversation.request_type} chat cannot write {scope} memories")
    checked: dict[str, Any] = {
        "content": content,
        "scope": scope,
        "category": category,
        "confidence": _number(args.get("confidence", 0.7)),
        "user_id": bound_user,
    }
    if scope == "GLOBAL":
        checked["item"] = _check_global(content, args.get("item"), scene)
    elif _item_number(args.get("item")) is not None:
        # Its provenance is that item alone: an erasure of whoever said another item of the
        # batch leaves it.
        checked["item"] = _item_number(args.get("item"))
    return checked


async def _apply_add_memory(writing: Writing, args: dict[str, Any]) -> str:
    conversation = writing.conversation
    user_id, group_id = conversation.bind(args["scope"], args.get("user_id"))
    if args["scope"] == "GLOBAL":
        # Never wider than what it is made from: a sensitive fact stays where it was said,
        # with the member in a group, in the private chat otherwise.
        ceiling = derive(conversation.key, user_id, marked=True, text=args["content"])
        if ceiling.scope != "GLOBAL":
            args = {**args, "scope": ceiling.scope}
            user_id, group_id = ceiling.user_id, ceiling.group_id
            writing.notes.append(f"add_memory: sensitive, kept as {args['scope']}")
    if args.get("slot") and await _replaced(writing, args, user_id, group_id):
        return "updated"
    _, created = await memories.add(
        writing.session,
        writing.tenant_id,
        scope=args["scope"],
        user_id=user_id,
        group_id=group_id,
        category=args["category"],
        content=args["content"],
        vector=writing.vector,
        settings=writing.settings,
        cause=writing.cause,
        confidence=float(args.get("confidence") or 0.5),
        valid_from=conversation.moment,
        evidence=writing.evidence,
    )
    return "added" if created else "duplicates"


async def _replaced(
    writing: Writing, args: dict[str, Any], user_id: str | None, group_id: str | None
) -> bool:
    """A standing fact (work, home …) replacing the person's older memory of the same slot:
    the newest one takes the new content (its history keeps the old), any other of the slot
    ends. False where the person has none of the slot yet."""
    rows = await memories.bound_to(
        writing.session, writing.tenant_id, args["scope"], user_id, group_id
    )
    same = [row for row in rows if slot_of(str(row["content"])) == args["slot"]]
    if not same:
        return False
    newest, *older = same
    reason = f"a newer {args['slot']} fact replaces it"
    if newest["content"] != args["content"]:
        old = newest.get("evidence") or {}
        evidence = {
            name: list(dict.fromkeys([*old.get(name, []), *writing.evidence.get(name, [])]))
            for name in {*old, *writing.evidence}
            if isinstance(old.get(name, []), list)
            and isinstance(writing.evidence.get(name, []), list)
        }
        await memories.change(
            writing.session,
            writing.tenant_id,
            int(newest["id"]),
            cause=writing.cause,
            reason=reason,
            content=args["content"],
            vector=writing.vector,
            evidence=evidence,
            valid_from=writing.conversation.moment,
        )
    for row in older:
        await memories.deactivate(
            writing.session,
            writing.tenant_id,
            int(row["id"]),
            cause=writing.cause,
            reason=reason,
            valid_to=writing.conversation.moment,
        )
    return True


ADD_MEMORY = Tool(
    "add_memory",
    "全新的事实、偏好或画像，且现有记忆中没有冲突的旧记忆时使用。Add a new memory.",
    {
        "content": {"type": "string", "description": "一句独立、绝对的陈述"},
        "scope": {"type": "string", "enum": list(SCOPES)},
        "category": {"type": "string", "enum": list(CATEGORIES)},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "user_id": {"type": "string", "description": "whom it is about (default: the speaker)"},
        "item": _ITEM,
    },
    ("content", "scope", "category"),
    _check_add_memory,
    _apply_add_memory,
    embeds="content",
)


# -- update_memory, delete_memory ---------------------------------------------------------


def _check_update_memory(args: dict[str, Any], scene: Scene) -> dict[str, Any]:
    memory_id = _shown_memory(args, scene)
    reason = _reason(args.get("reason"))
    content = absolute(args.get("new_content"), "new_content")
    checked: dict[str, Any] = {"memory_id": memory_id, "new_content": content, "reason": reason}
    if scene.known[memory_id].get("scope") == "GLOBAL":
        checked["item"] = _check_global(content, args.get("item"), scene)
    elif _item_number(args.get("item")) is not None:
        checked["item"] = _item_number(args.get("item"))
    return checked


async def _apply_update_memory(writing: Writing, args: dict[str, Any]) -> str:
    await memories.change(
        writing.session,
        writing.tenant_id,
        args["memory_id"],
        cause=writing.cause,
        reason=args.get("reason"),
        content=args["new_content"],
        vector=writing.vector,
    )
    return "updated"


UPDATE_MEMORY = Tool(
    "update_memory",
    "信息纠正、补充或改变现有记忆时使用；memory_id 必须来自【现有记忆】。",
    {
        "memory_id": {"type": "integer"},
        "new_content": {"type": "string"},
        "reason": {"type": "string"},
        "item": _ITEM,
    },
    ("memory_id", "new_content", "reason"),
    _check_update_memory,
    _apply_update_memory,
    embeds="new_content",
)


def _check_delete_memory(args: dict[str, Any], scene: Scene) -> dict[str, Any]:
    memory_id = _shown_memory(args, scene)
    return {"memory_id": memory_id, "reason": _reason(args.get("reason"))}


async def _apply_delete_memory(writing: Writing, args: dict[str, Any]) -> str:
    await memories.deactivate(
        writing.session,
        writing.tenant_id,
        args["memory_id"],
        cause=writing.cause,
        reason=args.get("reason"),
        valid_to=writing.conversation.moment,
    )
    return "deactivated"


DELETE_MEMORY = Tool(
    "delete_memory",
    "记忆不再成立（计划取消、事实过时、用户要求遗忘）时使用；记忆会失效但保留历史。",
    {"memory_id": {"type": "integer"}, "reason": {"type": "string"}},
    ("memory_id", "reason"),
    _check_delete_memory,
    _apply_delete_memory,
)


# -- todos --------------------------------------------------------------------------------


def _check_add_todo(args: dict[str, Any], scene: Scene) -> dict[str, Any]:
    description = absolute(args.get("description"), "description")
    trigger = args.get("trigger_time")
    when = None
    if trigger not in (None, ""):
        try:
            when = datetime.fromisoformat(str(trigger))
        except ValueError:
            raise Invalid("trigger_time must be an ISO 8601 time") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=scene.conversation.moment.tzinfo)
        try:
            # 0001-01-01T00:00+14:00 has no UTC to store: the job's write failed on it.
            in_range(when)
        except ValueError as exc:
            raise Invalid(f"trigger_time: {exc}") from None
    # Someone of this chat, never a member of another group or a made-up id: the todo goes
    # with its assignee into their export, and with their erasure.
    assignee = _participant(args.get("assignee_id"), scene, "assignee")
    return {
        "description": description,
        "trigger_time": when.isoformat() if when else None,
        "assignee_id": assignee,
    }


async def _apply_add_todo(writing: Writing, args: dict[str, Any]) -> str:
    conversation = writing.conversation
    when = args.get("trigger_time")
    private = conversation.request_type == "private"
    place = todos.Place(
        conversation.key,
        conversation.group_id,
        conversation.speaker_id if private else None,
        conversation.speaker_id,
    )
    _, created = await todos.add(
        writing.session,
        writing.tenant_id,
        place,
        args["description"],
        datetime.fromisoformat(when) if when else None,
        conversation.moment.tzinfo or UTC,
        assignee_id=args.get("assignee_id"),
        evidence=writing.evidence,
    )
    return "todos_added" if created else "todos_duplicates"


ADD_TODO = Tool(
    "add_todo",
    "需要在将来提醒或完成的事（如“明天提醒大家提交周报”）。",
    {
        "description": {"type": "string"},
        "trigger_time": {"type": "string", "description": "ISO 8601 with offset, or empty"},
        "assignee_id": {"type": "string", "description": "whom it is for: a participant's id"},
    },
    ("description",),
    _check_add_todo,
    _apply_add_todo,
)


def _todo_status(status: str) -> Callable[[Writing, dict[str, Any]], Awaitable[str]]:
    async def apply(writing: Writing, args: dict[str, Any]) -> str:
        zone = writing.conversation.moment.tzinfo or UTC
        await todos.patch(
            writing.session, writing.tenant_id, args["todo_id"], {"status": status}, zone
        )
        return f"todos_{status.lower()}"

    return apply


COMPLETE_TODO = Tool(
    "complete_todo",
    "待办已完成。",
    {"todo_id": {"type": "integer"}},
    ("todo_id",),
    _shown_todo,
    _todo_status("COMPLETED"),
)

CANCEL_TODO = Tool(
    "cancel_todo",
    "待办取消了。",
    {"todo_id": {"type": "integer"}},
    ("todo_id",),
    _shown_todo,
    _todo_status("CANCELLED"),
)


# -- write_summary (group chats) ----------------------------------------------------------


def _check_write_summary(args: dict[str, Any], scene: Scene) -> dict[str, Any]:
    try:
        day = date.fromisoformat(str(args.get("day")))
    except ValueError:
        raise Invalid("day must be YYYY-MM-DD") from None
    content = absolute(args.get("content"), "content")
    return {"day": day.isoformat(), "content": content}


async def _apply_write_summary(writing: Writing, args: dict[str, Any]) -> str:
    group_id = writing.conversation.group_id
    assert group_id is not None
    await memories.set_day_summary(
        writing.session,
        writing.tenant_id,
        group_id,
        date.fromisoformat(args["day"]),
        args["content"],
        writing.vector,
        writing.cause,
    )
    return "summaries"


SUMMARY_TOOL = Tool(
    "write_summary",
    "本群某一天讨论内容的一句话摘要（如“2026-03-01 群里主要讨论了 Koin 依赖注入”）。",
    {"day": {"type": "string", "description": "YYYY-MM-DD"}, "content": {"type": "string"}},
    ("day", "content"),
    _check_write_summary,
    _apply_write_summary,
    embeds="content",
)

TOOLS: tuple[Tool, ...] = (
    ADD_MEMORY,
    UPDATE_MEMORY,
    DELETE_MEMORY,
    ADD_TODO,
    COMPLETE_TODO,
    CANCEL_TODO,
)
REGISTRY = {tool.name: tool for tool in (*TOOLS, SUMMARY_TOOL)}


def validate_call(name: str, args: dict[str, Any] | None, scene: Scene) -> Operation:
    """A model's tool call checked against the conversation, or ``Invalid`` with the reason."""
    if args is None:
        raise Invalid("the arguments are not valid JSON")
    tool = REGISTRY.get(name)
    if tool is None or name not in scene.offered:
        raise Invalid(f"unknown tool {name}; the tools are {', '.join(sorted(scene.offered))}")
    return tool.validate(args, scene)
