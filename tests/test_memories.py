"""Scoped memories: the historian's tools, history, validity, duplicates, todos, forgetting."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import text

from service.app import create_app
from service.audit import service as audit
from service.db.engine import Database
from service.settings import Settings
from service.tenants.service import create_tenant
from service.text import STATEMENT_MAX_CHARS
from service.todos import service as todos
from service.todos.service import Courier
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

GROUP = {
    "request_type": "group",
    "group_id": "g1",
    "group_name": "登山群",
    "sender_id": "10001",
    "sender_name": "用户A",
    "bot_id": "20002",
    "bot_name": "小助手",
    "timestamp": "2026-02-21T23:30:00+08:00",
}


async def hand_over(client: AppClient, tenant: TenantHandle, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/end", json={**GROUP, **body}, headers=tenant.headers)
    assert response.status_code == 202, response.text
    return await until_finished(client, tenant, response.json()["job_id"])


async def add(
    client: AppClient, tenant: TenantHandle, content: str, **extra: Any
) -> dict[str, Any]:
    body = {
        "scope": "MEMBER_IN_GROUP",
        "group_id": "g1",
        "user_id": "10001",
        "category": "FACT",
        "content": content,
        **extra,
    }
    response = await client.post("/v1/memories", json=body, headers=tenant.headers)
    assert response.status_code in (200, 201), response.text
    return dict(response.json())


async def history(client: AppClient, tenant: TenantHandle, memory_id: int) -> list[dict[str, Any]]:
    return list(
        (await client.get(f"/v1/memories/{memory_id}/history", headers=tenant.headers)).json()
    )


async def test_the_seed_example_updates_the_nickname_and_ends_the_plan(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    nickname = await add(client, tenant, "用户A(10001) 的昵称是小王", category="PREFERENCE")
    hiking = await add(client, tenant, "用户A(10001) 计划 2026-02-23 那周去爬山")
    message = "别再叫我小王了，叫我王总。另外，我下周不去爬山了。"
    llm.script(
        tool(
            "submit_rewrite",
            {
                "rewrites": [
                    {
                        "index": 0,
                        "text": "用户A(10001) 不再希望被叫小王，希望被称为王总；用户A(10001) 2026-02-23 那周不去爬山了",
                    }
                ]
            },
        ),
        Reply(content="no profile change"),
        Reply(
            tool_calls=[
                (
                    "update_memory",
                    {
                        "memory_id": nickname["id"],
                        "new_content": "用户A(10001) 希望被称为王总",
                        "reason": "用户要求更改称呼",
                    },
                ),
                ("delete_memory", {"memory_id": hiking["id"], "reason": "计划取消"}),
            ]
        ),
    )
    job = await hand_over(
        client, tenant, request_id="seed3", observations=[message], source_message=message
    )
    assert job["status"] == "done", job
    assert job["result"]["memory"] == {"updated": 1, "deactivated": 1}
    prompt = llm.chat_requests[2]["messages"][1]["content"]
    assert f"[ID: {nickname['id']}]" in prompt and f"[ID: {hiking['id']}]" in prompt

    renamed = (await client.get(f"/v1/memories/{nickname['id']}", headers=tenant.headers)).json()
    assert renamed["content"] == "用户A(10001) 希望被称为王总" and renamed["is_active"]
    ended = (await client.get(f"/v1/memories/{hiking['id']}", headers=tenant.headers)).json()
    assert ended["is_active"] is False
    assert ended["valid_to"] is not None and ended["content"] == hiking["content"]
    changes = await history(client, tenant, nickname["id"])
    assert [c["action"] for c in changes] == ["add", "update"]
    assert changes[1]["old_content"] == "用户A(10001) 的昵称是小王"
    assert changes[1]["reason"] == "用户要求更改称呼"
    assert changes[1]["cause"]["by"] == "job"
    assert [c["action"] for c in await history(client, tenant, hiking["id"])] == [
        "add",
        "deactivate",
    ]


async def test_made_up_ids_and_other_groups_are_refused(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    other = await add(client, tenant, "群 g2 的规矩", scope="GROUP", group_id="g2", user_id=None)
    llm.script(
        tool("submit_rewrite", {"rewrites": [{"index": 0, "text": "用户A(10001) 喜欢攀岩"}]}),
        Reply(content="no profile change"),
        Reply(
            tool_calls=[
                ("update_memory", {"memory_id": 999999, "new_content": "x", "reason": "made up"}),
                ("delete_memory", {"memory_id": other["id"], "reason": "not shown to me"}),
                (
                    "add_memory",
                    {
                        "content": "群 g2 禁止广告",
                        "scope": "GROUP",
                        "category": "FACT",
                        "group_id": "g2",
                    },
                ),
                (
                    "add_memory",
                    {
                        "content": "用户A(10001) 明天去攀岩",
                        "scope": "MEMBER_IN_GROUP",
                        "category": "FACT",
                    },
                ),
            ]
        ),
        tool(
            "add_memory",
            {
                "content": "用户A(10001) 喜欢攀岩",
                "scope": "MEMBER_IN_GROUP",
                "category": "PREFERENCE",
            },
        ),
    )
    job = await hand_over(client, tenant, request_id="refuse", observations=["我喜欢攀岩"])
    notes = " | ".join(job["result"]["notes"])
    assert "999999 is not among" in notes
    assert f"{other['id']} is not among" in notes
    assert "cannot write memories of group g2" in notes
    assert "must be absolute" in notes and "明天" in notes
    # The refusals went back to the model, which then made one valid call.
    feedback = [m["content"] for m in llm.chat_requests[3]["messages"] if m["role"] == "tool"]
    assert all(f.startswith("refused") for f in feedback)
    assert job["result"]["memory"] == {"added": 1}
    listed = (await client.get("/v1/memories?group_id=g1", headers=tenant.headers)).json()
    assert [m["content"] for m in listed] == ["用户A(10001) 喜欢攀岩"]
    assert (await client.get(f"/v1/memories/{other['id']}", headers=tenant.headers)).json()[
        "is_active"
    ]


async def test_offline_every_observation_becomes_an_add_without_duplicates(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    await hand_over(
        client, tenant, request_id="o1", observations=["我喜欢吃辣", "群规：禁止发广告"]
    )
    await hand_over(client, tenant, request_id="o2", observations=["我喜欢吃辣"])
    memories = (await client.get("/v1/memories?group_id=g1", headers=tenant.headers)).json()
    by_content = {m["content"]: m for m in memories}
    assert set(by_content) == {"用户A(10001)喜欢吃辣", "群规：禁止发广告"}
    spicy = by_content["用户A(10001)喜欢吃辣"]
    assert (spicy["scope"], spicy["user_id"], spicy["category"]) == (
        "MEMBER_IN_GROUP",
        "10001",
        "PREFERENCE",
    )
    rules = by_content["群规：禁止发广告"]
    assert (rules["scope"], rules["user_id"]) == ("GROUP", None)
    assert spicy["evidence"]["event_ids"] == ["g:g1:o1:1.1"]
    assert [h["action"] for h in await history(client, tenant, spicy["id"])] == [
        "add",
        "noop_duplicate",
    ]
    # A private chat writes the user's PRIVATE memories: read in that chat only.
    private = {
        "request_type": "private",
        "user_id": "10001",
        "sender_id": "10001",
        "sender_name": "用户A",
    }
    response = await client.post(
        "/v1/end",
        json={**private, "request_id": "p1", "observations": ["我是一名护士"]},
        headers=tenant.headers,
    )
    await until_finished(client, tenant, response.json()["job_id"])
    mine = (
        await client.get("/v1/memories?scope=PRIVATE&user_id=10001", headers=tenant.headers)
    ).json()
    assert [(m["content"], m["category"]) for m in mine] == [("用户A(10001)是一名护士", "PROFILE")]


async def test_api_changes_are_all_in_the_history_and_delete_is_real(
    client: AppClient, db_url: str
) -> None:
    tenant = await new_tenant(client)
    memory = await add(client, tenant, "用户A(10001) 住在杭州")
    patched = await client.patch(
        f"/v1/memories/{memory['id']}",
        json={"content": "用户A(10001) 住在上海", "reason": "搬家了", "importance": 0.9},
        headers=tenant.headers,
    )
    assert (
        patched.json()["content"] == "用户A(10001) 住在上海" and patched.json()["importance"] == 0.9
    )
    off = await client.patch(
        f"/v1/memories/{memory['id']}", json={"is_active": False}, headers=tenant.headers
    )
    assert off.json()["is_active"] is False and off.json()["valid_to"] is not None
    on = await client.patch(
        f"/v1/memories/{memory['id']}", json={"is_active": True}, headers=tenant.headers
    )
    assert on.json()["is_active"] is True and on.json()["valid_to"] is None
    actions = [h["action"] for h in await history(client, tenant, memory["id"])]
    assert actions == ["add", "update", "deactivate", "restore"]

    deleted = await client.delete(f"/v1/memories/{memory['id']}", headers=tenant.headers)
    assert deleted.status_code == 200
    assert (
        await client.get(f"/v1/memories/{memory['id']}", headers=tenant.headers)
    ).status_code == 404
    after = await history(client, tenant, memory["id"])
    assert [h["action"] for h in after] == [*actions, "delete"]
    assert all(h["old_content"] is None and h["new_content"] is None for h in after)
    async with raw_connection(db_url) as conn:
        leftovers = await conn.fetchval(
            "SELECT count(*) FROM memory_history WHERE old_content LIKE '%杭州%' OR new_content LIKE '%上海%'"
        )
    assert leftovers == 0


async def test_a_long_history_comes_a_page_at_a_time(client: AppClient, db_url: str) -> None:
    # A group's day summary is rewritten at every quiet spell, a changing fact at each change:
    # months of them gave thousands of entries, each with its old and new text, in one answer.
    tenant = await new_tenant(client)
    memory = await add(client, tenant, "用户A(10001) 每天跑步")
    async with raw_connection(db_url) as conn:
        await conn.execute(
            "INSERT INTO memory_history (tenant_id, memory_id, action, old_content,"
            " new_content, reason, cause)"
            " SELECT $1, $2, 'update', repeat('旧', 2000), repeat('新', 2000), 'x', '{}'"
            " FROM generate_series(1, 1233)",
            uuid.UUID(tenant.id),
            memory["id"],
        )
    url = f"/v1/memories/{memory['id']}/history"
    first = (await client.get(url, headers=tenant.headers)).json()
    assert len(first) == 100 and first[0]["action"] == "add"
    walked: list[int] = []
    after: int | None = None
    while True:
        query = f"?limit=500&after={after}" if after else "?limit=500"
        page = (await client.get(url + query, headers=tenant.headers)).json()
        walked += [h["id"] for h in page]
        if len(page) < 500:
            break
        after = page[-1]["id"]
    assert len(walked) == 1234 and walked == sorted(set(walked))
    past_the_end = await client.get(f"{url}?after={walked[-1]}", headers=tenant.headers)
    assert past_the_end.status_code == 200 and past_the_end.json() == []
    for query, name in [
        ("?limit=0", "limit"),
        ("?limit=501", "limit"),
        ("?limit=x", "limit"),
        ("?after=-1", "after"),
        (f"?after={2**63}", "after"),
        ("?after=1%3A2", "after"),
    ]:
        refused = await client.get(url + query, headers=tenant.headers)
        assert refused.status_code == 422, (query, refused.text)
        assert name in refused.text, (query, refused.text)
    for query in ("", f"?after={walked[0]}"):
        missing = await client.get(f"/v1/memories/999999/history{query}", headers=tenant.headers)
        assert missing.status_code == 404
    other = await new_tenant(client, "other")
    assert (await client.get(url, headers=other.headers)).status_code == 404


async def test_api_add_suppresses_near_duplicates_within_a_scope(client: AppClient) -> None:
    tenant = await new_tenant(client)
    first = await add(client, tenant, "用户A(10001) 对花生过敏")
    again = await client.post(
        "/v1/memories",
        json={
            "scope": "MEMBER_IN_GROUP",
            "group_id": "g1",
            "user_id": "10001",
            "content": "用户A(10001)对花生过敏。",
        },
        headers=tenant.headers,
    )
    assert again.status_code == 200 and again.json()["duplicate"] is True
    assert again.json()["id"] == first["id"]
    elsewhere = await client.post(
        "/v1/memories",
        json={
            "scope": "MEMBER_IN_GROUP",
            "group_id": "g2",
            "user_id": "10001",
            "content": "用户A(10001) 对花生过敏",
        },
        headers=tenant.headers,
    )
    assert elsewhere.status_code == 201  # another group is another scope
    bad = await client.post(
        "/v1/memories",
        json={"scope": "GROUP", "user_id": "10001", "content": "x"},
        headers=tenant.headers,
    )
    assert bad.status_code == 422 and bad.json()["field"] == "group_id"


async def test_search_is_hard_filtered_and_marks_use(client: AppClient) -> None:
    tenant = await new_tenant(client)
    mine = await add(client, tenant, "用户A(10001) 喜欢川菜和火锅")
    await add(client, tenant, "用户B(10002) 喜欢川菜", user_id="10002")
    await add(client, tenant, "群 g2 的人都爱吃火锅", scope="GROUP", group_id="g2", user_id=None)
    await add(client, tenant, "用户A(10001) 是素食者", scope="GLOBAL", group_id=None)
    await add(
        client, tenant, "用户B(10002) 是素食者", scope="GLOBAL", group_id=None, user_id="10002"
    )
    await add(client, tenant, "用户A(10001) 私下爱吃辣条", scope="PRIVATE", group_id=None)
    await add(client, tenant, "用户A(10001) 在 g2 爱吃面", group_id="g2")
    hits = (
        await client.post(
            "/v1/memories/search",
            json={"query": "爱吃什么", "group_id": "g1", "user_id": "10001"},
            headers=tenant.headers,
        )
    ).json()
    contents = {h["content"] for h in hits}
    # The group's members' items said in it (用户B's too), the person's own GLOBAL one; no
    # other group's, no one's PRIVATE, no other person's GLOBAL.
    assert contents == {
        "用户A(10001) 喜欢川菜和火锅",
        "用户B(10002) 喜欢川菜",
        "用户A(10001) 是素食者",
    }
    # Use is written to the primary in batches (the search itself writes nothing).
    await client.app.state.runtime.db.last_use.flush()
    used = (await client.get(f"/v1/memories/{mine['id']}", headers=tenant.headers)).json()
    assert used["last_used_at"] is not None
    missing = await client.post("/v1/memories/search", json={"query": "x"}, headers=tenant.headers)
    assert missing.status_code == 422


async def test_forget_by_id_category_and_query(client: AppClient) -> None:
    tenant = await new_tenant(client)
    a = await add(client, tenant, "用户A(10001) 喜欢猫", category="PREFERENCE")
    b = await add(client, tenant, "用户A(10001) 喜欢狗", category="PREFERENCE")
    c = await add(client, tenant, "用户A(10001) 在银行工作", category="PROFILE")
    by_id = await client.post(
        "/v1/memories/forget", json={"ids": [a["id"]]}, headers=tenant.headers
    )
    assert by_id.json() == {"mode": "deactivate", "changed": [a["id"]], "dry_run": False}
    by_category = await client.post(
        "/v1/memories/forget",
        json={"category": "PREFERENCE", "group_id": "g1", "mode": "delete"},
        headers=tenant.headers,
    )
    assert sorted(by_category.json()["changed"]) == sorted([a["id"], b["id"]])
    by_query = await client.post(
        "/v1/memories/forget",
        json={"query": "用户A在哪里上班", "group_id": "g1", "min_score": 0.8},
        headers=tenant.headers,
    )
    assert by_query.json()["changed"] == [c["id"]]
    assert (await client.get(f"/v1/memories/{c['id']}", headers=tenant.headers)).json()[
        "is_active"
    ] is False
    nothing = await client.post(
        "/v1/memories/forget", json={"mode": "delete"}, headers=tenant.headers
    )
    assert nothing.status_code == 422


async def test_a_reminder_becomes_a_todo_with_an_absolute_time(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    job = await hand_over(client, tenant, request_id="t1", observations=["明天提醒大家提交周报"])
    assert job["result"]["memory"] == {"todos_added": 1}
    [todo] = (await client.get("/v1/todos?group_id=g1", headers=tenant.headers)).json()
    assert todo["status"] == "PENDING" and "周报" in todo["description"]
    assert datetime.fromisoformat(todo["trigger_time"]) == datetime.fromisoformat(
        "2026-02-22T09:00:00+08:00"
    )
    assert todo["creator_id"] == "10001"
    due = (await client.get("/v1/todos/due", headers=tenant.headers)).json()
    assert [t["id"] for t in due] == [todo["id"]]  # 2026-02-22 is in the past now
    done = await client.patch(
        f"/v1/todos/{todo['id']}", json={"status": "COMPLETED"}, headers=tenant.headers
    )
    assert done.json()["status"] == "COMPLETED" and done.json()["completed_at"] is not None
    assert (await client.get("/v1/todos/due", headers=tenant.headers)).json() == []
    back = await client.patch(
        f"/v1/todos/{todo['id']}", json={"status": "EXPIRED"}, headers=tenant.headers
    )
    assert back.status_code == 422 and back.json()["field"] == "status"


async def test_a_reminder_naming_no_real_day_is_a_todo_without_a_time(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    # A date that is no day (a typo, a serial number) or too near the calendar's ends to
    # convert between zones is no trigger time: the todo is kept untimed, and the job ends.
    client, tenant = offline
    said = [
        "提醒大家 2026-02-30 提交周报",
        "提醒大家交 SN 2024-13-45 的保修单",
        "提醒大家 9999-12-31 23:30 续费",
        "提醒大家 0001-01-01 00:10 续费",
    ]
    job = await hand_over(client, tenant, request_id="t9", observations=said)
    assert job["status"] == "done", job
    assert job["result"]["memory"] == {"todos_added": 4}
    todos_ = (await client.get("/v1/todos?group_id=g1", headers=tenant.headers)).json()
    assert len(todos_) == 4 and all(t["trigger_time"] is None for t in todos_)


async def test_times_without_an_offset_are_on_the_tenants_clocks(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    # The tenant's clocks are Asia/Shanghai (UTC+8), whatever the server's.
    client, tenant = offline

    def at(value: str) -> datetime:
        return datetime.fromisoformat(value)

    memory = await add(
        client,
        tenant,
        "用户A(10001) 在北京出差",
        valid_from="2027-03-01T08:00:00",
        valid_to="2027-03-05T18:00:00",
    )
    assert at(memory["valid_from"]) == at("2027-03-01T08:00:00+08:00")
    assert at(memory["valid_to"]) == at("2027-03-05T18:00:00+08:00")
    changed = await client.patch(
        f"/v1/memories/{memory['id']}",
        json={"valid_to": "2027-03-04T18:00:00"},
        headers=tenant.headers,
    )
    assert at(changed.json()["valid_to"]) == at("2027-03-04T18:00:00+08:00")

    await hand_over(client, tenant, request_id="t1", observations=["明天提醒大家提交周报"])
    [todo] = (await client.get("/v1/todos?group_id=g1", headers=tenant.headers)).json()
    moved = await client.patch(
        f"/v1/todos/{todo['id']}",
        json={"trigger_time": "2027-03-01T08:00:00"},
        headers=tenant.headers,
    )
    assert at(moved.json()["trigger_time"]) == at("2027-03-01T08:00:00+08:00")
    for due_before, found in (("2027-03-01T07:59:59", []), ("2027-03-01T08:00:00", [todo["id"]])):
        listed = await client.get(
            "/v1/todos", params={"due_before": due_before}, headers=tenant.headers
        )
        assert [t["id"] for t in listed.json()] == found, due_before

    # The audit trail of the tenant, since a few minutes ago on its clocks (and not after now).
    await audit.flush()
    local = datetime.now(ZoneInfo("Asia/Shanghai")).replace(tzinfo=None, microsecond=0)
    for since, routes in (
        (local - timedelta(minutes=5), {"/v1/memories", "/v1/todos/{todo_id}"}),
        (local + timedelta(minutes=5), set()),
    ):
        params = {"tenant_id": tenant.id, "since": since.isoformat()}
        entries = (await client.get("/admin/audit", params=params, headers=ADMIN)).json()
        assert routes <= {e["route"] for e in entries}, since
        assert bool(entries) == bool(routes), since
    # Across tenants there are no caller's clocks to read it on.
    since = {"since": local.isoformat()}
    refused = await client.get("/admin/audit", params=since, headers=ADMIN)
    assert refused.status_code == 422 and refused.json()["field"] == "since", refused.text


async def test_the_llm_completes_a_todo(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    llm.script(
        tool("submit_rewrite", {"rewrites": [{"index": 0, "text": "2026-02-22 提醒大家提交周报"}]}),
        Reply(content="no profile change"),
        tool(
            "add_todo",
            {
                "description": "提醒群 g1 的大家提交周报",
                "trigger_time": "2026-02-22T18:00:00+08:00",
            },
        ),
    )
    await hand_over(client, tenant, request_id="lt1", observations=["明天提醒大家提交周报"])
    [todo] = (await client.get("/v1/todos?status=PENDING", headers=tenant.headers)).json()
    assert datetime.fromisoformat(todo["trigger_time"]) == datetime.fromisoformat(
        "2026-02-22T18:00:00+08:00"
    )
    llm.script(
        tool(
            "submit_rewrite",
            {"rewrites": [{"index": 0, "text": "用户A(10001) 2026-02-22 已提交周报"}]},
        ),
        Reply(content="no profile change"),
        tool("complete_todo", {"todo_id": todo["id"]}),
    )
    job = await hand_over(client, tenant, request_id="lt2", observations=["周报我交了"])
    assert job["result"]["memory"] == {"todos_completed": 1}
    assert f"[TODO: {todo['id']}]" in llm.chat_requests[-1]["messages"][1]["content"]
    assert (await client.get("/v1/todos?status=COMPLETED", headers=tenant.headers)).json()[0][
        "id"
    ] == todo["id"]


async def test_numbers_and_times_no_column_can_hold_are_refused_to_the_model(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    # JSON lets a model write 1e999 (infinity), NaN, a 400-digit integer or the calendar's
    # first moment east of UTC: each is refused back to it (or the default confidence is
    # taken), and the turn's other calls are kept.
    client, tenant = online
    added = '{"content": "用户A(10001)喜欢爬山", "scope": "MEMBER_IN_GROUP", "confidence": %s}'
    first = Reply(
        tool_calls=[
            ("delete_memory", '{"memory_id": 1e999, "reason": "x"}'),
            ("complete_todo", '{"todo_id": -1e999}'),
            ("add_memory", added % "NaN"),
            ("add_memory", added.replace("爬山", "攀岩") % ("1" + "0" * 400)),
            (
                "add_todo",
                '{"description": "提醒群 g1 的大家续费", '
                '"trigger_time": "0001-01-01T00:00:00+14:00"}',
            ),
        ]
    )
    llm.script(
        tool("submit_rewrite", {"rewrites": [{"index": 0, "text": "用户A(10001)喜欢爬山"}]}),
        Reply(content="no profile change"),
        first,
    )
    job = await hand_over(client, tenant, request_id="inf1", observations=["我喜欢爬山"])
    assert job["status"] == "done", job
    assert job["result"]["memory"] == {"added": 2}
    refused = [n for n in job["result"]["notes"] if "refused" in n]
    assert len(refused) == 3, job["result"]["notes"]
    found = (await client.get("/v1/memories?group_id=g1", headers=tenant.headers)).json()
    assert sorted(m["confidence"] for m in found) == [0.7, 1.0]
    assert (await client.get("/v1/todos?group_id=g1", headers=tenant.headers)).json() == []


async def test_a_reason_holding_a_nul_character_is_stored_without_it(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    # A change's reason goes to the memory's history, whose text holds no NUL character.
    client, tenant = online
    kept = await add(client, tenant, "用户A(10001)喜欢爬山")
    llm.script(
        tool("submit_rewrite", {"rewrites": [{"index": 0, "text": "用户A(10001)不再爬山"}]}),
        Reply(content="no profile change"),
        tool("delete_memory", {"memory_id": kept["id"], "reason": "不再\x00爬山"}),
    )
    job = await hand_over(client, tenant, request_id="nul1", observations=["我不再爬山了"])
    assert job["status"] == "done", job
    assert job["result"]["memory"] == {"deactivated": 1}
    assert "不再爬山" in [
        entry.get("reason") for entry in await history(client, tenant, kept["id"])
    ]


async def test_maintenance_expires_forgets_and_expires_todos(db_url: str) -> None:
    settings = make_settings(
        db_url,
        cognitive={
            "queue": FAST_QUEUE,
            "memory": {
                "maintenance_interval_minutes": 0.01,
                "decay_after_days": 1,
                "forget_after_days": 1,
            },
        },
    )
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        tenant = await new_tenant(client)
        past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
        expired = await add(client, tenant, "用户A(10001) 本周在出差", valid_to=past)
        faded = await add(client, tenant, "用户A(10001) 随口提过喜欢蓝色", importance=0.05)
        kept = await add(client, tenant, "用户A(10001) 对花生过敏", importance=0.9)
        async with raw_connection(db_url) as conn:
            await conn.execute("UPDATE memories SET created_at = now() - interval '10 days'")
            await conn.execute(
                "INSERT INTO todos (tenant_id, conversation_key, group_id, description, trigger_time)"
                f" VALUES ('{tenant.id}', 'g:g1', 'g1', '很久以前的提醒', now() - interval '30 days')"
            )
        client.app.state.runtime.start_worker()

        async def maintained() -> dict[str, Any] | None:
            jobs = (await client.get("/v1/jobs?status=done", headers=tenant.headers)).json()["jobs"]
            return next((j for j in jobs if j["kind"] == "memories.maintain"), None)

        job = await wait_for(maintained, timeout=30)
        assert job["result"]["expired"] == 1 and job["result"]["forgotten"] == 1
        assert job["result"]["todos_expired"] == 1
        state = {
            m["id"]: m["is_active"]
            for m in (await client.get("/v1/memories?group_id=g1", headers=tenant.headers)).json()
        }
        assert state == {expired["id"]: False, faded["id"]: False, kept["id"]: True}
        assert [h["action"] for h in await history(client, tenant, faded["id"])][-1] == "forget"
        assert (await client.get("/v1/todos?status=EXPIRED", headers=tenant.headers)).json()


async def test_consolidation_merges_near_duplicates(db_url: str) -> None:
    settings = make_settings(
        db_url,
        cognitive={
            "queue": FAST_QUEUE,
            "extraction": {"pause_minutes": 0.005, "check_interval_seconds": 0.2},
            # Adds keep both near-duplicates (only identical wording is a no-op); the
            # quiet-time consolidation then merges them.
            "memory": {"duplicate_threshold": 1.0, "consolidate_threshold": 0.97},
        },
    )
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        tenant = await new_tenant(client)
        older = await add(client, tenant, "用户A(10001) 喜欢喝美式咖啡")
        newer = await add(client, tenant, "用户A(10001) 很喜欢喝美式咖啡")
        other = await add(client, tenant, "用户A(10001) 周末常去爬山")
        await client.post(
            "/v1/messages",
            json={
                "request_type": "group",
                "group_id": "g1",
                "messages": [{"message_id": "1", "text": "hi"}],
            },
            headers=tenant.headers,
        )

        async def consolidated() -> dict[str, Any] | None:
            jobs = (await client.get("/v1/jobs?status=done", headers=tenant.headers)).json()["jobs"]
            return next((j for j in jobs if j["kind"] == "memories.consolidate"), None)

        job = await wait_for(consolidated, timeout=30)
        assert job["result"]["merged"] == 1
        state = {
            m["id"]: m["is_active"]
            for m in (await client.get("/v1/memories?group_id=g1", headers=tenant.headers)).json()
        }
        mine = {k: v for k, v in state.items() if k in (older["id"], newer["id"], other["id"])}
        assert mine == {older["id"]: False, newer["id"]: True, other["id"]: True}
        last = (await history(client, tenant, older["id"]))[-1]
        assert last["action"] == "consolidate" and last["cause"]["merged_into"] == newer["id"]


@dataclass
class Hook:
    """A loopback webhook: what it was sent, and how often it was called."""

    url: str
    received: list[dict[str, Any]]
    calls: int = 0


@contextmanager
def webhook(status: Callable[[int], int] = lambda call: 200) -> Iterator[Hook]:
    """A loopback webhook answering its ``call``-th POST (from 1) with ``status(call)``; what
    it accepted (2xx) is ``received``."""
    hook = Hook("", [])

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            hook.calls += 1
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            answer = status(hook.calls)
            if answer < 300:
                hook.received.append(body)
            self.send_response(answer)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook.url = f"http://127.0.0.1:{server.server_address[1]}/todos"
    try:
        yield hook
    finally:
        server.shutdown()


def delivering(db_url: str) -> Settings:
    """A service with a worker, whose operator lets the tests' loopback webhooks in."""
    return make_settings(
        db_url,
        cognitive={"queue": FAST_QUEUE, "extraction": {"check_interval_seconds": 0.2}},
        webhook_allow_private=True,
    )


