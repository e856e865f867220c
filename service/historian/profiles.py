"""The historian's profile step: new facts merged into the profiles they concern.

With an LLM, a bounded tool loop (``read_profile``, ``update_profile``) like seed 002's
``historian_profile_merge``; every update is validated and refused back to the model with the
reason. Without one, the deterministic merge (a dated list, duplicates skipped).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service import pii
from service.embedding import Embedder
from service.errors import Invalid
from service.llm import ChatModel
from service.profiles import service as profiles
from service.profiles.consolidate import within_budget
from service.profiles.document import Profile, ProfileKey, parse, render
from service.profiles.service import Fact
from service.settings import Settings
from service.text import bounded, clip
from service.visibility import Viewer, derive

log = logging.getLogger("service.historian")

# Words that make a fact about the group itself rather than one member (offline routing).
_GROUP_WORDS = re.compile(
    r"群|本群|群规|群里|大家|所有人|全体|\b(?:group|everyone|all members|chat rules)\b", re.I
)


# A rule or an announcement to the group: it is the group's, whoever of its members said it.
_ANNOUNCEMENT = re.compile(
    r"群规|群公告|(?:本群|群里|群内)(?:禁止|不允许|不准|严禁|不许|不要|规定|只能|请勿)|以后群里|"
    r"(?:大家|所有人|全体成员?|各位)(?:注意|请|都要|必须|不要|别|记得)|请大家|"
    r"\bgroup rules?\b|\b(?:chat|group) announcement\b|"
    r"\bfrom (?:now|\d{4}-\d{2}-\d{2}) on,? "
    r"(?:everyone|everybody|all of you|no one|nobody|we all|in this group)\b|"
    r"\b(?:everyone|everybody|all members|no one|nobody) in (?:this|the|our) (?:group|chat)\b|"
    r"\b(?:no|don't|do not) \w+(?:ing)? (?:is allowed )?in (?:this|the|our) (?:group|chat)\b",
    re.I,
)


def announces_for_group(text: str) -> bool:
    """Whether a statement is a rule or an announcement for the whole group ("本群禁止发广告",
    "from now on everyone …", "group rule: …"): it goes to the group, not to the speaker."""
    return bool(_ANNOUNCEMENT.search(text))


def about_the_group(text: str) -> bool:
    """Whether a fact concerns the group as a whole (rules, topics, everyone)."""
    return bool(_GROUP_WORDS.search(text)) or announces_for_group(text)


def of_the_member(facts: list[Fact]) -> list[Fact]:
    """The facts a member's profile takes offline: not the group's rules and announcements."""
    return [f for f in facts if not announces_for_group(f.text)]


Reader = Callable[[ProfileKey], Awaitable[dict[str, Any] | None]]


@dataclass
class Staged:
    """A document the model submitted, and the version it was written against."""

    profile: Profile
    base_version: int | None


@dataclass
class Target:
    """A profile this job may write, with the facts for it and the name seen in context."""

    key: ProfileKey
    name: str | None
    facts: list[Fact] = field(default_factory=list)
    guidance: str = ""


_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_profile",
            "description": "Read the current Markdown profile of a target (读取侧写).",
            "parameters": {
                "type": "object",
                "properties": {
                    "entity_type": {"type": "string", "enum": ["user", "group", "member"]},
                    "entity_id": {"type": "string"},
                    "group_id": {"type": "string", "description": "members only"},
                },
                "required": ["entity_type", "entity_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "update_profile",
            "description": (
                "Replace a target's profile with a complete Markdown document with YAML front "
                "matter (entity_type, entity_id, group_id for members, name, tags, updated_at)."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "entity_type": {"type": "string", "enum": ["user", "group", "member"]},
                    "entity_id": {"type": "string"},
                    "group_id": {"type": "string"},
                    "document": {"type": "string"},
                },
                "required": ["entity_type", "entity_id", "document"],
            },
        },
    },
]

_SYSTEM = """你是侧写维护员：把新事实合并进目标实体的侧写（Markdown + YAML front matter）。
You maintain profiles: merge the new facts into each target's profile.

