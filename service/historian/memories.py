"""Retrieve-Compare-Act (seed 003 §6): new information against the memories already held.

The historian retrieves the active memories of the conversation's scopes nearest to the new
information, shows them to the LLM with their ids, and lets it call ``add_memory``,
``update_memory``, ``delete_memory`` and the todo tools (``memory_tools``; the prompts are in
``prompts``). Every call is validated (ids must be among those shown, scopes must be the
conversation's, content must be absolute); refusals go back to the model with the reason.
Without an LLM every observation becomes an ``add``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, tzinfo
from typing import Any

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from service.embedding import Embedder
from service.errors import Invalid, NotFound
from service.historian import reminders
from service.historian.absolutize import Person, Situation, absolutize
from service.historian.conversation import Conversation, Operation, Plan
from service.historian.gate import gate
from service.historian.memory_tools import (
    REGISTRY,
    SUMMARY_TOOL,
    TOOLS,
    Scene,
    Writing,
    validate_call,
)
from service.historian.profiles import about_the_group
from service.historian.prompts import MEMORY_SYSTEM, memory_prompt
from service.llm import ChatModel
from service.memories import service as memories
from service.memories.digest import day_summary
from service.settings import Settings
from service.text import bounded, clip
from service.todos import service as todos
from service.visibility import derive

__all__ = [
    "Conversation",
    "MemoryKeeper",
    "Operation",
    "Plan",
    "day_summary",
    "guess_category",
]

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


def guess_category(text: str) -> str:
    """The offline category: PREFERENCE, PROFILE or FACT by wording."""
    if _PREFERENCE.search(text):
        return "PREFERENCE"
    if _PROFILE.search(text):
        return "PROFILE"
    return "FACT"


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
        for vector in vectors:
            # Compared with, not used: their last use stays as it was.
            for row in await memories.search_in_scope(
                session,
                tenant_id,
                conversation.filter,
                vector,
                limit=self.settings.cognitive.memory.retrieve_top_k,
                mark_used=False,
            ):
                found.setdefault(int(row["id"]), row)
        pending = await todos.pending(session, tenant_id, conversation.key, limit=50)
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
        for index, (text, original) in enumerate(items):
            if gate(text):
                plan.notes.append(f"not remembered (still relative): {text}")
                continue
            reminder = reminders.request(original)
            if reminder is not None:
                todo = self._reminder(conversation, index, reminder, plan)
                if todo is not None:
                    plan.operations.append(todo)
                continue
            # The fact is about who said it: in a batch of several people's messages, the
            # sender of its message (not the group, where everyone would read it).
            in_group = conversation.request_type == "group"
            who = (
                conversation.speakers.get(index) if in_group else None
            ) or conversation.speaker_id
            if conversation.request_type == "private":
                # PRIVATE, or GLOBAL where the person marked it and it is not sensitive. No
                # wording decides it: "千万不要告诉大家" names everyone as "告诉大家" does.
                marked = index in conversation.shareable
                scope = derive(conversation.key, None, marked=marked, text=text).scope
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
                        **(
                            {"slot": conversation.slots[index]}
                            if scope != "GROUP" and who and index in conversation.slots
                            else {}
                        ),
                    },
                )
            )
        return plan

    def _reminder(
        self, conversation: Conversation, index: int, reminder: reminders.Reminder, plan: Plan
    ) -> Operation | None:
        """A request to be reminded as the ``add_todo`` call the model would make, checked by
        the same tool; none where it names no time (the model can ask when)."""
        moment = conversation.moments.get(index, conversation.moment)
        trigger = reminders.trigger(
            reminder, moment, self.settings.cognitive.memory.todo_default_hour
        )
        if not reminder.times:
            plan.notes.append(f"no todo (a reminder naming no time): {reminder.task}")
            return None
        who = conversation.speakers.get(index) or conversation.speaker_id
        speaker = Person(conversation.participants.get(who or "") or None, who)
        if speaker.id == conversation.speaker_id and not speaker.name:
            speaker = Person(conversation.speaker_name, who)
        task = absolutize(reminder.task, Situation(moment, speaker, Person(None, None)))
        args = {
            "description": reminder.description(task),
            "trigger_time": trigger.isoformat() if trigger else None,
            "assignee_id": who if reminder.whom is None else None,
        }
        try:
            todo = validate_call("add_todo", args, Scene(conversation, {}, set()))
        except Invalid as exc:
            plan.notes.append(f"no todo: {exc.message}")
            return None
        todo.args["item"] = index
        return todo

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
        offered = [*TOOLS, SUMMARY_TOOL] if summaries else list(TOOLS)
        tools = [tool.schema() for tool in offered]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": MEMORY_SYSTEM},
            {"role": "user", "content": memory_prompt(conversation, items, known, pending)},
        ]
        scene = Scene(
            conversation,
            known,
            {int(t["id"]) for t in pending},
            offered=frozenset(tool.name for tool in offered),
        )
        limit = self.settings.cognitive.memory.max_tool_calls
        room = limit
        for _ in range(self.settings.cognitive.memory.max_tool_turns):
            result = await self.llm.chat(
                messages, tools=tools, tool_choice="auto", purpose="historian_memory"
            )
            plan.calls += 1
            if not result.tool_calls:
                break
            messages.append(result.as_message())
            taken = result.tool_calls[:room]
            room -= len(taken)
            if len(taken) < len(result.tool_calls):
                # The first calls stand as if they were all; the rest are not even checked
                # (each would be a note), and no turn follows: there is no room left.
                beyond = len(result.tool_calls) - len(taken)
                plan.notes.append(
                    f"{beyond} tool calls refused: at most {limit} are taken from the model"
                    " in one memory step"
                )
            refused = 0
            for call in taken:
                try:
                    operation = validate_call(call.name, call.arguments, scene)
                except Invalid as exc:
                    refused += 1
                    # The message may quote the call (an id, a name it made up), at any length.
                    reply = bounded(f"refused: {exc.message}")
                    plan.notes.append(bounded(f"{clip(call.name, 100)}: {reply}"))
                else:
                    plan.operations.append(operation)
                    reply = "ok"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": reply})
            if not refused or not room:
                break  # everything was accepted (no second turn needed), or no room is left
        return plan

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
        embedded = [(op, REGISTRY[op.tool].embeds) for op in plan.operations]
        texts = [op.args.get(name) for op, name in embedded if name]
        vectors = iter(await self.embedder.passages([t for t in texts if t]))
        counts: Counter[str] = Counter()
        for op in plan.operations:
            tool = REGISTRY[op.tool]
            source = evidence
            item = op.args.get("item")
            if item_evidence is not None and isinstance(item, int):
                # A number past the items (a model's slip) keeps the whole batch's provenance.
                source = item_evidence[item] if 0 <= item < len(item_evidence) else evidence
            writing = Writing(
                session,
                tenant_id,
                conversation,
                self.settings.cognitive.memory,
                cause,
                source,
                next(vectors) if tool.embeds else None,
                plan.notes,
            )
            try:
                counts[await tool.apply(writing, op.args)] += 1
            except (Invalid, NotFound) as exc:  # e.g. a todo closed or erased meanwhile
                plan.notes.append(f"{op.tool}: skipped at apply: {exc.message}")
        return dict(counts)


def _utc() -> tzinfo:
    return UTC
