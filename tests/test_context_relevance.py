"""What a turn is handed: only what is relevant, best first, on one scale with the searches.

With the local model (its calibration is what the floor reads): a greeting in a group full of
stored facts gets no event and no memory; a question about a stored fact gets it among the
first items the prompt lists; a member's fact said in the group reaches every member's turn
there, and no other group or private chat.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.app import create_app
from service.settings import QuerySettings
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    serve_app,
    until_finished,
)

GROUP = {
    "request_type": "group",
    "group_id": "g1",
    "group_name": "周末小组",
    "sender_id": "10001",
    "sender_name": "张三",
}
LISI = {**GROUP, "sender_id": "10002", "sender_name": "李四"}
FLOOR = QuerySettings().context_min_relevance


@pytest.fixture
async def group(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    """A four-person group's week: news told as events, facts kept as memories."""
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        tenant = await new_tenant(client)
        told = [
            ("10001", "我下周三要去杭州出差，住在西湖边", "2026-02-16"),
            ("10003", "王五的新车是一辆白色的特斯拉", "2026-02-17"),
            ("10004", "赵六在准备五月份的马拉松比赛", "2026-02-18"),
            ("10001", "周六晚上我们在老地方吃火锅", "2026-02-19"),
        ]
        for n, (sender, text, day) in enumerate(told):
            response = await client.post(
                "/v1/end",
                json={
                    **GROUP,
                    "sender_id": sender,
                    "request_id": f"told-{n}",
                    "observations": [text],
                    "timestamp": f"{day}T10:00:00+08:00",
                },
                headers=tenant.headers,
            )
            assert response.status_code == 202, response.text
            await until_finished(client, tenant, response.json()["job_id"])
        for memory in (
            {
                "scope": "MEMBER_IN_GROUP",
                "group_id": "g1",
                "user_id": "10002",
                "content": "李四对花生过敏，吃了会起疹子",
            },
            {"scope": "GROUP", "group_id": "g1", "content": "小组每周六晚上聚餐"},
            {"scope": "GLOBAL", "user_id": "10001", "content": "张三养了一只橘猫，叫咪咪"},
            {
                "scope": "MEMBER_IN_GROUP",
                "group_id": "g2",
                "user_id": "10002",
                "content": "李四在另一个群说他喜欢钓鱼",
            },
            {"scope": "PRIVATE", "user_id": "10002", "content": "李四私下说他在找新工作"},
        ):
            response = await client.post("/v1/memories", json=memory, headers=tenant.headers)
            assert response.status_code in (200, 201), response.text
        yield client, tenant


async def context(
    client: AppClient, tenant: TenantHandle, turn: dict[str, Any], message: str
) -> Any:
    response = await client.post(
        "/v1/context", json={**turn, "message": message}, headers=tenant.headers
    )
    assert response.status_code == 200, response.text
    return response.json()


def shown(prompt: str) -> list[str]:
    """The ids of the events and memories, in the order the prompt lists them."""
    return re.findall(r'<item id="((?:event|memory):[^"]+)"', prompt)


@pytest.mark.parametrize("message", ["早上好", "哈哈哈哈", "谢谢！", "在吗？"])
async def test_small_talk_is_handed_no_event_and_no_memory(
    group: tuple[AppClient, TenantHandle], message: str
) -> None:
    client, tenant = group
    body = await context(client, tenant, GROUP, message)
    assert body["events"] == [] and body["memories"] == [], (body["events"], body["memories"])
    assert shown(body["prompt"]) == []
    assert body["member_profile"] is None or body["member_profile"]["kind"] == "member_profile"


