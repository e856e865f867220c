"""Importing the original bot's data directory into a tenant, idempotently.

Profiles come first (with their snapshots as older revisions), then the exported events
(embedded again with this service's embedder), then the memo log, and the queued jobs last,
handed over as ``end`` calls: a worker that picks them up at once then merges their facts
into profiles that are already here. Every id derives from the source (file names, event
ids, content hashes), so a second run finds everything and adds nothing.

Failed jobs are queued again like pending ones: the bot gave up on them because its LLM or
embedder failed, and this historian never drops a job (its last attempt stores the rule
rewrite). The summary counts them apart.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service import pii
from service.db import statistics
from service.db.engine import Database
from service.embedding import Embedder
from service.ends.schemas import loose_bool
from service.ends.service import accept_end, dedupe_key, event_ids, record_memo
from service.errors import Conflict, MemoriaError
from service.events.service import store as store_events
from service.importer import repository
from service.importer.coerce import Chat, identifier, text_or_none
from service.importer.report import Report
from service.importer.source import ProfileHistory, Skip, Source, StoredEvent
from service.importer.undefined import FORMAT, read_source
from service.privacy.service import was_erased
from service.profiles import service as profiles
from service.profiles.consolidate import digest
from service.profiles.document import parse
from service.settings import Settings
from service.tenants.service import TenantContext, tenant_context

Progress = Callable[[str, int, int], None]
BATCH = 64


def _quiet(stage: str, done: int, total: int) -> None:
    return None


async def import_undefined(
    db: Database,
    settings: Settings,
    embedder: Embedder,
    tenant_id: uuid.UUID,
    root: Path,
    *,
    dry_run: bool = False,
    events_file: Path | None = None,
    memo_chat: Chat | None = None,
    progress: Progress = _quiet,
) -> Report:
    """Import the bot's ``data/`` directory into a tenant (``dry_run``: only count).

    ``embedder`` must make the stored vectors' kind (``reembed.service.settle`` picks it).
    """
    async with db.system() as session:
        tenant = await tenant_context(session, tenant_id, settings)
    source = await asyncio.to_thread(
        read_source, root, tenant.timezone, events_file=events_file, memo_chat=memo_chat
    )
    writer = _Writer(db, settings, embedder, tenant, source, dry_run, progress)
    await writer.run()
    return writer.report


class _Writer:
    """Writes one source into one tenant, a transaction per profile, batch or job."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        embedder: Embedder,
        tenant: TenantContext,
        source: Source,
        dry_run: bool,
        progress: Progress,
    ) -> None:
        self.db = db
        self.settings = settings
        self.embedder = embedder
        self.tenant = tenant
        self.source = source
        self.dry_run = dry_run
        self.progress = progress
        self.report = Report(
            source.root, FORMAT, tenant.tenant_id, dry_run, skipped=list(source.skipped)
        )
        self.erased: set[str] = set()

    @property
    def tenant_id(self) -> uuid.UUID:
        """The tenant written to."""
        return self.tenant.tenant_id

    async def run(self) -> None:
        """Every part of the source, in the order that keeps jobs last."""
        await self._find_erased()
        await self._profiles()
        await self._events()
        await self._memos()
        await self._jobs()
        self._notes()

    def _skip(self, origin: str, reason: str) -> None:
        self.report.skipped.append(Skip(origin, reason))

    async def _find_erased(self) -> None:
        # Jobs go through the end call, which applies the tenant's erased_policy itself.
        if self.tenant.erased_policy == "accept":
            return
        people = {
            i
            for chat in [m.chat for m in self.source.memos] + [e.chat for e in self.source.events]
            for i in (chat.user_id, chat.sender_id)
            if i
        }
        async with self.db.tenant(self.tenant_id) as session:
            self.erased = await was_erased(session, self.tenant_id, sorted(people))

    def _refused(self, origin: str, chat: Chat) -> bool:
        erased = sorted({i for i in (chat.user_id, chat.sender_id) if i} & self.erased)
        if not erased:
            return False
        if self.tenant.erased_policy == "refuse":
            self._skip(origin, "about an erased person (the tenant's erased_policy is refuse)")
            return True
        self.report.notes.append(f"{origin}: about a person erased before ({erased[0]})")
        return False

    # ------------------------------------------------------------ profiles

    async def _profiles(self) -> None:
        total = len(self.source.profiles)
        for n, history in enumerate(self.source.profiles, 1):
            try:
                await self._profile(history)
            except Conflict:
                self._skip(history.versions[-1].origin, "the profile changed during the import")
            self.progress("profiles", n, total)

    async def _profile(self, history: ProfileHistory) -> None:
        key, newest = history.key, history.versions[-1]
        async with self.db.tenant(self.tenant_id) as session:
            row = await profiles.find(session, self.tenant_id, key)
            known = row is not None and (
                newest.document == row["document"]
                or await profiles.is_kept(session, self.tenant_id, key, newest.document)
            )
        if row is not None:
            if known:
                self.report.present["profiles"] += 1
            else:
                self._skip(
                    newest.origin,
                    f"the tenant already has another profile of {key.describe()}; left as it is",
                )
            return
        keep = self.settings.cognitive.profile.revision_keep
        self.report.imported["profiles"] += 1
        self.report.imported["revisions"] += min(len(history.versions) - 1, keep)
        if self.dry_run:
            return
        # Every version is checked before anything is embedded or written.
        versions = [
            (
                parse(v.document, expected=key),
                v.document,
                {"by": "import", "source": FORMAT, "file": v.origin},
            )
            for v in history.versions
        ]
        [vector] = await self.embedder.passages([digest(versions[-1][0].body)])
        async with self.db.tenant(self.tenant_id) as session:
            await profiles.restore_history(
                session, self.tenant_id, key, versions, vector, keep=keep
            )

    # ------------------------------------------------------------ events

    async def _events(self) -> None:
        events = self.source.events
        written: Counter[tuple[uuid.UUID, str]] = Counter()
        for start in range(0, len(events), BATCH):
            batch = events[start : start + BATCH]
            async with self.db.tenant(self.tenant_id) as session:
                have = await repository.existing_events(
                    session, self.tenant_id, [e.id for e in batch]
                )
            fresh: list[tuple[StoredEvent, str]] = []
            for event in batch:
                if event.id in have:
                    self.report.present["events"] += 1
                    continue
                if self._refused(event.origin, event.chat):
                    continue
                text, kinds = pii.apply(event.text, self.tenant.pii_policy)
                if text is None:
                    self._skip(event.origin, f"personal data ({', '.join(kinds)}), pii_policy drop")
                    continue
                fresh.append((event, text))
            self.report.imported["events"] += len(fresh)
            if fresh and not self.dry_run:
                vectors = await self.embedder.passages([text for _, text in fresh])
                rows = [
                    self._event_row(event, text, vector)
                    for (event, text), vector in zip(fresh, vectors, strict=True)
                ]
                async with self.db.tenant(self.tenant_id) as session:
                    await store_events(session, rows)
                written.update((self.tenant_id, row["conversation_key"]) for row in rows)
            self.progress("events", min(start + BATCH, len(events)), len(events))
        imported = self.report.imported["events"]
        if imported and not self.dry_run:
            # The bot's whole history may be most of the tables: a turn right after the
            # import must not be planned on statistics of the tables before it.
            await statistics.analyze_outgrown(
                self.db, ["events", "event_vectors"], imported, written
            )

    def _event_row(self, event: StoredEvent, text: str, vector: Any) -> dict[str, Any]:
        meta, chat = event.metadata, event.chat
        group = chat.request_type == "group"
        perspective = text_or_none(meta.get("perspective"), 100) or ""
        if not 0 < len(perspective) <= 16:
            perspective = "group" if group else "sender"
        try:
            absolute = bool(loose_bool(meta.get("is_absolute", True)))
        except ValueError:
            absolute = True
        return {
            "tenant_id": self.tenant_id,
            "id": event.id,
            "conversation_key": chat.key,
            "request_type": chat.request_type,
            "group_id": chat.group_id,
            "user_id": chat.user_id,
            "sender_id": chat.sender_id,
            "request_id": text_or_none(meta.get("request_id"), 200) or event.id[:200],
            "end_seq": _small_int(meta.get("end_seq")),
            "kind": "memo" if meta.get("kind") == "memo" else "observation",
            "perspective": perspective,
            "text": text,
            "source_text": text,
            "is_absolute": absolute,
            "warnings": [],
            "occurred_at": event.occurred_at,
            "timezone": event.timezone or self.tenant.timezone,
            "location_abs": text_or_none(meta.get("location_abs"), 500),
            "message_ids": _message_ids(meta.get("message_ids")),
            "metadata": {**meta, "imported_from": FORMAT},
            "embedding": vector,
            "job_id": None,
        }

    # ------------------------------------------------------------ the memo log

    async def _memos(self) -> None:
        memos = self.source.memos
        for start in range(0, len(memos), 500):
            batch = memos[start : start + 500]
            async with self.db.tenant(self.tenant_id) as session:
                have = await repository.imported_turns(
                    session, self.tenant_id, [(m.chat.key, m.request_id) for m in batch], [], {}
                )
                for memo in batch:
                    if (memo.chat.key, memo.request_id) in have:
                        self.report.present["memos"] += 1
                        continue
                    if self._refused(memo.origin, memo.chat):
                        continue
                    if self.dry_run:
                        self.report.imported["memos"] += 1
                        continue
                    row = {
                        "tenant_id": self.tenant_id,
                        "conversation_key": memo.chat.key,
                        "request_type": memo.chat.request_type,
                        "group_id": memo.chat.group_id,
                        "user_id": memo.chat.user_id,
                        "sender_id": memo.chat.sender_id,
                        "request_id": memo.request_id,
                        "end_seq": 1,
                        "memo": memo.text,
                        "said_at": memo.said_at,
                    }
                    added = await record_memo(session, row)
                    self.report.imported["memos"] += added
                    self.report.present["memos"] += not added
            self.progress("memos", min(start + 500, len(memos)), len(memos))

    # ------------------------------------------------------------ queued jobs

    async def _jobs(self) -> None:
        jobs = self.source.jobs
        have: set[tuple[str, str]] = set()
        for start in range(0, len(jobs), 500):
            requests = [j.request for j in jobs[start : start + 500]]
            # A turn's events: as the bot's store named them, or as a job of this import did.
            ids = [
                eid
                for r in requests
                for eid in (
                    *bot_event_ids(r.request_id, r.end_seq, len(r.observations), bool(r.memo)),
                    *event_ids(
                        r.conversation_key,
                        r.request_id,
                        r.end_seq,
                        len(r.observations),
                        bool(r.memo),
                    ),
                )
            ]
            async with self.db.tenant(self.tenant_id) as session:
                have |= await repository.imported_turns(
                    session,
                    self.tenant_id,
                    [(r.conversation_key, r.request_id) for r in requests],
                    ids,
                    {
                        dedupe_key(r.conversation_key, r.request_id, r.end_seq): (
                            r.conversation_key,
                            r.request_id,
                        )
                        for r in requests
                    },
                )
        for n, job in enumerate(jobs, 1):
            self.progress("jobs", n, len(jobs))
            if (job.request.conversation_key, job.request.request_id) in have:
                self.report.present["jobs"] += 1
                continue
            if not self.dry_run:
                try:
                    accepted = await accept_end(self.db, self.tenant, job.request, self.settings)
                except MemoriaError as exc:
                    self._skip(job.origin, exc.message)
                    continue
                if accepted.duplicate:
                    self.report.present["jobs"] += 1
                    continue
            self.report.imported["jobs"] += 1
            self.report.imported["failed jobs"] += job.state == "failed"

    def _notes(self) -> None:
        notes = self.report.notes
        if self.report.imported["jobs"] and not self.tenant.cognitive_enabled:
            notes.append(
                "cognitive memory is off for this tenant: the jobs' memos were recorded,"
                " no historian jobs were made"
            )
        for note, count in sorted(self.source.notes.items()):
            notes.append(f"{note}: {count}")
        for kind, fields in sorted(self.source.unknown.items()):
            listed = ", ".join(f"{name} ({count})" for name, count in fields.most_common())
            notes.append(f"{kind}: unknown fields ignored: {listed}")


def bot_event_ids(request_id: str, end_seq: int, observations: int, memo: bool) -> list[str]:
    """The ids the bot's own store gave a job's events (``rid:seq`` for a lone observation,
    ``rid:seq:N`` for several, ``rid:seq:memo``), by which an imported turn is found."""
    base = f"{request_id}:{end_seq}"
    ids = [base] if observations == 1 else [f"{base}:{n}" for n in range(1, observations + 1)]
    return [*ids, f"{base}:memo"] if memo else ids


def _small_int(value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return 0
    return number if 0 <= number < 2**31 else 0


def _message_ids(value: Any) -> list[str]:
    # Chroma metadata holds no lists, so the bot's message ids arrive as text ("1,2" or "[…]").
    if isinstance(value, str):
        value = value.strip().strip("[]").replace('"', "").replace("'", "").split(",")
    if not isinstance(value, list):
        return []
    return [i for i in map(identifier, value) if i]