规则 Rules:
1. 只保留稳定的特征、身份、偏好、约束和长期目标；一次性事件不写入侧写。
   Keep stable traits, identity, preferences, constraints and long-running goals;
   drop one-off events.
2. 新旧冲突时以较新的事实为准。Newer facts win conflicts.
3. 只能更新列出的目标实体。Update only the listed targets; never invent facts.
4. tags 是身份标签（职业、角色、语言），不是话题，最多 20 个短词。
5. 先用 read_profile 读取，再用 update_profile 提交完整文档；
   没有值得写的内容就不调用 update_profile。
   Read with read_profile, then submit the complete document with update_profile, or do nothing."""


def _facts_block(target: Target) -> str:
    return "\n".join(f"- {f.day}: {f.text}" for f in target.facts) or "(none)"


@dataclass
class ProfileMerger:
    """Runs the profile step of one job for its targets."""

    embedder: Embedder
    llm: ChatModel | None
    settings: Settings

    async def prepare(
        self, read: Reader, targets: list[Target], moment: datetime
    ) -> tuple[dict[str, Staged], list[str], int]:
        """The LLM's new documents for the targets, before anything is written.

        Returns the staged documents by key, notes about refused tool calls, and LLM calls.
        Without an LLM nothing is staged: ``write`` merges offline.
        """
        if self.llm is None or not any(t.facts for t in targets):
            return {}, [], 0
        by_key = {t.key.key: t for t in targets}
        staged: dict[str, Staged] = {}
        notes: list[str] = []
        lines = [f"当前时间 Now: {moment:%Y-%m-%d %H:%M %z}", "目标 Targets:"]
        for t in targets:
            ident = {"entity_type": t.key.entity_type, "entity_id": t.key.entity_id}
            if t.key.group_id:
                ident["group_id"] = t.key.group_id
            lines.append(json.dumps({**ident, "name": t.name}, ensure_ascii=False))
            if t.guidance:
                lines.append(f"  ({t.guidance})")
            lines.append("  新事实 New facts:\n" + _facts_block(t))
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": "\n".join(lines)},
        ]
        calls = 0
        for _ in range(self.settings.cognitive.historian.profile_merge_max_turns):
            result = await self.llm.chat(
                messages, tools=_TOOLS, tool_choice="auto", purpose="historian_profile_merge"
            )
            calls += 1
            if not result.tool_calls:
                break
            messages.append(result.as_message())
            # A turn reads and updates each target once; calls past that are answered
            # without being run, or each would render a document into the next prompt.
            room = 2 * len(targets)
            if len(result.tool_calls) > room:
                beyond = len(result.tool_calls) - room
                notes.append(f"{beyond} tool calls refused: at most {room} are run a turn")
            for n, call in enumerate(result.tool_calls):
                if n >= room:
                    reply = f"refused: at most {room} tool calls are run a turn"
                else:
                    reply = await self._tool(
                        read, call.name, call.arguments, by_key, staged, moment
                    )
                    if reply.startswith("refused"):
                        # The reason may quote the call (a key, a document) at any length.
                        reply = bounded(reply)
                        notes.append(bounded(f"{clip(call.name, 100)}: {reply}"))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": reply})
        return staged, notes, calls

    async def _tool(
        self,
        read: Reader,
        name: str,
        arguments: dict[str, Any] | None,
        targets: dict[str, Target],
        staged: dict[str, Staged],
        moment: datetime,
    ) -> str:
        if arguments is None:
            return "refused: the arguments are not valid JSON"
        entity_type = str(arguments.get("entity_type", ""))
        entity_id = str(arguments.get("entity_id", ""))
        group_id = arguments.get("group_id")
        key = ProfileKey(
            entity_type, entity_id, str(group_id) if entity_type == "member" and group_id else None
        )
        target = targets.get(key.key)
        if target is None:
            return (
                f"refused: {key.describe()} is not a target of this job; targets: {sorted(targets)}"
            )
        if name == "read_profile":
            if key.key in staged:
                return render(staged[key.key].profile)
            row = await read(key)
            if row is not None:
                return str(row["document"])
            template = Profile(key, target.name or key.entity_id, [], moment, None, "(empty)")
            return "no profile yet; start from this template:\n" + render(template)
        if name != "update_profile":
            return f"refused: unknown tool {name}"
        try:
            profile = parse(str(arguments.get("document", "")), expected=key)
        except Invalid as exc:
            return f"refused: {exc.message}; fix it and call update_profile again"
        kinds = pii.sensitive(profile.body) if key.entity_type == "user" else []
        if kinds:
            return (
                f"refused: a user profile is read in every group; remove the sensitive data "
                f"({', '.join(kinds)}) and call update_profile again"
            )
        # System-owned fields: when, from which event, and the display name seen in context.
        profile.updated_at = moment
        profile.source_event_id = next((f.event_id for f in target.facts if f.event_id), None)
        if target.name:
            profile.name = target.name
        row = await read(key)
        staged[key.key] = Staged(profile, row["version"] if row else None)
        return "ok: staged; it will be saved when the job finishes"

    async def write(
        self,
        session: AsyncSession,
        tenant_id: Any,
        targets: list[Target],
        staged: dict[str, Staged],
        moment: datetime,
        cause: dict[str, Any],
        *,
        model_decided: bool,
    ) -> dict[str, int]:
        """Write every target's change with compare-and-swap (re-merging on a lost race).

        ``model_decided``: the LLM saw these targets; one it did not update stays as it is.
        """
        work = ProfileWork(targets, staged, moment, cause, model_decided)
        return (await self.write_many(session, tenant_id, [work]))[0]

    async def write_many(
        self, session: AsyncSession, tenant_id: Any, works: list[ProfileWork]
    ) -> list[dict[str, int]]:
        """The profile changes of several jobs, in their order, with one write per profile:
        each job's change is made to the text the previous ones left, as if they had run one
        after the other, and only the last text is stored (one revision, one embedding).
        Returns each job's new versions by key."""
        steps: dict[str, list[tuple[int, Step]]] = {}
        keys: dict[str, ProfileKey] = {}
        causes: dict[str, list[dict[str, Any]]] = {}
        for index, work in enumerate(works):
            for target in work.targets:
                step = _step(target, work.staged.get(target.key.key), work)
                steps.setdefault(target.key.key, []).append((index, step))
                keys[target.key.key] = target.key
                causes.setdefault(target.key.key, []).append(work.cause)
        changed_by: dict[str, set[int]] = {}
        merges = []
        for key, key_steps in steps.items():
            changed_by[key] = set()
            merges.append((keys[key], _folded(key_steps, changed_by[key]), _cause(causes[key])))
        keep = self.settings.cognitive.profile.revision_keep
        versions = await profiles.apply_merges(session, tenant_id, merges, self.embedder, keep=keep)
        out: list[dict[str, int]] = [{} for _ in works]
        for key, version in versions.items():
            if version is None:
                continue
            for index in changed_by[key]:
                out[index][key] = version
        return out