async def test_greeting_a_member_by_name_is_small_talk_asking_about_them_is_not(
    group: tuple[AppClient, TenantHandle],
) -> None:
    """王五 has spoken in the group: "王五早！" greets him, and is handed nothing of what is
    stored about him (his car came at the top before); a question to him by name still
    gets it."""
    client, tenant = group
    response = await client.post(
        "/v1/messages",
        json={
            "request_type": "group",
            "group_id": "g1",
            "messages": [
                {"message_id": "w1", "sender_id": "10003", "sender_name": "王五", "text": "早"},
                {"message_id": "w2", "sender_id": "10004", "sender_name": "赵六", "text": "早啊"},
            ],
        },
        headers=tenant.headers,
    )
    assert response.status_code in (200, 201, 202), response.text
    for greeting in ("王五早！", "赵六，早上好", "早啊王五"):
        body = await context(client, tenant, GROUP, greeting)
        assert shown(body["prompt"]) == [], (greeting, body["events"], body["memories"])
    body = await context(client, tenant, GROUP, "王五，你那辆车是什么颜色的？")
    texts = {i["id"]: i["text"] for i in body["events"] + body["memories"]}
    assert any("特斯拉" in texts[i] for i in shown(body["prompt"])[:3]), body["prompt"]


@pytest.mark.parametrize(
    "message", ["年会的地点是什么？", "周年庆安排在哪里？", "马拉松是什么时候？"]
)
async def test_a_short_question_sharing_only_words_of_asking_is_handed_nothing_unrelated(
    group: tuple[AppClient, TenantHandle], message: str
) -> None:
    """A short question names its topic; what shares only the words every question has
    ("什么", "哪", "what") with it is unrelated. 张三 once wondered what gift to buy: a
    question about a party's venue is not about that, and a question about the marathon
    still gets the marathon."""
    client, tenant = group
    response = await client.post(
        "/v1/end",
        json={
            **GROUP,
            "request_id": "asked",
            "observations": ["我不知道该给朋友送什么生日礼物"],
            "timestamp": "2026-02-20T10:00:00+08:00",
        },
        headers=tenant.headers,
    )
    assert response.status_code == 202, response.text
    await until_finished(client, tenant, response.json()["job_id"])
    body = await context(client, tenant, GROUP, message)
    texts = [i["text"] for i in body["events"] + body["memories"]]
    assert not any("礼物" in t for t in texts), texts
    if "马拉松" in message:
        assert any("马拉松" in t for t in texts), texts


