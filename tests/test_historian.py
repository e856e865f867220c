"""The historian end to end: end call → job → rules/LLM/gate → embedded, absolute events."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime
from types import SimpleNamespace
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from service.app import create_app
from service.historian import extraction
from service.text import STATEMENT_MAX_CHARS
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    llm_settings,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    until_finished,
)
from tests.fake_llm import FakeLLM, Reply, tool

CONTEXT = {
    "request_type": "group",
    "group_id": "100200",
    "group_name": "Python 群",
    "user_id": "10001",
    "sender_id": "10001",
    "sender_name": "张三",
    "bot_id": "20002",
    "bot_name": "小助手",
    "timestamp": "2026-02-21T23:30:00+08:00",
    "timezone": "Asia/Shanghai",
    "location_abs": "上海",
    "message_ids": ["m-1"],
}


def rewrites(*texts: str) -> Reply:
    return tool(
        "submit_rewrite", {"rewrites": [{"index": i, "text": t} for i, t in enumerate(texts)]}
    )


async def started(settings: Any) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    app = create_app(settings, migrate=False, run_worker=True)
    async with serve_app(app) as client:
        yield client, await new_tenant(client)


@pytest.fixture
async def offline(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async for pair in started(settings):
        yield pair


@pytest.fixture
async def online(db_url: str, llm: FakeLLM) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(
        db_url,
        cognitive={"queue": {**FAST_QUEUE, "job_max_retries": 1}},
        **llm_settings(llm),
    )
    # Once the script runs out (the rewrite is done), the profile step hears "no change".
    llm.default = lambda request: Reply(content="nothing to change")
    async for pair in started(settings):
        yield pair


async def hand_over(client: AppClient, tenant: TenantHandle, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/end", json={**CONTEXT, **body}, headers=tenant.headers)
    assert response.status_code == 202, response.text
    accepted = response.json()
    job = await until_finished(client, tenant, accepted["job_id"])
    return {**accepted, "job": job}


async def event(client: AppClient, tenant: TenantHandle, event_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/events/{event_id}", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_offline_rules_make_absolute_events(offline: tuple[AppClient, TenantHandle]) -> None:
    client, tenant = offline
    done = await hand_over(
        client, tenant, request_id="r1", memo="我帮你查了天气", observations=["我明天去北京"]
    )
    assert done["job"]["status"] == "done"
    assert done["job"]["result"]["llm_calls"] == 0
    observation = await event(client, tenant, "g:100200:r1:1.1")
    assert observation["text"] == "张三(10001) 2026-02-22 去北京"
    assert observation["is_absolute"] is True
    assert observation["source_text"] == "我明天去北京"
    memo = await event(client, tenant, "g:100200:r1:1.memo")
    assert memo["text"].startswith("小助手(20002)帮张三(10001)查了天气")
    assert memo["perspective"] == "bot"
    meta = observation["metadata"]
    assert meta["timestamp_local"] == "2026-02-21T23:30:00+08:00"
    assert meta["timestamp_utc"] == "2026-02-21T15:30:00+00:00"
    assert meta["timestamp_epoch"] == 1771687800
    assert meta["location_abs"] == "上海"
    assert meta["group_id"] == "100200" and meta["sender_id"] == "10001"
    assert meta["message_ids"] == ["m-1"]
    assert meta["schema_version"] == "final_v1"
    assert meta["is_absolute"] is True
    # Listed newest first within the conversation, and nowhere else.
    listed = (await client.get("/v1/events?group_id=100200", headers=tenant.headers)).json()
    assert {e["id"] for e in listed["events"]} == {"g:100200:r1:1.1", "g:100200:r1:1.memo"}
    other = (await client.get("/v1/events?group_id=999", headers=tenant.headers)).json()
    assert other["events"] == []


async def test_offline_unresolvable_words_are_stored_not_dropped(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    await hand_over(client, tenant, request_id="r2", observations=["他说那边的店关门了"])
    stored = await event(client, tenant, "g:100200:r2:1.1")
    assert stored["is_absolute"] is False
    assert any("他" in w for w in stored["warnings"])
    assert stored["text"] == "他说那边的店关门了"


async def profile_and_memories(client: AppClient, tenant: TenantHandle) -> tuple[str, list[str]]:
    profile = await client.get("/v1/profiles/member/100200/10001", headers=tenant.headers)
    body = profile.json()["body"] if profile.status_code == 200 else ""
    found = await client.post(
        "/v1/memories/search",
        json={"query": "店 关门 北京", "group_id": "100200", "user_id": "10001", "top_k": 50},
        headers=tenant.headers,
    )
    assert found.status_code == 200, found.text
    return body, [m["content"] for m in found.json()]


async def test_only_what_passed_the_gate_reaches_profiles_and_memories(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    done = await hand_over(
        client, tenant, request_id="g1", observations=["他说那边的店关门了", "我下周三去北京"]
    )
    assert done["job"]["result"]["degraded"] == 1
    body, memories = await profile_and_memories(client, tenant)
    assert "北京" in body and any("北京" in m for m in memories)
    assert "关门" not in body and not any("关门" in m for m in memories)
    # Asked to store it anyway (force), the same statement is kept.
    await hand_over(
        client, tenant, request_id="g2", observations=["他说那边的店关门了"], force=True
    )
    stored = await event(client, tenant, "g:100200:g2:1.1")
    assert stored["is_absolute"] is False and "forced past the gate" in stored["warnings"]
    body, memories = await profile_and_memories(client, tenant)
    assert "关门" in body


async def test_the_event_is_embedded(offline: tuple[AppClient, TenantHandle], db_url: str) -> None:
    client, tenant = offline
    await hand_over(client, tenant, request_id="r3", observations=["张三喜欢 Rust"])
    async with raw_connection(db_url) as conn:
        dims = await conn.fetchval(
            "SELECT vector_dims(embedding) FROM events WHERE id = 'g:100200:r3:1.1'"
        )
    assert dims == 384


async def test_llm_rewrite_passing_the_gate_takes_one_call(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    llm.script(
        rewrites(
            "张三(10001)计划 2026-02-22 去北京出差", "小助手(20002)为张三(10001)查询了北京天气"
        )
    )
    done = await hand_over(
        client,
        tenant,
        request_id="l1",
        memo="帮他查了天气",
        observations=["我明天去北京出差"],
        source_message="<message><content>我明天去北京出差</content></message>",
        recent_messages=[{"sender_name": "李四", "sender_id": "10003", "text": "北京冷吗"}],
    )
    assert done["job"]["result"]["llm_calls"] == 1
    stored = await event(client, tenant, "g:100200:l1:1.1")
    assert stored["text"] == "张三(10001)计划 2026-02-22 去北京出差"
    assert stored["is_absolute"] is True
    prompt = llm.chat_requests[0]["messages"][1]["content"]
    assert "2026-02-21 23:30" in prompt and "Asia/Shanghai" in prompt
    assert "张三(10001)" in prompt and "小助手(20002)" in prompt
    assert "我明天去北京出差" in prompt  # the source message, its <content> only
    assert "<message>" not in prompt
    assert "李四(10003): 北京冷吗" in prompt
    assert llm.chat_requests[0]["tool_choice"]["function"]["name"] == "submit_rewrite"


async def test_gate_hit_is_fed_back_and_fixed(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    llm.script(rewrites("他 2026-02-22 去北京"), rewrites("张三(10001) 2026-02-22 去北京"))
    done = await hand_over(client, tenant, request_id="l2", observations=["我明天去北京"])
    assert done["job"]["result"]["llm_calls"] == 2
    feedback = llm.chat_requests[1]["messages"][-1]["content"]
    assert "他" in feedback and "代词" in feedback
    stored = await event(client, tenant, "g:100200:l2:1.1")
    assert stored["text"] == "张三(10001) 2026-02-22 去北京"
    assert stored["is_absolute"] is True


async def test_gate_failing_every_retry_degrades(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    llm.script(*(rewrites("他明天去北京") for _ in range(3)))
    done = await hand_over(client, tenant, request_id="l3", observations=["我明天去北京"])
    assert done["job"]["status"] == "done"
    assert done["job"]["result"]["llm_calls"] == 3  # the first try and rewrite_max_retry = 2
    stored = await event(client, tenant, "g:100200:l3:1.1")
    assert stored["is_absolute"] is False
    assert stored["warnings"]


async def test_force_stores_at_once(online: tuple[AppClient, TenantHandle], llm: FakeLLM) -> None:
    client, tenant = online
    llm.script(rewrites("他 2026-02-22 去北京"))
    done = await hand_over(
        client, tenant, request_id="l4", observations=["他明天去北京"], force=True
    )
    assert done["job"]["result"]["llm_calls"] == 1
    stored = await event(client, tenant, "g:100200:l4:1.1")
    assert stored["text"] == "他 2026-02-22 去北京"
    assert stored["is_absolute"] is False
    assert "forced past the gate" in stored["warnings"]


async def test_id_drift_is_never_accepted_even_with_force(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    llm.script(*(rewrites("某用户 2026-02-22 去北京") for _ in range(3)))
    await hand_over(
        client, tenant, request_id="l5", observations=["QQ 12345678 的用户明天去北京"], force=True
    )
    rewrite_calls = [
        r for r in llm.chat_requests if r["tools"][0]["function"]["name"] == "submit_rewrite"
    ]
    assert len(rewrite_calls) == 3
    assert "12345678" in rewrite_calls[1]["messages"][-1]["content"]
    stored = await event(client, tenant, "g:100200:l5:1.1")
    assert "12345678" in stored["text"]  # the rules' draft, which kept the id
    assert "2026-02-22" in stored["text"]


async def test_llm_outage_retries_the_job_then_stores_the_rules_draft(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    llm.script(Reply(status=500), Reply(status=503, headers={"Retry-After": "0"}))
    done = await hand_over(client, tenant, request_id="l6", observations=["我明天去北京"])
    job = done["job"]
    assert job["status"] == "done" and job["attempts"] == 2  # job_max_retries = 1
    stored = await event(client, tenant, "g:100200:l6:1.1")
    assert stored["text"] == "张三(10001) 2026-02-22 去北京"
    assert stored["is_absolute"] is False
    assert any("llm unavailable" in w for w in stored["warnings"])


async def test_malformed_tool_arguments_retry_the_job(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    llm.script(
        tool("submit_rewrite", '{"rewrites": [{"index": 0, "text": "unterminated'),
        rewrites("张三(10001) 2026-02-22 去北京"),
    )
    done = await hand_over(client, tenant, request_id="l7", observations=["我明天去北京"])
    assert done["job"]["attempts"] == 2
    assert (await event(client, tenant, "g:100200:l7:1.1"))["is_absolute"] is True


async def test_a_rerun_job_rewrites_the_same_rows(
    offline: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = offline
    done = await hand_over(client, tenant, request_id="r9", observations=["a", "b"])
    async with raw_connection(db_url) as conn:
        await conn.execute("UPDATE jobs SET status = 'queued' WHERE id = $1", done["job_id"])
        await until_finished(client, tenant, done["job_id"])
        count = await conn.fetchval("SELECT count(*) FROM events WHERE request_id = 'r9'")
    assert count == 2


async def test_tool_arguments_of_the_wrong_types_are_retried_then_degraded(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    llm.script(
        tool("submit_rewrite", {"rewrites": "all fine, trust me"}),
        tool("submit_rewrite", {"rewrites": [{"index": "zero", "text": 42}]}),
        tool("submit_rewrite", {"rewrites": [{"index": 0, "text": None}]}),
        tool("submit_rewrite", {"rewrites": [{"index": 0}]}),
    )
    done = await hand_over(client, tenant, request_id="l8", observations=["我明天去北京"])
    assert done["job"]["status"] == "done"
    stored = await event(client, tenant, "g:100200:l8:1.1")
    # Never dropped: the rules' absolute draft, marked as not confirmed by the model.
    assert stored["text"] == "张三(10001) 2026-02-22 去北京"


async def test_a_rewrite_holding_a_nul_character_is_stored_without_it(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    # PostgreSQL's text holds no NUL character, and a model may write one (JSON's \u0000,
    # which a chat user can ask for): it is dropped from the rewrite.
    client, tenant = online
    llm.script(rewrites("张三(10001) 2026-02-22\x00 去北京\x00"))
    done = await hand_over(client, tenant, request_id="l9", observations=["我明天去北京"])
    assert done["job"]["status"] == "done", done["job"]
    assert done["job"]["attempts"] == 1 and done["job"]["result"]["llm_calls"] == 1
    stored = await event(client, tenant, "g:100200:l9:1.1")
    assert stored["text"] == "张三(10001) 2026-02-22 去北京" and stored["is_absolute"] is True


@pytest.mark.parametrize("llm", [False, True])
def test_a_message_at_the_calendars_first_day_is_read_on_any_clocks(llm: bool) -> None:
    # 0001-01-02T00:00 on UTC+14 is 0001-01-01T10:00Z, refused by no check; on the clocks of
    # a tenant 12 hours behind UTC it lies before the calendar's first day. Read there, the
    # extraction of its conversation raised at every try and read no message after it.
    said = datetime(1, 1, 2, tzinfo=ZoneInfo("Etc/GMT-14"))
    message = SimpleNamespace(
        sent_at=said, sender_id="10001", sender_name="张三", text="记住: 我住在上海", seq=1,
        message_id="m1", group_name=None,
    )  # fmt: skip
    zone = ZoneInfo("Etc/GMT+12")
    targets = extraction.extraction_targets("g:1", [message], zone, llm=llm)
    _, items, days = extraction.extraction_material(
        "g:1", [message], zone, datetime(2026, 1, 1, tzinfo=UTC), llm=llm
    )
    assert targets and items and days == {date(1, 1, 1)}


async def test_a_rewrite_longer_than_a_statement_falls_back_to_the_rules(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    """A model's rewrite of 2,000,000 characters is not stored: that item gets the rules'
    draft, at once (the model is not asked again), and says why; the other rewrite of the
    same call is kept as the model wrote it."""
    client, tenant = online
    huge = "张三(10001) 2026-02-22 去北京，" + "很远" * 1_000_000
    llm.script(rewrites(huge, "张三(10001) 计划 2026-02-22 去北京玩"))
    done = await hand_over(
        client,
        tenant,
        request_id=f"long-{uuid.uuid4().hex}",
        observations=["我明天去北京", "我明天去北京玩"],
    )
    job = done["job"]
    assert job["status"] == "done", str(job)[:2000]
    assert job["result"]["llm_calls"] == 1
    assert len(json.dumps(job)) < 20_000
    fallback = await event(client, tenant, done["event_ids"][0])
    assert fallback["text"] == "张三(10001) 2026-02-22 去北京"
    assert any(f"over {STATEMENT_MAX_CHARS} characters" in w for w in fallback["warnings"])
    kept = await event(client, tenant, done["event_ids"][1])
    assert kept["text"] == "张三(10001) 计划 2026-02-22 去北京玩" and kept["is_absolute"] is True
    context = await client.post(
        "/v1/context", json={**CONTEXT, "message": "北京"}, headers=tenant.headers
    )
    assert context.status_code == 200, context.text
    assert "很远很远" not in context.text


async def test_a_provider_error_of_megabytes_is_kept_bounded(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    """A provider that refuses with a 2,000,000-character message: the job falls back to
    the rules' draft, and the warning it keeps on the event quotes the message bounded."""
    client, tenant = online
    message = f"bad request {uuid.uuid4().hex} " + "x" * 2_000_000
    error = json.dumps({"error": {"message": message, "type": "invalid_request_error"}})
    llm.script(*(Reply(status=400, raw_body=error.encode()) for _ in range(2)))
    done = await hand_over(
        client, tenant, request_id=f"err-{uuid.uuid4().hex}", observations=["我明天去北京"]
    )
    assert done["job"]["status"] == "done", str(done["job"])[:2000]
    stored = await event(client, tenant, done["event_ids"][0])
    assert stored["text"] == "张三(10001) 2026-02-22 去北京"
    [warning] = [w for w in stored["warnings"] if "llm unavailable" in w]
    assert message[:40] in warning
    assert len(warning) <= STATEMENT_MAX_CHARS + len("llm unavailable: ")
