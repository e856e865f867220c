"""Temporary directories a test run owns: removed when the run ends, however it ends, and swept
by a later run when the one that made them was killed before it could remove them.

A directory is the run's when it holds an owner file naming the run's process (its pid and
start time, so that a pid the system gave to another process since does not pass for the
owner). Directories without one (another tool's, or a run of an older suite) are never
touched. An embedded PostgreSQL started under such a directory detaches from the run's
process group, so it outlives a killed run: it is stopped before its files are deleted.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psutil

PREFIX = "memoria-run-"
OWNER_FILE = "memoria-run-owner.json"


@dataclass(frozen=True)
class Owner:
    """The process a scratch directory belongs to."""

    pid: int
    started: float

    @classmethod
    def this_process(cls) -> Owner:
        process = psutil.Process()
        return cls(process.pid, process.create_time())

    @classmethod
    def of(cls, root: Path) -> Owner | None:
        """The owner written in ``root``, or None when it has none (or not yet a whole one)."""
        try:
            data = json.loads((root / OWNER_FILE).read_text())
            return cls(int(data["pid"]), float(data["started"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def alive(self) -> bool:
        """Whether this very process still runs."""
        try:
            return abs(psutil.Process(self.pid).create_time() - self.started) < 0.01
        except psutil.Error:
            return False


_made: list[Path] = []


def make(kind: str) -> Path:
    """A new directory owned by this process, removed when the process exits."""
    root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-"))
    owner = Owner.this_process()
    # Written whole or not at all: a sweep running meanwhile skips a directory without one.
    partial = root / f"{OWNER_FILE}.partial"
    partial.write_text(json.dumps({"pid": owner.pid, "started": owner.started}))
    partial.rename(root / OWNER_FILE)
    _made.append(root)
    return root


def remove(root: Path) -> None:
    """Stop the servers running from ``root`` and delete it."""
    for pid_file in root.glob("*/postmaster.pid"):
        _stop_postmaster(pid_file)
    shutil.rmtree(root, ignore_errors=True)
    with contextlib.suppress(ValueError):
        _made.remove(root)


def sweep() -> list[Path]:
    """Remove the scratch directories whose owning process is gone; the ones removed."""
    removed = []
    for root in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        owner = Owner.of(root)
        if owner is not None and not owner.alive():
            remove(root)
            removed.append(root)
    return removed


def _stop_postmaster(pid_file: Path) -> None:
    """Shut down the PostgreSQL whose lock file is ``pid_file``, if it still runs."""
    try:
        pid = int(pid_file.read_text().split()[0])
        postmaster = psutil.Process(pid)
        if str(pid_file.parent) not in postmaster.cmdline():
            return  # the pid now belongs to another process
        backends = postmaster.children(recursive=True)
        # Immediate shutdown: nothing in a scratch server is worth a checkpoint.
        postmaster.send_signal(signal.SIGQUIT)
        _, alive = psutil.wait_procs([postmaster], timeout=10)
        for process in [*alive, *backends]:
            with contextlib.suppress(psutil.Error):
                process.kill()
    except (OSError, ValueError, IndexError, psutil.Error):
        return


def _remove_all() -> None:
    for root in list(_made):
        remove(root)


atexit.register(_remove_all)
