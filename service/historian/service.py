"""The historian's ``end`` job: rules, the LLM, the gate, embeddings, events — never a drop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service import pii
from service.context import ConversationContext
from service.embedding import Embedder
from service.events import service as events
from service.historian.absolutize import Person, Situation
from service.historian.memories import Conversation, MemoryKeeper, Plan
from service.historian.profiles import (
    ProfileMerger,
    ProfileWork,
    Reader,
    Staged,
    Target,
    end_targets,
)
from service.historian.rewrite import Item, Outcome, rewrite_with_llm, rule_outcome
from service.historian.rewrite import Situation as PromptSituation
from service.historian.standing import SLOTS
from service.historian.statements import draft, observed
from service.llm import ChatModel, LLMError
from service.observability import GATE
from service.privacy.keys import contributors
from service.profiles import service as profiles
from service.profiles.document import ProfileKey
from service.profiles.service import Fact
from service.queue.payloads import EndPayload
from service.queue.worker import BatchContext, JobContext, PermanentJobError
from service.settings import Settings
from service.text import clip, message_content

log = logging.getLogger("service.historian")

SCHEMA_VERSION = "final_v1"


def screen(payload: dict[str, Any], ids: list[str]) -> tuple[dict[str, Any], list[str], list[str]]:
    """The tenant's personal-data policy, before the rules, the LLM or the embedder see
    anything: masked items stay, dropped ones lose their event too."""
    policy = str(payload.get("pii_policy", "store"))
    if policy == "store":
        return payload, ids, []
    notes: list[str] = []
    # A memo's id ends ".memo" (":memo" in a job queued before ids named their conversation).
    is_memo = bool(ids) and ids[-1].endswith((".memo", ":memo"))
    memo_id = ids[-1] if payload.get("memo") and is_memo else None
    observation_ids = ids[: len(ids) - (1 if memo_id else 0)]
    kept_observations: list[str] = []
    kept_ids: list[str] = []
    kept_shareable: list[int] = []
    shareable = set(payload.get("shareable") or [])
    for n, (text, event_id) in enumerate(
        zip(payload.get("observations", []), observation_ids, strict=False)
    ):
        value, kinds = pii.apply(text, policy)
        if value is None:
            notes.append(f"{event_id} dropped: personal data ({', '.join(kinds)})")
            continue
        if n in shareable:
            kept_shareable.append(len(kept_observations))
        kept_observations.append(value)
        kept_ids.append(event_id)
    memo = payload.get("memo") or ""
    if memo:
        value, kinds = pii.apply(memo, policy)
        if value is None:
            notes.append(f"{memo_id} dropped: personal data ({', '.join(kinds)})")
            memo, memo_id = "", None
        else:
            memo = value
    reference = [
        pii.mask(str(m)) if isinstance(m, str) else m for m in payload.get("recent_messages") or []
    ]
    source = payload.get("source_message")
    screened = {
        **payload,
        "observations": kept_observations,
        "shareable": kept_shareable,
        "memo": memo,
        "recent_messages": reference,
        "source_message": pii.mask(source) if isinstance(source, str) else source,
    }
    return screened, kept_ids + ([memo_id] if memo_id else []), notes


def recent_lines(messages: list[Any], keep: int, width: int) -> list[str]:
    """The newest ``keep`` reference messages as short lines (time, name, id, text)."""
    lines = []
    for message in messages[-keep:] if keep else []:
        if isinstance(message, dict):
            who = message.get("sender_name") or message.get("sender") or ""
            sid = message.get("sender_id") or ""
            when = message.get("sent_at") or message.get("time") or ""
            body = message_content(str(message.get("text") or message.get("content") or ""))
            line = " ".join(p for p in (str(when), f"{who}({sid})" if sid else str(who)) if p)
            lines.append(clip(f"{line}: {body}" if line else body, width))
        else:
            lines.append(clip(message_content(str(message)), width))
    return lines


def end_conversation(
    context: ConversationContext, moment: datetime, recent: list[Any], keep: int
) -> Conversation:
    """The memory step's view of an end call's conversation. Its participants are the speaker
    and the senders of the newest ``keep`` reference messages the bot sent with the turn (the
    ones its rewrite is shown), so that "remind 李四 to hand in the report" can be assigned to
    李四; ids a chat user merely writes in a text are never among them."""
    speaker = context.sender_id or (
        context.private_user if context.request_type == "private" else None
    )
    participants = {speaker: context.sender_name} if speaker else {}
    if context.request_type == "group":
        for message in recent[-keep:] if keep else []:
            sender = message.get("sender_id") if isinstance(message, dict) else None
            if sender in (None, "") or str(sender) == context.bot_id:
                continue
            name = message.get("sender_name") or message.get("sender")
            participants.setdefault(str(sender), str(name)[:64] if name else None)
    return Conversation(
        key=context.conversation_key,
        request_type=context.request_type,
        group_id=context.group_id,
        group_name=context.group_name,
        speaker_id=speaker,
        speaker_name=context.sender_name,
        participants=participants,
        moment=moment,
    )


class KnownVectors:
    """An embedder that answers from vectors already made for the same texts (a batch's
    events, which the memory step stores again as memories) and embeds only the rest."""

    def __init__(self, embedder: Embedder, known: dict[str, Any]) -> None:
        self.inner = embedder
        self.known = known
        self.name = embedder.name
        self.dimension = embedder.dimension
        self.calibration = embedder.calibration

    async def passages(self, texts: Sequence[str]) -> list[Any]:
        """The known vectors, and one call to the embedder for the others."""
        missing = [t for t in dict.fromkeys(texts) if t not in self.known]
        if missing:
            self.known.update(zip(missing, await self.inner.passages(missing), strict=True))
        return [self.known[t] for t in texts]

    async def query(self, text: str) -> Any:
        """A query's vector, from the embedder."""
        return await self.inner.query(text)

    async def close(self) -> None:
        """Nothing to release: the embedder belongs to the process."""