@dataclass
class ProfileWork:
    """One job's profile step, ready to write: its targets, what the model staged, when,
    and the cause recorded with the replaced text."""

    targets: list[Target]
    staged: dict[str, Staged]
    moment: datetime
    cause: dict[str, Any]
    model_decided: bool


# One job's change to one profile: (current, version) → the new profile, or None.
Step = Callable[[Profile | None, int | None], Awaitable[Profile | None]]


def _step(target: Target, chosen: Staged | None, work: ProfileWork) -> Step:
    """One job's change to one target's profile."""
    moment = work.moment

    async def merge(current: Profile | None, version: int | None) -> Profile | None:
        if chosen is not None and chosen.base_version == version:
            # However long the model's text, what is stored stays within budget.
            chosen.profile.body = within_budget(chosen.profile.body, chosen.profile.name)
            return chosen.profile
        if chosen is None and work.model_decided and target.facts:
            return _renamed(current, target, moment)  # the model looked and kept it
        # Offline, or the model wrote against a text that changed since: this job's
        # facts are merged into the newer text the deterministic way.
        merged = profiles.merge_facts(
            current, target.key, target.name or target.key.entity_id, target.facts, moment
        )
        if merged is None:
            return _renamed(current, target, moment)
        if target.name:
            merged.name = target.name
        return merged

    return merge


