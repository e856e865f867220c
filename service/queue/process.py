"""``memoria serve``'s worker in a child process: the historian's CPU work (embedding, rules,
profile merges) runs on another interpreter, so it never holds the API's event loop or GIL
while a bot waits for ``end``.

The child is ``memoria worker`` itself, on the parent's database URL (the embedded server the
parent started, which the child only connects to). It is told the parent's pid and exits when
it is orphaned; the parent restarts it with a backoff if it dies, and stops it (SIGTERM, then
SIGKILL after the grace) before closing the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from service.observability import WORKER_PROCESS_EXITS

log = logging.getLogger("service.worker")

# A child that ran this long before dying is restarted at once, not after the longer backoff.
STABLE_SECONDS = 60.0


def worker_command(parent_pid: int, config: str | Path | None, nice: int = 0) -> list[str]:
    """The child's command line: ``memoria worker`` with this interpreter."""
    command = [sys.executable, "-m", "service", "worker", "--parent-pid", str(parent_pid)]
    if nice:
        command += ["--nice", str(nice)]
    if config is not None:
        command += ["--config", str(config)]
    return command


def worker_environment(
    database_url: str, base: Mapping[str, str] | None = None, *, embedding_threads: int = 0
) -> dict[str, str]:
    """The parent's environment, with the database the parent resolved (an embedded server is
    started once, by the parent; the child connects to its socket).

    ``embedding_threads`` 0 (the setting's "all cores"): the child's local model runs on all
    cores but one, which stays the API's, so that a call never waits for an embedding of the
    backlog (on 2 cores, ``end`` p95 with the worker busy fell from 2.0x to 1.1x the figure
    without it)."""
    env = dict(os.environ if base is None else base)
    env["MEMORIA_DATABASE_URL"] = database_url
    if embedding_threads == 0:
        env["MEMORIA_MODELS__EMBEDDING__THREADS"] = str(max(1, (os.cpu_count() or 1) - 1))
    return env


class WorkerProcess:
    """One supervised ``memoria worker`` child."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        stop_seconds: float,
        restart_base: float = 1.0,
        restart_cap: float = 60.0,
    ) -> None:
        self.command = list(command)
        self.env = dict(env)
        self.stop_seconds = stop_seconds
        self.restart_base = restart_base
        self.restart_cap = restart_cap
        self.restarts = 0
        self._process: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        """The running child's pid (None before the start, or between a death and a restart)."""
        process = self._process
        return process.pid if process is not None and process.returncode is None else None

    async def start(self) -> None:
        """Start the child, and a task that restarts it whenever it dies."""
        self._process = await self._spawn()
        self._watch = asyncio.create_task(self._supervise(), name="worker-process")

    async def _spawn(self) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            *self.command,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            # Its own session: a Ctrl-C in the terminal reaches the parent only, which then
            # stops the child in order (before the database it works on).
            start_new_session=True,
        )
        log.info("worker process %d started", process.pid)
        return process

    async def _supervise(self) -> None:
        delay = self.restart_base
        while True:
            process = self._process
            assert process is not None
            started = time.monotonic()
            code = await process.wait()
            if self._stopping:
                return
            WORKER_PROCESS_EXITS.inc()
            if time.monotonic() - started >= STABLE_SECONDS:
                delay = self.restart_base
            log.error("worker process %d exited with code %s", process.pid, code)
            while True:
                log.info("starting another worker process in %.0f s", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.restart_cap)
                try:
                    self._process = await self._spawn()
                except OSError as exc:  # no memory or no pids left now: try again later
                    log.error("could not start a worker process: %s", exc)
                    continue
                self.restarts += 1
                break

    async def stop(self) -> None:
        """SIGTERM: the child finishes or releases the jobs in hand; SIGKILL after the grace."""
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        process = self._process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=self.stop_seconds)
        except TimeoutError:
            log.warning("worker process %d did not stop in time; killing it", process.pid)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        log.info("worker process %d stopped (code %s)", process.pid, process.returncode)

    def kill(self) -> None:
        """Last resort when the event loop is gone: never leave the child behind."""
        self._stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
