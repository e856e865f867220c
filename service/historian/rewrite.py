"""The LLM rewrite: one forced ``submit_rewrite`` call per job, the gate, feedback rounds."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from service.historian.absolutize import Person
from service.historian.gate import GateHit, gate, id_drift
from service.llm import ChatModel, LLMError
from service.text import STATEMENT_MAX_CHARS

SUBMIT_REWRITE = {
    "type": "function",
    "function": {
        "name": "submit_rewrite",
        "description": "Submit the absolute rewrite of every item (提交每一条的绝对化改写).",
        "parameters": {
            "type": "object",
            "properties": {
                "rewrites": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "index": {"type": "integer", "description": "the item's index"},
                            "text": {"type": "string", "description": "the rewritten statement"},
                        },
                        "required": ["index", "text"],
                    },
                }
            },
            "required": ["rewrites"],
        },
    },
}

_SYSTEM = """你是史官：把机器人在一次对话中记下的条目改写成独立、绝对的陈述，供长期记忆检索。
You are the historian: rewrite each item into one self-contained, absolute statement.

规则 Rules:
1. 消灭代词：我/你/他/她/它/我们/这位… 以及 I/you/he/she/they…
   一律替换为具体的人名并附 ID，如「张三(10001)」。
   Replace every pronoun with the person's name and id, e.g. "Alice (10001)".
2. 消灭相对时间：今天/昨天/明天/刚才/上周/下周三/最近… 以及 today/tomorrow/last week…
   一律换成绝对日期（YYYY-MM-DD）。
   Replace relative times with absolute dates computed from the current time below.
3. 消灭相对地点：这里/本地/那边/here/there 换成具体地点；不知道地点就写明具体对象，不要编造。
4. 保留原文语言、事实和每一个数字 ID；不得添加原文和参考消息中没有的细节。
   Keep the original language, facts and every numeric id. Never invent details.
5. 每条输出一句完整陈述。调用 submit_rewrite 一次提交全部条目。"""


# The warning of an item whose rewrite the model made longer than a statement may be.
TOO_LONG = f"the model's rewrite is over {STATEMENT_MAX_CHARS} characters; the rules' draft is kept"


@dataclass
class Item:
    """One thing to rewrite: an observation, or the bot's memo."""

    index: int
    kind: str  # observation | memo
    original: str
    draft: str  # the rule rewriter's output
    first_person: Person
    second_person: Person
    shareable: bool = False  # the person lets it be known beyond the chat it was said in
    slot: str | None = None  # the standing fact it states (work, home …), if any


@dataclass
class Outcome:
    """The final text of an item and how it got there."""

    text: str
    is_absolute: bool
    warnings: list[str] = field(default_factory=list)
    forced: bool = False  # the bot asked to store it now, past the gate
    # The rules' draft passed the gate but is stored as not absolute (the LLM was down).
    passed_gate: bool = False

    @property
    def accepted(self) -> bool:
        """Whether the statement may change profiles and memories: it passed the gate, or
        was forced. A degraded one is stored as an event and goes no further."""
        return self.is_absolute or self.forced or self.passed_gate


@dataclass
class Situation:
    """What the prompt tells the model about the moment and the people."""

    moment: datetime
    timezone: str
    location: str | None
    participants: list[str]
    group: str | None
    source_message: str | None
    recent_messages: list[str]


def rule_outcome(item: Item, *, force: bool = False) -> Outcome:
    """The rules alone (no LLM, or the LLM gave up): absolute only if the gate passes;
    ``force`` lets a gate failure through, unless the draft lost an id."""
    drift = id_drift(item.original, item.draft)
    hits = gate(item.draft) + drift
    if not hits:
        return Outcome(item.draft, True)
    if force and not drift:
        return Outcome(item.draft, False, ["forced past the gate", *_warn(hits)], forced=True)
    return Outcome(item.draft, False, _warn(hits))


def _prompt(items: list[Item], situation: Situation) -> str:
    weekday = "一二三四五六日"[situation.moment.weekday()]
    lines = [
        f"当前时间 Now: {situation.moment:%Y-%m-%d %H:%M} ({situation.timezone}, 星期{weekday})",
        f"地点 Place: {situation.location or '未知 unknown'}",
        "参与者 Participants: " + "; ".join(situation.participants),
    ]
    if situation.group:
        lines.append(f"群 Group: {situation.group}")
    if situation.source_message:
        lines.append(f"当前消息原文 Source message: {situation.source_message}")
    if situation.recent_messages:
        lines.append("最近消息 Recent messages (for disambiguation only):")
        lines.extend(f"  - {m}" for m in situation.recent_messages)
    lines.append("条目 Items (draft = 规则初稿, improve it):")
    for item in items:
        who = f"我/I = {item.first_person.label()}; 你/you = {item.second_person.label()}"
        lines.append(
            json.dumps(
                {
                    "index": item.index,
                    "kind": item.kind,
                    "original": item.original,
                    "draft": item.draft,
                    "pronouns": who,
                },
                ensure_ascii=False,
            )
        )
    return "\n".join(lines)


