"""The raw message archive: ingest, extraction triggers, background embedding."""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.ext.asyncio import AsyncSession

from service.context import DEFAULT_TIMEZONE, conversation_key
from service.db.engine import Database
from service.embedding import Embedder
from service.errors import Invalid
from service.historian.absolutize import Person, Situation, absolutize
from service.historian.gate import gate
from service.historian.memories import Conversation, MemoryKeeper, Plan, day_summary
from service.historian.profiles import ProfileMerger, Target, about_the_group, for_everyone
from service.historian.service import clip
from service.llm import ChatModel
from service.memories import service as memories
from service.memories.upkeep import enqueue_consolidation
from service.messages import repository
from service.messages.schemas import MessageBatch, MessagesStored
from service.privacy import pii
from service.privacy.service import was_erased
from service.profiles import repository as profile_rows
from service.profiles.document import ProfileKey
from service.profiles.service import Fact
from service.queue import repository as jobs
from service.queue.payloads import ExtractPayload, NoPayload
from service.queue.worker import JobContext
from service.retrieval.terms import terms, to_tsvector_literal
from service.settings import Settings
from service.tenants.service import TenantContext
from service.tenants.service import find as get_tenant

log = logging.getLogger("service.messages")

EMBED_JOB = "messages.embed"
EXTRACT_JOB = "messages.extract"


def asks_to_remember(text: str, keywords: list[str]) -> bool:
    """A message that asks the bot to remember something triggers extraction at once."""
    lowered = text.lower()
    return any(keyword.lower() in lowered for keyword in keywords)


async def ingest(
    session: AsyncSession, tenant: TenantContext, batch: MessageBatch, settings: Settings
) -> MessagesStored:
    """Store a batch (duplicates ignored), count it per conversation, fire extraction triggers."""
    limits = settings.cognitive.messages
    if len(batch.messages) > limits.batch_max:
        raise Invalid(f"at most {limits.batch_max} messages per call", field="messages")
    rows: list[dict[str, Any]] = []
    group_names: dict[str, str] = {}
    dropped = 0
    for n, message in enumerate(batch.messages):
        if len(message.text) > limits.text_max_chars:
            raise Invalid(f"at most {limits.text_max_chars} characters", field=f"messages.{n}.text")
        if "\x00" in message.text:
            raise Invalid("text must not contain NUL characters", field=f"messages.{n}.text")
        body, _ = pii.apply(message.text, tenant.pii_policy)
        if body is None:
            dropped += 1  # the tenant's policy: items with personal data are not stored
            continue
        user = message.user_id or (message.sender_id if message.request_type == "private" else None)
        key = conversation_key(message.request_type, message.group_id, user)
        if message.group_name:
            group_names[key] = message.group_name
        rows.append(
            {
                "conversation_key": key,
                "message_id": message.message_id,
                "request_type": message.request_type,
                "group_id": message.group_id,
                "user_id": user,
                "sender_id": message.sender_id,
                "sender_name": message.sender_name,
                "text": body,
                "sent_at": _sent_at(message.sent_at, message.timezone or tenant.timezone, n),
                "lexical": to_tsvector_literal(terms(body)),
            }
        )
    if tenant.erased_policy != "accept":
        erased = await was_erased(
            session, tenant.tenant_id, [r["sender_id"] for r in rows if r["sender_id"]]
        )
        if erased and tenant.erased_policy == "refuse":
            raise Invalid("messages of an erased person are refused", field="messages.sender_id")
        warnings = [
            f"user {u} was erased before; these messages are about them" for u in sorted(erased)
        ]
    else:
        warnings = []
    inserted = await repository.insert_messages(session, tenant.tenant_id, rows) if rows else []
    per_conversation: dict[str, list[Any]] = defaultdict(list)
    for row in inserted:
        per_conversation[row.conversation_key].append(row)
    first_row = {r["conversation_key"]: r for r in reversed(rows)}
    extraction = settings.cognitive.extraction
    extraction_jobs = []
    for key, new in per_conversation.items():
        sample = first_row[key]
        pending, last_seq = await repository.touch_conversation(
            session,
            {
                "tenant_id": tenant.tenant_id,
                "conversation_key": key,
                "request_type": sample["request_type"],
                "group_id": sample["group_id"],
                "user_id": sample["user_id"] if sample["request_type"] == "private" else None,
                "group_name": group_names.get(key),
                "count": len(new),
                "term_count": sum(r.term_count for r in new),
                "last_at": max(r.sent_at for r in new),
                "last_seq": max(r.seq for r in new),
            },
        )
        remember = any(asks_to_remember(r.text, extraction.remember_keywords) for r in new)
        if pending >= extraction.every_n_messages or remember:
            reason = "remember" if remember else "count"
            extraction_jobs.append(
                await _enqueue_extraction(
                    session, tenant.tenant_id, key, last_seq, reason, settings
                )
            )
            await repository.reset_pending(session, tenant.tenant_id, key)
    embed_job = None
    if inserted and not await jobs.kind_queued(session, tenant.tenant_id, EMBED_JOB):
        embed_job, _ = await jobs.enqueue(
            session,
            tenant.tenant_id,
            EMBED_JOB,
            NoPayload(),
            max_attempts=settings.cognitive.queue.max_attempts,
        )
    return MessagesStored(
        stored=len(inserted),
        duplicates=len(rows) - len(inserted),
        dropped=dropped,
        warnings=warnings,
        extraction_job_ids=extraction_jobs,
        embed_job_id=embed_job,
    )


