"""A group's day digest says what the day was about and who said it, in the chat's language,
or is not written: no count of messages, no filler, no sensitive message's words."""

from __future__ import annotations

import json
import random
import re
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import date
from typing import Any

import pytest

from service.app import create_app
from service.memories.digest import Said, day_summary
from service.retrieval.terms import topic_words
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    llm_settings,
    make_settings,
    new_tenant,
    serve_app,
)
from tests.dev_chats import BENCH
from tests.fake_llm import FakeLLM, Reply, quiet
from tests.test_erasure_digests import DAY, digests, made_up_words, post

REALTALK = BENCH / "realtalk_dev.jsonl"
D = date(2026, 11, 24)

CHIT_CHAT = [
    "早",
    "早啊",
    "哈哈",
    "哈哈哈",
    "在吗",
    "在",
    "ok",
    "lol",
    "good night",
    "晚安",
    "谢谢",
]


@pytest.fixture
async def running(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")


def _badminton() -> list[Said]:
    return [
        Said("张三", "周末去打羽毛球吗？"),
        Said("李四", "好啊，我来订羽毛球场地"),
        Said("张三", "场地订好了说一声"),
        Said("王五", "哈哈"),
        Said("李四", "周末下午两点可以吗"),
    ]


def test_a_day_of_chit_chat_has_no_digest() -> None:
    said = [Said(f"p{n % 4}", t) for n, t in enumerate(CHIT_CHAT * 3)]
    assert day_summary(D, said, "Python 群") is None


def test_a_discussion_is_digested_with_its_words_and_people_and_no_count() -> None:
    summary = day_summary(D, _badminton(), "Python 群")
    assert summary is not None
    assert summary.startswith("2026-11-24 群「Python 群」：")
    for word in ("羽毛球", "场地", "周末", "张三", "李四"):
        assert word in summary, summary
    # Who only laughed talked of nothing; no count of messages.
    assert "王五" not in summary and "条消息" not in summary
    assert not re.search(r"\d+ 条", summary)


def test_an_english_group_gets_an_english_digest() -> None:
    said = [
        Said("Alice", "Anyone up for badminton on Saturday?"),
        Said("Bob", "Sure, I will book a badminton court"),
        Said("Alice", "lol good night"),
        Said("Alice", "Did you book the court?"),
        Said("Bob", "good night"),
    ]
    summary = day_summary(D, said, "Sports")
    assert summary is not None
    assert summary.startswith("2026-11-24 in the group “Sports”: "), summary
    assert "badminton" in summary and "court" in summary
    assert "Alice" in summary and "Bob" in summary
    assert not re.search(r"[\u4e00-\u9fff]", summary)
    assert "night" not in summary and "lol" not in summary


def test_a_sensitive_messages_words_are_left_out() -> None:
    said = [
        *_badminton(),
        Said("赵六", "我确诊了糖尿病，最近在打胰岛素"),
        Said("赵六", "糖尿病要控制饮食，胰岛素每天打"),
        Said("钱七", "我的电话是 13800138000，打羽毛球叫我"),
    ]
    summary = day_summary(D, said, "Python 群")
    assert summary is not None and "羽毛球" in summary
    for word in ("糖尿", "胰岛素", "饮食", "赵六", "钱七", "13800138000"):
        assert word not in summary, summary


def test_a_day_with_only_sensitive_talk_has_no_digest() -> None:
    said = [
        Said("赵六", "我确诊了糖尿病，最近在打胰岛素"),
        Said("钱七", "糖尿病要控制饮食，胰岛素每天打"),
    ]
    assert day_summary(D, said, "Python 群") is None


def _realtalk_days() -> dict[tuple[str, str], list[Said]]:
    days: dict[tuple[str, str], list[Said]] = defaultdict(list)
    for line in REALTALK.read_text().splitlines():
        row = json.loads(line)
        if row.get("kind") == "turn":
            key = (row["conv_id"], row["session_time"][:10])
            days[key].append(Said(row["speaker"], row["text"]))
    return days


@pytest.mark.skipif(not REALTALK.exists(), reason="the dev chats are not on this machine")
def test_real_days_are_digested_of_words_two_messages_share_and_their_speakers() -> None:
    days = _realtalk_days()
    for (_, day), said in sorted(days.items()):
        summary = day_summary(date.fromisoformat(day), said, "G")
        if summary is None:
            continue
        assert len(summary) <= 400, summary
        assert "message" not in summary
        body = summary.split(": ", 1)[1]
        speakers = {s.name for s in said if s.name}
        for part in body.split("; "):
            who, words = re.split(r" (?:talked about|asked about|mentioned) ", part, maxsplit=1)
            named = set(re.split(r", | and ", who.removesuffix(" and others")))
            assert named <= speakers, part
            for word in re.split(r"[ ,]+", words):
                keys = {w.key for w in topic_words(word)}
                assert keys, (word, part)
                holding = [s for s in said if keys & {w.key for w in topic_words(s.text)}]
                assert len(holding) >= 2, (word, part)


async def test_a_chit_chat_day_writes_no_digest_and_a_discussion_day_does(
    running: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = running
    group = f"g{uuid.uuid4().hex[:10]}"
    people = [str(random.randrange(10**8, 10**9)) for _ in range(3)]
    lines = [(people[n % 3], t, f"{DAY}T09:{n:02d}:00") for n, t in enumerate(CHIT_CHAT)]
    await post(client, tenant, group, [*lines, (people[0], "记住：明天见", f"{DAY}T10:00:00")])
    assert await digests(client, tenant, group) == {}

    court, racket = made_up_words(2)
    await post(
        client,
        tenant,
        group,
        [
            (people[0], f"周六去打{court}吗", f"{DAY}T11:00:00"),
            (people[1], f"好，我订{court}，带上{racket}", f"{DAY}T11:05:00"),
            (people[0], f"{racket}我有", f"{DAY}T11:10:00"),
            (people[2], "记住：周六上午十点", f"{DAY}T11:15:00"),
        ],
    )
    [summary] = (await digests(client, tenant, group)).values()
    assert court in summary and racket in summary, summary
    assert f"n{people[0]}" in summary and f"n{people[1]}" in summary, summary
    assert "条消息" not in summary


async def test_a_digest_left_with_nothing_to_say_is_removed(db_url: str, llm: FakeLLM) -> None:
    """The model wrote the day's digest of a batch; the day's later batch, worded offline,
    finds no topic: the day keeps no digest of what its messages do not say."""
    settings = make_settings(
        db_url, cognitive={"queue": {**FAST_QUEUE, "job_max_retries": 0}}, **llm_settings(llm)
    )
    written = f"{DAY} 群里聊了西湖划船"
    calls = {"summary": 0}

    def memory_step(request: dict[str, Any]) -> Reply:
        if request["tools"][0]["function"]["name"] == "add_memory":
            if request["messages"][-1]["role"] == "user" and calls["summary"] == 0:
                calls["summary"] += 1
                return Reply(tool_calls=[("write_summary", {"day": DAY, "content": written})])
            return Reply(content="done")
        return quiet(request)

    llm.default = memory_step
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        tenant = await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")
        group = f"g{uuid.uuid4().hex[:10]}"
        a, b = (str(random.randrange(10**8, 10**9)) for _ in range(2))
        await post(
            client,
            tenant,
            group,
            [
                (a, "周末我们去西湖划船吧", f"{DAY}T09:00:00"),
                (b, "记住：下周三开会", f"{DAY}T09:01:00"),
            ],
        )
        assert await digests(client, tenant, group) == {DAY: written}
        await post(
            client,
            tenant,
            group,
            [(a, "哈哈", f"{DAY}T10:00:00"), (b, "记住：晚安", f"{DAY}T10:01:00")],
        )
        # The day's words are now said once each: nothing two messages share.
        assert await digests(client, tenant, group) == {}
