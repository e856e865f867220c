"""The historian's ``end`` job: rules, the LLM, the gate, embeddings, events — never a drop."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from service.context import ConversationContext
from service.embedding import Embedder
from service.events import repository as events
from service.historian.absolutize import Person, Situation, absolutize
from service.historian.memories import Conversation, MemoryKeeper, Plan
from service.historian.profiles import ProfileMerger, Staged, Target, end_targets
from service.historian.rewrite import Item, Outcome, rewrite_with_llm, rule_outcome
from service.historian.rewrite import Situation as PromptSituation
from service.llm import ChatModel, LLMError
from service.observability import GATE
from service.privacy import pii
from service.profiles import repository as profile_rows
from service.profiles.document import ProfileKey
from service.profiles.service import Fact
from service.queue.payloads import EndPayload
from service.queue.worker import JobContext, PermanentJobError
from service.settings import Settings

log = logging.getLogger("service.historian")

SCHEMA_VERSION = "final_v1"


def screen(payload: dict[str, Any], ids: list[str]) -> tuple[dict[str, Any], list[str], list[str]]:
    """The tenant's personal-data policy, before the rules, the LLM or the embedder see
    anything: masked items stay, dropped ones lose their event too."""
    policy = str(payload.get("pii_policy", "store"))
    if policy == "store":
        return payload, ids, []
    notes: list[str] = []
    memo_id = ids[-1] if payload.get("memo") and ids and ids[-1].endswith(":memo") else None
    observation_ids = ids[: len(ids) - (1 if memo_id else 0)]
    kept_observations, kept_ids = [], []
    for text, event_id in zip(payload.get("observations", []), observation_ids, strict=False):
        value, kinds = pii.apply(text, policy)
        if value is None:
            notes.append(f"{event_id} dropped: personal data ({', '.join(kinds)})")
            continue
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
        "memo": memo,
        "recent_messages": reference,
        "source_message": pii.mask(source) if isinstance(source, str) else source,
    }
    return screened, kept_ids + ([memo_id] if memo_id else []), notes


def message_content(text: str) -> str:
    """The ``<content>`` of a bot message frame, or the text itself."""
    # Found by position, not by a lazy regex: from every '<content>' without a closing tag,
    # '(.*?)</content>' scanned to the end of the text, quadratic in a hostile message.
    start = text.find("<content>")
    end = text.find("</content>", start + len("<content>")) if start >= 0 else -1
    if end < 0:
        return text.strip()
    return text[start + len("<content>") : end].strip()


def clip(text: str, limit: int) -> str:
    """At most ``limit`` characters, marked when cut."""
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


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


def end_conversation(context: ConversationContext, moment: datetime) -> Conversation:
    """The memory step's view of an end call's conversation."""
    speaker = context.sender_id or (
        context.private_user if context.request_type == "private" else None
    )
    participants = {speaker: context.sender_name} if speaker else {}
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

        outcomes, calls = await self._rewrite(job, context, moment, payload, items)
        policy = str(payload.get("pii_policy", "store"))
        for outcome in outcomes:
            # The rewrite may bring personal data back from the reference messages.
            kept, _ = pii.apply(outcome.text, "mask" if policy == "drop" else policy)
            outcome.text = kept or outcome.text
        vectors = await self.embedder.passages([o.text for o in outcomes])
        rows = [
            self._event_row(job, context, moment, payload, item, outcome, event_id, vector)
            for item, outcome, event_id, vector in zip(items, outcomes, ids, vectors, strict=True)
        ]
        # Only what passed the gate (or was forced) reaches profiles and memories: a
        # degraded statement still says "he" or "tomorrow" and would mislead them for good.
        accepted = [
            (item, outcome, event_id, vector)
            for item, outcome, event_id, vector in zip(items, outcomes, ids, vectors, strict=True)
            if item.kind == "observation" and outcome.accepted
        ]
        facts = [
            Fact(outcome.text, moment.date().isoformat(), event_id)
            for _, outcome, event_id, _ in accepted
        ]
        targets = end_targets(context, facts, llm=self.llm is not None)
        staged, notes, profile_calls = await self._prepare_profiles(job, targets, moment)
        notes = pii_notes + notes
        model_decided = profile_calls > 0
        conversation = end_conversation(context, moment)
        observed = [(item, outcome, vector) for item, outcome, _, vector in accepted]
        plan = await self._plan_memories(job, conversation, observed)
        notes += plan.notes
        async with job.finishing() as session:
            await events.upsert_events(session, rows)
            versions = await self.profiles.write(
                session,
                job.job.tenant_id,
                targets,
                staged,
                moment,
                {"by": "job", "job_id": job.job.id, "event_id": ids[0] if ids else None},
                model_decided=model_decided,
            )
            memory_changes = await self.memories.apply(
                session,
                job.job.tenant_id,
                conversation,
                plan,
                {"by": "job", "job_id": job.job.id},
                {"event_ids": ids, "message_ids": context.message_ids},
                [
                    {"event_ids": [event_id], "message_ids": context.message_ids}
                    for _, _, event_id, _ in accepted
                ],
            )
            for outcome in outcomes:
                GATE.labels("absolute" if outcome.is_absolute else "degraded").inc()
            job.result = {
                "event_ids": ids,
                "absolute": sum(o.is_absolute for o in outcomes),
                "degraded": sum(not o.is_absolute for o in outcomes),
                "llm_calls": calls,
                "profile_llm_calls": profile_calls,
                "profiles": versions,
                "memory": memory_changes,
                "memory_llm_calls": plan.calls,
                "notes": notes,
            }
        return job.result

    async def _plan_memories(
        self,
        job: JobContext,
        conversation: Conversation,
        observed: list[tuple[Item, Outcome, Any]],
    ) -> Plan:
        if not observed:
            return Plan()
        async with job.transaction() as session:
            known, pending = await self.memories.retrieve(
                session, job.job.tenant_id, conversation, [vector for _, _, vector in observed]
            )
        items = [(outcome.text, item.original) for item, outcome, _ in observed]
        try:
            return await self.memories.decide(conversation, items, known, pending)
        except LLMError as exc:
            if job.job.attempts < job.job.max_attempts:
                raise
            plan = MemoryKeeper(self.embedder, None, self.settings).decide
            fallback = await plan(conversation, items, known, pending)
            fallback.notes.insert(0, f"memories without the LLM (it failed: {exc})")
            return fallback

    async def _prepare_profiles(
        self, job: JobContext, targets: list[Target], moment: datetime
    ) -> tuple[dict[str, Staged], list[str], int]:
        async def read(key: ProfileKey) -> dict[str, Any] | None:
            async with job.transaction() as session:
                return await profile_rows.get(session, job.job.tenant_id, key)

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
        for observation in payload.get("observations", []):
            draft = absolutize(observation, Situation(moment, speaker, bot, location))
            items.append(Item(len(items), "observation", observation, draft, speaker, bot))
        memo = payload.get("memo") or ""
        if memo:
            draft = absolutize(memo, Situation(moment, bot, user, location))
            items.append(Item(len(items), "memo", memo, draft, bot, user))
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