def _sent_at(value: datetime | None, zone: str, n: int) -> datetime:
    if value is None:
        return datetime.now(UTC)
    if value.tzinfo is not None:
        return value
    try:
        return value.replace(tzinfo=ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError):
        raise Invalid(f"unknown IANA timezone {zone!r}", field=f"messages.{n}.timezone") from None


async def _enqueue_extraction(
    session: AsyncSession,
    tenant_id: Any,
    key: str,
    upto_seq: int,
    reason: str,
    settings: Settings,
) -> int:
    job_id, _ = await jobs.enqueue(
        session,
        tenant_id,
        EXTRACT_JOB,
        ExtractPayload(conversation_key=key, upto_seq=upto_seq, reason=reason),
        max_attempts=settings.cognitive.queue.max_attempts,
        dedupe_key=f"extract:{key}:{upto_seq}",
    )
    return job_id


def passage_text(sender_name: str | None, text: str) -> str:
    """What is embedded of a message: who said it, and what.

    Questions about a chat name people ("what did Caroline paint?"); a vector of the bare
    text cannot tell whose message it was (on LoCoMo, dense hit@10 0.30 without the name,
    0.55 with it).
    """
    return f"{sender_name}: {text}" if sender_name else text


# Leading white space is matched (and removed) from its first character only: tried from
# every character of a long run of spaces, the search was quadratic in the run.
_REMEMBER = re.compile(
    r"(?<!\s)\s*(?:请|帮我|麻烦)?(?:记住|记得|别忘了|不要忘了|记一下)了?[：:，,\s]*"
    r"|(?<!\s)\s*(?:please\s+)?(?:remember|don't forget|do not forget|note|keep in mind)"
    r"\s*(?:that\s+)?[:,]?\s*",
    re.I,
)
MAX_SPEAKER_TARGETS = 5


async def _tenant_zone(session: AsyncSession, tenant_id: Any) -> ZoneInfo:
    tenant = await get_tenant(session, tenant_id)
    name = (tenant.settings or {}).get("timezone") if tenant is not None else None
    return ZoneInfo(name or DEFAULT_TIMEZONE)


def extraction_targets(key: str, unread: list[Any], zone: ZoneInfo, *, llm: bool) -> list[Target]:
    """Profiles the unread messages concern, with their facts.

    With an LLM, every message is material and the model decides; without one, only the
    messages that ask to be remembered become facts (rule-absolutized, prefix removed).
    """
    kind, _, ident = key.partition(":")
    speakers: dict[str, str | None] = {}
    for message in unread:
        if message.sender_id:
            speakers.setdefault(message.sender_id, message.sender_name)
    facts_by_sender: dict[str, list[Fact]] = {}
    group_facts: list[Fact] = []
    for message in unread:
        local = message.sent_at.astimezone(zone)
        who = Person(message.sender_name, message.sender_id)
        if llm:
            line = f"{who.label() if who.known else '?'} ({local:%Y-%m-%d %H:%M}): {message.text}"
            fact = Fact(clip(line, 500), local.date().isoformat())
        else:
            if not _REMEMBER.search(message.text):
                continue
            stripped = _REMEMBER.sub("", message.text, count=1).strip(" ，,。.!！")
            text_ = absolutize(stripped, Situation(local, who, Person(None, None), None))
            if gate(text_):
                continue  # still relative after the rules: not a fact to keep about anyone
            fact = Fact(text_, local.date().isoformat())
        group_facts.append(fact)
        if message.sender_id:
            facts_by_sender.setdefault(message.sender_id, []).append(fact)
    targets: list[Target] = []
    if kind == "p":
        # The user profile is read in every group: only what the person lets be known.
        facts = for_everyone(group_facts, private=True)
        if facts:
            targets.append(Target(ProfileKey("user", ident), speakers.get(ident), facts))
        return targets
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
    key: str, unread: list[Any], zone: ZoneInfo, moment: datetime, *, llm: bool
) -> tuple[Conversation, list[tuple[str, str]], set[date]]:
    """The memory step's view of a batch of messages: conversation, items, days touched.

    With an LLM every message is material; without one, only what asks to be remembered.
    """
    kind, _, ident = key.partition(":")
    participants: dict[str, str | None] = {}
    items: list[tuple[str, str]] = []
    speakers: dict[int, str] = {}  # item → its sender: a personal fact stays theirs
    days: set[date] = set()
    group_name = None
    for message in unread:
        before = len(items)
        local = message.sent_at.astimezone(zone)
        days.add(local.date())
        if message.sender_id:
            participants.setdefault(message.sender_id, message.sender_name)
        who = Person(message.sender_name, message.sender_id)
        if llm:
            label = who.label() if who.known else "?"
            items.append(
                (f"{label} ({local:%Y-%m-%d %H:%M}): {clip(message.text, 500)}", message.text)
            )
        elif _REMEMBER.search(message.text):
            stripped = _REMEMBER.sub("", message.text, count=1).strip(" ，,。.!！")
            items.append(
                (absolutize(stripped, Situation(local, who, Person(None, None), None)), stripped)
            )
        if len(items) > before and message.sender_id:
            speakers[before] = message.sender_id
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
    )
    return conversation, items, days


