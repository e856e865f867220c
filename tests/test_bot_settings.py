"""Many bots, one tenant: each bot's persona and query settings over the tenant's, the memory
shared by all of them, and no bot setting that lets more be seen."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from mcp.types import CallToolResult, TextContent

from service.app import create_app
from service.client import MemoriaClient
from service.mcp_server import Conversation, build_server
from tests.conftest import (
    ADMIN,
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    serve_app,
    until_finished,
)

GROUP = {"request_type": "group", "group_id": "g1", "sender_id": "10001", "sender_name": "张三"}
LAKE = [
    "我 2026-03-01 在西湖划船",
    "我 2026-03-02 在西湖边跑步",
    "我 2026-03-03 在西湖拍了日落",
    "我 2026-03-04 带朋友去西湖喂鱼",
    "我 2026-03-05 在西湖断桥等人",
    "我 2026-03-06 在西湖边吃了小笼包",
]
MAX_BOTS = 3


@pytest.fixture
async def running(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    """The service with its worker; keys cached for a minute, as a busy deployment would."""
    settings = make_settings(
        db_url,
        cognitive={"queue": FAST_QUEUE},
        auth_cache_seconds=60,
        max_bots_per_tenant=MAX_BOTS,
    )
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client)


async def put_bot(
    client: AppClient, tenant: TenantHandle, bot_id: str, body: dict[str, Any]
) -> dict[str, Any]:
    response = await client.put(f"/v1/bots/{bot_id}/settings", json=body, headers=tenant.headers)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def context(
    client: AppClient, tenant: TenantHandle, bot_id: str | None, message: str = "西湖"
) -> dict[str, Any]:
    bot = {"bot_id": bot_id} if bot_id else {}
    response = await client.post(
        "/v1/context", json={**GROUP, **bot, "message": message}, headers=tenant.headers
    )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def told_about_the_lake(client: AppClient, tenant: TenantHandle) -> None:
    response = await client.post(
        "/v1/end",
        json={**GROUP, "request_id": "lake", "observations": LAKE},
        headers=tenant.headers,
    )
    assert response.status_code == 202, response.text
    await until_finished(client, tenant, response.json()["job_id"])


async def test_each_bot_gets_its_own_persona_and_settings_over_one_shared_memory(
    running: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = running
    await client.put("/v1/persona", json={"text": "你是客栈掌柜。"}, headers=tenant.headers)
    await told_about_the_lake(client, tenant)
    remembered = await client.post(
        "/v1/memories",
        json={"scope": "GLOBAL", "user_id": "10001", "content": "张三喜欢西湖龙井"},
        headers=tenant.headers,
    )
    assert remembered.status_code == 201, remembered.text
    smith = await put_bot(
        client,
        tenant,
        "npc-1",
        {
            "persona": "你是铁匠，说话粗声粗气。",
            "query": {"auto_top_k": 1, "tool_default_top_k": 2},
        },
    )
    assert smith["configured"] and smith["query"]["auto_top_k"] == 1
    assert smith["overrides"] == {
        "persona": "你是铁匠，说话粗声粗气。",
        "query": {"auto_top_k": 1, "tool_default_top_k": 2},
    }
    await put_bot(client, tenant, "npc-2", {"persona": "你是药师。", "query": {"auto_top_k": 5}})

    first, second = await context(client, tenant, "npc-1"), await context(client, tenant, "npc-2")
    assert first["persona"] == "你是铁匠，说话粗声粗气。" and "铁匠" in first["prompt"]
    assert second["persona"] == "你是药师。" and "客栈掌柜" not in second["prompt"]
    assert len(first["events"]) == 1 and len(second["events"]) == 5
    # One memory of the person, the same for every bot: settings are not a partition.
    assert {e["id"] for e in first["events"]} < {e["id"] for e in second["events"]}
    # The same memories for every bot: each bot's search of them finds the same.
    found = []
    for bot in ("npc-1", "npc-2", None):
        called = await client.post(
            "/v1/tools/call",
            json={
                "name": "cognitive_search_memories",
                "arguments": {"query": "龙井", "top_k": 5},
                "context": {**GROUP, **({"bot_id": bot} if bot else {})},
            },
            headers=tenant.headers,
        )
        assert called.status_code == 200, called.text
        found.append([m["id"] for m in called.json()["result"]])
    assert found[0] == found[1] == found[2]
    assert remembered.json()["id"] in found[0]
    handed = []
    # A bot with no settings of its own, or a call naming none: the tenant's.
    for bot in ("npc-3", None):
        plain = await context(client, tenant, bot)
        assert plain["persona"] == "你是客栈掌柜。"
        assert len(plain["events"]) == 3  # the deployment's auto_top_k
        handed.append([m["id"] for m in plain["memories"]])
    assert handed[0] == handed[1]
    listed = (await client.get("/v1/bots", headers=tenant.headers)).json()
    assert [b["bot_id"] for b in listed] == ["npc-1", "npc-2"]
    unconfigured = (await client.get("/v1/bots/npc-3/settings", headers=tenant.headers)).json()
    assert not unconfigured["configured"] and unconfigured["persona"] == "你是客栈掌柜。"

    # The bot's tool calls take its settings too: the default number of events returned.
    for bot, expected in (("npc-1", 2), ("npc-3", len(LAKE))):
        called = await client.post(
            "/v1/tools/call",
            json={
                "name": "cognitive_search_events",
                "arguments": {"query": "西湖"},
                "context": {**GROUP, "bot_id": bot},
            },
            headers=tenant.headers,
        )
        assert called.status_code == 200, called.text
        assert len(called.json()["result"]["events"]) == expected, bot


async def test_a_bot_may_turn_cross_group_tools_off_but_never_on(
    running: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = running
    field = "settings.bots.npc-1.query.allow_cross_group_tools"
    for value in (True, "true", 1):
        refused = await client.put(
            "/v1/bots/npc-1/settings",
            json={"query": {"allow_cross_group_tools": value}},
            headers=tenant.headers,
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["field"] == field
    # The admin's replacement of the settings goes through the same check.
    whole = {"bots": {"npc-1": {"query": {"allow_cross_group_tools": True}}}}
    by_admin = await client.patch(
        f"/admin/tenants/{tenant.id}", json={"settings": whole}, headers=ADMIN
    )
    assert by_admin.status_code == 422 and by_admin.json()["field"] == field
    assert (await client.get("/v1/bots", headers=tenant.headers)).json() == []

    # With the tenant's on, a bot may keep its own tools within the conversation.
    turned_on = await client.patch(
        "/v1/settings", json={"query": {"allow_cross_group_tools": True}}, headers=tenant.headers
    )
    assert turned_on.status_code == 200, turned_on.text
    quiet = await put_bot(client, tenant, "npc-1", {"query": {"allow_cross_group_tools": False}})
    assert quiet["query"]["allow_cross_group_tools"] is False

    async def reach(bot: str) -> tuple[int, int]:
        conversation = {**GROUP, "bot_id": bot}
        searched = await client.post(
            "/v1/events/search",
            json={"query": "西湖", "context": conversation, "target_group_id": "g2"},
            headers=tenant.headers,
        )
        called = await client.post(
            "/v1/tools/call",
            json={
                "name": "cognitive_search_events",
                "arguments": {"query": "西湖", "target_group_id": "g2"},
                "context": conversation,
            },
            headers=tenant.headers,
        )
        return searched.status_code, called.status_code

    assert await reach("npc-1") == (403, 403)
    assert await reach("npc-2") == (200, 200)
    # Turned off on the tenant, it is off for every bot, whatever the bot said.
    await client.patch(
        "/v1/settings", json={"query": {"allow_cross_group_tools": False}}, headers=tenant.headers
    )
    assert await reach("npc-1") == (403, 403)
    assert await reach("npc-2") == (403, 403)


@pytest.mark.parametrize(
    ("bot_id", "body", "field"),
    [
        ("npc-1", {"query": {"auto_top_k": 999}}, "settings.bots.npc-1.query.auto_top_k"),
        ("npc-1", {"query": {"auto_top_k": "many"}}, "settings.bots.npc-1.query.auto_top_k"),
        ("npc-1", {"query": {"no_such_setting": 1}}, "settings.bots.npc-1.query.no_such_setting"),
        ("npc-1", {"query": ["auto_top_k"]}, "query"),
        ("npc-1", {"persona": "人" * 20_001}, "settings.bots.npc-1.persona"),
        ("npc-1", {"timezone": "UTC"}, "timezone"),
        ("%20npc-1", {"persona": "x"}, "bot_id"),
        ("n" * 129, {"persona": "x"}, "bot_id"),
    ],
)
async def test_bad_bot_settings_are_refused_naming_the_field(
    running: tuple[AppClient, TenantHandle], bot_id: str, body: dict[str, Any], field: str
) -> None:
    client, tenant = running
    await put_bot(client, tenant, "npc-1", {"persona": "你是铁匠。"})
    refused = await client.put(f"/v1/bots/{bot_id}/settings", json=body, headers=tenant.headers)
    assert 400 <= refused.status_code < 500, refused.text
    answer = refused.json()
    named = [answer.get("field")] + [p.get("field") for p in answer.get("errors") or []]
    assert field in named, answer
    kept = (await client.get("/v1/bots/npc-1/settings", headers=tenant.headers)).json()
    assert kept["overrides"] == {"persona": "你是铁匠。"}


async def test_a_tenant_configures_at_most_its_cap_of_bots(
    running: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = running
    for n in range(MAX_BOTS):
        await put_bot(client, tenant, f"npc-{n}", {"persona": f"第 {n} 个"})
    refused = await client.put(
        "/v1/bots/one-more/settings", json={"persona": "x"}, headers=tenant.headers
    )
    assert refused.status_code == 422 and refused.json()["field"] == "settings.bots"
    # Changing one already configured is not one more.
    await put_bot(client, tenant, "npc-0", {"persona": "改了"})
    deleted = await client.delete("/v1/bots/npc-1/settings", headers=tenant.headers)
    assert deleted.status_code == 200 and not deleted.json()["configured"]
    await put_bot(client, tenant, "one-more", {"persona": "x"})


async def test_bots_configured_side_by_side_all_keep_their_settings(
    running: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = running
    writes = [
        client.put(
            f"/v1/bots/npc-{n}/settings", json={"persona": f"第 {n} 个"}, headers=tenant.headers
        )
        for n in range(MAX_BOTS)
    ]
    writes.append(
        client.put("/v1/persona", json={"text": "你是客栈掌柜。"}, headers=tenant.headers)
    )
    writes.append(client.patch("/v1/settings", json={"timezone": "UTC"}, headers=tenant.headers))
    assert [r.status_code for r in await asyncio.gather(*writes)] == [200] * (MAX_BOTS + 2)
    listed = (await client.get("/v1/bots", headers=tenant.headers)).json()
    assert [b["persona"] for b in listed] == [f"第 {n} 个" for n in range(MAX_BOTS)]
    own = (await client.get("/v1/settings", headers=tenant.headers)).json()
    assert own["timezone"] == "UTC" and own["overrides"]["persona"] == "你是客栈掌柜。"


async def test_another_tenant_neither_reads_nor_sets_a_tenants_bots(
    running: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = running
    other = await new_tenant(client, "other")
    await put_bot(client, tenant, "npc-1", {"persona": "你是铁匠。", "query": {"auto_top_k": 1}})
    assert (await client.get("/v1/bots", headers=other.headers)).json() == []
    seen = (await client.get("/v1/bots/npc-1/settings", headers=other.headers)).json()
    assert not seen["configured"] and seen["persona"] is None and seen["overrides"] == {}
    assert (await context(client, other, "npc-1"))["persona"] is None
    # The other tenant's bot of the same id is its own.
    await put_bot(client, other, "npc-1", {"persona": "你是渔夫。"})
    mine = (await client.get("/v1/bots/npc-1/settings", headers=tenant.headers)).json()
    assert mine["persona"] == "你是铁匠。" and mine["query"]["auto_top_k"] == 1
    assert (await context(client, tenant, "npc-1"))["persona"] == "你是铁匠。"
    assert (await context(client, other, "npc-1"))["persona"] == "你是渔夫。"
    await client.delete("/v1/bots/npc-1/settings", headers=other.headers)
    assert (await context(client, tenant, "npc-1"))["persona"] == "你是铁匠。"


async def test_a_change_is_in_force_on_the_next_request(
    running: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = running
    await client.put("/v1/persona", json={"text": "你是客栈掌柜。"}, headers=tenant.headers)
    assert (await context(client, tenant, "npc-1"))["persona"] == "你是客栈掌柜。"  # now cached
    await put_bot(client, tenant, "npc-1", {"persona": "你是铁匠。"})
    assert (await context(client, tenant, "npc-1"))["persona"] == "你是铁匠。"
    await put_bot(client, tenant, "npc-1", {"persona": ""})  # this bot speaks without one
    assert (await context(client, tenant, "npc-1"))["persona"] is None
    await client.delete("/v1/bots/npc-1/settings", headers=tenant.headers)
    assert (await context(client, tenant, "npc-1"))["persona"] == "你是客栈掌柜。"


async def test_the_tenant_export_carries_its_bots_settings(
    running: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = running
    await put_bot(client, tenant, "npc-1", {"persona": "你是铁匠。", "query": {"auto_top_k": 1}})
    whole = await client.get(f"/admin/tenants/{tenant.id}/export", headers=ADMIN)
    assert whole.status_code == 200, whole.text
    rows = [json.loads(line) for line in whole.text.splitlines() if line.strip()]
    (own,) = [r["row"] for r in rows if r["table"] == "tenants"]
    assert own["settings"]["bots"] == {
        "npc-1": {"persona": "你是铁匠。", "query": {"auto_top_k": 1}}
    }


async def test_an_mcp_server_started_for_a_bot_reads_with_its_settings(
    running: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = running
    await told_about_the_lake(client, tenant)
    await put_bot(client, tenant, "npc-1", {"query": {"tool_default_top_k": 2}})
    transport = httpx.ASGITransport(app=client.app)
    found = {}
    async with MemoriaClient("http://memoria.test", tenant.key, transport=transport) as memoria:
        for bot in ("npc-1", "npc-2"):
            conversation = Conversation(group_id="g1", sender_id="10001", bot_id=bot)
            result = await build_server(memoria, conversation).call_tool(
                "search_events", {"query": "西湖"}
            )
            assert isinstance(result, CallToolResult)
            [content] = result.content
            assert isinstance(content, TextContent)
            found[bot] = len(json.loads(content.text)["events"])
    assert found == {"npc-1": 2, "npc-2": len(LAKE)}
