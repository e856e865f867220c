"""The raw message archive: batches, duplicates, triggers, background embedding, search."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text

from service.app import create_app
from service.db.engine import Database
from service.messages import repository as messages_repository
from service.messages.schemas import MessageBatch
from service.messages.service import ingest
from service.retrieval import floods
from service.settings import Settings
from service.tenants.service import create_tenant, tenant_context
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    plain_dsn,
    raw_connection,
    serve_app,
    until_finished,
    wait_for,
)

GROUP = {"request_type": "group", "group_id": "g1", "group_name": "旅行群"}


@pytest.fixture
async def running(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(
        db_url,
        cognitive={
            "queue": FAST_QUEUE,
            "extraction": {
                "every_n_messages": 5,
                "pause_minutes": 0.01,
                "check_interval_seconds": 0.2,
            },
        },
    )
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client)


def chat(n: int, start: int = 0, **extra: Any) -> list[dict[str, Any]]:
    lines = [
        "周末大家想去哪里玩？",
        "我想去杭州西湖划船",
        "上次去黄山爬山累坏了",
        "听说苏州园林很漂亮",
        "我最近在学做红烧肉",
        "有人推荐好看的科幻电影吗",
        "星际穿越很好看",
        "下周要交季度报告，好忙",
    ]
    return [
        {
            "message_id": f"m{i}",
            "sender_id": f"u{i % 3}",
            "sender_name": ["阿明", "小红", "老王"][i % 3],
            "text": lines[i % len(lines)],
            "sent_at": f"2026-03-01T10:{i:02d}:00+08:00",
            **extra,
        }
        for i in range(start, start + n)
    ]


async def all_embedded(db_url: str) -> bool:
    async with raw_connection(db_url) as conn:
        return bool(
            await conn.fetchval("SELECT count(*) = 0 FROM messages WHERE embedding IS NULL")
        )


async def test_batches_are_stored_and_duplicates_ignored(
    running: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = running
    first = await client.post(
        "/v1/messages", json={**GROUP, "messages": chat(3)}, headers=tenant.headers
    )
    assert first.status_code == 202, first.text
    assert first.json()["stored"] == 3 and first.json()["duplicates"] == 0
    again = await client.post(
        "/v1/messages", json={**GROUP, "messages": chat(4)}, headers=tenant.headers
    )
    assert again.json()["stored"] == 1 and again.json()["duplicates"] == 3
    # The same message id in another conversation is another message.
    other = await client.post(
        "/v1/messages",
        json={"request_type": "private", "user_id": "u0", "messages": chat(1)},
        headers=tenant.headers,
    )
    assert other.json()["stored"] == 1
    async with raw_connection(db_url) as conn:
        rows = await conn.fetch(
            "SELECT conversation_key, count(*) FROM messages GROUP BY 1 ORDER BY 1"
        )
    assert [(r[0], r[1]) for r in rows] == [("g:g1", 4), ("p:u0", 1)]


async def test_bad_messages_are_refused_naming_the_field(
    running: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = running
    cases = [
        ({"messages": chat(1)}, "request_type"),  # no context anywhere
        ({"request_type": "group", "messages": chat(1)}, "group_id"),
        ({**GROUP, "messages": [{"text": "no id"}]}, "message_id"),
        ({**GROUP, "messages": []}, "messages"),
        ({**GROUP, "messages": [{**chat(1)[0], "sent_at": "soon"}]}, "sent_at"),
        ({**GROUP, "messages": [{**chat(1)[0], "text": "a\x00b"}]}, "messages.0.text"),
    ]
    for body, field in cases:
        response = await client.post("/v1/messages", json=body, headers=tenant.headers)
        assert response.status_code == 422, (body, response.text)
        assert field in response.text, (field, response.text)
    too_many = await client.post(
        "/v1/messages", json={**GROUP, "messages": chat(501)}, headers=tenant.headers
    )
    assert too_many.status_code == 422
    async with raw_connection(db_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM messages") == 0


async def test_a_time_off_the_calendar_on_the_tenants_clocks_is_refused(
    running: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = running
    # In range as given, but the historian reads it on the tenant's clocks (Shanghai): the
    # 31st of December 9999, and a day before 1 January 1. Stored, they failed the extraction
    # of their day, and with it every later extraction of the group.
    for edge in ("9999-12-30T00:00:00-16:00", "0001-01-02T00:00:00+14:00"):
        batch = [*chat(1), {**chat(1, start=1)[0], "sent_at": edge}]
        response = await client.post(
            "/v1/messages", json={**GROUP, "messages": batch}, headers=tenant.headers
        )
        assert response.status_code == 422, response.text
        assert response.json()["field"] == "messages.1.sent_at", response.text
    message = {**chat(1, start=2)[0], "text": "记住：我对花生过敏"}
    response = await client.post(
        "/v1/messages", json={**GROUP, "messages": [message]}, headers=tenant.headers
    )
    [job_id] = response.json()["extraction_job_ids"]
    job = await until_finished(client, tenant, job_id)
    assert job["status"] == "done" and job["result"]["messages"] == 1, job


async def test_every_n_messages_triggers_extraction(
    running: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = running
    below = await client.post(
        "/v1/messages", json={**GROUP, "messages": chat(4)}, headers=tenant.headers
    )
    assert below.json()["extraction_job_ids"] == []
    reach = await client.post(
        "/v1/messages", json={**GROUP, "messages": chat(2, start=4)}, headers=tenant.headers
    )
    [job_id] = reach.json()["extraction_job_ids"]
    job = await until_finished(client, tenant, job_id)
    assert job["status"] == "done"
    assert job["result"]["messages"] == 6 and job["result"]["reason"] == "count"
    async with raw_connection(db_url) as conn:
        row = await conn.fetchrow(
            "SELECT extracted_seq, last_seq, pending_count FROM conversations"
        )
    assert row["extracted_seq"] == row["last_seq"] and row["pending_count"] == 0


async def test_remember_triggers_at_once(running: tuple[AppClient, TenantHandle]) -> None:
    client, tenant = running
    message = {**chat(1)[0], "text": "记住：我对花生过敏"}
    response = await client.post(
        "/v1/messages", json={**GROUP, "messages": [message]}, headers=tenant.headers
    )
    [job_id] = response.json()["extraction_job_ids"]
    job = await until_finished(client, tenant, job_id)
    assert job["result"]["reason"] == "remember" and job["result"]["messages"] == 1
    english = {**chat(1, start=1)[0], "text": "Please remember that I moved to Berlin"}
    response = await client.post(
        "/v1/messages", json={**GROUP, "messages": [english]}, headers=tenant.headers
    )
    assert len(response.json()["extraction_job_ids"]) == 1


async def test_a_pause_triggers_extraction(running: tuple[AppClient, TenantHandle]) -> None:
    client, tenant = running
    await client.post("/v1/messages", json={**GROUP, "messages": chat(2)}, headers=tenant.headers)

    async def extraction_done() -> dict[str, Any] | None:
        jobs = (await client.get("/v1/jobs?status=done", headers=tenant.headers)).json()["jobs"]
        return next((j for j in jobs if j["kind"] == "messages.extract"), None)

    job = await wait_for(extraction_done)
    assert job["result"]["reason"] == "pause" and job["result"]["messages"] == 2


async def test_messages_are_embedded_in_the_background_and_searchable(
    running: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = running
    await client.post("/v1/messages", json={**GROUP, "messages": chat(8)}, headers=tenant.headers)
    other_group = {**GROUP, "group_id": "g2"}
    leak = [{**chat(1)[0], "message_id": "secret", "text": "我想去杭州西湖划船（另一个群）"}]
    await client.post(
        "/v1/messages", json={**other_group, "messages": leak}, headers=tenant.headers
    )
    await wait_for(lambda: all_embedded(db_url))

    found = await client.post(
        "/v1/messages/search",
        json={"query": "谁想去西湖？", "group_id": "g1", "top_k": 3},
        headers=tenant.headers,
    )
    assert found.status_code == 200, found.text
    hits = found.json()["messages"]
    assert hits[0]["message_id"] == "m1"
    assert hits[0]["sender_name"] == "小红"
    assert all(h["message_id"] != "secret" for h in hits)
    assert hits == sorted(hits, key=lambda h: -h["score"])

    ranged = await client.post(
        "/v1/messages/search",
        json={
            "query": "电影",
            "group_id": "g1",
            "time_from": "2026-03-01T10:06:00+08:00",
            "time_to": "2026-03-01T10:03:00+08:00",
        },
        headers=tenant.headers,
    )
    body = ranged.json()
    assert {h["message_id"] for h in body["messages"]} == {"m3", "m4", "m5", "m6"}
    assert body["warnings"] and "swapped" in body["warnings"][0]

    # Another tenant sees nothing of this archive.
    stranger = await new_tenant(client, "stranger")
    empty = await client.post(
        "/v1/messages/search", json={"query": "西湖", "group_id": "g1"}, headers=stranger.headers
    )
    assert empty.json()["messages"] == []


async def test_a_message_inserted_before_a_later_batch_commits_is_still_extracted(
    db_url: str,
) -> None:
    # A batch of two conversations inserts its messages, then waits on the first one (another
    # writer holds it), while a later batch of the second commits and is extracted: the
    # waiting batch's message of the second conversation has the smaller seq, and an
    # extraction that read past it before it was committed would never read it.
    db = Database(db_url, pool_size=6)
    settings = Settings()
    try:
        async with db.system() as session:
            tenant, _ = await create_tenant(session, "race", {}, settings)
            context = await tenant_context(session, tenant.id, settings)

        def batch(*messages: tuple[str, str]) -> MessageBatch:
            return MessageBatch.model_validate(
                {
                    "request_type": "group",
                    "messages": [
                        {"group_id": group, "message_id": ident, "sender_id": "u1", "text": ident}
                        for group, ident in messages
                    ],
                }
            )

        async def post(messages: MessageBatch, until: asyncio.Event | None = None) -> None:
            async with db.tenant(tenant.id) as session:
                await ingest(session, context, messages, settings)
                if until is not None:
                    await until.wait()  # the transaction stays open

        async def extract(key: str) -> list[str]:
            """What an extraction job of the conversation, queued now, reads and marks."""
            async with db.tenant(tenant.id) as session:
                upto = (
                    await session.execute(
                        text("SELECT last_seq FROM conversations WHERE conversation_key = :k"),
                        {"k": key},
                    )
                ).scalar_one()
                _, rows = await messages_repository.unread_messages(
                    session, tenant.id, key, upto, 1000
                )
                if rows:
                    await messages_repository.advance_extracted(
                        session, tenant.id, key, rows[-1].seq
                    )
            return [row.message_id for row in rows]

        release = asyncio.Event()
        holder = asyncio.create_task(post(batch(("x", "x1")), release))
        await asyncio.sleep(0.3)
        waiting = asyncio.create_task(post(batch(("x", "x2"), ("y", "y1"))))
        await asyncio.sleep(0.3)
        await post(batch(("y", "y2")))
        read = await extract("g:y")
        release.set()
        await asyncio.gather(holder, waiting)
        read += await extract("g:y")
        assert sorted(read) == ["y1", "y2"]
    finally:
        await db.dispose()


async def test_copies_of_a_flood_in_batches_sent_at_once_leave_one_indexed(db_url: str) -> None:
    # A batch's flood look-up (``copies``) must see the copies of the conversation's batch
    # before it: had two batches sent at once, each with a copy of a flood, both looked before
    # either committed, both copies would stay indexed.
    db = Database(db_url, pool_size=6)
    settings = Settings()
    conn = await asyncpg.connect(plain_dsn(db_url))
    ad = "买车优惠 王芳 电话 12345"
    start = datetime(2026, 3, 2, 1, tzinfo=UTC)
    stored = asyncio.Event()

    def batch(*copies: tuple[str, int]) -> MessageBatch:
        messages = [
            {
                "message_id": ident,
                "sender_id": "spam",
                "text": ad,
                "sent_at": start + timedelta(seconds=n),
            }
            for ident, n in copies
        ]
        return MessageBatch.model_validate(
            {"request_type": "group", "group_id": "g1", "messages": messages}
        )

    async def post(messages: MessageBatch, until: asyncio.Event | None = None) -> None:
        async with db.tenant(tenant.id) as session:
            await ingest(session, context, messages, settings)
            stored.set()
            if until is not None:
                await until.wait()  # the transaction stays open

    async def a_batch_waits() -> bool:
        waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted"
        return bool(await conn.fetchval(waiting))

    try:
        async with db.system() as session:
            tenant, _ = await create_tenant(session, "flood", {}, settings)
            context = await tenant_context(session, tenant.id, settings)
        await post(batch(*[(f"s{n}", n) for n in range(floods.FLOOD_COPIES + 1)]))
        stored.clear()
        release = asyncio.Event()
        first = asyncio.create_task(post(batch(("a", 60)), release))
        await stored.wait()
        second = asyncio.create_task(post(batch(("b", 120))))
        await wait_for(a_batch_waits)
        release.set()
        await asyncio.gather(first, second)
        indexed = await conn.fetch(
            "SELECT message_id FROM messages WHERE tenant_id = $1 AND length(lexical) > 0",
            tenant.id,
        )
        assert [row["message_id"] for row in indexed] == ["b"]
    finally:
        await conn.close()
        await db.dispose()
