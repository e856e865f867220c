"""Remember at volume: months of one busy person's chat, handed over call by call.

2,000 ``end`` calls (rules only) from one person in one group, with a few others around:
no job may fail, every statement is stored as an event, every profile stays far below the
cap, what the embedder is given does not grow with the history, and the last calls are
processed as fast as the first.
"""

from __future__ import annotations

import os
import random
import statistics
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.app import create_app
from service.profiles.consolidate import BODY_BUDGET, DIGEST_CHARS, Body
from service.profiles.document import MAX_DOCUMENT_CHARS
from tests.conftest import (
    FAST_QUEUE,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    wait_for,
)
from tests.fake_llm import FakeLLM

CALLS = int(os.environ.get("MEMORIA_VOLUME_CALLS", "2000"))
START = datetime(2026, 1, 1, 8, tzinfo=UTC)
PLACES = ["公司", "健身房", "西湖边", "图书馆", "火锅店", "机场", "医院", "咖啡馆", "球场", "老家"]
DOINGS = ["加班写代码", "跑了五公里", "看了一场电影", "和朋友吃饭", "学吉他", "拍照", "读书"]
CITIES = ["上海", "杭州", "深圳", "成都", "南京"]
OTHERS = {"10002": "李四", "10003": "王五", "10004": "赵六"}


def statement(rng: random.Random, n: int) -> str:
    """A first-person chat line of call ``n``: mostly events, now and then a standing fact."""
    if n % 97 == 0:
        return f"我搬到{CITIES[(n // 97) % len(CITIES)]}了"
    if n % 89 == 0:
        return "他说那里很好"  # no one to resolve "他" to: stays relative, not remembered
    day = rng.choice(["今天", "昨天", "刚才", ""])
    return f"我{day}在{rng.choice(PLACES)}{rng.choice(DOINGS)}，第{n}次记一笔"


async def finished_jobs(db_url: str) -> list[dict[str, Any]]:
    async with raw_connection(db_url) as connection:
        rows = await connection.fetch(
            "SELECT id, status, last_error, started_at, finished_at, payload->'context' AS ctx"
            " FROM jobs WHERE kind = 'historian.end' ORDER BY id"
        )
    return [dict(r) for r in rows]


@pytest.mark.slow
async def test_two_thousand_end_calls_are_all_remembered_at_an_even_pace(
    db_url: str, llm: FakeLLM
) -> None:
    settings = make_settings(
        db_url,
        cognitive={"queue": {**FAST_QUEUE, "concurrency": 4, "claim_batch": 8}},
        # Hash vectors from the scripted server: this test is about the historian's own
        # work; the local model's cost is measured by bench/historian_throughput.py.
        models={
            "embedding": {
                "provider": "openai",
                "api_url": llm.base_url,
                "model_name": "hash-384",
                "dimensions": 384,
            }
        },
    )
    rng = random.Random(14)
    expected_events = 0
    relative: set[str] = set()
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        tenant = await new_tenant(client)
        for n in range(CALLS):
            sender, name = ("10001", "张三")
            if n % 10 == 9:
                sender = rng.choice(sorted(OTHERS))
                name = OTHERS[sender]
            text = statement(rng, n)
            if "他" in text:
                relative.add(text)
            body: dict[str, Any] = {
                "request_type": "group",
                "group_id": "g1",
                "group_name": "杭州跑团",
                "sender_id": sender,
                "sender_name": name,
                "bot_id": "20002",
                "bot_name": "小助手",
                "request_id": f"call-{n}",
                "timestamp": (START + timedelta(hours=2 * n)).isoformat(),
                "observations": [text],
            }
            if n % 5 == 0:
                body["memo"] = f"我提醒了你第{n}次记一笔"
            response = await client.post("/v1/end", json=body, headers=tenant.headers)
            assert response.status_code == 202, response.text
            expected_events += 2 if n % 5 == 0 else 1

        async def drained() -> list[dict[str, Any]] | None:
            jobs = await finished_jobs(db_url)
            return jobs if all(j["status"] in ("done", "failed") for j in jobs) else None

        jobs = await wait_for(drained, timeout=900, interval=1.0)

    assert len(jobs) == CALLS
    failed = [(j["id"], j["last_error"]) for j in jobs if j["status"] != "done"]
    assert failed == []

    async with raw_connection(db_url) as connection:
        events = await connection.fetchval("SELECT count(*) FROM events")
        profiles = await connection.fetch("SELECT profile_key, document, body FROM profiles")
        memories = await connection.fetch("SELECT content FROM memories")
    assert events == expected_events

    sizes = {p["profile_key"]: len(p["document"]) for p in profiles}
    largest = max(sizes.values())
    print(f"\nlargest profile after {CALLS} calls: {largest} characters ({sizes})")
    assert largest < MAX_DOCUMENT_CHARS / 2
    member = next(p for p in profiles if p["profile_key"] == "member:g1:10001")
    assert len(member["body"]) <= BODY_BUDGET
    parsed = Body.read(member["body"])
    last_move = max(n for n in range(CALLS) if n % 97 == 0 and n % 10 != 9)
    assert f"搬到{CITIES[(last_move // 97) % len(CITIES)]}" in parsed.kinds["居住地"]
    assert parsed.folds, "months of records fold into summaries"
    newest = max(n for n in range(CALLS) if n % 10 != 9 and n % 97 and n % 89)
    assert f"第{newest}次记一笔" in member["body"]
    # What failed the gate stays an event: no profile or memory repeats it.
    assert relative
    assert not any("那里很好" in p["body"] for p in profiles)
    assert not any("那里很好" in m["content"] for m in memories)

    # The embedder is never handed the growing history, only short texts.
    inputs = [
        t
        for request in llm.embedding_requests
        for t in ([request["input"]] if isinstance(request["input"], str) else request["input"])
    ]
    assert max(len(t) for t in inputs) <= DIGEST_CHARS

    # The last 200 jobs take no longer than the first 200. Jobs claimed together (one
    # batch: the same started_at) share their batch's time.
    batch_sizes = Counter(j["started_at"] for j in jobs if j["started_at"])
    durations = [
        (j["finished_at"] - j["started_at"]).total_seconds() / batch_sizes[j["started_at"]]
        for j in jobs
        if j["started_at"]
    ]
    first, last = statistics.median(durations[:200]), statistics.median(durations[-200:])
    print(f"median job: first 200 {first * 1000:.1f} ms, last 200 {last * 1000:.1f} ms")
    assert last <= 1.5 * first + 0.01
