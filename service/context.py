"""The conversation context every bot call carries: who, where, when."""

from __future__ import annotations

import math
from collections import deque
from datetime import UTC, datetime, tzinfo
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from service.errors import Invalid

DEFAULT_TIMEZONE = "Asia/Shanghai"
ID_MAX = 128


# PostgreSQL and the driver work in UTC, and a time within a day of Python's limits may have
# none (0001-01-01T00:00+14:00): such times are refused by name instead of failing later.
_EARLIEST = datetime(1, 1, 2)
_LATEST = datetime(9999, 12, 30)


def in_range(value: datetime) -> datetime:
    """Refuse a time too close to the limits of the calendar to convert between zones."""
    if not _EARLIEST <= value.replace(tzinfo=None) <= _LATEST:
        raise ValueError("a time must lie between 0001-01-02 and 9999-12-30")
    return value


def checked_moment(value: datetime | None, field: str) -> datetime | None:
    """``in_range`` for a query parameter: ``Invalid`` naming it."""
    try:
        return None if value is None else in_range(value)
    except ValueError as exc:
        raise Invalid(str(exc), field=field) from None


Moment = Annotated[datetime, AfterValidator(in_range)]


def on_clocks(value: datetime | None, zone: tzinfo) -> datetime | None:
    """A request's time with its offset: one given without is read on ``zone``, the caller's
    clocks, as a message's ``sent_at`` is (the driver would read it on the server's)."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=zone)


def on_clocks_of(value: datetime, zone: tzinfo) -> datetime:
    """A stored time as the clocks of ``zone`` read it, or in UTC where they cannot: a time
    refused by none of the checks may lie before the calendar's first day on clocks far behind
    its own (0001-01-02T00:00+14:00 is 0001-01-01T10:00Z, two hours before it at UTC-12)."""
    try:
        return value.astimezone(zone)
    except OverflowError:
        return value.astimezone(UTC)


# No request needs more; deeper JSON is refused before it reaches a model, a jsonb column or
# the historian (which renders what it is given).
MAX_JSON_DEPTH = 64


_HALF_PAIR = "text must not contain half of a UTF-16 surrogate pair (\\ud800-\\udfff alone)"


def _encodable(text: str) -> bool:
    """Whether UTF-8 can write ``text`` (it holds no lone surrogate)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_json(value: Any, field: str = "") -> None:
    """Refuse, naming the field (``messages.0.text``), the shallowest JSON value PostgreSQL
    cannot store or that is nested too deeply: text holding a NUL character (text and jsonb
    cannot hold one), text holding half of a UTF-16 pair (Python's json reads ``\ud83d``
    alone; UTF-8 has no bytes for it), a number that is not finite (NaN and Infinity,
    which Python's json reads and writes, and jsonb has no word for), or nesting beyond
    ``MAX_JSON_DEPTH``."""
    # Iterative: a body may be nested as deep as the decoder allows.
    pending: deque[tuple[str, Any, int]] = deque([(field, value, 0)])
    while pending:
        path, item, depth = pending.popleft()
        if depth > MAX_JSON_DEPTH:
            raise Invalid(f"nested more than {MAX_JSON_DEPTH} levels deep", field=path)
        if isinstance(item, str) and "\x00" in item:
            raise Invalid("text must not contain NUL characters", field=path or "body")
        if isinstance(item, str) and not _encodable(item):
            raise Invalid(_HALF_PAIR, field=path or "body")
        if isinstance(item, float) and not math.isfinite(item):
            raise Invalid("a number must be finite (not NaN or Infinity)", field=path or "body")
        if isinstance(item, dict):
            for key, child in item.items():
                name = f"{path}.{key}" if path else str(key)
                if "\x00" in str(key):
                    raise Invalid("a key must not contain NUL characters", field=name)
                if not _encodable(str(key)):
                    raise Invalid(_HALF_PAIR, field=name)
                pending.append((name, child, depth + 1))
        elif isinstance(item, list):
            pending.extend(
                (f"{path}.{n}" if path else str(n), child, depth + 1)
                for n, child in enumerate(item)
            )


def path_safe(value: Any) -> Any:
    """Refuse an id holding '/': ids are URL path segments (``/v1/profiles/user/{id}``,
    ``/v1/events/{request_id}:1``), where an encoded slash cannot be told from a separator, so
    such an id could be stored but never read, exported or erased again."""
    if isinstance(value, str) and "/" in value:
        raise ValueError("an id must not contain '/' (ids appear in URL paths)")
    return value


def _as_id(value: Any) -> Any:
    """Ids are strings; bots often send QQ numbers as integers, which is accepted."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return path_safe(value.strip())
    return value


Id = str


def iana_zone(value: str | None) -> str | None:
    """A timezone field's value: an IANA name PostgreSQL and Python both know (empty: none)."""
    if value in (None, ""):
        return None
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown IANA timezone {value!r}") from None
    return value


