"""The bot's profiles and their snapshots: each current file, with the snapshot taken before
each change as an older text, in time order."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from pathlib import Path

from service.errors import Invalid
from service.importer.coerce import conform_profile, identifier, moment
from service.importer.source import (
    MAX_FILE_BYTES,
    ProfileHistory,
    ProfileVersion,
    Source,
    mtime,
    read_text,
)
from service.profiles.document import ProfileKey


def _snapshot_time(path: Path, zone: str) -> datetime:
    # The bot names a snapshot by its local time, %Y%m%d%H%M%S%f.
    stem = path.stem
    if stem.isdigit() and len(stem) >= 14:
        try:
            naive = datetime.strptime(stem[:14], "%Y%m%d%H%M%S")
            found = moment(naive.replace(microsecond=int(stem[14:20].ljust(6, "0"))), zone)
        except ValueError:
            found = None
        if found is not None:
            return found
    return mtime(path)


def read_profiles(source: Source, base: Path, zone: str) -> None:
    """Every current profile file under ``base`` with its snapshots, oldest first."""
    current: dict[tuple[str, str], Path] = {}
    for kind in ("user", "group"):
        for path in sorted((base / f"{kind}s").glob("*.md")):
            current[(kind, path.stem)] = path
    history: dict[tuple[str, str], list[Path]] = defaultdict(list)
    for folder in ("user", "users", "group", "groups"):
        kind = folder.removesuffix("s")
        directory = base / "history" / folder
        for entity in sorted(directory.iterdir()) if directory.is_dir() else []:
            if entity.is_dir():
                history[(kind, entity.name)] += entity.glob("*.md")
    for (kind, entity_id), snapshots in sorted(history.items()):
        if (kind, entity_id) not in current and snapshots:
            source.skip(
                snapshots[0].parent, "snapshots of a profile that has no current file; left out"
            )
    for (kind, entity_id), path in sorted(current.items()):
        if identifier(entity_id) != entity_id:
            source.skip(path, "the file name is not a usable id")
            continue
        key = ProfileKey(kind, entity_id)
        snapshots = sorted(
            history.get((kind, entity_id), []), key=lambda p: (_snapshot_time(p, zone), p.name)
        )
        try:
            newest = conform_profile(read_text(path, MAX_FILE_BYTES), key, mtime(path), zone)
        except (Invalid, UnicodeDecodeError, OSError) as exc:
            also = f"; its {len(snapshots)} snapshots left out too" if snapshots else ""
            source.skip(path, f"{_reason(exc)}{also}")
            continue
        versions: list[ProfileVersion] = []
        for snapshot in snapshots:
            try:
                text = read_text(snapshot, MAX_FILE_BYTES)
                document = conform_profile(text, key, _snapshot_time(snapshot, zone), zone)
            except (Invalid, UnicodeDecodeError, OSError) as exc:
                source.skip(snapshot, _reason(exc))
                continue
            if versions and versions[-1].document == document:
                continue  # a restore writes the same text again
            versions.append(ProfileVersion(source.relative(snapshot), document))
        if not versions or versions[-1].document != newest:
            versions.append(ProfileVersion(source.relative(path), newest))
        source.profiles.append(ProfileHistory(key, versions))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, Invalid):
        return exc.message
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    return f"unreadable ({getattr(exc, 'strerror', exc)})"
