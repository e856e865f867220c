"""Reading the original bot's loosely typed values: ids, times, conversations, profiles.

The bot wrote ids as numbers or strings ("" for none), times as ISO text with or without an
offset or as Unix seconds, and its profiles' front matter in several generations of shape
(``user_id: 1708213363``, ``updated_at: 1771590000``, naive ``datetime.now()`` times). Each
helper turns one such value into this service's shape, or says it cannot.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from service.context import ID_MAX, conversation_key, in_range
from service.errors import Invalid
from service.profiles.document import (
    MAX_TAG_CHARS,
    MAX_TAGS,
    Profile,
    ProfileKey,
    check_front_matter,
    front_matter,
    parse,
    render,
)
from service.profiles.document import split as split_document

_FENCED = re.compile(r"^```[\w-]*\n(.*?)\n?```$", re.S)
# Unix times after 2286 in seconds are milliseconds in practice.
_MILLISECONDS = 10**10


@dataclass(frozen=True)
class Chat:
    """A conversation as the source names it: a group, or one person's private chat."""

    request_type: str
    group_id: str | None
    user_id: str | None
    sender_id: str | None = None

    @property
    def key(self) -> str:
        """The service's conversation key (``g:<group>`` / ``p:<user>``)."""
        return conversation_key(self.request_type, self.group_id, self.user_id)


def identifier(value: Any) -> str | None:
    """An id as text; None for none, "" and anything that cannot be an id in a URL path."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        value = str(value)
    if not isinstance(value, str):
        return None
    ident = value.strip()
    if not ident or len(ident) > ID_MAX or "/" in ident:
        return None
    return ident


def text_or_none(value: Any, limit: int) -> str | None:
    """A non-empty string, clipped to ``limit`` characters."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip()[:limit]


def chat_of(record: dict[str, Any]) -> Chat | None:
    """The conversation a record names by ``request_type``, ``group_id``, ``user_id``,
    ``sender_id`` (a group when it has a group id and says nothing else)."""
    group = identifier(record.get("group_id"))
    user = identifier(record.get("user_id"))
    sender = identifier(record.get("sender_id"))
    kind = record.get("request_type")
    if kind not in ("group", "private"):
        kind = "group" if group else "private"
    if kind == "group":
        return Chat("group", group, user, sender) if group else None
    if not (user or sender):
        return None
    return Chat("private", None, user or sender, sender)


def parse_chat(value: str) -> Chat:
    """``group:<id>`` or ``private:<id>`` (the command line's way to name a conversation)."""
    kind, _, raw = value.partition(":")
    ident = identifier(raw)
    if kind not in ("group", "private") or ident is None:
        raise Invalid("name a conversation as group:ID or private:ID", field="memo_conversation")
    if kind == "group":
        return Chat("group", ident, None)
    return Chat("private", None, ident)


def iana_zone(value: Any) -> str | None:
    """An IANA timezone name, or None. The bot wrote ``str(tzinfo)`` ("CST"), which names no
    zone reliably (China, Cuba and the US Midwest all say CST); only Area/City names pass."""
    if not isinstance(value, str) or ("/" not in value and value != "UTC"):
        return None
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        return None
    return value


def moment(value: Any, zone: str) -> datetime | None:
    """An aware time from ISO text, a datetime, a date or Unix seconds (naive: in ``zone``)."""
    try:
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, str) and re.fullmatch(r"\s*\d+(\.\d+)?\s*", value):
            value = float(value)
        if isinstance(value, int | float):
            seconds = value / 1000 if value > _MILLISECONDS else value
            found = datetime.fromtimestamp(seconds, UTC)
        elif isinstance(value, datetime):
            found = value
        elif isinstance(value, date):
            found = datetime(value.year, value.month, value.day)
        elif isinstance(value, str) and value.strip():
            found = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        else:
            return None
        if found.tzinfo is None:
            found = found.replace(tzinfo=ZoneInfo(zone))
        return in_range(found)
    except (ValueError, OverflowError, OSError):
        return None


def record_moment(record: dict[str, Any], zone: str) -> datetime | None:
    """When a job, memo or event happened: the first readable of its time fields."""
    if (utc := record.get("timestamp_utc")) and (found := moment(utc, "UTC")):
        return found
    for name in ("timestamp_local", "timestamp", "timestamp_epoch", "time"):
        if (found := moment(record.get(name), zone)) is not None:
            return found
    return None


def stable_id(prefix: str, *parts: str) -> str:
    """A deterministic id from the content it stands for (the same source, the same id)."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:24]
    return f"{prefix}-{digest}"


def conform_profile(text: str, key: ProfileKey, taken_at: datetime, zone: str) -> str:
    """The document to store for a profile file: the file itself when it is already valid
    here, else the same body under front matter completed from the older shapes (name from
    ``nickname``/``group_name``, epoch or naive ``updated_at``, …). ``Invalid`` says why not."""
    text = text.lstrip("\ufeff").strip()
    fenced = _FENCED.match(text)
    if fenced:  # the bot's LLM sometimes wrapped the whole file in a code fence
        text = fenced.group(1).strip()
    try:
        head, body = split_document(text)
    except Invalid:
        raise Invalid("no YAML front matter (a profile starts with a '---' line)") from None
    text += "\n"
    try:
        parse(text, expected=key)
        return text
    except Invalid:
        pass
    meta = front_matter(head)
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise Invalid("the front matter is not a YAML mapping")
    check_front_matter(meta)  # what the renderer below could not write
    declared_type = meta.get("entity_type")
    if declared_type not in (None, "", key.entity_type):
        raise Invalid(f"it describes a {declared_type}, but lies among {key.entity_type} files")
    own_id = "user_id" if key.entity_type == "user" else "group_id"
    declared = identifier(meta.get("entity_id")) or identifier(meta.get(own_id))
    if declared is not None and declared != key.entity_id:
        raise Invalid(f"it describes {declared}, not {key.describe()} (its file name)")
    names = (meta.get("name"), meta.get("nickname"), meta.get("group_name"), key.entity_id)
    name = next(n for n in (text_or_none(v, 200) for v in names) if n)
    handled = {"entity_type", "entity_id", own_id, "name", "tags", "updated_at", "source_event_id"}
    source = text_or_none(meta.get("source_event_id"), 300)
    profile = Profile(
        key=key,
        name=name,
        tags=_tags(meta.get("tags")),
        updated_at=moment(meta.get("updated_at"), zone) or taken_at,
        source_event_id=source,
        body=body,
        extra={k: v for k, v in meta.items() if k not in handled},
    )
    document = render(profile)
    parse(document, expected=key)  # an empty body or an oversized file is still refused
    return document


def _tags(value: Any) -> list[str]:
    if isinstance(value, str):
        value = re.split(r"[,，、]", value)
    if not isinstance(value, list):
        return []
    tags = [str(t).strip()[:MAX_TAG_CHARS] for t in value if isinstance(t, str | int | float)]
    return [t for t in tags if t][:MAX_TAGS]