async def test_due_todos_are_delivered_to_the_webhook(db_url: str) -> None:
    # The first delivery fails (503) and is retried.
    with webhook(lambda call: 503 if call == 1 else 200) as hook:
        async with serve_app(
            create_app(delivering(db_url), migrate=False, run_worker=True)
        ) as client:
            tenant = await new_tenant(client)
            await client.patch(
                "/v1/settings", json={"webhook_url": hook.url}, headers=tenant.headers
            )
            await hand_over(client, tenant, request_id="w1", observations=["明天提醒大家交周报"])

            async def delivered() -> bool:
                todos = (await client.get("/v1/todos", headers=tenant.headers)).json()
                return bool(todos and todos[0]["delivered_at"])

            await wait_for(delivered, timeout=30)
    received = hook.received
    assert hook.calls == 2
    assert len(received) == 1 and received[0]["event"] == "todo.due"
    assert "周报" in received[0]["todo"]["description"]


async def test_a_todo_rescheduled_after_its_delivery_is_delivered_at_its_new_time(
    db_url: str,
) -> None:
    """Asked to "remind me again in a moment": a delivered todo given a new trigger_time is POSTed
    again once that time comes (its first delivery job, kept a day, held its place)."""
    with webhook() as hook:
        async with serve_app(
            create_app(delivering(db_url), migrate=False, run_worker=True)
        ) as client:
            received = hook.received
            tenant = await new_tenant(client)
            await client.patch(
                "/v1/settings", json={"webhook_url": hook.url}, headers=tenant.headers
            )
            await hand_over(client, tenant, request_id="w2", observations=["明天提醒大家交周报"])

            async def delivered() -> dict[str, Any] | None:
                todos = (await client.get("/v1/todos", headers=tenant.headers)).json()
                return todos[0] if todos and todos[0]["delivered_at"] else None

            todo = await wait_for(delivered, timeout=30)
            again = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
            response = await client.patch(
                f"/v1/todos/{todo['id']}", json={"trigger_time": again}, headers=tenant.headers
            )
            assert response.status_code == 200 and response.json()["delivered_at"] is None

            async def twice() -> bool:
                return len(received) >= 2

            await wait_for(twice, timeout=15)
            # The delivery is recorded once the webhook has answered: a moment after it was
            # received.
            assert await wait_for(delivered, timeout=15) is not None
    assert [datetime.fromisoformat(r["todo"]["trigger_time"]) for r in received][1] == (
        datetime.fromisoformat(again)
    )