def _folded(steps: list[tuple[int, Step]], changed_by: set[int]) -> Step:
    """The jobs' steps one after the other, each on the text the previous one left (read
    back as it would be stored), the version counting one per change as separate writes
    would. Records in ``changed_by`` which jobs changed the profile."""

    async def merge(current: Profile | None, version: int | None) -> Profile | None:
        changed_by.clear()
        result: Profile | None = None
        for index, step in steps:
            new = await step(current, version)
            if new is None:
                continue
            changed_by.add(index)
            result = new
            current = parse(render(new), stored=True) if len(steps) > 1 else new
            version = (version or 0) + 1
        return result

    return merge


def _cause(causes: list[dict[str, Any]]) -> dict[str, Any]:
    """The cause of a profile written once for several jobs: the last one's, with every
    job's id and everyone whose words went into it (``people``, as keyed hashes)."""
    if len(causes) == 1:
        return causes[0]
    job_ids = [c["job_id"] for c in causes if c.get("job_id") is not None]
    people = sorted({p for c in causes for p in c.get("people", [])})
    return {**causes[-1], "job_ids": job_ids, "people": people}


def _renamed(current: Profile | None, target: Target, moment: datetime) -> Profile | None:
    if current is None or not target.name:
        return None
    return profiles.renamed(current, target.name, moment)


def for_everyone(facts: list[Fact], key: str, person: str) -> list[Fact]:
    """The facts a user profile may take: it is read in every conversation of the person
    (GLOBAL), so only those ``derive`` lets reach there, what the person marked as theirs to
    be known beyond the chat ``key`` it was said in and not sensitive."""
    return [
        f for f in facts if derive(key, person, marked=f.shareable, text=f.text).scope == "GLOBAL"
    ]


def private_targets(person: str | None, name: str | None, facts: list[Fact]) -> list[Target]:
    """The profiles a private chat's facts build: the person's private profile, which only
    this chat reads, takes them all; their shared user profile only the marked ones."""
    if not person or not facts:
        return []
    targets = [
        Target(
            ProfileKey("private", person),
            name,
            list(facts),
            "只在与本人的私聊中读取 read only in the person's own private chat",
        )
    ]
    public = for_everyone(facts, Viewer.private(person).conversation_key, person)
    if public:
        targets.append(Target(ProfileKey("user", person), name, public))
    return targets


def end_targets(context: Any, facts: list[Fact], llm: bool) -> list[Target]:
    """The profiles an end job concerns: the speaker (user or member) and the group."""
    sender = context.sender_id or (
        context.private_user if context.request_type == "private" else None
    )
    targets: list[Target] = []
    if context.request_type == "private":
        return private_targets(sender, context.sender_name, facts)
    if sender:
        targets.append(
            Target(
                ProfileKey("member", sender, context.group_id),
                context.sender_name,
                list(facts) if llm else of_the_member(facts),
                "这个人在本群中的形象 how this group knows the person",
            )
        )
    group_facts = facts if llm else [f for f in facts if about_the_group(f.text)]
    targets.append(
        Target(
            ProfileKey("group", context.group_id),
            context.group_name,
            list(group_facts),
            "群的主题、规则、文化 the group's topics, rules and culture",
        )
    )
    public = for_everyone(facts, context.conversation_key, sender) if llm and sender else []
    if sender and public:
        targets.append(
            Target(
                ProfileKey("user", sender),
                context.sender_name,
                public,
                "只写跨群稳定且不敏感的特征；群内信息留在成员侧写 "
                "only stable, non-sensitive traits true everywhere",
            )
        )
    return targets
