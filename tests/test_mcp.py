"""``memoria mcp`` as an MCP client sees it: a real SDK session over stdio and over streamable
HTTP, to a server process that forwards to the app on a loopback port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
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
CONVERSATION_KEYS = {"group_id", "user_id", "sender_id", "bot_id", "request_type", "context"}

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
            # The conversation is the server's: no tool offers the model a way to name one.
            for tool in listed.tools:
                assert not CONVERSATION_KEYS & set(tool.input_schema["properties"]), tool.name

            # The server's flags make the conversation: group 100200, sender 10001.
            added = answer(
                await session.call_tool(
                    "add_memory", {"content": "张三(10001)对花生过敏", "category": "FACT"}
                )
            )
            assert added["scope"] == "MEMBER_IN_GROUP" and added["duplicate"] is False
            found = answer(await session.call_tool("search_memories", {"query": "过敏"}))
            assert [m["id"] for m in found] == [added["id"]]
            # An argument naming another group is refused, and says which argument it was.
            elsewhere = await session.call_tool(
                "search_memories", {"query": "过敏", "group_id": "999"}
            )
            assert elsewhere.is_error and "group_id" in text(elsewhere)

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


@contextmanager
def mcp_over_http(base_url: str, key: str, *flags: str) -> Iterator[str]:
    """``memoria mcp --transport http`` with these flags; yields its /mcp URL."""
    port = free_port()
    # The key from the environment: on the command line every local user could read it.
    command = [sys.executable, "-m", "service", "mcp", "--api-url", base_url, *flags]
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


@asynccontextmanager
async def mcp_session(url: str) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session with the server at ``url``."""
    client = create_mcp_http_client(headers={"Authorization": f"Bearer {MCP_TOKEN}"})
    async with (
        client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def some_id() -> str:
    """A fresh chat id (digits, like the QQ numbers bots send)."""
    return str(uuid.uuid4().int)[:15]


@pytest.fixture
def private_user() -> str:
    return some_id()


@pytest.fixture
def http_mcp(loopback: tuple[str, str], private_user: str) -> Iterator[str]:
    """``memoria mcp --transport http`` for a private chat with ``private_user``."""
    base_url, key = loopback
    with mcp_over_http(base_url, key, "--user-id", private_user) as url:
        yield url


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


async def test_streamable_http_session(http_mcp: str, private_user: str) -> None:
    async with mcp_session(http_mcp) as session:
        assert {t.name for t in (await session.list_tools()).tools} == TOOLS

        content = f"{private_user} 喜欢喝茶"
        added = answer(await session.call_tool("add_memory", {"content": content}))
        assert added["scope"] == "PRIVATE"
        found = answer(await session.call_tool("search_memories", {"query": "喝茶"}))
        assert [m["id"] for m in found] == [added["id"]]
        invalid = await session.call_tool("add_memory", {"content": "x", "scope": "GROUP"})
        assert invalid.is_error and "group" in text(invalid)


def test_mcp_without_a_conversation_refuses_to_start(loopback: tuple[str, str]) -> None:
    """A server with no conversation would leave the model to pick one: it does not start."""
    base_url, key = loopback
    done = subprocess.run(
        [sys.executable, "-m", "service", "mcp", "--api-url", base_url, "--bot-id", some_id()],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "MEMORIA_API_KEY": key},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr.decode()
    assert b"--group-id" in done.stderr and b"--user-id" in done.stderr


async def seed_elsewhere(base_url: str, key: str, group: str, person: str) -> list[str]:
    """Memories and events of another group and of a person's private chat; returns the
    secret words they hold, each found by a search for it within its own conversation."""
    secrets = [f"暗号{uuid.uuid4().hex[:10]}" for _ in range(4)]
    in_group = {"request_type": "group", "group_id": group, "sender_id": person}
    private = {"request_type": "private", "user_id": person}
    async with MemoriaClient(base_url, key) as memoria:
        await memoria.add_memory(scope="GROUP", group_id=group, content=f"群里说 {secrets[0]}")
        await memoria.add_memory(scope="PRIVATE", user_id=person, content=f"私下说 {secrets[1]}")
        for context, secret in ((in_group, secrets[2]), (private, secrets[3])):
            ended = await memoria.end(context, memo="", observations=[f"{person} 说了 {secret}"])
            assert (await memoria.wait_for_job(ended.job_id)).status == "done"
        # Each is there to be found, in its own conversation.
        for context, secret in zip((in_group, private, in_group, private), secrets, strict=True):
            found = await memoria.call_tool(
                "cognitive_search_memories" if secret in secrets[:2] else "cognitive_search_events",
                {"query": secret},
                context,
            )
            assert secret in found.content, (secret, found.content)
    return secrets


@pytest.mark.parametrize("served_chat", ["group", "private"])
async def test_a_server_reads_nothing_of_another_conversation(
    loopback: tuple[str, str], served_chat: str
) -> None:
    """Over the real MCP server for group G (or a private chat with U): no tool argument
    reaches another group's memories and events or another person's private chat."""
    base_url, key = loopback
    group, sender, other_group, person = some_id(), some_id(), some_id(), some_id()
    secrets = await seed_elsewhere(base_url, key, other_group, person)
    hostile = [
        {"group_id": "", "user_id": person},
        {"group_id": "", "user_id": person, "sender_id": person},
        {"user_id": person, "sender_id": person},
        {"group_id": other_group},
        {"group_id": other_group, "sender_id": person},
        {"context": {"request_type": "private", "user_id": person}},
    ]
    reads = (
        [("search_memories", {"query": s}) for s in secrets]
        + [("search_events", {"query": s}) for s in secrets]
        + [("search_profiles", {"query": secrets[0]})]
    )
    # Naming the person to search for is the API's to allow or refuse within the conversation.
    targeted = ("search_events", {"query": secrets[2], "target_user_id": person})
    chat = ["--group-id", group, "--sender-id", sender] if served_chat == "group" else []
    flags = chat or ["--user-id", sender]
    with mcp_over_http(base_url, key, *flags, "--bot-id", some_id()) as url:
        async with mcp_session(url) as session:
            for name, arguments in [*reads, targeted]:
                for conversation in hostile:
                    result = await session.call_tool(name, {**arguments, **conversation})
                    shown = text(result)
                    assert not [s for s in secrets if s in shown], (name, conversation, shown)
                    named = next(iter(conversation))
                    assert result.is_error and named in shown, (name, conversation, shown)
            # Within its own conversation the reads answer, and nothing of elsewhere is in them.
            for name, arguments in reads:
                result = await session.call_tool(name, arguments)
                assert not result.is_error, text(result)
                assert not [s for s in secrets if s in text(result)]
            result = await session.call_tool(*targeted)
            assert not [s for s in secrets if s in text(result)], text(result)


async def test_a_group_server_writes_only_into_its_group(loopback: tuple[str, str]) -> None:
    """Over the real MCP server for group G: add_memory and end cannot write into another
    group or a person's private chat, and they still write into G."""
    base_url, key = loopback
    group, sender, other_group, person = some_id(), some_id(), some_id(), some_id()
    hostile = [
        ("add_memory", {"content": f"{sender} 在别的群说了话", "group_id": other_group}),
        ("add_memory", {"content": "群规是周五开会", "scope": "GROUP", "group_id": other_group}),
        (
            "add_memory",
            {"content": f"{person} 的私事", "scope": "PRIVATE", "group_id": "", "user_id": person},
        ),
        ("add_memory", {"content": f"{person} 养了一只猫", "sender_id": person}),
        ("end", {"memo": "在别的群里做了事", "group_id": other_group}),
        ("end", {"memo": "在私聊里做了事", "group_id": "", "user_id": person}),
    ]
    flags = ["--group-id", group, "--sender-id", sender]
    with mcp_over_http(base_url, key, *flags) as url:
        async with mcp_session(url) as session:
            answers = [await session.call_tool(name, args) for name, args in hostile]
            # The server's own conversation works as before.
            fact = f"{sender} 下周去杭州"
            added = answer(await session.call_tool("add_memory", {"content": fact}))
            assert added["scope"] == "MEMBER_IN_GROUP"
            found = answer(await session.call_tool("search_memories", {"query": "杭州"}))
            assert [m["id"] for m in found] == [added["id"]]
            ended = answer(await session.call_tool("end", {"memo": "提醒了杭州的行程"}))
            assert ended["memo_recorded"] is True

    async with MemoriaClient(base_url, key) as memoria:
        assert await memoria.list_memories(group_id=other_group) == []
        assert await memoria.list_memories(user_id=person) == []
        assert await memoria.memos(group_id=other_group) == []
        assert await memoria.memos(user_id=person) == []
        mine = await memoria.list_memories(group_id=group)
        assert [(m.scope, m.user_id, m.content) for m in mine] == [
            ("MEMBER_IN_GROUP", sender, fact)
        ]
        assert [m.memo for m in await memoria.memos(group_id=group)] == ["提醒了杭州的行程"]
    # Each attempt was refused, naming the argument the model may not give.
    for (name, arguments), result in zip(hostile, answers, strict=True):
        named = sorted(set(arguments) - {"content", "scope", "memo"})
        assert result.is_error and all(n in text(result) for n in named), (name, text(result))