def _speaker(context: ConversationContext) -> str | None:
    """Who a turn's observations come from: its sender, or the private chat's person."""
    if context.sender_id:
        return context.sender_id
    return context.private_user if context.request_type == "private" else None


@dataclass
class EndWork:
    """One ``end`` job on its way through the steps, until its writes."""

    job: JobContext
    context: ConversationContext
    moment: datetime
    payload: dict[str, Any]
    ids: list[str]
    items: list[Item]
    notes: list[str]
    outcomes: list[Outcome] = field(default_factory=list)
    calls: int = 0
    vectors: list[Any] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    accepted: list[tuple[Item, Outcome, str, Any]] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    conversation: Conversation | None = None
    staged: dict[str, Staged] = field(default_factory=dict)
    profile_calls: int = 0
    known: tuple[dict[int, dict[str, Any]], list[dict[str, Any]]] = ({}, [])
    plan: Plan = field(default_factory=Plan)

    @property
    def observed(self) -> list[tuple[Item, Outcome, Any]]:
        """The accepted observations and their vectors: what the memory step gets."""
        return [(item, outcome, vector) for item, outcome, _, vector in self.accepted]


@dataclass
class Historian:
    """Turns a job's memo and observations into stored, embedded, absolute events."""

    embedder: Embedder
    llm: ChatModel | None
    settings: Settings

    @property
    def profiles(self) -> ProfileMerger:
        """The profile step, with the same providers."""
        return ProfileMerger(self.embedder, self.llm, self.settings)

    @property
    def memories(self) -> MemoryKeeper:
        """The Retrieve-Compare-Act step, with the same providers."""
        return MemoryKeeper(self.embedder, self.llm, self.settings)

    async def run_end(self, job: JobContext) -> dict[str, Any]:
        """The ``historian.end`` job."""
        work = await self._begin(job)
        vectors = await self.embedder.passages([o.text for o in work.outcomes])
        self._describe(work, vectors)

        async def read(key: ProfileKey) -> dict[str, Any] | None:
            async with job.transaction() as session:
                return await profiles.find(session, job.job.tenant_id, key)

        if self._compares(work):
            async with job.transaction() as session:
                await self._retrieve(session, work)
        await self._decide(work, read)
        known = dict(zip([o.text for o in work.outcomes], vectors, strict=True))
        async with job.finishing() as session:
            await self._write(
                session, job.job.tenant_id, [work], KnownVectors(self.embedder, known)
            )
        self._count_gate([work])
        assert job.result is not None
        return job.result

    async def run_end_batch(self, batch: BatchContext) -> None:
        """``historian.end`` jobs of one tenant together: the same steps as ``run_end``,
        with one embedder call for every text, one read of the profiles, the memory step's
        reads in one transaction, the LLM called for every job at once, and every write and
        completion in one transaction (a profile written once for all its jobs).

        A job that fails on its own is left in ``batch.failed``; if the shared transaction
        fails, each job is written in a transaction of its own.
        """
        begun = await asyncio.gather(
            *(self._begin(batch.job(job.id)) for job in batch.jobs), return_exceptions=True
        )
        works = self._survivors(batch, begun, [batch.job(job.id) for job in batch.jobs])
        try:
            texts = [o.text for work in works for o in work.outcomes]
            vectors = await self.embedder.passages(texts)
            start = 0
            for work in works:
                self._describe(work, vectors[start : start + len(work.outcomes)])
                start += len(work.outcomes)
            rows: dict[str, dict[str, Any]] = {}
            if self.llm is not None and any(t.facts for w in works for t in w.targets):
                async with batch.transaction() as session:
                    keys = [t.key for w in works for t in w.targets]
                    rows = await profiles.find_many(session, batch.tenant_id, keys)
            if any(self._compares(work) for work in works):
                async with batch.transaction() as session:
                    for work in works:
                        if self._compares(work):
                            await self._retrieve(session, work)
        except Exception as exc:
            for work in works:
                batch.failed[work.job.job.id] = exc
            return

        async def read(key: ProfileKey) -> dict[str, Any] | None:
            return rows.get(key.key)

        decided = await asyncio.gather(
            *(self._decide(work, read) for work in works), return_exceptions=True
        )
        works = self._survivors(batch, decided, [work.job for work in works], works)
        if not works:
            return
        known = {o.text: v for w in works for o, v in zip(w.outcomes, w.vectors, strict=True)}
        try:
            async with batch.finishing([work.job.job.id for work in works]) as session:
                await self._write(
                    session, batch.tenant_id, works, KnownVectors(self.embedder, known)
                )
        except Exception as exc:
            log.warning(
                "writing %d end job(s) together failed (%s: %s); writing them one by one",
                len(works),
                type(exc).__name__,
                exc,
            )
            for work in works:
                try:
                    async with work.job.finishing() as session:
                        await self._write(
                            session, batch.tenant_id, [work], KnownVectors(self.embedder, known)
                        )
                except Exception as error:
                    batch.failed[work.job.job.id] = error
        self._count_gate([work for work in works if work.job.finished])

    @staticmethod
    def _survivors(
        batch: BatchContext,
        outcomes: list[Any],
        jobs: list[JobContext],
        works: list[EndWork] | None = None,
    ) -> list[EndWork]:
        """The works whose step succeeded; the failed ones' jobs go to ``batch.failed``."""
        kept = []
        for index, (outcome, job) in enumerate(zip(outcomes, jobs, strict=True)):
            if isinstance(outcome, Exception):
                batch.failed[job.job.id] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                kept.append(works[index] if works is not None else outcome)
        return kept

    async def _begin(self, job: JobContext) -> EndWork:
        """Read the job, screen it, rewrite its items (rules or the LLM)."""
        payload = EndPayload.of(job.job.payload).model_dump(mode="json")
        try:
            context = ConversationContext.model_validate(
                {
                    **payload["context"],
                    "timestamp": payload["moment"],
                    "timezone": payload["timezone"],
                }
            )
            moment = datetime.fromisoformat(payload["moment"])
            ids: list[str] = list(payload["event_ids"])
        except (KeyError, ValueError, TypeError) as exc:
            raise PermanentJobError(f"malformed end job payload: {exc}") from exc
        payload, ids, pii_notes = screen(payload, ids)
        items = self._items(context, moment, payload)
        if len(items) != len(ids):
            raise PermanentJobError("the job's event ids do not match its items")
        work = EndWork(job, context, moment, payload, ids, items, pii_notes)
        work.outcomes, work.calls = await self._rewrite(job, context, moment, payload, items)
        policy = str(payload.get("pii_policy", "store"))
        for outcome in work.outcomes:
            # The rewrite may bring personal data back from the reference messages.
            kept, _ = pii.apply(outcome.text, "mask" if policy == "drop" else policy)
            outcome.text = kept or outcome.text
        return work

    def _describe(self, work: EndWork, vectors: list[Any]) -> None:
        """The event rows, and what passed the gate for profiles and memories."""
        work.vectors = list(vectors)
        work.rows = [
            self._event_row(work.job, work.context, work.moment, work.payload, *entry)
            for entry in zip(work.items, work.outcomes, work.ids, vectors, strict=True)
        ]
        # Only what passed the gate (or was forced) reaches profiles and memories: a
        # degraded statement still says "he" or "tomorrow" and would mislead them for good.
        work.accepted = [
            (item, outcome, event_id, vector)
            for item, outcome, event_id, vector in zip(
                work.items, work.outcomes, work.ids, vectors, strict=True
            )
            if item.kind == "observation" and outcome.accepted
        ]
        facts = [
            Fact(
                outcome.text,
                work.moment.date().isoformat(),
                event_id,
                item.shareable,
                SLOTS[item.slot] if item.slot else None,
            )
            for item, outcome, event_id, _ in work.accepted
        ]
        work.targets = end_targets(work.context, facts, llm=self.llm is not None)
        work.conversation = end_conversation(
            work.context,
            work.moment,
            list(work.payload.get("recent_messages") or []),
            self.settings.cognitive.historian.recent_messages_inject_k,
        )
        # The memory step numbers its items as ``observed`` lists them.
        work.conversation.shareable = frozenset(
            n for n, (item, _, _) in enumerate(work.observed) if item.shareable
        )
        work.conversation.slots = {
            n: item.slot for n, (item, _, _) in enumerate(work.observed) if item.slot
        }

    def _compares(self, work: EndWork) -> bool:
        """Whether the memory step reads the memories near the job's items: only the LLM
        compares with them; the rules add each item (the duplicate rule still checks it at
        write), so their read would grow with the memories for nothing."""
        return self.llm is not None and bool(work.observed)

    async def _retrieve(self, session: AsyncSession, work: EndWork) -> None:
        """The memories near the job's accepted observations, and the pending todos."""
        assert work.conversation is not None
        work.known = await self.memories.retrieve(
            session,
            work.job.job.tenant_id,
            work.conversation,
            [vector for _, _, vector in work.observed],
        )

    async def _decide(self, work: EndWork, read: Reader) -> None:
        """The profile step's staged documents and the memory step's plan (LLM calls)."""
        work.staged, notes, work.profile_calls = await self._prepare_profiles(
            work.job, work.targets, work.moment, read
        )
        work.notes += notes
        work.plan = await self._plan_memories(work)
        work.notes += work.plan.notes

    async def _write(
        self,
        session: AsyncSession,
        tenant_id: Any,
        works: list[EndWork],
        embedder: Embedder,
    ) -> None:
        """Every write of these jobs in the caller's transaction: events, memories, profiles
        (one write per profile); each job's result. The profiles come last: their rows are
        locked until the commit, and other jobs writing the same people wait for that."""
        await events.store(session, [row for work in works for row in work.rows])
        keeper = MemoryKeeper(embedder, self.llm, self.settings)
        changes, notes = [], []
        for work in works:
            assert work.conversation is not None
            notes_before = len(work.plan.notes)
            changes.append(
                await keeper.apply(
                    session,
                    tenant_id,
                    work.conversation,
                    work.plan,
                    {"by": "job", "job_id": work.job.job.id},
                    {"event_ids": work.ids, "message_ids": work.context.message_ids},
                    [
                        {"event_ids": [event_id], "message_ids": work.context.message_ids}
                        for _, _, event_id, _ in work.accepted
                    ],
                )
            )
            notes.append(work.plan.notes[notes_before:])
            del work.plan.notes[notes_before:]  # a write tried again adds them once
        profile_works = [
            ProfileWork(
                work.targets,
                work.staged,
                work.moment,
                {
                    "by": "job",
                    "job_id": work.job.job.id,
                    "event_id": work.ids[0] if work.ids else None,
                    # Whose words the new text is made of: an erasure of them drops the lines
                    # this change brought, however the model worded them.
                    "people": await contributors(session, tenant_id, [_speaker(work.context)]),
                },
                work.profile_calls > 0,
            )
            for work in works
        ]
        merger = ProfileMerger(embedder, self.llm, self.settings)
        versions = await merger.write_many(session, tenant_id, profile_works)
        for work, work_versions, memory_changes, apply_notes in zip(
            works, versions, changes, notes, strict=True
        ):
            outcomes = work.outcomes
            work.job.result = {
                "event_ids": work.ids,
                "absolute": sum(o.is_absolute for o in outcomes),
                "degraded": sum(not o.is_absolute for o in outcomes),
                "llm_calls": work.calls,
                "profile_llm_calls": work.profile_calls,
                "profiles": work_versions,
                "memory": memory_changes,
                "memory_llm_calls": work.plan.calls,
                "notes": work.notes + apply_notes,
            }

    @staticmethod
    def _count_gate(works: list[EndWork]) -> None:
        for work in works:
            for outcome in work.outcomes:
                GATE.labels("absolute" if outcome.is_absolute else "degraded").inc()

    async def _plan_memories(self, work: EndWork) -> Plan:
        observed = work.observed
        if not observed:
            return Plan()
        assert work.conversation is not None
        known, pending = work.known
        items = [(outcome.text, item.original) for item, outcome, _ in observed]
        try:
            return await self.memories.decide(work.conversation, items, known, pending)
        except LLMError as exc:
            job = work.job
            if job.job.attempts < job.job.max_attempts:
                raise
            plan = MemoryKeeper(self.embedder, None, self.settings).decide
            fallback = await plan(work.conversation, items, known, pending)
            fallback.notes.insert(0, f"memories without the LLM (it failed: {exc})")
            return fallback

    async def _prepare_profiles(
        self, job: JobContext, targets: list[Target], moment: datetime, read: Reader
    ) -> tuple[dict[str, Staged], list[str], int]:
        try:
            return await self.profiles.prepare(read, targets, moment)
        except LLMError as exc:
            if job.job.attempts < job.job.max_attempts:
                raise
            note = f"profile merge without the LLM (it failed on the last attempt: {exc})"
            log.warning("job %s: %s", job.job.id, note)
            return {}, [note], 0

    def _items(
        self, context: ConversationContext, moment: datetime, payload: dict[str, Any]
    ) -> list[Item]:
        speaker = Person(context.sender_name, context.sender_id)
        if not speaker.known and context.request_type == "private":
            speaker = Person(None, context.private_user)
        bot = Person(context.bot_name, context.bot_id)
        user = speaker if speaker.known else Person(None, context.user_id)
        location = context.location_abs
        items: list[Item] = []
        shareable = set(payload.get("shareable") or [])
        for observation in payload.get("observations", []):
            # The bot is spoken to, never what a person's observation is about.
            statement = observed(observation, Situation(moment, speaker, bot, location), bot)
            items.append(
                Item(
                    len(items),
                    "observation",
                    observation,
                    statement.text,
                    speaker,
                    bot,
                    shareable=len(items) in shareable,
                    slot=statement.slot,
                )
            )
        memo = payload.get("memo") or ""
        if memo:
            text = draft(memo, Situation(moment, bot, user, location))
            items.append(Item(len(items), "memo", memo, text, bot, user))
        return items

    async def _rewrite(
        self,
        job: JobContext,
        context: ConversationContext,
        moment: datetime,
        payload: dict[str, Any],
        items: list[Item],
    ) -> tuple[list[Outcome], int]:
        force = bool(payload.get("force"))
        if self.llm is None:
            return [rule_outcome(item, force=force) for item in items], 0
        historian = self.settings.cognitive.historian
        participants = []
        for label, person in (
            ("发送者 sender", Person(context.sender_name, context.sender_id)),
            ("机器人 bot", Person(context.bot_name, context.bot_id)),
            ("服务对象 user", Person(None, context.user_id)),
        ):
            if person.known:
                participants.append(f"{label} {person.label()}")
        source = payload.get("source_message")
        situation = PromptSituation(
            moment=moment,
            timezone=str(payload["timezone"]),
            location=context.location_abs,
            participants=participants,
            group=(f"{context.group_name or ''}({context.group_id})" if context.group_id else None),
            source_message=(
                clip(message_content(source), historian.source_message_max_len) if source else None
            ),
            recent_messages=recent_lines(
                list(payload.get("recent_messages") or []),
                historian.recent_messages_inject_k,
                historian.recent_message_line_max_len,
            ),
        )
        try:
            return await rewrite_with_llm(
                self.llm,
                items,
                situation,
                max_retry=historian.rewrite_max_retry,
                force=force,
            )
        except LLMError as exc:
            if job.job.attempts < job.job.max_attempts:
                raise  # retried with backoff; the rules' draft is the last resort, not the first
            log.warning(
                "job %s: LLM failed on the last attempt (%s); storing rule rewrites",
                job.job.id,
                exc,
            )
            outcomes = [rule_outcome(item, force=force) for item in items]
            for outcome in outcomes:
                outcome.passed_gate, outcome.is_absolute = outcome.is_absolute, False
                outcome.warnings.insert(0, f"llm unavailable: {exc}")
            return outcomes, 0

    def _event_row(
        self,
        job: JobContext,
        context: ConversationContext,
        moment: datetime,
        payload: dict[str, Any],
        item: Item,
        outcome: Outcome,
        event_id: str,
        vector: Any,
    ) -> dict[str, Any]:
        if item.kind == "memo":
            perspective = "bot"
        else:
            perspective = "group" if context.request_type == "group" else "sender"
        user_id = context.user_id or (
            context.private_user if context.request_type == "private" else None
        )
        utc = moment.astimezone(UTC)
        metadata = {
            "tenant_id": str(job.job.tenant_id),
            "request_id": payload["request_id"],
            "end_seq": payload["end_seq"],
            "timestamp_utc": utc.isoformat(),
            "timestamp_local": moment.isoformat(),
            "timestamp_epoch": int(utc.timestamp()),
            "timezone": payload["timezone"],
            "location_abs": context.location_abs,
            "request_type": context.request_type,
            "user_id": user_id,
            "group_id": context.group_id,
            "sender_id": context.sender_id,
            "message_ids": context.message_ids,
            "perspective": perspective,
            "is_absolute": outcome.is_absolute,
            "has_new_info": item.kind == "observation",
            "schema_version": SCHEMA_VERSION,
        }
        if outcome.warnings:
            log.warning("event %s stored with is_absolute=false: %s", event_id, outcome.warnings)
        return {
            "tenant_id": job.job.tenant_id,
            "id": event_id,
            "conversation_key": context.conversation_key,
            "request_type": context.request_type,
            "group_id": context.group_id,
            "user_id": user_id,
            "sender_id": context.sender_id,
            "request_id": payload["request_id"],
            "end_seq": payload["end_seq"],
            "kind": item.kind,
            "perspective": perspective,
            "text": outcome.text,
            "source_text": item.original,
            "is_absolute": outcome.is_absolute,
            "warnings": outcome.warnings,
            "occurred_at": moment,
            "timezone": payload["timezone"],
            "location_abs": context.location_abs,
            "message_ids": context.message_ids,
            "metadata": metadata,
            "embedding": vector,
            "job_id": job.job.id,
        }
