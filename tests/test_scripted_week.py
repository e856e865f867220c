"""A week of a four-person group and one private chat, handed over as a bot does (messages
archived, one ``/v1/end`` a turn with what the bot noticed), on the offline default: then the
turns of the week after, each asked through ``/v1/context`` as the bot would.

What a bot builder notices is asserted: the fact a turn needs is among the first three items
the prompt shows, small talk gets nothing injected, no day digest takes a slot it did not
earn, and what was told in private never shows in the group.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.conftest import AppClient, TenantHandle, until_finished

ZONE = "Asia/Shanghai"
GROUP = "g-" + uuid.uuid4().hex[:6]
GROUP_NAME = "周末运动群"
BOT = {"bot_id": "b-42", "bot_name": "阿福"}
PEOPLE = {"u-hu": "胡静", "u-ma": "马超", "u-he": "何晓", "u-qi": "齐远"}
_ITEM = re.compile(r'<item id="((?:event|memory):[^"]+)">(.*?)</item>')


def _when(days_ago: int, hour: int) -> str:
    moment = datetime.now(UTC).astimezone().replace(microsecond=0) - timedelta(days=days_ago)
    return moment.replace(hour=hour, minute=0, second=0).isoformat()


def _group(user: str, at: str) -> dict[str, Any]:
    return {
        "request_type": "group",
        "group_id": GROUP,
        "group_name": GROUP_NAME,
        "user_id": user,
        "sender_id": user,
        "sender_name": PEOPLE[user],
        "timestamp": at,
        "timezone": ZONE,
        **BOT,
    }


def _private(user: str, at: str) -> dict[str, Any]:
    return {
        "request_type": "private",
        "user_id": user,
        "sender_id": user,
        "sender_name": PEOPLE[user],
        "timestamp": at,
        "timezone": ZONE,
        **BOT,
    }


# (days ago, hour, speaker, where, text, the bot's memo, what the bot noticed)
WEEK: list[tuple[int, int, str, str, str, str, list[str]]] = [
    (7, 9, "u-hu", "group", "早上好呀各位", "回了早安", []),
    (7, 9, "u-ma", "group", "早", "回了早安", []),
    (7, 20, "u-he", "group", "提醒一下，我对芒果过敏，一口都不能吃", "记下了", ["我对芒果过敏"]),
    (
        7,
        21,
        "u-qi",
        "group",
        "以后每周三晚上七点我们在体育中心打乒乓球",
        "说会准时提醒",
        ["每周三晚上七点在体育中心打乒乓球"],
    ),
    (6, 12, "u-ma", "group", "哈哈哈哈", "发了个笑脸", []),
    (
        6,
        13,
        "u-ma",
        "group",
        "我现在在美团做产品经理，最近忙疯了",
        "安慰了几句",
        ["我在美团做产品经理"],
    ),
    (
        5,
        22,
        "u-hu",
        "private",
        "千万不要告诉大家，我下个月要辞职去读研",
        "答应保密，祝她顺利",
        ["我下个月要辞职去读研"],
    ),
    (4, 10, "u-hu", "group", "在吗", "回了在的", []),
    (4, 10, "u-qi", "group", "在", "", []),
    (4, 11, "u-hu", "group", "今天天气真好", "附和了一句", []),
    (3, 19, "u-he", "group", "我家狗叫豆包，是只柯基", "夸了狗狗可爱", ["我家狗叫豆包，是只柯基"]),
    (2, 8, "u-ma", "group", "晚安", "回了晚安", []),
    (1, 18, "u-qi", "group", "好的收到", "", []),
]


async def _hand_over(client: AppClient, tenant: TenantHandle) -> None:
    for n, (days, hour, user, where, text, memo, noticed) in enumerate(WEEK):
        at = _when(days, hour)
        turn = _group(user, at) if where == "group" else _private(user, at)
        message = {k: v for k, v in turn.items() if k not in ("timestamp", *BOT)}
        stored = await client.post(
            "/v1/messages",
            json={"messages": [{**message, "message_id": f"m{n}", "text": text, "sent_at": at}]},
            headers=tenant.headers,
        )
        assert stored.status_code in (200, 201, 202), stored.text
        ended = await client.post(
            "/v1/end",
            json={
                **turn,
                "message_ids": [f"m{n}"],
                "request_id": f"turn-{n}",
                "memo": memo,
                "observations": noticed,
                "source_message": text,
            },
            headers=tenant.headers,
        )
        # A turn with nothing to note (no memo, nothing noticed) is accepted with no job.
        assert ended.status_code == (202 if memo or noticed else 200), ended.text
        if ended.status_code == 202:
            job = await until_finished(client, tenant, ended.json()["job_id"])
            assert job["status"] == "done", job


async def _context(
    client: AppClient, tenant: TenantHandle, turn: dict[str, Any], message: str
) -> tuple[dict[str, Any], list[str]]:
    response = await client.post(
        "/v1/context", json={**turn, "message": message}, headers=tenant.headers
    )
    assert response.status_code == 200, response.text
    body = response.json()
    # The items in the order the prompt shows them: what the bot's model reads first.
    shown = [text for _, text in _ITEM.findall(body["prompt"])]
    return body, shown


async def test_a_week_of_a_group_hands_each_turn_what_it_needs(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    await _hand_over(client, tenant)
    now = datetime.now(UTC).astimezone().isoformat()

    # Who needs what, asked by someone other than the person it is about.
    probes = [
        ("u-qi", "周五聚餐我来订，大家有什么过敏或者忌口的吗？", "芒果"),
        ("u-hu", "这周乒乓球几点打？在哪？", "乒乓球"),
        ("u-qi", "马超现在在哪家公司？", "美团"),
        ("u-ma", "何晓家的狗叫什么名字？", "豆包"),
    ]
    for user, message, needed in probes:
        body, shown = await _context(client, tenant, _group(user, now), message)
        assert any(needed in text for text in shown[:3]), (message, shown)
        # A day's digest is shown only when it says something about the turn.
        for item in body["memories"]:
            assert "条消息" not in item["text"], item

    # The recurrence stays one: a weekly game is not a single date.
    _, shown = await _context(client, tenant, _group("u-hu", now), "乒乓球是每周几？")
    game = next(text for text in shown if "乒乓球" in text)
    assert "每周三" in game, game

    # Small talk is answered with nothing from memory.
    for user, message in [("u-ma", "哈哈哈"), ("u-he", "早上好"), ("u-qi", "今天好冷啊")]:
        body, shown = await _context(client, tenant, _group(user, now), message)
        assert shown == [], (message, shown)

    # What 胡静 said in private never reaches the group, not even when asked for.
    for user in PEOPLE:
        body, _ = await _context(client, tenant, _group(user, now), "胡静是不是要辞职去读研？")
        assert "读研" not in body["prompt"] and "辞职" not in body["prompt"], body["prompt"]
    # Her own private chat still has it.
    body, shown = await _context(
        client, tenant, _private("u-hu", now), "我跟你说过我的打算吗？辞职"
    )
    assert "读研" in body["prompt"], body["prompt"]
