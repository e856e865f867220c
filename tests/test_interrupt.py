"""A run of the suite stopped by Ctrl-C, by a timeout's SIGTERM or killed outright: it ends
promptly and leaves no database server, no worker and no data directory behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from sqlalchemy.engine import make_url

from tests import scratch

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow

# A test that has the suite's server and writes to it, then runs until it is stopped.
HANGING_TEST = """
import asyncio
import os
from pathlib import Path

from tests.conftest import raw_connection


async def test_runs_until_stopped(pg_server_url: str) -> None:
    async with raw_connection(pg_server_url) as conn:
        await conn.execute("CREATE TABLE filler AS SELECT g FROM generate_series(1, 50000) g")
        data_directory = await conn.fetchval("SHOW data_directory")
    Path(os.environ["STARTED_FILE"]).write_text(data_directory)
    await asyncio.sleep(3600)
"""

PYTEST_INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = session
asyncio_default_test_loop_scope = session
"""


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TEST_DATABASE_URL"}
    # The embedded server, whatever this run itself uses.
    env.update(PYTHONPATH=str(ROOT), DOCKER_HOST="unix:///nonexistent/docker.sock", **extra)
    return env


def start_run(
    args: list[str], cwd: Path, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """A pytest run in its own process group, as a terminal starts one; Ctrl-C not ignored
    even where this run was started in the background."""
    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=cwd,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            process_group=0,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )


@pytest.fixture
def tiny_suite(tmp_path: Path) -> Path:
    """A test module on the suite's own fixtures."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / f"test_hangs_{uuid.uuid4().hex[:8]}.py").write_text(HANGING_TEST)
    (tmp_path / "pytest.ini").write_text(PYTEST_INI)
    return tmp_path


def owned_by(pid: int) -> list[Path]:
    """The scratch directories of process ``pid``."""
    return [
        root
        for root in Path(tempfile.gettempdir()).glob(f"{scratch.PREFIX}*")
        if (owner := scratch.Owner.of(root)) is not None and owner.pid == pid
    ]


def postmaster(data_directory: Path) -> psutil.Process:
    """The PostgreSQL server running from this directory."""
    return psutil.Process(int((data_directory / "postmaster.pid").read_text().split()[0]))


def left_behind(pid: int, data_directory: Path) -> list[Path]:
    """What remains on disk of the run ``pid`` whose server kept its data in this directory."""
    return [p for p in [data_directory, *owned_by(pid)] if p.exists()]


def running(processes: list[psutil.Process]) -> list[int]:
    """The pids of those still running (a zombie has ended)."""
    alive = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process.pid)
    return alive


def workers_of(run: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The ``memoria worker`` processes the run started."""
    found = []
    with contextlib.suppress(psutil.Error):
        for process in psutil.Process(run.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if process.cmdline()[-2:] == ["service", "worker"]:
                    found.append(process)
    return found


def database_directory(worker: psutil.Process) -> Path:
    """The data directory of the embedded server a worker uses (its socket's directory)."""
    url = make_url(worker.environ()["MEMORIA_DATABASE_URL"])
    return Path(str(url.query["host"]))


def wait_until(
    condition: Callable[[], object],
    timeout: float,
    what: str,
    run: subprocess.Popen[bytes],
    log: Path,
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if run.poll() is not None:
            raise AssertionError(f"the run ended before {what}:\n{log.read_text()[-3000:]}")
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout} s"
        time.sleep(0.1)


@pytest.fixture
def runs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Runs started by a test; killed if the test leaves one running."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for run in started:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


def stopped_within(run: subprocess.Popen[bytes], seconds: float, log: Path) -> None:
    """Fails when the run has not exited ``seconds`` after it was told to stop."""
    try:
        run.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the run was still going {seconds} s after it was told to stop:\n"
            f"{log.read_text()[-3000:]}"
        )


@pytest.mark.parametrize(
    ("signum", "whole_group"),
    [(signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["ctrl-c", "sigterm"],
)
def test_a_stopped_run_ends_promptly_and_deletes_its_database(
    tiny_suite: Path, runs: list[subprocess.Popen[bytes]], signum: int, whole_group: bool
) -> None:
    started_file, log = tiny_suite / "started", tiny_suite / "run.log"
    run = start_run([], tiny_suite, child_env(STARTED_FILE=str(started_file)), log)
    runs.append(run)
    wait_until(started_file.exists, 120, "the test started", run, log)
    data_directory = Path(started_file.read_text())
    server = postmaster(data_directory)

    # Ctrl-C in a terminal reaches the whole process group; a timeout signals the run alone.
    if whole_group:
        os.killpg(run.pid, signum)
    else:
        run.send_signal(signum)
    stopped_within(run, 30, log)

    assert run.returncode != 0
    assert running([server]) == []
    assert left_behind(run.pid, data_directory) == []


def test_a_killed_runs_database_is_removed_by_the_next_run(
    tiny_suite: Path, runs: list[subprocess.Popen[bytes]]
) -> None:
    started_file, log = tiny_suite / "started", tiny_suite / "run.log"
    run = start_run([], tiny_suite, child_env(STARTED_FILE=str(started_file)), log)
    runs.append(run)
    wait_until(started_file.exists, 120, "the test started", run, log)
    data_directory = Path(started_file.read_text())
    server = postmaster(data_directory)

    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    # Nothing of the run could clean up: its server runs on, detached from its group.
    assert running([server]) == [server.pid]

    (tiny_suite / "test_after.py").write_text("def test_nothing() -> None:\n    pass\n")
    following = start_run(["test_after.py"], tiny_suite, child_env(), log)
    runs.append(following)
    assert following.wait(timeout=120) == 0, log.read_text()[-3000:]

    assert running([server]) == []
    assert left_behind(run.pid, data_directory) == []


def test_a_stopped_soak_leaves_no_worker_running(
    tmp_path: Path, runs: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "run.log"
    soak = str(ROOT / "tests" / "test_soak.py")
    run = start_run([soak], ROOT, child_env(MEMORIA_SOAK_CALLS="1000000"), log)
    runs.append(run)
    wait_until(lambda: len(workers_of(run)) == 2, 180, "the soak's workers started", run, log)
    time.sleep(3)  # into the stream of calls and kills
    workers = workers_of(run)
    data_directory = database_directory(workers[0])

    # A CI job's timeout: SIGTERM to the run alone.
    run.send_signal(signal.SIGTERM)
    stopped_within(run, 30, log)

    # Any worker the soak had at the end: these, or the ones it started in their place.
    assert running([p for p in psutil.process_iter() if _uses(p, data_directory)]) == []
    assert left_behind(run.pid, data_directory) == []


def _uses(process: psutil.Process, data_directory: Path) -> bool:
    with contextlib.suppress(psutil.Error, KeyError):
        return process.cmdline()[-2:] == ["service", "worker"] and (
            database_directory(process) == data_directory
        )
    return False
