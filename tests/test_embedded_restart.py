"""``memoria serve`` on the embedded default brings its PostgreSQL back after it is killed.

Real processes: the service in a subprocess with its own data directory, the postmaster
killed with SIGKILL (its pid from ``postmaster.pid``), the answers read over HTTP.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.db.embedded import RestartPolicy
from tests.conftest import ADMIN_TOKEN
from tests.test_cli import clean_env, free_port


def _serve(data_dir: Path, port: int, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--port", str(port)],
        env=clean_env(MEMORIA_DATA_DIR=str(data_dir), MEMORIA_ADMIN_TOKEN=ADMIN_TOKEN, **env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _readyz(port: int) -> tuple[int, dict[str, Any]] | None:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
    except httpx.HTTPError:
        return None
    return response.status_code, response.json()


def _until_ready(port: int, proc: subprocess.Popen[bytes], limit: float) -> list[str]:
    """Wait for /readyz 200; the details of the 503s seen on the way."""
    details: list[str] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            stderr = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"serve exited with {proc.returncode}:\n{stderr[-3000:]}")
        answer = _readyz(port)
        if answer is not None:
            status, body = answer
            if status == 200:
                return details
            details.append(str(body.get("detail")))
        time.sleep(0.1)
    raise AssertionError(f"serve was not ready again within {limit} s: {details[-3:]}")


def _until_restarting(port: int, proc: subprocess.Popen[bytes], limit: float = 30) -> str:
    """Wait for /readyz to say the database is being started again (a 200 may still come in
    the moment before the death is noticed)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        answer = _readyz(port)
        if answer is not None and str(answer[1].get("detail")).startswith("database: restart"):
            assert answer[0] == 503, answer
            return str(answer[1]["detail"])
        time.sleep(0.1)
    raise AssertionError("/readyz never said the database was restarting")


def _kill_postmaster(data_dir: Path) -> int:
    pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
    os.kill(pid, signal.SIGKILL)
    return pid


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def _new_tenant(base: str) -> dict[str, str]:
    created = httpx.post(
        f"{base}/admin/tenants",
        json={"name": f"t-{uuid.uuid4().hex[:8]}"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert created.status_code == 201, created.text
    return {"Authorization": f"Bearer {created.json()['api_key']['key']}"}


def _end(base: str, headers: dict[str, str], user: str, observation: str) -> dict[str, Any]:
    accepted = httpx.post(
        f"{base}/v1/end",
        json={
            "request_type": "private",
            "user_id": user,
            "sender_id": user,
            "request_id": uuid.uuid4().hex,
            "observations": [observation],
        },
        headers=headers,
        timeout=30,
    )
    assert accepted.status_code == 202, accepted.text
    return dict(accepted.json())


def _until_event(base: str, headers: dict[str, str], event_id: str, limit: float = 60) -> str:
    """The stored text of an accepted turn's event, once its job has written it."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = httpx.get(f"{base}/v1/events/{event_id}", headers=headers, timeout=10)
        if found.status_code == 200:
            return str(found.json())
        time.sleep(0.3)
    raise AssertionError(f"event {event_id} never appeared")


@pytest.mark.slow
def test_a_killed_embedded_postgres_is_started_again_and_keeps_what_was_accepted(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "pg"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # A first wait long enough to see the state /readyz reports while the database is away.
    proc = _serve(data_dir, port, MEMORIA_EMBEDDED__RESTART_FIRST_DELAY_SECONDS="2")
    try:
        _until_ready(port, proc, 120)
        headers = _new_tenant(base)
        user, said = str(uuid.uuid4().int % 10**9), f"我养了一只叫{uuid.uuid4().hex[:6]}的猫"
        accepted = _end(base, headers, user, said)
        [event_id] = accepted["event_ids"]

        killed = _kill_postmaster(data_dir)
        assert "start 1 of 6" in _until_restarting(port, proc)
        _until_ready(port, proc, 90)
        restarted = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        assert restarted != killed

        assert said in _until_event(base, headers, event_id)
        later = f"我周末去{uuid.uuid4().hex[:6]}爬山"
        [later_id] = _end(base, headers, user, later)["event_ids"]
        assert later in _until_event(base, headers, later_id)
    finally:
        code = _stop(proc)
    assert code == 0


@pytest.mark.slow
def test_serve_exits_non_zero_when_its_embedded_postgres_will_not_start_again(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "pg"
    port = free_port()
    proc = _serve(
        data_dir,
        port,
        MEMORIA_EMBEDDED__RESTART_ATTEMPTS="3",
        MEMORIA_EMBEDDED__RESTART_FIRST_DELAY_SECONDS="1",
    )
    try:
        _until_ready(port, proc, 120)
        # A setting PostgreSQL refuses: every start fails until an operator fixes it.
        with (data_dir / "postgresql.conf").open("a") as conf:
            # (Six hex digits can be all digits, a size PostgreSQL takes: the letter keeps
            # it refused.)
            conf.write(f"\nshared_buffers = 'x{uuid.uuid4().hex[:6]}'\n")
        _kill_postmaster(data_dir)
        _until_restarting(port, proc)
        details: list[str] = []
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            answer = _readyz(port)
            if answer is not None:
                assert answer[0] == 503, answer
                details.append(str(answer[1].get("detail")))
            time.sleep(0.2)
        assert proc.poll() is not None, "serve kept running without its database"
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert proc.returncode == 1, stderr[-3000:]
    assert "did not start again in 3 tries" in stderr, stderr[-3000:]
    assert any("start 3 of 3" in d for d in details), details


def test_restarts_wait_twice_as_long_each_time_up_to_the_cap() -> None:
    policy = RestartPolicy(attempts=8, first_delay=0.5, max_delay=30, check_seconds=0.5)
    assert [policy.delay(n) for n in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert policy.delay(10_000) == 30
