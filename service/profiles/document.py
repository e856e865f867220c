"""Profile documents: Markdown with YAML front matter, parsed without touching the text.

    ---
    entity_type: user
    entity_id: "10001"
    name: 张三
    tags: [Python, 架构]
    updated_at: "2026-02-22T10:30:00+08:00"
    source_event_id: "req-1:1"
    ---
    张三是一名 Python 开发者……

The stored text is exactly what was written; the parsed fields are kept beside it as
columns for filtering. A ``---`` line inside the body is body text: only the first closing
fence ends the front matter.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import yaml

from service.context import MAX_JSON_DEPTH, in_range
from service.errors import Invalid

# "private": a person as their own private chat knows them, read there and nowhere else.
ENTITY_TYPES = ("user", "group", "member", "private")
MAX_TAGS = 20
MAX_TAG_CHARS = 40
MAX_DOCUMENT_CHARS = 20_000
_FENCE = re.compile(r"^---[ \t]*$", re.M)
# What JSON leaves as it is and YAML does not read back as it was: DEL and the C1 controls
# (refused: the stored text could never be parsed again) and NEL (read as a line break, so a
# name holding one never equals itself). JSON's \u escapes say them in words YAML reads.
_UNPRINTABLE = re.compile("[\x7f-\x9f\ufffe\uffff]")
# libyaml's safe loader when PyYAML has it: ten times faster, and a profile is parsed at
# every merge.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class ProfileKey:
    """Which entity a profile describes: a user, a group, a member of a group, or a user as
    their private chat knows them (``private``)."""

    entity_type: str
    entity_id: str
    group_id: str | None = None

    @property
    def key(self) -> str:
        """The row key: ``user:<id>``, ``group:<id>``, ``member:<group>:<user>``.

        A member key holds two ids, each with '%' and ':' escaped (``key_part``): ids with ':'
        are common (Matrix, ``@a:b.org``), and unescaped, member X:Y of group C and member Y:C
        of group X would share one key. A user or group key holds one id after its first ':',
        which cannot be ambiguous.
        """
        if self.entity_type == "member":
            return member_key(str(self.group_id), self.entity_id)
        return f"{self.entity_type}:{self.entity_id}"

    def describe(self) -> str:
        """How the key reads in a prompt or an error."""
        if self.entity_type == "member":
            return f"member {self.entity_id} of group {self.group_id}"
        return f"{self.entity_type} {self.entity_id}"


def key_part(value: str) -> str:
    """An id as one part of a member key: '%' and ':' percent-escaped (the SQL of migration
    0012 and ``member_prefix`` escape the same way)."""
    return value.replace("%", "%25").replace(":", "%3A")


def member_key(group_id: str, user_id: str) -> str:
    """The row key of ``user_id``'s profile as a member of ``group_id``."""
    return f"member:{key_part(group_id)}:{key_part(user_id)}"


def member_prefix(group_id: str) -> str:
    """What every member key of ``group_id`` starts with (compare it with ``starts_with``,
    not LIKE: an escaped id still holds '%', and ids may hold '_')."""
    return f"member:{key_part(group_id)}:"


@dataclass
class Profile:
    """A parsed profile document."""

    key: ProfileKey
    name: str
    tags: list[str]
    updated_at: datetime
    source_event_id: str | None
    body: str
    extra: dict[str, Any] = field(default_factory=dict)


def split(document: str) -> tuple[str, str]:
    """(front matter YAML, body) of a document, or ``Invalid``."""
    text = document.lstrip("\ufeff")
    first = _FENCE.match(text)
    if first is None:
        raise Invalid("a profile starts with a '---' line of YAML front matter", field="document")
    closing = _FENCE.search(text, first.end())
    if closing is None:
        raise Invalid("the front matter has no closing '---' line", field="document")
    return text[first.end() : closing.start()], text[closing.end() :].lstrip("\r\n")


def front_matter(head: str) -> Any:
    """The value of a front matter's YAML, or ``Invalid``."""
    try:
        return yaml.load(head, Loader=_LOADER)  # noqa: S506 - a safe loader, in C
    except yaml.YAMLError as exc:
        raise Invalid(f"the front matter is not valid YAML: {exc}", field="document") from None
    except (ValueError, IndexError, OverflowError) as exc:
        # YAML's own constructors raise these for a value shaped like a date or a number that
        # names none: 2026-02-30, an offset of 25 hours, ``!!int ''``.
        raise Invalid(
            f"the front matter holds a value YAML cannot read ({exc})", field="document"
        ) from None


