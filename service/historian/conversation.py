"""What the memory step works on: the conversation, and the changes it decides."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from service.visibility import Viewer


@dataclass
class Conversation:
    """Where new information comes from, and which scopes it may write."""

    key: str
    request_type: str
    group_id: str | None
    group_name: str | None
    speaker_id: str | None  # the person a first-hand observation is about (end jobs)
    speaker_name: str | None
    participants: dict[str, str | None]  # user id → name: whom memories may be bound to
    moment: datetime
    # Item index → who said it, where one batch holds several people (the message stream).
    speakers: dict[int, str] = field(default_factory=dict)
    # The items the person marked as theirs to be known beyond this chat: only these may be
    # written where the person's other conversations read them (GLOBAL).
    shareable: frozenset[int] = frozenset()
    # Item index → the message it was read from (the message stream): its provenance.
    sources: dict[int, str] = field(default_factory=dict)
    # Item index → when it was said, on the conversation's clocks, where that is not
    # ``moment`` (the message stream): what its relative words are read against.
    moments: dict[int, datetime] = field(default_factory=dict)
    # Item index → the standing fact it states (work, home …): offline, it replaces the
    # person's older memory of that slot instead of being added beside it.
    slots: dict[int, str] = field(default_factory=dict)

    @property
    def filter(self) -> Viewer:
        """What this conversation may read and write."""
        if self.request_type == "private":
            return Viewer(None, self.speaker_id, ("PRIVATE", "GLOBAL"))
        return Viewer(self.group_id, None)

    def bind(self, scope: str, user_id: str | None) -> tuple[str | None, str | None]:
        """(user_id, group_id) of a new memory of ``scope`` about ``user_id``."""
        if scope == "GROUP":
            return None, self.group_id
        who = user_id or self.speaker_id
        if scope in ("GLOBAL", "PRIVATE"):
            return who, None
        return who, self.group_id


@dataclass
class Operation:
    """A validated change to apply when the job finishes."""

    tool: str
    args: dict[str, Any]


@dataclass
class Plan:
    """What the step decided, and what it refused."""

    operations: list[Operation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    calls: int = 0
