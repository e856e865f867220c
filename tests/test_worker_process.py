"""serve's supervised worker process: restarted when it dies, stopped within its grace."""

from __future__ import annotations

import asyncio
import os
import subprocess
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


def test_the_worker_beside_the_api_leaves_it_a_core_for_its_calls() -> None:
    """The local model of serve's worker runs on all cores but one (its embeddings of a
    backlog would otherwise delay the bot's calls), unless the threads are configured."""
    read = _python(
        "from service.settings import Settings; print(Settings().models.embedding.threads)"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}

    def threads(env: dict[str, str]) -> int:
        return int(subprocess.run(read, env=env, capture_output=True, text=True, check=True).stdout)

    cores = os.cpu_count() or 1
    assert threads(worker_environment("postgresql+asyncpg://nowhere/db", base)) == max(1, cores - 1)
    configured = {**base, "MEMORIA_MODELS__EMBEDDING__THREADS": "3"}
    chosen = worker_environment("postgresql+asyncpg://nowhere/db", configured, embedding_threads=3)
    assert threads(chosen) == 3
