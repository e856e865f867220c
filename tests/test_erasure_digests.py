"""A group's day digest is made of its members' words: an erased member's words leave it,
its history and every export, and the others' stay."""

from __future__ import annotations

import json
import random
import string
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.app import create_app
from service.retrieval.terms import COMMON_CHINESE_CHARS
from tests.conftest import (
    ADMIN,
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    llm_settings,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    until_finished,
    wait_for,
)
from tests.fake_llm import FakeLLM, Reply, quiet, tool
from tests.test_privacy import leftovers

DAY, NEXT_DAY = "2026-11-23", "2026-11-24"


@pytest.fixture
async def running(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")


@pytest.fixture
async def online(db_url: str, llm: FakeLLM) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(
        db_url, cognitive={"queue": {**FAST_QUEUE, "job_max_retries": 0}}, **llm_settings(llm)
    )
    llm.default = quiet
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")


def made_up_words(n: int) -> list[str]:
    """``n`` two-character words of uncommon characters, no character in two of them: each a
    term of a day digest, and none a part of another."""
    pool = [chr(c) for c in range(0x4E00, 0x9FA5) if chr(c) not in COMMON_CHINESE_CHARS]
    chars = random.sample(pool, 2 * n)
    return [chars[2 * i] + chars[2 * i + 1] for i in range(n)]


def english_word() -> str:
    """A random word of ten letters, a digest term no other message holds."""
    return "".join(random.choices(string.ascii_lowercase, k=10))


async def post(
    client: AppClient, tenant: TenantHandle, group: str, lines: list[tuple[str, str, str]]
) -> None:
    """Post (sender, text, local time) messages to the group, then a member's request to
    remember, which runs the extraction (and the digest of each day touched)."""
    messages = [
        {
            "message_id": uuid.uuid4().hex,
            "sender_id": sender,
            "sender_name": f"n{sender}",
            "text": words,
            "sent_at": f"{at}+08:00",
        }
        for sender, words, at in lines
    ]
    *batch, ask = messages
    body = {"request_type": "group", "group_id": group, "group_name": f"群{group}"}
    stored = await client.post(
        "/v1/messages", json={**body, "messages": batch}, headers=tenant.headers
    )
    assert stored.status_code in (200, 201, 202), stored.text
    response = await client.post(
        "/v1/messages", json={**body, "messages": [ask]}, headers=tenant.headers
    )
    [job_id] = response.json()["extraction_job_ids"]
    job = await until_finished(client, tenant, job_id)
    assert job["status"] == "done", job


async def digests(client: AppClient, tenant: TenantHandle, group: str) -> dict[str, str]:
    """The group's day digests, by day."""
    rows = (
        await client.get(f"/v1/memories?group_id={group}&category=SUMMARY", headers=tenant.headers)
    ).json()
    return {r["summary_day"]: r["content"] for r in rows}


async def tenant_export(client: AppClient, tenant: TenantHandle) -> str:
    """The admin's whole-tenant export, as its text."""
    response = await client.get(f"/admin/tenants/{tenant.id}/export", headers=ADMIN)
    if response.status_code == 200:
        return response.text
    assert response.status_code == 202, response.text

    async def ready() -> Any:
        answer = await client.get(response.json()["export_url"], headers=ADMIN)
        return answer if answer.status_code == 200 else None

    return str((await wait_for(ready)).text)


async def test_an_erased_members_words_leave_the_groups_day_digests(
    running: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = running
    group = f"g{uuid.uuid4().hex[:10]}"
    victim, *others = (str(random.randrange(10**8, 10**9)) for _ in range(4))
    secret, lake, boat, alone = made_up_words(4)
    english = english_word()
    # The others talk of two things all day; the victim says a word of their own twice, the
    # second time after the day's first digest (so its history holds both versions).
    await post(
        client,
        tenant,
        group,
        [
            (others[0], f"{lake}！", f"{DAY}T09:00:00"),
            (others[1], f"{lake}？{boat}", f"{DAY}T09:05:00"),
            (victim, f"{secret}！{english}", f"{DAY}T09:10:00"),
            (others[2], f"{boat}。", f"{DAY}T09:15:00"),
            (others[0], "记住：集合地点在断桥", f"{DAY}T09:20:00"),
        ],
    )
    await post(
        client,
        tenant,
        group,
        [
            (victim, f"{secret}，{english}", f"{DAY}T10:00:00"),
            (others[1], f"{lake}，{boat}", f"{DAY}T10:05:00"),
            # The next day only the victim spoke: that day's digest is all theirs.
            (victim, f"{alone}！", f"{NEXT_DAY}T08:00:00"),
            (victim, f"{alone}？", f"{NEXT_DAY}T08:05:00"),
            (others[2], "记住：明天八点出发", f"{DAY}T10:10:00"),
        ],
    )
    before = await digests(client, tenant, group)
    assert secret in before[DAY] and english in before[DAY], before
    assert lake in before[DAY] and boat in before[DAY]
    assert alone in before[NEXT_DAY]

    receipt = await client.delete(f"/v1/users/{victim}", headers=tenant.headers)
    assert receipt.status_code == 200, receipt.text

    # The day's digest is made again of the others' messages: their topics and names, not the
    # victim's words or name.
    assert f"n{victim}" in before[DAY] and f"n{others[1]}" in before[DAY], before
    after = await digests(client, tenant, group)
    assert set(after) == {DAY}, after
    assert lake in after[DAY] and boat in after[DAY]
    assert secret not in after[DAY] and english not in after[DAY]
    assert f"n{victim}" not in after[DAY] and f"n{others[1]}" in after[DAY], after[DAY]
    assert after[DAY].startswith(f"{DAY} 群「群{group}」：")
    assert "条消息" not in after[DAY], after[DAY]
    # No row anywhere holds the victim's words: not the memories, not their history.
    assert await leftovers(db_url, [secret, english, alone]) == []
    async with raw_connection(db_url) as conn:
        history = await conn.fetch(
            "SELECT h.old_content, h.new_content, h.reason, h.cause::text AS cause"
            " FROM memory_history AS h JOIN memories AS m"
            " ON m.tenant_id = h.tenant_id AND m.id = h.memory_id"
            " WHERE m.tenant_id = $1 AND m.category = 'SUMMARY'",
            uuid.UUID(tenant.id),
        )
    assert history and lake in json.dumps([dict(h) for h in history], ensure_ascii=False)
    # Nor do the exports made after the erasure, the group's and the whole tenant's.
    group_export = await client.get(f"/v1/groups/{group}/export", headers=tenant.headers)
    assert group_export.status_code == 200, group_export.text
    assert lake in group_export.text
    whole = await tenant_export(client, tenant)
    assert lake in whole and boat in whole
    for word in (secret, english, alone):
        assert word not in group_export.text and word not in whole, word


async def test_a_digest_the_model_wrote_is_made_again_without_the_erased_members_words(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    group = f"g{uuid.uuid4().hex[:10]}"
    victim, other = (str(random.randrange(10**8, 10**9)) for _ in range(2))
    secret, lake = made_up_words(2)
    written = f"{DAY} 群里主要讨论了{lake}，还有人说起{secret}"

    def memory_step(request: dict[str, Any]) -> Reply:
        if request["tools"][0]["function"]["name"] == "add_memory":
            first = request["messages"][-1]["role"] == "user"
            call = ("write_summary", {"day": DAY, "content": written})
            return Reply(tool_calls=[call]) if first else Reply(content="done")
        return quiet(request)

    llm.default = memory_step
    await post(
        client,
        tenant,
        group,
        [
            (other, f"{lake}！", f"{DAY}T09:00:00"),
            (victim, f"{secret}。", f"{DAY}T09:05:00"),
            (other, f"{lake}？", f"{DAY}T09:10:00"),
            (other, "记住：集合地点在断桥", f"{DAY}T09:20:00"),
        ],
    )
    assert (await digests(client, tenant, group)) == {DAY: written}

    receipt = await client.delete(f"/v1/users/{victim}", headers=tenant.headers)
    assert receipt.status_code == 200, receipt.text
    # What the model wrote drew on the victim's message too: the day is worded again, offline,
    # of the messages that remain.
    after = await digests(client, tenant, group)
    assert secret not in after[DAY] and lake in after[DAY], after
    assert f"n{victim}" not in after[DAY] and f"n{other}" in after[DAY], after[DAY]
    assert receipt.json()["counts"]["memories_rebuilt"] == 1


def _group_document(group: str, lines: list[str]) -> str:
    body = "\n".join(["# 群侧写", *lines])
    return (
        f'---\nentity_type: group\nentity_id: "{group}"\nname: 群\ntags: []\n'
        f'updated_at: "2026-11-23T10:00:00+08:00"\n---\n{body}\n'
    )


async def test_a_profile_line_the_model_paraphrased_leaves_with_the_erased_member(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    """The model writes what a member said into the group profile in words of its own (none
    of the member's words): erasing the member takes that line from the profile and every
    kept revision; the line another member's turn brought stays."""
    client, tenant = online
    group = f"g{uuid.uuid4().hex[:10]}"
    victim, other = (str(random.randrange(10**8, 10**9)) for _ in range(2))
    # Each turn's line, worded so that it shares no word with what was said.
    theirs, others = "某位群友迷上了黏土手作", "大家周末常结伴去郊外徒步"
    turns = [(other, "我们这周六去爬山吧", [others]), (victim, "我最近学做陶艺", [others, theirs])]
    document: dict[str, str] = {}

    def profile_step(request: dict[str, Any]) -> Reply:
        if request["tools"][0]["function"]["name"] != "read_profile":
            return quiet(request)
        if any(m["role"] == "tool" for m in request["messages"]):
            return Reply(content="done")
        arguments = {"entity_type": "group", "entity_id": group, "document": document["next"]}
        return tool("update_profile", arguments)

    llm.default = profile_step
    for n, (who, said, lines) in enumerate(turns):
        document["next"] = _group_document(group, lines)
        response = await client.post(
            "/v1/end",
            json={
                "request_type": "group",
                "group_id": group,
                "sender_id": who,
                "sender_name": f"N{who[:4]}",
                "timestamp": f"{DAY}T1{n}:00:00+08:00",
                "observations": [f"N{who[:4]}({who})说{said}"],
                "force": True,
            },
            headers=tenant.headers,
        )
        assert response.status_code == 202, response.text
        job = await until_finished(client, tenant, response.json()["job_id"])
        assert job["status"] == "done", job
    before = await client.get(f"/v1/profiles/group/{group}", headers=tenant.headers)
    assert before.status_code == 200, before.text
    assert theirs in before.json()["body"] and others in before.json()["body"]

    erased = await client.delete(f"/v1/users/{victim}", headers=tenant.headers)
    assert erased.status_code == 200, erased.text
    after = (await client.get(f"/v1/profiles/group/{group}", headers=tenant.headers)).json()
    assert theirs not in after["body"], after["body"]
    assert others in after["body"]
    history = await client.get(f"/v1/profiles/group/{group}/revisions", headers=tenant.headers)
    assert history.status_code == 200, history.text
    assert theirs not in history.text
    assert any(others in r["document"] for r in history.json())
