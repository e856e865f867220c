"""``memoria mcp`` as an MCP client sees it: a real SDK session over stdio and over streamable
HTTP, to a server process that forwards to the app on a loopback port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import CallToolResult, TextContent

from service.client import MemoriaClient
from tests.conftest import FAST_QUEUE, make_settings
from tests.served import create_tenant, served

ROOT = Path(__file__).resolve().parent.parent
TOOLS = {"search_events", "get_profile", "search_profiles", "search_memories", "add_memory", "end"}

pytestmark = pytest.mark.slow


@pytest.fixture
def loopback(db_url: str) -> Iterator[tuple[str, str]]:
    """The app under uvicorn on 127.0.0.1 with its worker: (base URL, a tenant's key)."""
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    with served(settings) as base_url:
        yield base_url, create_tenant(base_url)


def text(result: CallToolResult) -> str:
    [content] = result.content
    assert isinstance(content, TextContent)
    return content.text


def answer(result: CallToolResult) -> Any:
    assert not result.is_error, text(result)
    return json.loads(text(result))


async def test_stdio_session(loopback: tuple[str, str], tmp_path: Path) -> None:
    base_url, key = loopback
    command = ["-m", "service", "mcp", "--api-url", base_url, "--api-key", key]
    defaults = ["--group-id", "100200", "--sender-id", "10001", "--bot-id", "20002"]
    server = StdioServerParameters(
        command=sys.executable, args=[*command, *defaults], cwd=ROOT, env={"PYTHONPATH": str(ROOT)}
    )
    with (tmp_path / "mcp-stderr.log").open("w") as errlog:
        async with (
            stdio_client(server, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = await session.list_tools()
            assert {tool.name for tool in listed.tools} == TOOLS
            add_memory = next(t for t in listed.tools if t.name == "add_memory")
            assert add_memory.input_schema["required"] == ["content"]
            assert "group_id" in add_memory.input_schema["properties"]

            # The server's defaults make the conversation: group 100200, sender 10001.
            added = answer(
                await session.call_tool(
                    "add_memory", {"content": "张三(10001)对花生过敏", "category": "FACT"}
                )
            )
            assert added["scope"] == "MEMBER_IN_GROUP" and added["duplicate"] is False
            found = answer(await session.call_tool("search_memories", {"query": "过敏"}))
            assert [m["id"] for m in found] == [added["id"]]
            # Another group's conversation does not see it.
            elsewhere = answer(
                await session.call_tool("search_memories", {"query": "过敏", "group_id": "999"})
            )
            assert elsewhere == []

            ended = answer(
                await session.call_tool(
                    "end",
                    {"memo": "提醒了过敏的事", "observations": ["张三(10001)下周去杭州"]},
                )
            )
            assert ended["enqueued"] is True
            async with MemoriaClient(base_url, key) as memoria:
                job = await memoria.wait_for_job(ended["job_id"])
            assert job.status == "done"
            events = answer(await session.call_tool("search_events", {"query": "杭州"}))
            assert any("杭州" in e["text"] for e in events["events"])
            profile = answer(
                await session.call_tool(
                    "get_profile", {"entity_type": "member", "entity_id": "10001"}
                )
            )
            assert profile["found"] is True and "杭州" in profile["document"]

            refused = await session.call_tool(
                "get_profile", {"entity_type": "group", "entity_id": "999"}
            )
            assert refused.is_error and "403" in text(refused)


MCP_TOKEN = "test-token-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def http_mcp(loopback: tuple[str, str]) -> Iterator[str]:
    """``memoria mcp --transport http`` without default conversation; yields its /mcp URL."""
    base_url, key = loopback
    port = free_port()
    # The key from the environment: on the command line every local user could read it.
    command = [sys.executable, "-m", "service", "mcp", "--api-url", base_url]
    process = subprocess.Popen(
        [*command, "--transport", "http", "--port", str(port)],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "MEMORIA_MCP_TOKEN": MCP_TOKEN,
            "MEMORIA_API_KEY": key,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                _, err = process.communicate(timeout=5)
                raise RuntimeError(f"memoria mcp did not listen: {err.decode()[-2000:]}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        _, err = process.communicate(timeout=10)
    # It says where it listens, and never prints the key.
    assert f"listening on http://127.0.0.1:{port}/mcp" in err.decode()
    assert key not in err.decode()


def test_mcp_without_a_key_says_how_to_give_one(loopback: tuple[str, str]) -> None:
    base_url, _ = loopback
    env = {k: v for k, v in os.environ.items() if k != "MEMORIA_API_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "service", "mcp", "--api-url", base_url],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and b"MEMORIA_API_KEY" in done.stderr


async def test_streamable_http_needs_the_token(http_mcp: str) -> None:
    """Over HTTP every request needs the bearer token: any local process could otherwise
    call the tools, for any conversation, with the tenant's key."""
    probe = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient() as plain:
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": MCP_TOKEN}):
            response = await plain.post(http_mcp, json=probe, headers={**headers, **auth})
            assert response.status_code == 401, auth
            assert response.headers["www-authenticate"].startswith("Bearer")


async def test_streamable_http_session(http_mcp: str) -> None:
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {MCP_TOKEN}"})
    async with (
        client,
        streamable_http_client(http_mcp, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        assert {t.name for t in (await session.list_tools()).tools} == TOOLS

        # No default conversation: a tool call without one is refused, with the reason.
        unbound = await session.call_tool("search_memories", {"query": "茶"})
        assert unbound.is_error and "no conversation" in text(unbound)

        private = {"user_id": "10001"}
        added = answer(
            await session.call_tool("add_memory", {"content": "张三(10001)喜欢喝茶", **private})
        )
        assert added["scope"] == "PRIVATE"
        found = answer(await session.call_tool("search_memories", {"query": "喝茶", **private}))
        assert [m["id"] for m in found] == [added["id"]]
        group = answer(
            await session.call_tool(
                "add_memory",
                {"content": "群里周五晚上开周会", "scope": "GROUP", "group_id": "100200"},
            )
        )
        assert group["scope"] == "GROUP"
        invalid = await session.call_tool(
            "add_memory", {"content": "x", "scope": "GROUP", **private}
        )
        assert invalid.is_error and "group" in text(invalid)
