"""What an import reads from a source: its items, and what it had to leave out and why."""

from __future__ import annotations

import json
import os
import stat
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.context import check_json
from service.ends.schemas import EndRequest
from service.errors import Invalid
from service.importer.coerce import Chat
from service.profiles.document import ProfileKey

# Every file is read whole, so none larger than these is. A profile (or a snapshot of one) is
# at most MAX_DOCUMENT_CHARS, and a job one end call (50 observations of 4,000 characters, a
# source message of 100,000): a few hundred kilobytes of UTF-8 at most, so 4 MiB leaves room
# for the fields the import does not read. The memo log and the events export hold a whole
# history (Chroma's get() leaves the embeddings out unless asked): a long one is tens of MiB.
MAX_FILE_BYTES = 4 * 2**20
MAX_HISTORY_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Skip:
    """Something left out, and why."""

    origin: str
    reason: str


@dataclass(frozen=True)
class MemoEntry:
    """One entry of the memo log, placed in a conversation."""

    origin: str
    request_id: str
    text: str
    said_at: datetime
    chat: Chat


@dataclass(frozen=True)
class ProfileVersion:
    """One text of a profile, valid here."""

    origin: str
    document: str


@dataclass(frozen=True)
class ProfileHistory:
    """A profile's texts, oldest first: its snapshots in time order, then the current file."""

    key: ProfileKey
    versions: list[ProfileVersion]


@dataclass(frozen=True)
class QueuedJob:
    """A historian job the bot had not finished, as the ``end`` call it came from."""

    origin: str
    state: str
    request: EndRequest
    error: str | None


@dataclass(frozen=True)
class StoredEvent:
    """An event of the bot's vector store (its text is embedded again here)."""

    origin: str
    id: str
    text: str
    chat: Chat
    occurred_at: datetime
    timezone: str | None
    metadata: dict[str, Any]


@dataclass
class Source:
    """Everything read from one data directory."""

    root: Path
    memos: list[MemoEntry] = field(default_factory=list)
    profiles: list[ProfileHistory] = field(default_factory=list)
    jobs: list[QueuedJob] = field(default_factory=list)
    events: list[StoredEvent] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    notes: Counter[str] = field(default_factory=Counter)
    unknown: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def skip(self, path: Path | str, reason: str) -> None:
        """Leave something out, naming it relative to the data directory."""
        self.skipped.append(Skip(self.relative(path), reason))

    def relative(self, path: Path | str) -> str:
        """A path as the summary shows it."""
        if isinstance(path, str):
            return path
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _check_regular(mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "of another kind")
        raise Invalid(f"not a regular file ({kind})")


def read_text(path: Path, limit: int, encoding: str = "utf-8") -> str:
    """A regular file's text (a symlink is followed); ``Invalid`` for anything else, as a FIFO,
    a device or a socket would block the import or feed it without end, and for a file over
    ``limit`` bytes, which would be held in memory whole."""
    # Checked by name before opening: opening some devices does something (a tape rewinds),
    # and a FIFO opened without O_NONBLOCK waits for a writer.
    _check_regular(path.stat().st_mode)
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
        # Again on what was opened: the name may have been replaced in between.
        opened = os.fstat(file.fileno())
        _check_regular(opened.st_mode)
        data = file.read(limit + 1) if opened.st_size <= limit else b""
    if opened.st_size > limit or len(data) > limit:  # the second: a file still growing
        raise Invalid(f"larger than {limit // 2**20} MiB (files are read whole)")
    return data.decode(encoding)


# What load_json returns for a file it could not read (None is valid JSON).
UNREADABLE = object()


def load_json(source: Source, path: Path, limit: int) -> Any:
    """A file's JSON, or ``UNREADABLE`` (and skipped, with the reason); see ``read_text``."""
    try:
        text = read_text(path, limit, encoding="utf-8-sig")
    except Invalid as exc:
        source.skip(path, exc.message)
        return UNREADABLE
    except UnicodeDecodeError:
        source.skip(path, "not UTF-8 text")
        return UNREADABLE
    except OSError as exc:
        source.skip(path, f"unreadable ({exc.strerror})")
        return UNREADABLE
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        source.skip(path, f"malformed JSON ({exc.msg}, line {exc.lineno} column {exc.colno})")
        return UNREADABLE


def note_unknown(source: Source, kind: str, record: dict[str, Any], known: frozenset[str]) -> None:
    """Count the fields of a record this import does not read."""
    for name in record:
        if name not in known:
            source.unknown[kind][str(name)] += 1


def storable(source: Source, origin: Path | str, record: Any) -> bool:
    """False (and skipped) when PostgreSQL could not store the record (NUL characters)."""
    try:
        check_json(record)
    except Invalid as exc:
        source.skip(origin, f"{exc.field}: {exc.message}")
        return False
    return True


def mtime(path: Path) -> datetime:
    """When a file last changed."""
    return datetime.fromtimestamp(path.stat().st_mtime, UTC)
