"""API shapes of ``POST /v1/end`` (with the older field names still accepted)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.context import ConversationContext, path_safe
from service.text import STATEMENT_MAX_CHARS

MAX_OBSERVATIONS = 50
MAX_ITEM_CHARS = STATEMENT_MAX_CHARS


def loose_bool(value: Any) -> Any:
    """Accept the booleans LLM tool calls produce: true, "TrUe", "1", "yes", 0, "off", …"""
    if isinstance(value, bool) or value is None:
        return bool(value)
    if isinstance(value, int | float):
        return value != 0
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "1", "yes", "y", "on", "t"):
            return True
        if text in ("false", "0", "no", "n", "off", "f", ""):
            return False
    raise ValueError("must be a boolean (true/false)")


def observation_text(given: Any, n: int) -> str:
    """The text of observation ``n``: a string, or the ``text`` of ``{"text", "shareable"}``."""
    if isinstance(given, str):
        return given
    if isinstance(given, dict):
        unknown = sorted(set(given) - {"text", "shareable"})
        if unknown:
            raise ValueError(
                f"observation {n}: unknown field {unknown[0]!r} (an observation object holds "
                "text and shareable)"
            )
        text = given.get("text")
        if not isinstance(text, str):
            raise ValueError(f"observation {n}: text must be a string")
        try:
            loose_bool(given.get("shareable"))
        except ValueError:
            raise ValueError(f"observation {n}: shareable must be a boolean") from None
        return text
    raise ValueError("each observation must be a string or an object with text")


def consented(observations: Any) -> list[int]:
    """The numbers of the observations given as objects marked ``shareable``, counted as the
    kept observations are (blank ones are dropped); a malformed one is refused later."""
    if isinstance(observations, dict):
        observations = [observations]
    if not isinstance(observations, list):
        return []
    marked, kept = [], 0
    for given in observations:
        text = given.get("text") if isinstance(given, dict) else given
        if not isinstance(text, str) or not text.strip():
            continue
        try:
            if isinstance(given, dict) and loose_bool(given.get("shareable")):
                marked.append(kept)
        except ValueError:
            pass  # refused by name when the observations are read
        kept += 1
    return marked


# The names the original bot's end tool gave memo and observations, still read by EndRequest.
OLDER_END_NAMES = ("action_summary", "summary", "new_info")


class EndRequest(ConversationContext):
    """The end of a bot turn: what the bot did (``memo``) and what it learned (``observations``).

    An unknown field is refused by name: a typo (``observation``) answered 200 and stored
    nothing. The older names (``action_summary``, ``summary``, ``new_info``) are still read.
    """

    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(
        default_factory=lambda: uuid.uuid4().hex,
        min_length=1,
        max_length=200,
        description="the bot's id of this turn; with end_seq it makes the call idempotent",
    )
    end_seq: int = Field(default=1, ge=1, le=100_000)
    memo: str = Field(default="", max_length=MAX_ITEM_CHARS, description="what the bot did")
    observations: list[str] = Field(
        default_factory=list,
        max_length=MAX_OBSERVATIONS,
        description=(
            "new facts about people or the group, one per item: a string, or "
            '{"text": …, "shareable": true} for one the person lets be known beyond this chat'
        ),
    )
    shareable: list[int] = Field(
        default_factory=list,
        max_length=MAX_OBSERVATIONS,
        description=(
            "which observations (numbered from 0) the person lets be known beyond this chat: "
            "only these may reach the person's other conversations (GLOBAL memories, the "
            "shared user profile); every other one stays where it was said"
        ),
    )
    force: bool = Field(default=False, description="store even if the gate still finds words")
    source_message: str | None = Field(default=None, max_length=100_000)
    recent_messages: list[Any] = Field(default_factory=list, max_length=500)

    @model_validator(mode="before")
    @classmethod
    def _legacy_names(cls, data: Any) -> Any:
        """action_summary → memo; new_info → observations (a string, or the list the
        original bot sent for a while); a lone summary → memo. An observation given as an
        object marks its consent: its number joins ``shareable``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        marked = consented(data.get("observations"))
        if marked:
            given = data.get("shareable")
            data["shareable"] = [*given, *marked] if isinstance(given, list) else marked
        action = data.pop("action_summary", None)
        summary = data.pop("summary", None)
        new_info = data.pop("new_info", None)
        if not data.get("memo"):
            data["memo"] = action or summary or ""
        if isinstance(new_info, str):
            new_info = [new_info]
        if isinstance(new_info, list):
            given = [i for i in new_info if not (isinstance(i, str) and not i.strip())]
            observations = data.get("observations") or []
            if isinstance(observations, str):
                observations = [observations]
            if given:
                data["observations"] = [*observations, *given]
        elif new_info is not None:
            data["new_info"] = new_info  # refused by name below: neither text nor a list
        return data

    @field_validator("observations", mode="before")
    @classmethod
    def _observations(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str | dict):
            value = [value]
        if isinstance(value, list):
            cleaned = []
            for n, given in enumerate(value):
                item = observation_text(given, n)
                if len(item) > MAX_ITEM_CHARS:
                    raise ValueError(
                        f"each observation must be at most {MAX_ITEM_CHARS} characters"
                    )
                if item.strip():
                    cleaned.append(item.strip())
            return cleaned
        return value

    @field_validator("memo", mode="before")
    @classmethod
    def _memo(cls, value: Any) -> Any:
        return value.strip() if isinstance(value, str) else ("" if value is None else value)

    @model_validator(mode="after")
    def _shareable_exist(self) -> EndRequest:
        for n in self.shareable:
            if not 0 <= n < len(self.observations):
                raise ValueError(
                    f"shareable: there is no observation {n} (the observations are numbered "
                    f"from 0, and there are {len(self.observations)})"
                )
        self.shareable = sorted(set(self.shareable))
        return self

    @field_validator("force", mode="before")
    @classmethod
    def _force(cls, value: Any) -> Any:
        return loose_bool(value)

    @field_validator("recent_messages", mode="before")
    @classmethod
    def _recent(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):
            return [line for line in value.splitlines() if line.strip()]
        return value

    @field_validator("request_id", mode="before")
    @classmethod
    def _request_id(cls, value: Any) -> Any:
        return path_safe(str(value).strip()) if isinstance(value, int | str) else value


class EndAccepted(BaseModel):
    """The answer to ``end``: what was recorded and which job will write which events."""

    enqueued: bool
    request_id: str | None = None
    end_seq: int | None = None
    memo_recorded: bool = False
    job_id: int | None = None
    event_ids: list[str] = Field(default_factory=list)
    cognitive_enabled: bool = True
    duplicate: bool = False
    warnings: list[str] = Field(default_factory=list)


class MemoInfo(BaseModel):
    """One entry of the memo log."""

    id: int
    request_id: str
    end_seq: int
    memo: str
    sender_id: str | None
    said_at: datetime
