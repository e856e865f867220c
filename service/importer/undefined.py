"""The original bot's data directory (Undefined, seed 002), read into items to import.

    DATA_DIR/
    ├── end_summaries.json                       the memo log: ["…"] or
    │                                            [{"summary", "timestamp", "location"}, …]
    └── cognitive/
        ├── chromadb/events.json                 an export of the events collection (optional)
        ├── profiles/users|groups/{id}.md        current profiles
        ├── profiles/history/{type}/{id}/{stamp}.md   the snapshot taken before each change
        └── queues/pending|processing|failed/{job_id}.json   the historian's jobs

The older layout of seed 000 (``profiles/`` and ``queues/`` beside ``end_summaries.json``)
is read too. Nothing here touches the database: whatever cannot be used becomes a ``Skip``
naming the file and the reason, and reading goes on.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from service.ends.schemas import MAX_ITEM_CHARS, EndRequest
from service.errors import Invalid, field_of
from service.importer.coerce import (
    Chat,
    chat_of,
    iana_zone,
    identifier,
    record_moment,
    stable_id,
    text_or_none,
)
from service.importer.snapshots import read_profiles
from service.importer.source import (
    MAX_FILE_BYTES,
    MAX_HISTORY_BYTES,
    UNREADABLE,
    MemoEntry,
    QueuedJob,
    Source,
    StoredEvent,
    load_json,
    mtime,
    note_unknown,
    storable,
)
from service.profiles.document import parse

FORMAT = "undefined"
JOB_STATES = ("pending", "processing", "failed")
EVENT_EXPORTS = ("cognitive/chromadb/events.json", "cognitive/events.json", "events.json")
# A memo in end_summaries.json and the same memo in a queued job are one turn (the bot wrote
# both); the two times differ by the bot's own latency.
SAME_TURN = timedelta(minutes=2)
MAX_EVENT_ID = 300

# fmt: off
_JOB_FIELDS = frozenset({
    "request_id", "end_seq", "request_type", "group_id", "user_id", "sender_id",
    "sender_name", "group_name", "bot_id", "bot_name", "message_ids", "location_abs",
    "timestamp_utc", "timestamp_local", "timestamp_epoch", "timezone", "perspective",
    "memo", "observations", "has_observations", "force", "profile_targets",
    "action_summary", "new_info", "has_new_info", "summary", "schema_version",
    "source_message", "recent_messages", "error", "_retry_count", "_last_error",
})
_MEMO_FIELDS = frozenset({
    "summary", "memo", "action_summary", "location", "sender_name", "group_name",
    "timestamp", "timestamp_utc", "timestamp_local", "timestamp_epoch",
    "request_type", "group_id", "user_id", "sender_id",
})
_EVENT_FIELDS = frozenset({
    "id", "document", "text", "metadata", "embedding", "embeddings", "distance", "uri",
})
# fmt: on


def read_source(
    root: Path, zone: str, *, events_file: Path | None = None, memo_chat: Chat | None = None
) -> Source:
    """Read a data directory. ``zone`` dates naive times; ``memo_chat`` takes the memos that
    name no conversation the reader can find."""
    if not root.is_dir():
        raise Invalid(f"no such directory: {root}", field="data_dir")
    # A name that is there but no regular file (a FIFO, a link to a device) is read, to be
    # reported as skipped, not passed over in silence.
    if events_file is not None and not events_file.exists():
        raise Invalid(f"no such file: {events_file}", field="events")
    source = Source(root)
    bases = [root / "cognitive", root]
    profiles = next((b / "profiles" for b in bases if (b / "profiles").is_dir()), None)
    if profiles is not None:
        read_profiles(source, profiles, zone)
    queues = next((b / "queues" for b in bases if (b / "queues").is_dir()), None)
    if queues is not None:
        _read_jobs(source, queues, zone)
    exported = events_file or next((root / p for p in EVENT_EXPORTS if (root / p).exists()), None)
    if exported is not None:
        _read_events(source, exported, zone)
    if (root / "end_summaries.json").exists():
        _read_memos(source, root / "end_summaries.json", zone, memo_chat)
    return source


# ---------------------------------------------------------------- queued jobs


def _read_jobs(source: Source, base: Path, zone: str) -> None:
    seen: dict[str, str] = {}
    for state in JOB_STATES:
        for path in sorted((base / state).glob("*.json")):
            record = load_json(source, path, MAX_FILE_BYTES)
            if record is UNREADABLE:
                continue
            if not isinstance(record, dict):
                source.skip(path, "a job is a JSON object")
                continue
            if not storable(source, path, record):
                continue
            note_unknown(source, "jobs", record, _JOB_FIELDS)
            # The job id (the file name) is the bot's own id of the turn; its events were
            # named after it, so it becomes the request id here.
            request_id = identifier(path.stem) or stable_id("undefined-job", path.stem)
            if request_id in seen:
                source.skip(path, f"the same job as {seen[request_id]}")
                continue
            chat = chat_of(record)
            if chat is None:
                source.skip(path, "names no conversation (no group_id, user_id or sender_id)")
                continue
            try:
                request = EndRequest.model_validate(_end_body(record, request_id, chat, zone))
            except ValidationError as exc:
                error = exc.errors()[0]
                where = field_of(error) or "job"
                source.skip(path, f"not a usable end job: {where}: {error['msg']}")
                continue
            if not request.memo and not request.observations:
                source.skip(path, "nothing to hand over (no memo and no observations)")
                continue
            if request.timestamp is None:
                source.notes["jobs without a readable time (dated at import)"] += 1
            seen[request_id] = source.relative(path)
            error_text = record.get("error") or record.get("_last_error")
            source.jobs.append(
                QueuedJob(
                    source.relative(path),
                    state,
                    request,
                    str(error_text) if error_text else None,
                )
            )


def _end_body(record: dict[str, Any], request_id: str, chat: Chat, zone: str) -> dict[str, Any]:
    when = record_moment(record, zone)
    memo = next(
        (m for m in (record.get(k) for k in ("memo", "action_summary", "summary")) if m), ""
    )
    observations = record.get("observations")
    if observations is None:
        observations = record.get("new_info")
    message_ids = record.get("message_ids")
    recent = record.get("recent_messages")
    return {
        "request_id": request_id,
        "end_seq": 1,
        "request_type": chat.request_type,
        "group_id": chat.group_id,
        "user_id": chat.user_id,
        "sender_id": chat.sender_id,
        "sender_name": text_or_none(record.get("sender_name"), 200),
        "group_name": text_or_none(record.get("group_name"), 200),
        "bot_id": identifier(record.get("bot_id")),
        "bot_name": text_or_none(record.get("bot_name"), 200),
        "message_ids": [m for m in map(identifier, message_ids) if m]
        if isinstance(message_ids, list)
        else [],
        "timestamp": when.isoformat() if when else None,
        "timezone": iana_zone(record.get("timezone")),
        "location_abs": text_or_none(record.get("location_abs"), 500),
        "memo": memo[:MAX_ITEM_CHARS] if isinstance(memo, str) else memo,
        "observations": observations,
        "force": record.get("force", False),
        "source_message": text_or_none(record.get("source_message"), 100_000),
        "recent_messages": recent[-500:] if isinstance(recent, list) else recent,
    }


# ---------------------------------------------------------------- events


def _event_records(data: Any) -> list[Any] | None:
    if isinstance(data, dict) and isinstance(data.get("ids"), list):
        # Chroma's own ``collection.get()`` shape: parallel lists (nested once by ``query()``).
        ids, documents, metadatas = (data.get(k) or [] for k in ("ids", "documents", "metadatas"))
        if ids and isinstance(ids[0], list):
            ids, documents, metadatas = (v[0] if v else [] for v in (ids, documents, metadatas))
        return [
            {
                "id": ident,
                "document": documents[n] if n < len(documents) else None,
                "metadata": metadatas[n] if n < len(metadatas) else None,
            }
            for n, ident in enumerate(ids)
        ]
    if isinstance(data, dict) and isinstance(data.get("events"), list):
        return list(data["events"])
    return list(data) if isinstance(data, list) else None


def _read_events(source: Source, path: Path, zone: str) -> None:
    records = load_json(source, path, MAX_HISTORY_BYTES)
    if records is UNREADABLE:
        return
    listed = _event_records(records)
    if listed is None:
        source.skip(path, "not an events export (expected Chroma's ids/documents/metadatas)")
        return
    seen: set[str] = set()
    name = source.relative(path)
    for n, record in enumerate(listed):
        origin = f"{name}[{n}]"
        if not isinstance(record, dict):
            source.skip(origin, "an event is a JSON object")
            continue
        if not storable(source, origin, record):
            continue
        note_unknown(source, "events", record, _EVENT_FIELDS)
        ident = record.get("id")
        text = text_or_none(record.get("document") or record.get("text"), 100_000)
        metadata = record.get("metadata") or {}
        if not isinstance(ident, str) or not ident.strip() or "/" in ident:
            source.skip(origin, "no usable event id")
            continue
        if len(ident) > MAX_EVENT_ID or ident in seen:
            source.skip(origin, "event id too long" if ident not in seen else "a repeated id")
            continue
        seen.add(ident)
        if text is None:
            source.skip(origin, f"event {ident} has no text")
            continue
        if not isinstance(metadata, dict):
            source.skip(origin, f"event {ident}: metadata is not an object")
            continue
        chat = chat_of(metadata)
        when = record_moment(metadata, zone)
        if chat is None:
            source.skip(origin, f"event {ident} names no conversation (group_id / user_id)")
            continue
        if when is None:
            source.skip(origin, f"event {ident} has no readable time")
            continue
        source.events.append(
            StoredEvent(
                origin, ident, text, chat, when, iana_zone(metadata.get("timezone")), metadata
            )
        )


# ---------------------------------------------------------------- the memo log


def _known_names(source: Source) -> dict[tuple[str, str], set[str]]:
    """Display names → ids, from the jobs and profiles (the memo log names places by name)."""
    names: dict[tuple[str, str], set[str]] = defaultdict(set)
    for job in source.jobs:
        request = job.request
        if request.request_type == "group" and request.group_name and request.group_id:
            names[("group", request.group_name)].add(request.group_id)
        if request.request_type == "private" and request.sender_name:
            names[("private", request.sender_name)].add(request.private_user)
    for profile in source.profiles:
        kind = "group" if profile.key.entity_type == "group" else "private"
        names[(kind, parse(profile.versions[-1].document).name)].add(profile.key.entity_id)
    return names


def _place(location: Any, names: dict[tuple[str, str], set[str]]) -> Chat | None:
    if not isinstance(location, dict):
        return None
    kind, name = location.get("type"), text_or_none(location.get("name"), 200)
    if kind not in ("group", "private") or name is None:
        return None
    # Without a name the bot wrote "群<id>" for a group and the bare id for a person.
    if kind == "group" and name.startswith("群") and name[1:].isdigit():
        return Chat("group", name[1:], None)
    if kind == "private" and name.isdigit():
        return Chat("private", None, name)
    ids = names.get((kind, name), set())
    if len(ids) != 1:
        return None
    [ident] = ids
    return Chat("group", ident, None) if kind == "group" else Chat("private", None, ident)


def _read_memos(source: Source, path: Path, zone: str, fallback: Chat | None) -> None:
    data = load_json(source, path, MAX_HISTORY_BYTES)
    if data is UNREADABLE:
        return
    if isinstance(data, dict):
        data = data.get("summaries", data.get("items"))
    if not isinstance(data, list):
        source.skip(path, "expected a JSON list of memos")
        return
    names = _known_names(source)
    job_memos: dict[str, list[QueuedJob]] = defaultdict(list)
    for job in source.jobs:
        if job.request.memo:
            job_memos[job.request.memo].append(job)
    # Entries without a time (the oldest format) keep their order a second apart, ending at
    # the file's last change: the same file gives the same times on every run.
    undated = mtime(path) - timedelta(seconds=len(data))
    occurrences: Counter[tuple[str, str]] = Counter()
    name = source.relative(path)
    for n, item in enumerate(data):
        origin = f"{name}[{n}]"
        record: dict[str, Any] = {"summary": item} if isinstance(item, str) else item
        if not isinstance(record, dict):
            source.skip(origin, "a memo is a string or an object")
            continue
        if not storable(source, origin, record):
            continue
        if record is item:
            note_unknown(source, "end_summaries.json entries", record, _MEMO_FIELDS)
        fields = (record.get(k) for k in ("summary", "memo", "action_summary"))
        text = next((t for t in (text_or_none(f, 100_000) for f in fields) if t), None)
        if text is None:
            source.skip(origin, "an empty memo")
            continue
        chat = chat_of(record) if _names_chat(record) else None
        chat = chat or _place(record.get("location"), names) or fallback
        if chat is None:
            source.skip(
                origin, "names no conversation this import can find; see --memo-conversation"
            )
            continue
        dated = record_moment(record, zone)
        said_at = dated or undated + timedelta(seconds=n)
        twin = next(
            (
                j
                for j in job_memos.get(text, [])
                if j.request.timestamp is None or abs(j.request.moment(zone) - said_at) <= SAME_TURN
            ),
            None,
        )
        if twin is not None:
            source.skip(origin, f"the same turn as the queued job {twin.origin} (recorded there)")
            continue
        stamp = str(record.get("timestamp") or record.get("timestamp_utc") or "")
        occurrences[(text, stamp)] += 1
        nth = str(occurrences[(text, stamp)])
        request_id = stable_id("undefined-memo", text, stamp, nth)
        if len(text) > MAX_ITEM_CHARS:
            text = text[:MAX_ITEM_CHARS]
            source.notes["memos clipped to 4000 characters"] += 1
        if dated is None:
            source.notes["memos without a readable time (dated by the file)"] += 1
        source.memos.append(MemoEntry(origin, request_id, text, said_at, chat))


def _names_chat(record: dict[str, Any]) -> bool:
    return any(identifier(record.get(k)) for k in ("group_id", "user_id", "sender_id"))
