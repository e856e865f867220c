"""What a newcomer sees: a normal run logs no ERROR (refused calls leave nothing half-done for
the event loop to complain about), ``serve`` logs in one format and says where it is, commands
attaching to it print only their output, and the embedded server stays modest in memory."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from service.db.embedded import _tune, tuning_text
from tests.conftest import ADMIN, ADMIN_TOKEN, AppClient, make_settings
from tests.served import create_tenant, served
from tests.test_cli import _wait_ready, clean_env, free_port, memoria


async def test_refused_admin_calls_leave_nothing_for_the_event_loop_to_clean_up(
    client: AppClient, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.get_running_loop()
    problems: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: problems.append(context))
    wrong = {"Authorization": "Bearer not-the-admin-token"}
    try:
        with caplog.at_level(logging.ERROR):
            for _ in range(3):
                answers = await asyncio.gather(
                    *(client.get("/admin/tenants", headers=wrong) for _ in range(30)),
                    *(client.get("/admin/tenants", headers=ADMIN) for _ in range(10)),
                )
                codes = [a.status_code for a in answers]
                # Refused: 401, or 429 once this client has failed too often; the admin's
                # own calls from the same client still pass.
                assert codes[30:] == [200] * 10
                assert all(code in (401, 429) for code in codes[:30])
            # What the loop would find later: abandoned generators are closed when collected.
            gc.collect()
            await asyncio.sleep(0.2)
            gc.collect()
            await asyncio.sleep(0.2)
    finally:
        loop.set_exception_handler(previous)
    assert [str(p.get("exception") or p.get("message")) for p in problems] == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# A log line in the readable format: time, level, logger, message.
_TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) [\w.]+: "
)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_serve_says_where_it_is_and_logs_in_one_format(tmp_path: Path, fmt: str) -> None:
    data_dir, port = tmp_path / "pg", free_port()
    env = clean_env(
        MEMORIA_DATA_DIR=str(data_dir), MEMORIA_ADMIN_TOKEN=ADMIN_TOKEN, MEMORIA_LOG_FORMAT=fmt
    )
    log_file = tmp_path / "serve.log"
    with log_file.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--port", str(port)],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(port, proc)
        base = f"http://127.0.0.1:{port}"
        created = httpx.post(f"{base}/admin/tenants", json={"name": "acme"}, headers=ADMIN)
        assert created.status_code == 201
        assert (
            httpx.get(f"{base}/admin/tenants", headers={"Authorization": "Bearer no"}).status_code
            == 401
        )
        assert (
            httpx.get(f"{base}/v1/tenant", headers={"Authorization": "Bearer mk_no"}).status_code
            == 401
        )
        # A command attaching to the running embedded server prints its output, nothing else.
        listed = memoria("tenants", "list", env=env)
        assert listed.returncode == 0 and "acme" in listed.stdout
        assert listed.stderr == ""
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=45) == 0
    output = log_file.read_text()
    url = f"http://127.0.0.1:{port}"
    if fmt == "json":
        entries = [json.loads(line) for line in output.splitlines()]  # every line is JSON
        [ready] = [e for e in entries if e.get("console")]
        assert (ready["url"], ready["console"], ready["docs"]) == (
            url,
            f"{url}/console",
            f"{url}/schema",
        )
        assert str(data_dir.resolve()) in ready["database"]
        assert [e for e in entries if e["level"] in ("ERROR", "CRITICAL")] == []
        return
    lines = output.splitlines()
    [first] = [i for i, line in enumerate(lines) if re.match(r"memoria \S+ is ready on ", line)]
    banner, logged = lines[first : first + 6], lines[:first] + lines[first + 6 :]
    assert f"is ready on {url} (pid {proc.pid})" in banner[0]
    assert banner[1:3] == [f"  console   {url}/console", f"  API docs  {url}/schema"]
    assert banner[3] == f"  database  embedded PostgreSQL, data in {data_dir.resolve()}"
    assert banner[4].startswith("  worker    a child process (pid ")
    # Everything else is a log line of the one format: no uvicorn or Alembic style, no ERROR.
    assert logged and [line for line in logged if not _TEXT_LINE.match(line)] == [], output
    assert "alembic" not in output and " ERROR " not in output


def _shared_buffers_mb(text: str) -> int:
    [value] = re.findall(r"^shared_buffers = (\d+)MB$", text, flags=re.M)
    return int(value)


@pytest.mark.parametrize(
    ("memory_gb", "expected_mb"), [(2, 512), (4, 1024), (24, 1024), (256, 1024)]
)
def test_the_embedded_servers_shared_buffers_stay_within_1_gb(
    memory_gb: int, expected_mb: int
) -> None:
    assert _shared_buffers_mb(tuning_text(memory_gb * 1024)) == expected_mb


def test_an_untouched_earlier_tuning_is_lowered_and_an_edited_one_kept(tmp_path: Path) -> None:
    memory_mb = psutil.virtual_memory().total // 2**20
    earlier = (
        "# Written once by Memoria for its embedded server; edit freely.\n"
        f"shared_buffers = {min(max(memory_mb // 4, 128), 8192)}MB\n"
        f"effective_cache_size = {max(memory_mb // 2, 256)}MB\n"
    )
    untouched, edited = tmp_path / "a", tmp_path / "b"
    for folder, text in ((untouched, earlier), (edited, "shared_buffers = 6000MB\n")):
        folder.mkdir()
        (folder / "memoria.conf").write_text(text)
        _tune(folder)
    assert _shared_buffers_mb((untouched / "memoria.conf").read_text()) <= 1024
    assert (edited / "memoria.conf").read_text() == "shared_buffers = 6000MB\n"
    fresh = tmp_path / "c"
    fresh.mkdir()
    (fresh / "postgresql.conf").write_text("# initdb's\n")
    _tune(fresh)
    assert _shared_buffers_mb((fresh / "memoria.conf").read_text()) <= 1024
    assert "include_if_exists = 'memoria.conf'" in (fresh / "postgresql.conf").read_text()


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """POST as Python's urllib does: the whole body first, then the answer is read."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_urllib_reads_the_413_and_it_states_the_limit(db_url: str) -> None:
    settings = make_settings(db_url, max_body_bytes=65_536)
    with served(settings, run_worker=False) as base_url:
        key = create_tenant(base_url)
        text = json.dumps({"request_type": "group", "group_id": "g", "messages": []})
        oversized = text[:-2] + " " * 6_000_000 + "]}"
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        status, body = _post(f"{base_url}/v1/messages", oversized.encode(), headers)
        assert status == 413
        assert body["field"] == "body" and "65,536 bytes" in body["message"]
        assert f"{len(oversized.encode()):,} bytes" in body["message"]
        # A refused key on a body within the limit is answered as usual.
        wrong = {**headers, "Authorization": "Bearer mk_aaaaaaaaaa_" + "x" * 43}
        status, body = _post(f"{base_url}/v1/messages", (text + " " * 60_000).encode(), wrong)
        assert status == 401
