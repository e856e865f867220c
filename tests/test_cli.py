"""The ``memoria`` command, run as a user runs it: real processes, real databases."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import pytest

from service.app import create_app
from tests.conftest import ADMIN_TOKEN, make_settings, serve_app

_T = TypeVar("_T")


def memoria(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_tenant_and_key_commands(db_url: str) -> None:
    env = clean_env(MEMORIA_DATABASE_URL=db_url)
    created = memoria("tenants", "create", "qq-bots", env=env)
    assert created.returncode == 0, created.stderr
    lines = dict(line.split(":", 1) for line in created.stdout.splitlines() if ":" in line)
    tenant_id, key = lines["tenant_id"].strip(), lines["api_key"].strip()

    listed = memoria("tenants", "list", env=env)
    assert tenant_id in listed.stdout and "qq-bots" in listed.stdout

    second = memoria("keys", "create", tenant_id, "--name", "worker", env=env)
    assert second.returncode == 0, second.stderr
    second_key = second.stdout.split("api_key:")[1].split()[0]
    prefix = second.stdout.split("prefix:")[1].split()[0]

    async with serve_app(
        create_app(make_settings(db_url), migrate=False, run_worker=False)
    ) as client:
        for k in (key, second_key):
            me = await client.get("/v1/tenant", headers={"Authorization": f"Bearer {k}"})
            assert me.status_code == 200 and me.json()["tenant_id"] == tenant_id
        revoked = memoria("keys", "revoke", prefix, env=env)
        assert revoked.returncode == 0, revoked.stderr
        gone = await client.get("/v1/tenant", headers={"Authorization": f"Bearer {second_key}"})
        assert gone.status_code == 401
        still = await client.get("/v1/tenant", headers={"Authorization": f"Bearer {key}"})
        assert still.status_code == 200

    jobs = memoria("jobs", env=env)
    assert jobs.returncode == 0 and "queued" in jobs.stdout and "oldest queued" in jobs.stdout
    bad = memoria("keys", "revoke", "mk_nosuchkey0", env=env)
    assert bad.returncode != 0 and "no key" in bad.stderr


async def test_migrate_command(databases) -> None:  # type: ignore[no-untyped-def]
    url = await databases.create_empty()
    result = memoria("migrate", env=clean_env(MEMORIA_DATABASE_URL=url))
    assert result.returncode == 0, result.stderr
    assert "newest migration" in result.stdout


def test_config_file_is_read(tmp_path: Path) -> None:
    from service.settings import load_settings

    config = tmp_path / "memoria.toml"
    config.write_text(
        "[cognitive]\nenabled = false\n[cognitive.query]\nauto_top_k = 6\n"
        '[models.historian]\napi_url = "http://llm:8000/v1"\nmodel_name = "qwen"\n',
        encoding="utf-8",
    )
    settings = load_settings(config)
    assert settings.cognitive.enabled is False
    assert settings.cognitive.query.auto_top_k == 6
    assert settings.cognitive.query.tool_default_top_k == 12
    assert settings.models.historian.configured
    # The environment wins over the file.
    os.environ["MEMORIA_COGNITIVE__QUERY__AUTO_TOP_K"] = "9"
    try:
        assert load_settings(config).cognitive.query.auto_top_k == 9
    finally:
        del os.environ["MEMORIA_COGNITIVE__QUERY__AUTO_TOP_K"]
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "missing.toml")


def _postgres_running(data_dir: Path) -> bool:
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "postgres" and str(data_dir) in " ".join(
            proc.info["cmdline"] or []
        ):
            return True
    return False


def _start_serve(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    env = clean_env(MEMORIA_DATA_DIR=str(data_dir), MEMORIA_ADMIN_TOKEN=ADMIN_TOKEN)
    return subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _wait_ready(port: int, proc: subprocess.Popen[bytes], limit: float = 90) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode() if proc.stderr else "serve exited")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("serve never became ready")


@pytest.mark.slow
def test_serve_on_the_embedded_default_keeps_data_and_stops_cleanly(tmp_path: Path) -> None:
    data_dir = tmp_path / "pg"
    port = free_port()
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    proc = _start_serve(data_dir, port)
    try:
        _wait_ready(port, proc)
        created = httpx.post(
            f"http://127.0.0.1:{port}/admin/tenants", json={"name": "kept"}, headers=admin
        )
        assert created.status_code == 201
        key = created.json()["api_key"]["key"]
        assert _postgres_running(data_dir)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=45) == 0
    assert not _postgres_running(data_dir), "the embedded database outlived the service"

    proc = _start_serve(data_dir, port)
    try:
        _wait_ready(port, proc)
        me = httpx.get(
            f"http://127.0.0.1:{port}/v1/tenant", headers={"Authorization": f"Bearer {key}"}
        )
        assert me.status_code == 200
        assert me.json()["name"] == "kept"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=45) == 0


def _worker_children(serve: subprocess.Popen[bytes]) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(serve.pid).children():
        try:
            if "worker" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue  # exited between the listing and the look (a zombie has no command line)
    return found


def _gone(process: psutil.Process) -> bool:
    """Exited (a zombie nobody reaped yet counts: it runs no more code)."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _until(predicate: Callable[[], _T], limit: float, what: str) -> _T:
    deadline = time.monotonic() + limit
    while not (value := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return value


def _end(port: int, key: str, request_id: str) -> int:
    accepted = httpx.post(
        f"http://127.0.0.1:{port}/v1/end",
        json={
            "request_type": "private",
            "user_id": "10001",
            "sender_id": "10001",
            "request_id": request_id,
            "observations": ["我喜欢爬山"],
        },
        headers={"Authorization": f"Bearer {key}"},
    )
    assert accepted.status_code == 202, accepted.text
    return int(accepted.json()["job_id"])


def _job(port: int, key: str, job_id: int) -> dict[str, Any]:
    response = httpx.get(
        f"http://127.0.0.1:{port}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


def _new_key(port: int) -> str:
    created = httpx.post(
        f"http://127.0.0.1:{port}/admin/tenants",
        json={"name": "worker-process"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert created.status_code == 201, created.text
    return str(created.json()["api_key"]["key"])


@pytest.mark.slow
def test_serve_runs_its_worker_in_a_child_process_and_stops_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "pg"
    port = free_port()
    proc = _start_serve(data_dir, port)
    try:
        _wait_ready(port, proc)
        [child] = _until(lambda: _worker_children(proc), 30, "serve started no worker process")
        # The embedded server was started by serve alone: the child connects to its socket
        # and holds no handle that would keep the server up (or stop it) on its own.
        handles = json.loads((data_dir / ".handle_pids.json").read_text())
        assert proc.pid in handles and child.pid not in handles
        assert str(data_dir) in child.environ()["MEMORIA_DATABASE_URL"]
        key = _new_key(port)

        # The API's own process runs no job: with the child frozen, an end stays queued.
        child.suspend()
        try:
            job_id = _end(port, key, "held-1")
            time.sleep(2)
            assert _job(port, key, job_id)["status"] == "queued"
        finally:
            child.resume()
        done = _until(
            lambda: (job := _job(port, key, job_id))["status"] in ("done", "failed") and job,
            60,
            "the worker process never finished the job",
        )
        assert done["status"] == "done", done["last_error"]
        assert done["result"]["event_ids"] == ["p:10001:held-1:1.1"]

        # A worker process that dies is replaced, and the replacement takes the next job.
        child.kill()
        _until(lambda: _gone(child), 10, "the killed worker process is still there")
        [second] = _until(
            lambda: [c for c in _worker_children(proc) if c.pid != child.pid],
            30,
            "the dead worker process was not replaced",
        )
        job_id = _end(port, key, "after-restart")
        done = _until(
            lambda: (job := _job(port, key, job_id))["status"] in ("done", "failed") and job,
            60,
            "the replacement worker process never finished the job",
        )
        assert done["status"] == "done", done["last_error"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert _gone(second), "the worker process outlived serve"
    assert not _postgres_running(data_dir), "the embedded database outlived the service"


@pytest.mark.slow
def test_a_worker_process_whose_serve_was_killed_stops(tmp_path: Path) -> None:
    data_dir = tmp_path / "pg"
    port = free_port()
    proc = _start_serve(data_dir, port)
    children: list[psutil.Process] = []
    try:
        _wait_ready(port, proc)
        [child] = children = _until(
            lambda: _worker_children(proc), 30, "serve started no worker process"
        )
        proc.kill()  # no shutdown hook runs: the child must notice by itself
        proc.wait(timeout=10)
        _until(lambda: _gone(child), 20, "the worker process outlived its killed serve")
    finally:
        if proc.poll() is None:
            proc.kill()
        for leftover in children:
            if not _gone(leftover):
                leftover.kill()
        # The embedded database outlives a killed serve (the next start takes it over).
        for pg in psutil.process_iter(["name", "cmdline"]):
            if pg.info["name"] == "postgres" and str(data_dir) in " ".join(
                pg.info["cmdline"] or []
            ):
                pg.terminate()
