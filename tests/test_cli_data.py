"""A command that works on the service's data finds it or refuses in one line: run from a
folder that holds none, it names where it looked and creates nothing there. Only ``serve``
and ``migrate`` make a database."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def memoria(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``memoria …`` run from ``cwd`` with only the given ``MEMORIA_`` variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}
    clean.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "service", *args],
        cwd=cwd,
        env=clean,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single line a refused command prints (and nothing on stdout)."""
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


def commands(tmp: Path) -> list[list[str]]:
    chats = tmp / f"chats-{uuid.uuid4().hex[:6]}"
    chats.mkdir()
    tenant = str(uuid.uuid4())
    return [
        ["tenants", "list"],
        ["import", "undefined", str(chats), "--tenant", tenant],
        ["jobs"],
        ["keys", "revoke", f"mk_{uuid.uuid4().hex[:10]}"],
        ["export", "--tenant", tenant, "--out", str(tmp / "out.json")],
        ["reembed", "--status"],
    ]


@pytest.mark.parametrize("index", range(6))
def test_a_command_run_where_no_data_is_refuses_naming_the_folder(
    tmp_path: Path, index: int
) -> None:
    folder = tmp_path / uuid.uuid4().hex[:8]
    folder.mkdir()
    command = commands(tmp_path)[index]
    line = one_line(memoria(*command, cwd=folder))
    assert str(folder / "data" / "pg") in line, line
    assert "MEMORIA_DATA_DIR" in line
    assert not (folder / "data").exists(), sorted(p.name for p in folder.iterdir())


def test_an_unknown_data_dir_is_named_and_left_uncreated(tmp_path: Path) -> None:
    missing = tmp_path / uuid.uuid4().hex / "pg"
    line = one_line(memoria("tenants", "list", cwd=tmp_path, MEMORIA_DATA_DIR=str(missing)))
    assert str(missing) in line
    assert not missing.parent.exists()


async def test_a_database_never_migrated_is_refused_in_one_line(databases, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url = await databases.create_empty()
    line = one_line(memoria("tenants", "list", cwd=tmp_path, MEMORIA_DATABASE_URL=url))
    assert "memoria migrate" in line and url.rsplit("/", 1)[1] in line


@pytest.mark.slow
def test_with_the_data_dir_set_a_command_works_from_any_folder(tmp_path: Path) -> None:
    data = tmp_path / "service" / "pg"
    made = memoria("migrate", cwd=tmp_path, MEMORIA_DATA_DIR=str(data))
    assert made.returncode == 0, made.stderr
    name = f"bots-{uuid.uuid4().hex[:8]}"
    elsewhere = tmp_path / "bot"
    elsewhere.mkdir()
    created = memoria("tenants", "create", name, cwd=elsewhere, MEMORIA_DATA_DIR=str(data))
    assert created.returncode == 0, created.stderr
    other = tmp_path / "other"
    other.mkdir()
    listed = memoria("tenants", "list", cwd=other, MEMORIA_DATA_DIR=str(data))
    assert listed.returncode == 0, listed.stderr
    assert name in listed.stdout
    assert list(elsewhere.iterdir()) == [] and list(other.iterdir()) == []
