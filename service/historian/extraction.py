"""Memories made from the message stream: the extraction job and the pause trigger.

Messages are stored and counted by ``service.messages``; when enough have come, one asks to be
remembered, or the conversation goes quiet, an extraction job reads the unread messages and
merges what they say into profiles and memories here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncSession

from service.context import DEFAULT_TIMEZONE, on_clocks_of
from service.db.engine import Database
from service.embedding import Embedder
from service.historian import reminders
from service.historian.absolutize import Person, Situation, absolutize
from service.historian.conversation import Conversation, Plan
from service.historian.gate import gate
from service.historian.memories import MemoryKeeper, day_summary
from service.historian.profiles import (
    ProfileMerger,
    Target,
    about_the_group,
    private_targets,
)
from service.historian.statements import offline_statements
from service.llm import ChatModel
from service.memories import service as memories
from service.memories.digest import said_in
from service.memories.upkeep import enqueue_consolidation
from service.messages import service as messages
from service.messages.service import EXTRACT_JOB, enqueue_extraction
from service.privacy.keys import contributors
from service.profiles import service as profiles
from service.profiles.document import ProfileKey
from service.profiles.service import Fact
from service.queue.payloads import ExtractPayload
from service.queue.worker import JobContext
from service.settings import Settings
from service.tenants.service import find as get_tenant
from service.text import clip

log = logging.getLogger("service.historian.extraction")

__all__ = ["EXTRACT_JOB", "Extractor", "extraction_material", "extraction_targets"]


MAX_SPEAKER_TARGETS = 5
NOBODY = Person(None, None)  # a tenant that named no bot


async def _tenant_zone(session: AsyncSession, tenant_id: Any) -> tuple[ZoneInfo, Person]:
    """The tenant's time zone, and its bot (whom a message may address by name)."""
    tenant = await get_tenant(session, tenant_id)
    settings = (tenant.settings or {}) if tenant is not None else {}
    bot = settings.get("bot")
    bot = bot if isinstance(bot, dict) else {}
    zone = ZoneInfo(settings.get("timezone") or DEFAULT_TIMEZONE)
    return zone, Person(bot.get("name") or None, bot.get("id") or None)


def extraction_targets(
    key: str, unread: list[Any], zone: ZoneInfo, *, llm: bool, bot: Person = NOBODY
) -> list[Target]:
    """Profiles the unread messages concern, with their facts.

    With an LLM, every message is material and the model decides; without one, what the
    messages ask to be remembered (prefix removed), the group's rules and the speakers'
    standing facts (``offline_statements``), rule-absolutized.
    """
    kind, _, ident = key.partition(":")
    speakers: dict[str, str | None] = {}
    for message in unread:
        if message.sender_id:
            speakers.setdefault(message.sender_id, message.sender_name)
    facts_by_sender: dict[str, list[Fact]] = {}
    group_facts: list[Fact] = []
    for message in unread:
        local = on_clocks_of(message.sent_at, zone)
        who = Person(message.sender_name, message.sender_id)
        if llm:
            line = f"{who.label() if who.known else '?'} ({local:%Y-%m-%d %H:%M}): {message.text}"
            fact = Fact(clip(line, 500), local.date().isoformat())
            group_facts.append(fact)
            if message.sender_id:
                facts_by_sender.setdefault(message.sender_id, []).append(fact)
            continue
        if reminders.request(message.text):
            continue  # a request to be reminded is a todo, not a fact about anyone
        situation = Situation(local, who, Person(None, None), None)
        for statement in offline_statements(message.text, situation, bot):
            if gate(statement.text):
                continue  # still relative after the rules: not a fact to keep about anyone
            fact = Fact(statement.text, local.date().isoformat(), kind=statement.kind)
            group_facts.append(fact)
            if message.sender_id and not statement.for_group:
                facts_by_sender.setdefault(message.sender_id, []).append(fact)
    targets: list[Target] = []
    if kind == "p":
        return private_targets(ident, speakers.get(ident), group_facts)
    busiest = sorted(facts_by_sender, key=lambda s: -len(facts_by_sender[s]))[:MAX_SPEAKER_TARGETS]
    for sender in busiest:
        facts = group_facts if llm else facts_by_sender[sender]
        targets.append(
            Target(
                ProfileKey("member", sender, ident),
                speakers.get(sender),
                facts,
                "这个人在本群中的形象 how this group knows the person",
            )
        )
    group_only = group_facts if llm else [f for f in group_facts if about_the_group(f.text)]
    if group_only:
        targets.append(
            Target(
                ProfileKey("group", ident),
                None,
                group_only,
                "群的主题、规则、文化 the group's topics, rules and culture",
            )
        )
    return targets