@dataclass
class Archivist:
    """The message stream's background jobs: embedding, extraction, the pause trigger."""

    db: Database
    embedder: Embedder
    settings: Settings
    llm: ChatModel | None = None

    async def run_embed(self, job: JobContext) -> dict[str, Any]:
        """Embed the tenant's messages that have no vector yet, a batch per transaction."""
        batch = self.settings.models.embedding.batch_size
        done = 0
        while True:
            if done:
                job.stop_point()  # each batch commits: a shutdown waits for one, not all
            async with job.transaction() as session:
                rows = await repository.unembedded_messages(session, job.job.tenant_id, batch)
                if not rows:
                    break
                vectors = await self.embedder.passages(
                    [passage_text(r.sender_name, r.text) for r in rows]
                )
                lexicals = [to_tsvector_literal(terms(r.text)) for r in rows]
                await repository.set_embeddings(session, job.job.tenant_id, rows, vectors, lexicals)
            done += len(rows)
        return {"embedded": done}

    async def run_extract(self, job: JobContext) -> dict[str, Any]:
        """Read the conversation's unread messages, merge what they say into profiles, and
        advance the mark (which messages have been processed)."""
        payload = ExtractPayload.of(job.job.payload)
        key, upto = payload.conversation_key, payload.upto_seq
        limit = self.settings.cognitive.extraction.max_batch
        tenant_id = job.job.tenant_id
        async with job.transaction() as session:
            mark, unread = await repository.unread_messages(session, tenant_id, key, upto, limit)
            zone = await _tenant_zone(session, tenant_id)
            group_name = await repository.group_name(session, tenant_id, key)
        targets = extraction_targets(key, unread, zone, llm=self.llm is not None)

        async def read(profile: ProfileKey) -> dict[str, Any] | None:
            async with job.transaction() as session:
                return await profile_rows.get(session, tenant_id, profile)

        moment = datetime.now(UTC).astimezone(zone)
        merger = ProfileMerger(self.embedder, self.llm, self.settings)
        staged, notes, calls = await merger.prepare(read, targets, moment)
        conversation, items, days = extraction_material(
            key, unread, zone, moment, llm=self.llm is not None
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
            again, _ = await repository.unread_messages(session, tenant_id, key, upto, limit)
            versions: dict[str, int] = {}
            memory_changes: dict[str, int] = {}
            if unread and again == mark:  # nobody processed these meanwhile
                versions = await merger.write(
                    session,
                    tenant_id,
                    targets,
                    staged,
                    moment,
                    {"by": "job", "job_id": job.job.id, "messages": [mark + 1, unread[-1].seq]},
                    model_decided=calls > 0,
                )
                memory_changes = await keeper.apply(
                    session,
                    tenant_id,
                    conversation,
                    plan,
                    {"by": "job", "job_id": job.job.id},
                    {"message_ids": [m.message_id for m in unread][:200]},
                )
                if conversation.group_id and not any(
                    op.tool == "write_summary" for op in plan.operations
                ):
                    memory_changes["summaries"] = await self._day_summaries(
                        session, tenant_id, key, conversation, days, zone, job.job.id
                    )
                last = unread[-1].seq
                await repository.advance_extracted(session, tenant_id, key, last)
                if last < upto:
                    # More than one batch: the rest goes to a follow-up job.
                    await _enqueue_extraction(
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
        """The rolling SUMMARY of each day the new messages touched (offline wording)."""
        assert conversation.group_id is not None
        written = 0
        for day in sorted(days):
            texts = await repository.texts_of_day(session, tenant_id, key, day, zone)
            content = day_summary(day, texts, conversation.group_name)
            if content is None:
                continue
            [vector] = await self.embedder.passages([content])
            await memories.set_day_summary(
                session,
                tenant_id,
                conversation.group_id,
                day,
                content,
                vector,
                {"by": "job", "job_id": job_id},
            )
            written += 1
        return written

    async def trigger_quiet_conversations(self) -> int:
        """The pause trigger: extraction for conversations quiet for ``pause_minutes``."""
        extraction = self.settings.cognitive.extraction
        async with self.db.system() as session:
            quiet = await repository.take_quiet_conversations(
                session, extraction.pause_minutes * 60, limit=500
            )
            for row in quiet:
                await _enqueue_extraction(
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