class ConversationContext(BaseModel):
    """Where a call comes from. A group call needs ``group_id``; a private one ``user_id``."""

    model_config = ConfigDict(extra="ignore", str_max_length=100_000)

    request_type: Literal["group", "private"] = Field(
        description="group: a group chat (needs group_id); private: a one-to-one chat"
    )
    group_id: Id | None = Field(default=None, max_length=ID_MAX, description="the group chat")
    group_name: str | None = Field(default=None, max_length=200)
    user_id: Id | None = Field(
        default=None, max_length=ID_MAX, description="the person the bot is serving"
    )
    sender_id: Id | None = Field(default=None, max_length=ID_MAX)
    sender_name: str | None = Field(default=None, max_length=200)
    bot_id: Id | None = Field(default=None, max_length=ID_MAX, description="the bot itself")
    bot_name: str | None = Field(default=None, max_length=200)
    message_ids: list[Id] = Field(default_factory=list, max_length=500)
    timestamp: Moment | None = Field(default=None, description="ISO 8601 with offset; default now")
    timezone: str | None = Field(default=None, max_length=64, description="IANA name")
    location_abs: str | None = Field(default=None, max_length=500)

    @field_validator("group_id", "user_id", "sender_id", "bot_id", mode="before")
    @classmethod
    def _ids(cls, value: Any) -> Any:
        value = _as_id(value)
        return value or None

    @field_validator("message_ids", mode="before")
    @classmethod
    def _message_ids(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str | int):
            value = [value]
        return [_as_id(v) for v in value] if isinstance(value, list) else value

    @field_validator("message_ids")
    @classmethod
    def _message_id_length(cls, value: list[str]) -> list[str]:
        for item in value:
            if not item or len(item) > ID_MAX:
                raise ValueError(f"each message id must be 1..{ID_MAX} characters")
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str | None) -> str | None:
        return iana_zone(value)

    @model_validator(mode="after")
    def _consistent(self) -> ConversationContext:
        if self.request_type == "group" and not self.group_id:
            raise ValueError("group_id is required when request_type is 'group'")
        if self.request_type == "private":
            if not (self.user_id or self.sender_id):
                raise ValueError("user_id is required when request_type is 'private'")
            if self.group_id:
                raise ValueError("group_id must be empty when request_type is 'private'")
        return self

    @property
    def private_user(self) -> str:
        """The person a private chat belongs to."""
        return str(self.user_id or self.sender_id)

    @property
    def conversation_key(self) -> str:
        """One conversation: a group, or one user's private chat."""
        if self.request_type == "group":
            return conversation_key("group", self.group_id, None)
        return conversation_key("private", None, self.private_user)

    def zone(self, default: str = DEFAULT_TIMEZONE) -> tzinfo:
        """The timezone in force: the call's, else the tenant's default."""
        return ZoneInfo(self.timezone or default)

    def moment(self, default_zone: str = DEFAULT_TIMEZONE) -> datetime:
        """The call's timestamp, aware, in its timezone (naive times are read in that zone)."""
        zone = self.zone(default_zone)
        if self.timestamp is None:
            return datetime.now(UTC).astimezone(zone)
        if self.timestamp.tzinfo is None:
            return self.timestamp.replace(tzinfo=zone)
        try:
            return self.timestamp.astimezone(zone)
        except OverflowError:
            # In range as given, off the calendar on the call's clocks (0001-01-02T00:00+23:59
            # is still year 1 in UTC, year 0 in New York).
            raise Invalid(
                "a time must lie between 0001-01-02 and 9999-12-30 on the call's clocks",
                field="timestamp",
            ) from None


def conversation_key(request_type: str, group_id: str | None, user_id: str | None) -> str:
    """``g:<group>`` or ``p:<user>``: the key every conversation-scoped row carries."""
    if request_type == "group":
        if not group_id:
            raise Invalid("group_id is required for a group conversation", field="group_id")
        return f"g:{group_id}"
    if not user_id:
        raise Invalid("user_id is required for a private conversation", field="user_id")
    return f"p:{user_id}"


def key_part(value: str) -> str:
    """An id as one part of a key made of several, split at ':': '%' and ':' percent-escaped,
    so that no two tuples of ids make the same key."""
    return value.replace("%", "%25").replace(":", "%3A")


def is_group(conversation_key: str) -> bool:
    """Whether the key (see ``conversation_key``) is a group's."""
    return conversation_key.startswith("g:")


def scope_of(group_id: str | None, user_id: str | None) -> str:
    """The conversation named by exactly one of ``group_id`` / ``user_id`` (query parameters)."""
    if group_id and user_id:
        raise Invalid("give group_id or user_id, not both", field="group_id")
    if group_id:
        return conversation_key("group", group_id, None)
    if user_id:
        return conversation_key("private", None, user_id)
    raise Invalid("group_id or user_id is required", field="group_id")