async def test_todos_whose_delivery_failed_do_not_hold_up_other_tenants(db_url: str) -> None:
    """The due scan takes 500 todos at a time: 500 of one tenant whose delivery jobs failed
    (its webhook is down) were taken again at every pass, so its other due todos, and another
    tenant's, never got a job."""
    db = Database(db_url, pool_size=4)
    courier = Courier(db, Settings())
    try:
        async with db.system() as session:
            down, _ = await create_tenant(session, "webhook-down", {}, Settings())
            up, _ = await create_tenant(session, "webhook-up", {}, Settings())
            await session.execute(
                text(
                    "UPDATE tenants SET settings = settings"
                    " || jsonb_build_object('webhook_url', 'https://example.com/hook')"
                    " WHERE id = ANY(:ids)"
                ),
                {"ids": [down.id, up.id]},
            )
            await session.execute(
                text(
                    "INSERT INTO todos (tenant_id, conversation_key, group_id, description,"
                    " trigger_time, evidence)"
                    " SELECT :tenant_id, 'g:g1', 'g1', '交周报 ' || n, now() - interval '1 hour',"
                    " '{}' FROM generate_series(1, 1000) AS n"
                ),
                {"tenant_id": down.id},
            )
        assert await courier.enqueue_due() == 500
        async with db.system() as session:
            await session.execute(
                text("UPDATE jobs SET status = 'failed', finished_at = now() WHERE tenant_id = :t"),
                {"t": down.id},
            )
            added, _ = await todos.add(
                session,
                up.id,
                todos.Place.of("group", "g2", None),
                "提醒大家开会",
                datetime.now(UTC) - timedelta(minutes=1),
                UTC,
            )
            waiting = added["id"]
        for _ in range(3):
            await courier.enqueue_due()
        async with db.system() as session:
            jobs = text("SELECT tenant_id, payload FROM jobs WHERE tenant_id = ANY(:ids)")
            found = (await session.execute(jobs, {"ids": [down.id, up.id]})).all()
        assert len({row.payload["todo_id"] for row in found if row.tenant_id == down.id}) == 1000
        assert [row.payload["todo_id"] for row in found if row.tenant_id == up.id] == [waiting]
    finally:
        await db.dispose()