def extraction_material(
    key: str,
    unread: list[Any],
    zone: ZoneInfo,
    moment: datetime,
    *,
    llm: bool,
    bot: Person = NOBODY,
) -> tuple[Conversation, list[tuple[str, str]], set[date]]:
    """The memory step's view of a batch of messages: conversation, items, days touched.

    With an LLM every message is material; without one, only what asks to be remembered.
    """
    kind, _, ident = key.partition(":")
    participants: dict[str, str | None] = {}
    items: list[tuple[str, str]] = []
    speakers: dict[int, str] = {}  # item → its sender: a personal fact stays theirs
    slots: dict[int, str] = {}  # item → the standing fact it states: it replaces the older
    sources: dict[int, str] = {}  # item → its message
    moments: dict[int, datetime] = {}  # item → when its message was sent
    days: set[date] = set()
    group_name = None
    for message in unread:
        before = len(items)
        local = on_clocks_of(message.sent_at, zone)
        days.add(local.date())
        if message.sender_id:
            participants.setdefault(message.sender_id, message.sender_name)
        who = Person(message.sender_name, message.sender_id)
        if llm:
            label = who.label() if who.known else "?"
            items.append(
                (f"{label} ({local:%Y-%m-%d %H:%M}): {clip(message.text, 500)}", message.text)
            )
        elif reminders.request(message.text) is not None:
            # A request to be reminded is a todo of its own words, as said then.
            items.append(
                (absolutize(message.text, Situation(local, who, Person(None, None))), message.text)
            )
            moments[before] = local
        else:
            situation = Situation(local, who, Person(None, None), None)
            for statement in offline_statements(message.text, situation, bot):
                if statement.slot:
                    slots[len(items)] = statement.slot
                items.append((statement.text, statement.original))
        for index in range(before, len(items)):
            sources[index] = message.message_id
            if message.sender_id:
                speakers[index] = message.sender_id
    speaker = (
        ident if kind == "p" else (next(iter(participants)) if len(participants) == 1 else None)
    )
    conversation = Conversation(
        key=key,
        request_type="private" if kind == "p" else "group",
        group_id=ident if kind == "g" else None,
        group_name=group_name,
        speaker_id=speaker,
        speaker_name=participants.get(speaker) if speaker else None,
        participants=participants or ({ident: None} if kind == "p" else {}),
        moment=moment,
        speakers=speakers,
        sources=sources,
        moments=moments,
        slots=slots,
    )
    return conversation, items, days


