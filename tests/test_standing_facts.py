"""Standing facts read by their structure: the slot a sentence states, what is not a fact of
the speaker, and a newer fact replacing the older one in the profile and the memories."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from service.app import create_app
from service.historian.absolutize import Person, Situation
from service.historian.gate import gate
from service.historian.standing import slot_of, standing, standing_facts
from service.historian.statements import draft
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    serve_app,
    until_finished,
)
from tests.dev_chats import BENCH

MOMENT = datetime(2026, 2, 21, 23, 30, tzinfo=ZoneInfo("Asia/Shanghai"))  # a Saturday


@pytest.mark.parametrize(
    ("text", "slot"),
    [
        ("现在在阿里巴巴做前端开发", "work"),
        ("我现在在阿里巴巴做前端开发", "work"),
        ("嗯，现在在阿里巴巴做前端开发", "work"),
        ("我在字节跳动上班", "work"),
        ("我是一名程序员", "work"),
        ("我是字节的后端工程师", "work"),
        ("写代码是我的工作", "work"),
        ("我上个月跳槽到腾讯了", "work"),
        ("我住在杭州", "home"),
        ("我下个月搬到深圳", "home"),
        ("我家在成都", "home"),
        ("我在北京大学读研", "school"),
        ("我在浙大读大三", "school"),
        ("我家猫叫咪咪", "pet"),
        ("我养了一只猫", "pet"),
        ("我的狗名字叫旺财", "pet"),
        ("下周三是我生日", "birthday"),
        ("我下周三生日", "birthday"),
        ("我的生日是3月5日", "birthday"),
        ("我是1995年3月5日出生的", "birthday"),
        ("我和小王结婚了", "relationship"),
        ("我老婆叫小美", "relationship"),
        ("I work at Google", "work"),
        ("Oh I work in a bubble tea shop while I'm studying", "work"),
        ("I currently work as the social media manager of a marketing firm", "work"),
        ("I'm a nurse at the city hospital", "work"),
        ("My job is teaching math", "work"),
        ("I live in San Francisco, I've only been to Orlando once", "home"),
        ("I'm moving to Shenzhen next month", "home"),
        ("I just moved to Berlin", "home"),
        ("I actually study at UCLA", "school"),
        ("I'm currently a sophomore at Stanford", "school"),
        ("I'm majoring in Computer Science", "school"),
        ("My cat Mochi is so cute", "pet"),
        ("My cat, Fluffy, is keeping me company", "pet"),
        ("My dog's name is Max", "pet"),
        ("I have a cat", "pet"),
        ("I also have a parrot", "pet"),
        ("My birthday is on May 3rd", "birthday"),
        ("tomorrow is my birthday", "birthday"),
        ("I'm married to Tom", "relationship"),
        ("My girlfriend is Lily", "relationship"),
    ],
)
def test_a_sentence_states_its_slot(text: str, slot: str) -> None:
    [fact] = standing_facts(text)
    assert fact.slot == slot


@pytest.mark.parametrize(
    "text",
    [
        # Questions.
        "你在哪工作？",
        "你住在哪里",
        "我是不是应该搬到深圳",
        "Do you work at Google?",
        "Where do you live?",
        # Negations.
        "我不在阿里工作了",
        "我没养猫",
        "I don't live in Paris",
        "I never worked at Google",
        "I'm not married",
        # Wishes and hypotheses.
        "如果我在阿里工作就好了",
        "要是我住在海边多好",
        "我想搬到大理",
        "If I lived in Paris I'd be happy",
        "I wish I worked at Pixar",
        "I hope to move to Tokyo",
        # Jokes and hearsay.
        "我在月球上班哈哈",
        "I work at NASA lol",
        "听说我要搬到火星",
        # About someone else.
        "我朋友在阿里工作",
        "我男朋友在腾讯工作",
        "我妈住在老家",
        "李四在阿里工作",
        "My friend works at Google",
        "My sister lives in Boston",
        "她养了一只猫",
        # Chat that only sounds like one.
        "我在家做饭",
        "我在写代码",
        "I had a relaxing day spending time with my dog",
        "I already invited her over for my birthday today",
        "我生日那天得到很多花",
    ],
)
def test_what_is_not_a_fact_of_the_speaker(text: str) -> None:
    assert standing_facts(text) == [], text


def test_a_relative_birthday_is_stored_as_a_date() -> None:
    speaker = Person("张三", "10001")
    situation = Situation(MOMENT, speaker, Person(None, None), None)
    [fact] = standing_facts("下周三是我生日")
    text = draft(fact.clause, situation)
    assert "2026-02-25" in text and "张三(10001)" in text and not gate(text), text
    [fact] = standing_facts("tomorrow is my birthday")
    text = draft(fact.clause, Situation(MOMENT, Person("Alice", "10001"), Person(None, None)))
    assert text == "Alice (10001)'s birthday is on 2026-02-22", text


@pytest.mark.parametrize(
    ("statement", "slot"),
    [
        ("张三(10001)在阿里巴巴工作", "work"),
        ("张三(10001)在阿里巴巴做前端开发", "work"),
        ("张三(10001)的猫改名叫年糕", "pet"),
        ("张三(10001)的生日是 2026-12-09", "birthday"),
        ("张三(10001)住在上海", "home"),
        ("Alice (10001) works at Google", "work"),
        ("Alice (10001)'s cat Mochi is cute", "pet"),
        ("Alice (10001) is moving to Shenzhen", "home"),
        ("Alice (10001) is married to Tom", "relationship"),
        ("张三(10001) 2026-02-22 去北京", None),
        ("Alice (10001) went to the hospital", None),
    ],
)
def test_a_stored_statement_has_the_slot_of_its_predicate(statement: str, slot: str) -> None:
    assert slot_of(statement) == slot


def _bench_sentences() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for name in (
        "locomo_dev.jsonl",
        "realtalk_dev.jsonl",
        "memdaily-zh/memdaily_events_pools.jsonl",
    ):
        path = BENCH / name
        if not path.exists():
            continue
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                record = json.loads(line)
                if record.get("kind") == "turn":
                    found.append((str(record.get("speaker") or "someone"), record["text"]))
    dialogue = BENCH / "madial-zh/MADial-Bench-zh-dialogue.json"
    if dialogue.exists():
        for line in dialogue.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            for said in json.loads(line).get("dialogue", []):
                m = re.match(r'<(\w+)>:"?(.*?)"?\s*$', said)
                if m and m.group(1) != "Assistant":
                    found.append((m.group(1), m.group(2)))
    return found


def test_every_standing_fact_of_the_dev_chats_names_the_speaker_and_agrees() -> None:
    sentences = _bench_sentences()
    if not sentences:
        pytest.skip("the dev chats are not on this machine")
    bot = Person("Assistant", "20002")
    facts = 0
    for speaker_name, text in sentences:
        speaker = Person(speaker_name, "10001")
        for fact in standing_facts(text):
            facts += 1
            assert "?" not in fact.clause and "？" not in fact.clause, text
            assert standing(fact.clause) is not None, (text, fact)
            out = draft(fact.clause, Situation(MOMENT, speaker, bot, None))
            assert out.startswith(speaker.label()), (text, out)
            assert "Assistant" not in out and "20002" not in out, (text, out)
            assert not re.search(r"\bI\b|\bI'm\b|\b[Mm]y\b|我", out), (text, out)
            # The verb after the name agrees: never "Elise work", "Elise am", "Elise have".
            after = out[len(speaker.label()) :]
            assert not re.match(
                r"\s+(?:\w+ly\s+|just\s+|also\s+|still\s+|actually\s+)*"
                r"(?:am|are|have|do|go|work|live|study|major)\b",
                after,
            ), (text, out)
    assert facts >= 10  # the extractor reads real chat, not only the tests' own sentences


# ---------------------------------------------------------------- end to end, offline

CONTEXT = {
    "request_type": "group",
    "group_id": "100200",
    "group_name": "Python 群",
    "user_id": "10001",
    "sender_id": "10001",
    "sender_name": "张三",
    "bot_id": "20002",
    "bot_name": "小助手",
    "timezone": "Asia/Shanghai",
    "message_ids": ["m-1"],
}


@pytest.fixture
async def offline(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client)


async def hand_over(
    client: AppClient, tenant: TenantHandle, request_id: str, when: str, *said: str, **more: Any
) -> None:
    body = {**CONTEXT, **more, "request_id": request_id, "timestamp": when}
    response = await client.post(
        "/v1/end", json={**body, "observations": list(said)}, headers=tenant.headers
    )
    assert response.status_code == 202, response.text
    job = await until_finished(client, tenant, response.json()["job_id"])
    assert job["status"] == "done", job


async def member_profile(client: AppClient, tenant: TenantHandle, person: str = "10001") -> str:
    response = await client.get(f"/v1/profiles/member/100200/{person}", headers=tenant.headers)
    return str(response.json()["body"]) if response.status_code == 200 else ""


async def memories(client: AppClient, tenant: TenantHandle, query: str) -> list[dict[str, Any]]:
    found = await client.post(
        "/v1/memories/search",
        json={"query": query, "group_id": "100200", "user_id": "10001", "top_k": 50},
        headers=tenant.headers,
    )
    assert found.status_code == 200, found.text
    return list(found.json())


async def test_a_newer_standing_fact_replaces_the_older_in_profile_and_memories(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    await hand_over(client, tenant, "w1", "2026-02-01T10:00:00+08:00", "我在字节跳动上班")
    await hand_over(
        client, tenant, "w2", "2026-02-21T10:00:00+08:00", "小助手，现在在阿里巴巴做前端开发"
    )
    body = await member_profile(client, tenant)
    work = [line for line in body.splitlines() if line.startswith("- 工作：")]
    assert len(work) == 1 and "阿里巴巴" in work[0], body
    assert "字节跳动" not in body and "小助手" not in body, body
    found = await memories(client, tenant, "工作 上班 阿里巴巴 字节跳动")
    texts = [m["content"] for m in found]
    assert any(t.startswith("张三(10001)") and "阿里巴巴" in t for t in texts), texts
    assert not any("字节跳动" in t for t in texts), texts  # replaced, its history kept
    [memory] = [m for m in found if "阿里巴巴" in m["content"]]
    history = await client.get(f"/v1/memories/{memory['id']}/history", headers=tenant.headers)
    assert history.status_code == 200 and "字节跳动" in history.text, history.text


async def test_a_relative_birthday_and_an_english_move_land_in_the_profile(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    await hand_over(client, tenant, "b1", "2026-02-21T23:30:00+08:00", "@小助手 下周三是我生日")
    body = await member_profile(client, tenant)
    assert "- 生日：张三(10001)的生日是 2026-02-25" in body, body
    english = {"sender_id": "10002", "user_id": "10002", "sender_name": "Alice"}
    await hand_over(client, tenant, "e1", "2026-02-21T10:00:00+08:00", "I live in Paris", **english)
    await hand_over(
        client, tenant, "e2", "2026-02-22T10:00:00+08:00", "I'm moving to Shenzhen", **english
    )
    body = await member_profile(client, tenant, "10002")
    assert "- 居住地：Alice (10002) is moving to Shenzhen" in body, body
    assert "Paris" not in body, body


async def test_a_members_group_rule_goes_to_the_group_not_his_profile(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    await hand_over(client, tenant, "r1", "2026-02-21T10:00:00+08:00", "本群禁止发广告")
    group = await client.get("/v1/profiles/group/100200", headers=tenant.headers)
    assert group.status_code == 200 and "禁止发广告" in group.json()["body"]
    assert "禁止发广告" not in await member_profile(client, tenant)
    found = await memories(client, tenant, "禁止发广告")
    assert [m["scope"] for m in found if "广告" in m["content"]] == ["GROUP"]


async def test_the_stream_keeps_standing_facts_offline_without_being_asked(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    said = [
        ("10001", "张三", "今天好热啊"),
        ("10002", "李四", "你在哪工作？"),
        ("10001", "张三", "现在在阿里巴巴做前端开发"),
        ("10003", "王五", "我朋友在腾讯工作"),
        ("10001", "张三", "记住：我对花生过敏"),
    ]
    response = await client.post(
        "/v1/messages",
        json={
            "request_type": "group",
            "group_id": "100200",
            "messages": [
                {
                    "message_id": str(n),
                    "sender_id": who,
                    "sender_name": name,
                    "text": text,
                    "sent_at": f"2026-03-01T10:0{n}:00+08:00",
                }
                for n, (who, name, text) in enumerate(said)
            ],
        },
        headers=tenant.headers,
    )
    assert response.status_code == 202, response.text
    for job_id in response.json()["extraction_job_ids"]:
        await until_finished(client, tenant, job_id)
    body = await member_profile(client, tenant)
    assert "- 工作：张三(10001)在阿里巴巴做前端开发" in body, body
    assert "对花生过敏" in body and "好热" not in body, body
    assert await member_profile(client, tenant, "10002") == ""
    assert "腾讯" not in await member_profile(client, tenant, "10003")