async def test_a_question_about_a_stored_fact_gets_it_first(
    group: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = group
    body = await context(client, tenant, GROUP, "王五的车是什么颜色的？")
    texts = {i["id"]: i["text"] for i in body["events"] + body["memories"]}
    first = shown(body["prompt"])[:3]
    assert any("特斯拉" in texts[i] for i in first), body["prompt"]
    # Best first, whatever the kind, and nothing under the floor.
    scores = {i["id"]: i["score"] for i in body["events"] + body["memories"]}
    assert [scores[i] for i in shown(body["prompt"])] == sorted(scores.values(), reverse=True)
    assert all(i["score"] >= FLOOR for i in body["memories"])
    assert len(body["events"]) <= 3 and len(body["memories"]) <= 3


async def test_a_members_fact_said_in_the_group_reaches_the_others_there_only(
    group: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = group
    question = "李四能吃花生吗？"
    body = await context(client, tenant, GROUP, question)
    first = [i for i in shown(body["prompt"])[:3] if i.startswith("memory:")]
    found = {m["id"]: m["text"] for m in body["memories"]}
    assert any("花生过敏" in found[i] for i in first), body["prompt"]
    # And by the bot's memory search in that group, over REST and as a tool.
    search = await client.post(
        "/v1/memories/search",
        json={
            "query": "花生过敏",
            "group_id": "g1",
            "user_id": "10001",
            "scopes": ["GROUP", "MEMBER_IN_GROUP", "GLOBAL"],
        },
        headers=tenant.headers,
    )
    assert search.status_code == 200, search.text
    assert "花生过敏" in search.json()[0]["content"]
    tool = await client.post(
        "/v1/tools/call",
        json={
            "name": "cognitive_search_memories",
            "arguments": {"query": "花生过敏"},
            "context": GROUP,
        },
        headers=tenant.headers,
    )
    assert tool.status_code == 200, tool.text
    assert "花生过敏" in tool.json()["result"][0]["content"]
    # Never another group, nor anyone's private chat (李四's own included).
    elsewhere = [
        {**GROUP, "group_id": "g2", "group_name": "钓鱼群"},
        {"request_type": "private", "user_id": "10001", "sender_id": "10001"},
        {"request_type": "private", "user_id": "10002", "sender_id": "10002"},
    ]
    for turn in elsewhere:
        other = await context(client, tenant, turn, question)
        assert "花生" not in other["prompt"], (turn, other["prompt"])
        tool = await client.post(
            "/v1/tools/call",
            json={
                "name": "cognitive_search_memories",
                "arguments": {"query": "花生过敏"},
                "context": turn,
            },
            headers=tenant.headers,
        )
        assert "花生" not in tool.text, (turn, tool.text)
    # What a member keeps private, or says in another group, stays there.
    mine = await context(client, tenant, GROUP, "李四在找新工作吗？喜欢钓鱼吗？")
    assert "新工作" not in mine["prompt"] and "钓鱼" not in mine["prompt"]


async def test_memories_profiles_and_events_score_on_one_scale(
    group: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = group
    member = lambda uid, name, body: (  # noqa: E731
        f'---\nentity_type: member\nentity_id: "{uid}"\ngroup_id: "g1"\nname: {name}\n'
        f'tags: []\nupdated_at: "2026-02-22T10:30:00+08:00"\n---\n{body}\n'
    )
    profiles = {
        "10001": (
            "张三",
            "程序员，喜欢爬山和摄影\n周末常去西湖边散步\n家里养了一只橘猫，叫咪咪\n爱吃火锅",
        ),
        "10003": (
            "王五",
            "程序员，喜欢爬山和摄影\n周末常去西湖边散步\n最近买了一辆白色特斯拉\n爱吃火锅",
        ),
    }
    for uid, (name, body) in profiles.items():
        put = await client.put(
            f"/v1/profiles/member/g1/{uid}",
            json={"document": member(uid, name, body)},
            headers=tenant.headers,
        )
        assert put.status_code == 200, put.text
    hits = (
        await client.post(
            "/v1/profiles/search",
            json={"query": "谁养猫", "entity_type": "member", "context": GROUP},
            headers=tenant.headers,
        )
    ).json()
    assert hits[0]["entity_id"] == "10001", hits
    # An unrelated memory scores under the floor on the memory search's scale, as an
    # unrelated event does on the event search's.
    memories = (
        await client.post(
            "/v1/memories/search",
            json={"query": "王五的车是什么颜色", "group_id": "g1", "user_id": "10001"},
            headers=tenant.headers,
        )
    ).json()
    by_text = {m["content"]: m["score"] for m in memories}
    assert by_text["小组每周六晚上聚餐"] < FLOOR
    events = (
        await client.post(
            "/v1/events/search",
            json={"query": "王五的车是什么颜色", "context": GROUP},
            headers=tenant.headers,
        )
    ).json()["events"]
    event_scores = {e["text"]: e["similarity"] for e in events}
    tesla = next(s for t, s in event_scores.items() if "特斯拉" in t)
    assert tesla >= FLOOR
    assert all(s < FLOOR for t, s in event_scores.items() if "马拉松" in t)
    # A floor of the bot's own keeps only what passes it.
    floored = (
        await client.post(
            "/v1/memories/search",
            json={
                "query": "花生过敏",
                "group_id": "g1",
                "user_id": "10001",
                "min_relevance": FLOOR,
            },
            headers=tenant.headers,
        )
    ).json()
    assert floored and all(m["score"] >= FLOOR for m in floored)
    assert all("聚餐" not in m["content"] for m in floored)


@pytest.mark.parametrize("value", [-0.1, 1.5, "high"])
async def test_a_bad_min_relevance_is_refused_naming_it(
    group: tuple[AppClient, TenantHandle], value: Any
) -> None:
    client, tenant = group
    for path, body in (
        ("/v1/memories/search", {"query": "花生", "group_id": "g1", "min_relevance": value}),
        ("/v1/profiles/search", {"query": "猫", "min_relevance": value}),
    ):
        response = await client.post(path, json=body, headers=tenant.headers)
        assert response.status_code in (400, 422), response.text
        assert "min_relevance" in response.text
    tool = await client.post(
        "/v1/tools/call",
        json={
            "name": "cognitive_search_memories",
            "arguments": {"query": "花生", "min_relevance": value},
            "context": GROUP,
        },
        headers=tenant.headers,
    )
    assert tool.status_code in (400, 422) and "min_relevance" in tool.text, tool.text