@dataclass
class Extractor:
    """The extraction job over a conversation's unread messages, and the pause trigger."""

    db: Database
    embedder: Embedder
    settings: Settings
    llm: ChatModel | None = None

    async def run_extract(self, job: JobContext) -> dict[str, Any]:
        """Read the conversation's unread messages, merge what they say into profiles, and
        advance the mark (which messages have been processed)."""
        payload = ExtractPayload.of(job.job.payload)
        key, upto = payload.conversation_key, payload.upto_seq
        limit = self.settings.cognitive.extraction.max_batch
        tenant_id = job.job.tenant_id
        async with job.transaction() as session:
            mark, unread = await messages.unread(session, tenant_id, key, upto, limit)
            zone, bot = await _tenant_zone(session, tenant_id)
            group_name = await messages.group_name(session, tenant_id, key)
        targets = extraction_targets(key, unread, zone, llm=self.llm is not None, bot=bot)

        async def read(profile: ProfileKey) -> dict[str, Any] | None:
            async with job.transaction() as session:
                return await profiles.find(session, tenant_id, profile)

        moment = datetime.now(UTC).astimezone(zone)
        merger = ProfileMerger(self.embedder, self.llm, self.settings)
        staged, notes, calls = await merger.prepare(read, targets, moment)
        conversation, items, days = extraction_material(
            key, unread, zone, moment, llm=self.llm is not None, bot=bot
        )
        conversation.group_name = group_name
        keeper = MemoryKeeper(self.embedder, self.llm, self.settings)
        plan = Plan()
        if items:
            vectors = await self.embedder.passages([text for text, _ in items][:50])
            async with job.transaction() as session:
                known, pending = await keeper.retrieve(session, tenant_id, conversation, vectors)
            plan = await keeper.decide(
                conversation, items, known, pending, summaries=conversation.group_id is not None
            )
        notes += plan.notes
        async with job.finishing() as session:
            again, _ = await messages.unread(session, tenant_id, key, upto, limit)
            versions: dict[str, int] = {}
            memory_changes: dict[str, int] = {}
            if unread and again == mark:  # nobody processed these meanwhile
                versions = await merger.write(
                    session,
                    tenant_id,
                    targets,
                    staged,
                    moment,
                    {
                        "by": "job",
                        "job_id": job.job.id,
                        "messages": [mark + 1, unread[-1].seq],
                        "people": await contributors(
                            session, tenant_id, [m.sender_id for m in unread]
                        ),
                    },
                    model_decided=calls > 0,
                )
                memory_changes = await keeper.apply(
                    session,
                    tenant_id,
                    conversation,
                    plan,
                    {"by": "job", "job_id": job.job.id},
                    {"message_ids": [m.message_id for m in unread][:200]},
                    # What is made of one item names its own message only: an erasure of
                    # its sender takes it, and no one else's.
                    [{"message_ids": [conversation.sources[n]]} for n in range(len(items))],
                )
                if conversation.group_id and not any(
                    op.tool == "write_summary" for op in plan.operations
                ):
                    memory_changes["summaries"] = await self._day_summaries(
                        session, tenant_id, key, conversation, days, zone, job.job.id
                    )
                last = unread[-1].seq
                await messages.mark_read(session, tenant_id, key, last)
                if last < upto:
                    # More than one batch: the rest goes to a follow-up job.
                    await enqueue_extraction(
                        session, tenant_id, key, upto, "continuation", self.settings
                    )
            elif unread:
                # Another run read from the same mark and wrote first (a job put back in the
                # queue may meet the one queued meanwhile): what it did not reach is still
                # to do, and no request may be waiting to ask for it.
                await enqueue_extraction(
                    session, tenant_id, key, upto, "continuation", self.settings
                )
            job.result = {
                "conversation_key": key,
                "from_seq": mark,
                "to_seq": unread[-1].seq if unread else mark,
                "messages": len(unread),
                "reason": payload.reason,
                "profiles": versions,
                "profile_llm_calls": calls,
                "memory": memory_changes,
                "memory_llm_calls": plan.calls,
                "notes": notes,
            }
        return job.result

    async def _day_summaries(
        self,
        session: AsyncSession,
        tenant_id: Any,
        key: str,
        conversation: Conversation,
        days: set[date],
        zone: ZoneInfo,
        job_id: int,
    ) -> int:
        """The rolling SUMMARY of each day the new messages touched (offline wording); a day
        with nothing to say has none, and loses the one it had."""
        assert conversation.group_id is not None
        written = 0
        cause = {"by": "job", "job_id": job_id}
        for day in sorted(days):
            said = said_in(await messages.said_on_day(session, tenant_id, key, day, zone))
            content = day_summary(day, said, conversation.group_name)
            if content is None:
                await memories.drop_day_summary(
                    session, tenant_id, conversation.group_id, day, cause
                )
                continue
            [vector] = await self.embedder.passages([content])
            await memories.set_day_summary(
                session,
                tenant_id,
                conversation.group_id,
                day,
                content,
                vector,
                cause,
            )
            written += 1
        return written

    async def trigger_quiet_conversations(self) -> int:
        """The pause trigger: extraction for conversations quiet for ``pause_minutes``."""
        extraction = self.settings.cognitive.extraction
        async with self.db.system() as session:
            quiet = await messages.take_quiet(session, extraction.pause_minutes * 60, limit=500)
            for row in quiet:
                await enqueue_extraction(
                    session,
                    row.tenant_id,
                    row.conversation_key,
                    row.last_seq,
                    "pause",
                    self.settings,
                )
                # A quiet conversation is also the moment to consolidate its memories.
                await enqueue_consolidation(
                    session, row.tenant_id, row.conversation_key, self.settings, row.last_seq
                )
        if quiet:
            log.info("extraction queued for %d quiet conversation(s)", len(quiet))
        return len(quiet)
