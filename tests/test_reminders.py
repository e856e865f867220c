"""Reminder requests without an LLM: a request naming a time becomes a todo (through the same
``add_todo`` tool as the model's calls), at its absolute time on the conversation's clocks;
a mention of a reminder, a question, a repeat or a request naming no time makes none."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.app import create_app
from service.historian import reminders
from service.historian.conversation import Conversation
from service.historian.memories import MemoryKeeper
from service.settings import Settings
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    serve_app,
    until_finished,
    wait_for,
)
from tests.dev_chats import BENCH, jsonl_texts

SHANGHAI = ZoneInfo("Asia/Shanghai")
# Tuesday 2026-11-24, 20:00 in Shanghai.
TUESDAY = datetime(2026, 11, 24, 20, 0, tzinfo=SHANGHAI)


def due(text: str, moment: datetime = TUESDAY) -> tuple[str, str | None, str | None] | None:
    """(task, whom, trigger) of the reminder a text asks for."""
    found = reminders.request(text)
    if found is None:
        return None
    when = reminders.trigger(found, moment, 9)
    return found.task, found.whom, when.isoformat() if when else None


@pytest.mark.parametrize(
    ("said", "task", "whom", "when"),
    [
        ("提醒我周二下午三点交周报", "交周报", None, "2026-12-01T15:00:00+08:00"),
        ("提醒我周四下午三点交周报", "交周报", None, "2026-11-26T15:00:00+08:00"),
        ("记得提醒我明天给妈妈打电话", "给妈妈打电话", None, "2026-11-25T09:00:00+08:00"),
        ("别忘了提醒我明天上午十点开会", "开会", None, "2026-11-25T10:00:00+08:00"),
        ("明早七点叫我起床", "起床", None, "2026-11-25T07:00:00+08:00"),
        ("到时候叫我，明天八点半出发", "出发", None, "2026-11-25T08:30:00+08:00"),
        ("帮我记一下明天下午要去取快递", "去取快递", None, "2026-11-25T15:00:00+08:00"),
        ("小助手，后天晚上8点提醒我看球赛", "看球赛", None, "2026-11-26T20:00:00+08:00"),
        ("@小助手 下周一提醒我续费会员", "续费会员", None, "2026-11-30T09:00:00+08:00"),
        ("明天提醒大家提交周报", "提交周报", "大家", "2026-11-25T09:00:00+08:00"),
        ("帮我提醒一下大家周五交材料", "交材料", "大家", "2026-11-27T09:00:00+08:00"),
        ("提醒我半小时后关火", "关火", None, "2026-11-24T20:30:00+08:00"),
        ("提醒我15号交房租", "交房租", None, "2026-12-15T09:00:00+08:00"),
        ("提醒我12月8日去体检", "去体检", None, "2026-12-08T09:00:00+08:00"),
        ("那就明天提醒我吧", None, None, None),
        ("remind me to call mom tomorrow at 5pm", "call mom", None, "2026-11-25T17:00:00+08:00"),
        ("Remind me on Friday to submit the report", "submit the report", None, None),
        ("Tomorrow morning, remind me to water the plants", "water the plants", None, None),
        ("don't let me forget to buy milk at 9pm", "buy milk", None, "2026-11-24T21:00:00+08:00"),
        ("please remind me in 2 hours to check the oven", "check the oven", None, None),
        ("remind everyone to bring snacks on Saturday", "bring snacks", "everyone", None),
        ("remind me about the dentist on December 3rd", "the dentist", None, None),
    ],
)
def test_a_request_with_a_time_is_read(
    said: str, task: str | None, whom: str | None, when: str | None
) -> None:
    found = due(said)
    if task is None:  # a request whose words are all time and particles: nothing to do
        assert found is None, found
        return
    assert found is not None, said
    assert found[0] == task and found[1] == whom, (said, found)
    assert found[2] is not None, said
    if when is not None:
        assert found[2] == when, (said, found)


def test_english_days_and_clocks_resolve_against_the_moment() -> None:
    assert due("Remind me on Friday to submit the report") == (
        "submit the report",
        None,
        "2026-11-27T09:00:00+08:00",
    )
    assert due("please remind me in 2 hours to check the oven") == (
        "check the oven",
        None,
        "2026-11-24T22:00:00+08:00",
    )
    # A clock time already past today is tomorrow's; a weekday said on that day, next week's.
    assert due("remind me at 3pm to stretch") == ("stretch", None, "2026-11-25T15:00:00+08:00")
    assert due("remind me on tuesday at 3pm to pay rent") == (
        "pay rent",
        None,
        "2026-12-01T15:00:00+08:00",
    )


@pytest.mark.parametrize(
    "said",
    [
        "他说要提醒我们明天带伞",
        "谢谢你提醒我明天开会",
        "不用提醒我了",
        "你提醒过我明天开会",
        "能提醒我明天开会吗？",
        "明天提醒我开会好吗",
        "她明天会提醒大家交周报",
        "叫我小王",
        "明天叫我小王",
        "帮我记一下我的生日是5月3日",
        "每天晚上提醒我吃药",
        "每周五提醒我交周报",
        "提醒我交周报",  # no time: a request, but no todo from the rules
        "remind me what you said about badminton",
        "Remind me again Emilia what are you majoring in?",
        "These photos remind me to slow down tomorrow",
        "You remind me of my sister",
        "That reminds me, I have a meeting tomorrow",
        "Can you remind me to call mom tomorrow?",
        "remind me every day to stretch",
        "remind me to stretch",
        "I told him to remind me tomorrow",
    ],
)
def test_no_todo_time_from_what_is_no_timed_request(said: str) -> None:
    found = due(said)
    assert found is None or found[2] is None, (said, found)


def _mentions() -> list[str]:
    texts: list[str] = []
    texts += jsonl_texts()
    for name in (
        "madial-zh/MADial-Bench-zh-dialogue.json",
        "madial-zh/MADial-Bench-zh-memory.json",
    ):
        path = BENCH / name
        if path.exists():
            texts += re.findall(r'"([^"\\]*)"', path.read_text(encoding="utf-8"))
    said = re.compile(r"提醒|记得|别忘|叫我|记一下|remind|forget", re.I)
    return [t for t in texts if said.search(t)]


def test_no_mention_of_a_reminder_in_the_dev_chats_is_read_as_a_request() -> None:
    # "These moments remind me to appreciate…", "我得提醒自己别忘了带相机": people talking.
    mentions = _mentions()
    if not mentions:
        pytest.skip("the dev chats are not on this machine")
    assert len(mentions) > 50
    read = [(t[:100], due(t)) for t in mentions if due(t) and due(t)[2]]  # type: ignore[index]
    assert read == []


CN_DAYS = st.sampled_from(["明天", "后天", "下周一", "下周三", "周五", "下个星期天"])
CN_CLOCKS = st.sampled_from(["", "下午三点", "上午十点", "晚上八点半", "早上7点", "14:30"])
CN_ASKS = st.sampled_from(["提醒我", "记得提醒我", "别忘了提醒我", "请提醒我", "麻烦提醒我"])
TASKS = st.sampled_from(["交周报", "给妈妈打电话", "去医院复查", "买牛奶", "续费服务器"])


@settings(max_examples=300, deadline=None)
@given(CN_ASKS, CN_DAYS, CN_CLOCKS, TASKS, st.booleans())
def test_any_chinese_request_with_a_day_is_a_todo_of_its_task_after_the_moment(
    ask: str, day: str, clock: str, task: str, time_first: bool
) -> None:
    said = f"{day}{clock}{ask}{task}" if time_first else f"{ask}{day}{clock}{task}"
    found = due(said)
    assert found is not None and found[0] == task, (said, found)
    assert found[2] is not None and datetime.fromisoformat(found[2]) > TUESDAY, (said, found)
    # The same words told of someone else, or asked, are no request.
    assert due(f"他说{said}") is None
    assert due(f"{said}吗？") is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_any_text_gives_a_reminder_or_none_never_an_error(text: str) -> None:
    found = reminders.request(text)
    if found is not None:
        reminders.trigger(found, TUESDAY, 9)


# ---------------------------------------------------------------- the memory step


def keeper() -> MemoryKeeper:
    return MemoryKeeper(None, None, Settings())  # type: ignore[arg-type]


def group() -> Conversation:
    return Conversation(
        key="g:g1",
        request_type="group",
        group_id="g1",
        group_name="周报群",
        speaker_id="10001",
        speaker_name="张三",
        participants={"10001": "张三"},
        moment=TUESDAY,
    )


def test_the_offline_plan_is_the_add_todo_call_the_tool_checks() -> None:
    items = [
        ("提醒张三(10001) 2026-12-01 下午三点交周报", "提醒我周二下午三点交周报"),
        ("李四说要提醒大家 2026-11-25 带伞", "李四说要提醒大家明天带伞"),
        ("提醒张三(10001)交周报", "提醒我交周报"),
    ]
    plan = keeper()._offline(group(), items)
    [todo, memory] = plan.operations
    assert todo.tool == "add_todo" and todo.args == {
        "description": "交周报",
        "trigger_time": "2026-12-01T15:00:00+08:00",
        "assignee_id": "10001",
        "item": 0,
    }
    assert memory.tool == "add_memory" and memory.args["item"] == 1
    assert any("naming no time" in note for note in plan.notes), plan.notes


def test_a_task_left_relative_is_no_todo() -> None:
    # The description must be absolute, as the tool demands of the model.
    plan = keeper()._offline(
        group(), [("提醒张三(10001) 2026-11-25 给她打电话", "提醒我明天给她打电话")]
    )
    assert plan.operations == [] and plan.notes


# ---------------------------------------------------------------- end to end

CONTEXT = {
    "request_type": "group",
    "group_id": "g1",
    "group_name": "周报群",
    "sender_id": "10001",
    "sender_name": "张三",
    "bot_id": "20002",
    "bot_name": "小助手",
    "timestamp": "2026-11-24T20:00:00+08:00",
    "timezone": "Asia/Shanghai",
}


@pytest.fixture
async def offline(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings_ = make_settings(
        db_url, cognitive={"queue": FAST_QUEUE, "extraction": {"check_interval_seconds": 0.2}}
    )
    async with serve_app(create_app(settings_, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client)


async def todos_of(client: AppClient, tenant: TenantHandle, group_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/todos?group_id={group_id}", headers=tenant.headers)
    return list(response.json())


async def test_a_reminder_handed_over_becomes_a_timed_todo_of_the_conversation(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    said = ["提醒我周二下午三点交周报", "他说要提醒我们明天带伞", "每周五晚上打羽毛球"]
    response = await client.post(
        "/v1/end",
        json={**CONTEXT, "observations": said, "memo": "张三说每周五晚上打羽毛球"},
        headers=tenant.headers,
    )
    job = await until_finished(client, tenant, response.json()["job_id"])
    assert job["status"] == "done", job
    # The mention says "他" (unresolved): its event is stored, and neither todo nor memory made.
    assert job["result"]["memory"] == {"todos_added": 1, "added": 1}, job["result"]
    [todo] = await todos_of(client, tenant, "g1")
    assert todo["description"] == "交周报"
    assert datetime.fromisoformat(todo["trigger_time"]) == datetime(
        2026, 12, 1, 15, tzinfo=SHANGHAI
    )
    assert todo["group_id"] == "g1" and todo["status"] == "PENDING"
    # Made of the request's own event: an erasure of who said it takes the todo too.
    assert todo["evidence"]["event_ids"] == [response.json()["event_ids"][0]]
    assert todo["creator_id"] == "10001" and todo["assignee_id"] == "10001"
    events = [
        (await client.get(f"/v1/events/{e}", headers=tenant.headers)).json()["text"]
        for e in response.json()["event_ids"]
    ]
    assert "每周五晚上打羽毛球" in events[2] and "每周五晚上打羽毛球" in events[3], events
    memories = (await client.get("/v1/memories?group_id=g1", headers=tenant.headers)).json()
    assert any("每周五晚上打羽毛球" in m["content"] for m in memories), memories
    # Another group of the tenant does not see it.
    assert await todos_of(client, tenant, "g2") == []


async def test_a_reminder_in_the_message_stream_becomes_a_todo_at_the_time_it_was_said(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    messages = [
        {
            "message_id": "m1",
            "sender_id": "10001",
            "sender_name": "张三",
            "text": "提醒我周二下午三点交周报",
            "sent_at": "2026-11-24T20:00:00+08:00",
        },
        {
            "message_id": "m2",
            "sender_id": "10002",
            "sender_name": "李四",
            "text": "remind me what you said about badminton",
            "sent_at": "2026-11-24T20:01:00+08:00",
        },
        {
            "message_id": "m3",
            "sender_id": "10002",
            "sender_name": "李四",
            "text": "记住：每周五晚上打羽毛球",
            "sent_at": "2026-11-24T20:02:00+08:00",
        },
    ]
    response = await client.post(
        "/v1/messages",
        json={"request_type": "group", "group_id": "g7", "messages": messages},
        headers=tenant.headers,
    )
    [job_id] = response.json()["extraction_job_ids"]
    job = await until_finished(client, tenant, job_id)
    assert job["status"] == "done", job
    [todo] = await wait_for(lambda: todos_of(client, tenant, "g7"))
    assert todo["description"] == "交周报" and todo["assignee_id"] == "10001"
    assert datetime.fromisoformat(todo["trigger_time"]) == datetime(
        2026, 12, 1, 15, tzinfo=SHANGHAI
    )
    memories = (await client.get("/v1/memories?group_id=g7", headers=tenant.headers)).json()
    assert [m["content"] for m in memories if "羽毛球" in m["content"]] == ["每周五晚上打羽毛球"]


@pytest.mark.parametrize(
    "unit", ["提醒我", "明天", "1", "十", " ", "@a", "remind me ", "tomorrow ", "那就", "12:00 "]
)
def test_reading_a_hostile_message_is_quick(unit: str) -> None:
    # The stream reads every message (up to 100 KB) for a request: a run of the ask's own
    # pieces must not make its patterns backtrack.
    text = (unit * (100_000 // len(unit) + 1))[:100_000]
    start = time.thread_time()
    reminders.request(text)
    reminders.request(f"提醒我{text}")
    assert time.thread_time() - start < 1.0
