"""serve's supervised worker process: restarted when it dies, stopped within its grace."""

from __future__ import annotations

import asyncio
import sys
import time

import psutil
from prometheus_client import REGISTRY

from service.queue.process import WorkerProcess, worker_environment


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _exits() -> float:
    return REGISTRY.get_sample_value("memoria_worker_process_exits_total") or 0.0


async def test_a_child_that_keeps_dying_is_restarted_with_a_growing_delay() -> None:
    exits_before = _exits()
    child = WorkerProcess(
        _python("raise SystemExit(3)"),
        worker_environment("postgresql+asyncpg://nowhere/db"),
        stop_seconds=5,
        restart_base=0.1,
        restart_cap=0.4,
    )
    await child.start()
    try:
        await asyncio.sleep(2.0)
    finally:
        await child.stop()
    # Delays 0.1, 0.2, 0.4, 0.4, … (plus the interpreter's start): a few restarts, not a
    # busy loop of hundreds.
    assert 2 <= child.restarts <= 8
    assert _exits() - exits_before >= child.restarts
    assert child.pid is None


async def test_stop_ends_a_child_that_ignores_sigterm_after_the_grace() -> None:
    child = WorkerProcess(
        _python(
            "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "time.sleep(60)\n"
        ),
        worker_environment("postgresql+asyncpg://nowhere/db"),
        stop_seconds=1.0,
    )
    await child.start()
    pid = child.pid
    assert pid is not None
    await asyncio.sleep(1.0)  # its SIGTERM handler is in place
    started = time.monotonic()
    await child.stop()
    assert time.monotonic() - started < 5
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert child.restarts == 0  # a stop is not a death to recover from