@dataclass
class Rewrites:
    """What one ``submit_rewrite`` call gave: the texts by index, and the indexes whose text
    was longer than a statement may be."""

    texts: dict[int, str]
    too_long: set[int] = field(default_factory=set)


def _parse(result_calls: list[Any]) -> Rewrites:
    for call in result_calls:
        if call.name != "submit_rewrite":
            continue
        if call.arguments is None:
            raise LLMError("submit_rewrite arguments are not valid JSON")
        rewrites = call.arguments.get("rewrites")
        if not isinstance(rewrites, list):
            raise LLMError("submit_rewrite has no list 'rewrites'")
        out = Rewrites({})
        for entry in rewrites:
            if not isinstance(entry, dict):
                raise LLMError("submit_rewrite entries must be objects")
            index, text = entry.get("index"), entry.get("text")
            if isinstance(index, str) and index.isdigit():
                index = int(index)
            if isinstance(text, str):
                # PostgreSQL's text holds no NUL: one the model wrote failed the job's write.
                text = re.sub(r"\s+", " ", text.replace("\x00", "")).strip()
            if not isinstance(index, int) or not isinstance(text, str) or not text:
                continue
            if len(text) > STATEMENT_MAX_CHARS:
                out.too_long.add(index)
            else:
                out.texts[index] = text
        return out
    raise LLMError("the model did not call submit_rewrite")


async def rewrite_with_llm(
    llm: ChatModel,
    items: list[Item],
    situation: Situation,
    *,
    max_retry: int,
    force: bool,
) -> tuple[list[Outcome], int]:
    """Rewrite, gate, and feed back what the gate hit; returns outcomes and LLM calls made.

    Raises ``LLMError`` when the model fails outright (the job is retried with backoff).
    """
    outcomes: dict[int, Outcome] = {}
    best: dict[int, str] = {}
    pending = list(items)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _SYSTEM},
        {"role": "user", "content": _prompt(items, situation)},
    ]
    calls = 0
    for round_ in range(max_retry + 1):
        result = await llm.chat(
            messages,
            tools=[SUBMIT_REWRITE],
            tool_choice={"type": "function", "function": {"name": "submit_rewrite"}},
            purpose="historian_rewrite",
        )
        calls += 1
        parsed = _parse(result.tool_calls)
        texts = parsed.texts
        feedback: list[str] = []
        still: list[Item] = []
        for item in pending:
            if item.index in parsed.too_long and item.index not in texts:
                # Not asked again: the rules' draft is the statement, as when the model is down.
                outcome = rule_outcome(item, force=force)
                outcome.warnings.insert(0, TOO_LONG)
                outcomes[item.index] = outcome
                continue
            text = texts.get(item.index)
            if text is None:
                still.append(item)
                feedback.append(f"条目 {item.index}: 缺少改写 (missing rewrite)")
                continue
            drift = id_drift(item.original, text)
            hits: list[GateHit] = gate(text) + drift
            if not drift:
                best[item.index] = text
            if not hits:
                outcomes[item.index] = Outcome(text, True)
            elif force and not drift:
                # force: the bot asked to store now; the gate's words are kept as warnings.
                outcomes[item.index] = Outcome(
                    text, False, ["forced past the gate", *_warn(hits)], forced=True
                )
            else:
                still.append(item)
                feedback.append(f"条目 {item.index}: " + "；".join(h.feedback() for h in hits))
        pending = still
        if not pending or round_ == max_retry:
            break
        messages.append({"role": "assistant", "content": json.dumps(texts, ensure_ascii=False)})
        messages.append(
            {
                "role": "user",
                "content": "闸门未通过，请只重写这些条目并再次调用 submit_rewrite：\n"
                + "\n".join(feedback),
            }
        )
    for item in pending:
        # Out of retries: keep the model's text if it lost no id, else the rules' draft.
        text = best.get(item.index, item.draft)
        hits = gate(text) + id_drift(item.original, text)
        outcomes[item.index] = Outcome(text, not hits, ["gate still failing", *_warn(hits)])
    return [outcomes[item.index] for item in items], calls


def _warn(hits: list[GateHit]) -> list[str]:
    return [f"gate: {h.kind} '{h.text}'" for h in hits]