async def test_extraction_keeps_a_rolling_summary_per_group_and_day(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    lines = [
        "周末去西湖划船吧",
        "西湖划船要排队吗",
        "西湖边上吃饭",
        "划船的人多不多",
        "我们下周也去西湖",
    ]
    messages = [
        {
            "message_id": str(n),
            "sender_id": "1",
            "text": t,
            "sent_at": f"2026-03-01T10:0{n}:00+08:00",
        }
        for n, t in enumerate(lines)
    ]
    for n, batch in enumerate((messages[:3], messages[3:])):
        await client.post(
            "/v1/messages",
            json={
                "request_type": "group",
                "group_id": "g9",
                "group_name": "旅行群",
                "messages": batch,
            },
            headers=tenant.headers,
        )
        # A message asking to remember triggers the extraction over everything unread.
        reminder = {
            "message_id": f"r{n}",
            "text": "记住：集合地点在断桥",
            "sent_at": "2026-03-01T11:00:00+08:00",
        }
        response = await client.post(
            "/v1/messages",
            json={"request_type": "group", "group_id": "g9", "messages": [reminder]},
            headers=tenant.headers,
        )
        [job_id] = response.json()["extraction_job_ids"]
        await until_finished(client, tenant, job_id)

    async def summary() -> list[dict[str, Any]]:
        rows = (
            await client.get("/v1/memories?group_id=g9&category=SUMMARY", headers=tenant.headers)
        ).json()
        return [r for r in rows if "西湖" in r["content"]]

    [day] = await wait_for(summary)
    assert day["summary_day"] == "2026-03-01" and day["scope"] == "GROUP"
    assert day["content"].startswith("2026-03-01 群「旅行群」：")
    assert "西湖" in day["content"] and "条消息" not in day["content"]
    # Rolling: the second extraction rewrote the same day's summary, with history.
    assert [h["action"] for h in await history(client, tenant, day["id"])] == ["add", "update"]


async def test_a_tool_not_offered_is_refused_and_the_job_still_lands(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    # A private chat is offered no write_summary (a group's day summary); a model talked into
    # calling it anyway is told so, and the chat's own event and memory are still stored.
    client, tenant = online
    calls = [
        ("write_summary", {"day": "2026-02-21", "content": "2026-02-21 群里讨论了攀岩"}),
        (
            "add_memory",
            {"content": "用户A(10001) 喜欢攀岩", "scope": "PRIVATE", "category": "PREFERENCE"},
        ),
    ]

    def memory_step(request: dict[str, Any]) -> Reply:
        if request["tools"][0]["function"]["name"] == "add_memory":
            offered = {t["function"]["name"] for t in request["tools"]}
            assert "write_summary" not in offered
            first = request["messages"][-1]["role"] == "user"
            return Reply(tool_calls=calls) if first else Reply(content="done")
        return quiet(request)

    llm.default = memory_step
    private = {
        "request_type": "private",
        "user_id": "10001",
        "sender_id": "10001",
        "sender_name": "用户A",
        "bot_id": "20002",
        "timestamp": "2026-02-21T23:30:00+08:00",
    }
    response = await client.post(
        "/v1/end",
        json={**private, "request_id": "unoffered", "observations": ["我喜欢攀岩"]},
        headers=tenant.headers,
    )
    job = await until_finished(client, tenant, response.json()["job_id"])
    assert job["status"] == "done", job
    assert job["result"]["memory"] == {"added": 1}
    assert any("write_summary: refused" in note for note in job["result"]["notes"])
    events = await client.get(f"/v1/events/{job['result']['event_ids'][0]}", headers=tenant.headers)
    assert events.status_code == 200
    mine = (await client.get("/v1/memories?user_id=10001", headers=tenant.headers)).json()
    assert [(m["scope"], m["content"]) for m in mine] == [("PRIVATE", "用户A(10001) 喜欢攀岩")]


async def test_a_flood_of_tool_calls_is_cut_at_the_cap_and_the_job_still_lands(
    db_url: str, llm: FakeLLM
) -> None:
    # A chat user can ask for "each of these 5,000 lines remembered separately"; a model
    # that obliges answers with thousands of calls. The step takes the first max_tool_calls
    # of them, refuses the rest in one note, and does not ask the model again.
    cap = 25
    settings = make_settings(
        db_url,
        cognitive={
            "queue": {**FAST_QUEUE, "job_max_retries": 0},
            "memory": {"max_tool_calls": cap},
        },
        # The scripted server's hash vectors as the embedder, to count what the job embeds.
        models={
            **llm_settings(llm)["models"],
            "embedding": {"provider": "openai", "api_url": llm.base_url, "model_name": "hash-384"},
        },
    )
    contents = [
        f"用户A(10001) 请记住第 {i} 行：编号 {i * 7919} 的零件放在 {i} 号柜" for i in range(2500)
    ]
    flood = [
        ("add_memory", {"content": text, "scope": "MEMBER_IN_GROUP", "category": "FACT"})
        for text in contents
    ]

    def memory_step(request: dict[str, Any]) -> Reply:
        if request["tools"][0]["function"]["name"] == "add_memory":
            return Reply(tool_calls=flood)
        return quiet(request)

    llm.default = memory_step
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        tenant = await new_tenant(client)
        job = await hand_over(client, tenant, request_id="flood", observations=["记住这些行"])
        assert job["status"] == "done", job
        assert job["result"]["memory"] == {"added": cap}
        assert job["result"]["memory_llm_calls"] == 1  # no second turn for the refused rest
        refused = [note for note in job["result"]["notes"] if "refused" in note]
        assert refused == [
            f"{2500 - cap} tool calls refused: at most {cap} are taken from the "
            "model in one memory step"
        ]
        listed = (
            await client.get("/v1/memories?group_id=g1&limit=500", headers=tenant.headers)
        ).json()
        assert sorted(m["content"] for m in listed) == sorted(contents[:cap])
    # What the job embedded is bounded by the cap too, not by the reply: its event, the
    # observation looked up, and the memories taken.
    embedded = [text for r in llm.embedding_requests for text in r["input"]]
    assert sum("请记住第" in text for text in embedded) == cap


async def test_what_a_model_quotes_in_refused_calls_is_kept_and_shown_bounded(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    """Tool calls holding megabytes (a made-up id, a person, a tool's own name) are refused
    with their reason, and each note kept in the job and each reply the model reads next is
    at most a statement long; a profile turn of hundreds of calls runs only a few of them."""
    client, tenant = online
    huge = "9" * 2_000_000
    memory_calls = [
        ("update_memory", {"memory_id": huge, "new_content": "用户A(10001) 爱攀岩", "reason": "r"}),
        (
            "add_memory",
            {
                "content": "用户A(10001) 喜欢攀岩",
                "scope": "MEMBER_IN_GROUP",
                "category": "FACT",
                "user_id": f"u{huge}",
            },
        ),
        ("add_todo", {"description": "用户A(10001) 2026-02-23 去攀岩", "assignee_id": f"a{huge}"}),
        (f"tool{huge[:1_000_000]}", {}),
    ]
    reads = 300
    profile_calls = [
        ("update_profile", {"entity_type": "user", "entity_id": f"e{huge}", "document": "-"}),
        *[("read_profile", {"entity_type": "user", "entity_id": "10001"})] * reads,
    ]

    def model(request: dict[str, Any]) -> Reply:
        first = request["messages"][-1]["role"] == "user"
        calls = {"read_profile": profile_calls, "add_memory": memory_calls}.get(
            request["tools"][0]["function"]["name"]
        )
        if calls is None:
            return quiet(request)
        return Reply(tool_calls=calls) if first else Reply(content="done")

    llm.default = model
    job = await hand_over(
        client, tenant, request_id=f"quotes-{uuid.uuid4().hex}", observations=["我喜欢攀岩"]
    )
    assert job["status"] == "done", str(job)[:2000]
    notes = job["result"]["notes"]
    assert len(json.dumps(notes)) < 10 * STATEMENT_MAX_CHARS, [n[:200] for n in notes]
    assert all(len(note) <= STATEMENT_MAX_CHARS for note in notes)
    joined = " | ".join(notes)
    assert "not an id" in joined and "is not part of this conversation" in joined
    assert "unknown tool" in joined and "is not a target of this job" in joined
    [flood] = re.findall(r"(\d+) tool calls refused: at most (\d+) are run a turn", joined)
    assert int(flood[0]) + int(flood[1]) == reads + 1 and int(flood[1]) < 10
    replies = [
        m["content"]
        for r in llm.chat_requests
        for m in r["messages"]
        if m["role"] == "tool" and m["content"].startswith("refused")
    ]
    assert len(replies) >= reads
    assert all(len(reply) <= STATEMENT_MAX_CHARS for reply in replies)


async def test_a_todo_is_assigned_only_to_someone_of_the_conversation(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    # The model chooses assignee_id; one of another group (10009), a made-up id, the bot, or
    # someone only named in a text (10003) would put the todo into that person's export and
    # /v1/todos, and take it away with their erasure. The speaker, and 李四, who sent one of
    # the messages the bot hands over with the turn ("提醒李四交周报"), may have it.
    client, tenant = online
    todo = {"description": "2026-02-22 提醒李四(10002)提交周报"}
    llm.script(
        tool(
            "submit_rewrite",
            {"rewrites": [{"index": 0, "text": "李四(10002) 要在 2026-02-22 被提醒交周报"}]},
        ),
        Reply(content="no profile change"),
        Reply(
            tool_calls=[
                ("add_todo", {**todo, "assignee_id": assignee})
                for assignee in ("10009", "../../x", "10001:evil", "20002", "10003")
            ]
            + [
                ("add_todo", {**todo, "assignee_id": "10002"}),
                (
                    "add_todo",
                    {"description": "2026-02-22 提醒用户A(10001)提交周报", "assignee_id": "10001"},
                ),
            ]
        ),
    )
    recent = [
        {"sender_id": "10002", "sender_name": "李四", "text": "周报我明天再交"},
        {"sender_id": "20002", "sender_name": "小助手", "text": "好的"},
        {
            "sender_id": "10001",
            "sender_name": "用户A",
            "text": "明天提醒李四交周报, 王五(10003)也要",
        },
    ]
    job = await hand_over(
        client,
        tenant,
        request_id="assign",
        observations=["明天提醒李四(10002)交周报"],
        recent_messages=recent,
    )
    assert job["status"] == "done", job
    assert job["result"]["memory"] == {"todos_added": 2}
    refused = [note for note in job["result"]["notes"] if "add_todo: refused" in note]
    assert len(refused) == 5, job["result"]["notes"]
    assert all("is not part of this conversation" in note for note in refused)
    listed = (await client.get("/v1/todos", headers=tenant.headers)).json()
    assert sorted(t["assignee_id"] for t in listed) == ["10001", "10002"]