def parse(document: str, expected: ProfileKey | None = None, *, stored: bool = False) -> Profile:
    """Validate a document (front matter parses, required keys, body, tags) and parse it.
    ``stored``: a text stored earlier, read as it was accepted then (neither today's size cap
    nor today's checks of the front matter's shape refuse it, so the next merge can rewrite
    it)."""
    if not stored and len(document) > MAX_DOCUMENT_CHARS:
        raise Invalid(f"a profile is at most {MAX_DOCUMENT_CHARS} characters", field="document")
    if "\x00" in document:
        raise Invalid("a profile must not contain NUL characters", field="document")
    head, body = split(document)
    meta = front_matter(head)
    if not isinstance(meta, dict):
        raise Invalid("the front matter must be a YAML mapping", field="document")
    if not stored:
        check_front_matter(meta)
    for required in ("entity_type", "entity_id", "name", "tags", "updated_at"):
        if meta.get(required) in (None, ""):
            if required == "tags" and meta.get("tags") == []:
                continue
            raise Invalid(f"the front matter needs '{required}'", field=f"document.{required}")
    for single in ("entity_type", "entity_id", "group_id", "name", "updated_at", "source_event_id"):
        if not stored and isinstance(meta.get(single), list | dict | set | bytes):
            raise Invalid(
                f"{single} is one text, not a list or mapping", field=f"document.{single}"
            )
    entity_type = str(meta["entity_type"])
    if entity_type not in ENTITY_TYPES:
        raise Invalid("entity_type is user, group, member or private", field="document.entity_type")
    group_id = meta.get("group_id")
    if entity_type == "member" and group_id in (None, ""):
        raise Invalid("a member profile needs group_id", field="document.group_id")
    key = ProfileKey(
        entity_type, str(meta["entity_id"]), str(group_id) if entity_type == "member" else None
    )
    if expected is not None and key != expected:
        raise Invalid(
            f"this document describes {key.describe()}, not {expected.describe()}",
            field="document.entity_id",
        )
    tags = meta["tags"]
    if not isinstance(tags, list) or not all(isinstance(t, str | int | float) for t in tags):
        raise Invalid("tags must be a list of short strings", field="document.tags")
    tags = [str(t).strip() for t in tags if str(t).strip()]
    if len(tags) > MAX_TAGS or any(len(t) > MAX_TAG_CHARS for t in tags):
        raise Invalid(
            f"at most {MAX_TAGS} tags of at most {MAX_TAG_CHARS} characters", field="document.tags"
        )
    updated = meta["updated_at"]
    if isinstance(updated, datetime):
        updated_at = updated
    else:
        try:
            updated_at = datetime.fromisoformat(str(updated))
        except ValueError:
            raise Invalid(
                "updated_at must be an ISO 8601 time", field="document.updated_at"
            ) from None
    if updated_at.tzinfo is None:
        raise Invalid("updated_at needs a UTC offset", field="document.updated_at")
    try:
        in_range(updated_at)
    except ValueError as exc:
        raise Invalid(str(exc), field="document.updated_at") from None
    if not body.strip():
        raise Invalid("the profile body is empty", field="document")
    known = {
        "entity_type",
        "entity_id",
        "group_id",
        "name",
        "tags",
        "updated_at",
        "source_event_id",
    }
    source = meta.get("source_event_id")
    return Profile(
        key=key,
        name=str(meta["name"]),
        tags=tags,
        updated_at=updated_at,
        source_event_id=str(source) if source not in (None, "") else None,
        body=body,
        extra={k: v for k, v in meta.items() if k not in known},
    )


def check_front_matter(meta: dict[str, Any]) -> None:
    """``Invalid`` for front matter that repeats a list or mapping by YAML alias (a few lines
    of anchors, each listing the previous one nine times, expand to billions of items when a
    value is turned into text: "billion laughs"), or nests deeper than ``MAX_JSON_DEPTH``
    (the renderer recurses into every level: a profile stored that deep could never be
    merged into, renamed or redacted again)."""
    seen: set[int] = set()
    pending: list[tuple[Any, int]] = [(meta, 0)]
    while pending:
        item, depth = pending.pop()
        if not isinstance(item, dict | list | set):
            continue
        if depth > MAX_JSON_DEPTH:
            raise Invalid(
                f"the front matter is nested more than {MAX_JSON_DEPTH} levels deep",
                field="document",
            )
        if id(item) in seen:
            raise Invalid(
                "the front matter must not repeat a list or mapping by YAML alias",
                field="document",
            )
        seen.add(id(item))
        children = item.values() if isinstance(item, dict) else item
        pending.extend((child, depth + 1) for child in children)


def render(profile: Profile) -> str:
    """The document of a profile: front matter in a fixed order, values as JSON scalars
    (valid YAML, and an id like 10001 stays a quoted string when read back)."""
    lines = [
        f"entity_type: {_scalar(profile.key.entity_type)}",
        f"entity_id: {_scalar(profile.key.entity_id)}",
    ]
    if profile.key.entity_type == "member":
        lines.append(f"group_id: {_scalar(profile.key.group_id)}")
    lines += [
        f"name: {_scalar(profile.name)}",
        f"tags: {_scalar(list(profile.tags))}",
        f"updated_at: {_scalar(profile.updated_at.isoformat())}",
    ]
    if profile.source_event_id:
        lines.append(f"source_event_id: {_scalar(profile.source_event_id)}")
    if profile.extra:
        lines.append(yaml.safe_dump(profile.extra, allow_unicode=True, sort_keys=False).rstrip())
    head = "\n".join(lines)
    return f"---\n{head}\n---\n{profile.body.strip()}\n"


def _scalar(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
