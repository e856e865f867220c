"""Re-embedding: every stored vector remade by another model in the background, then one
switch; searches, restarts and the ``memoria reembed`` command see the new model."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import numpy as np
import pytest
from pgvector.asyncpg import register_vector

from service.app import create_app
from service.errors import Conflict
from service.events.repository import upsert_events
from service.messages.models import passage_text
from service.profiles.consolidate import digest
from service.reembed import service as reembed
from service.runtime import Runtime
from service.settings import Settings
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    wait_for,
)
from tests.fake_llm import FakeLLM, hash_vector

NEW = "small-embed"
DIM = 64
QUIET = {"every_n_messages": 10_000, "pause_minutes": 600.0, "remember_keywords": []}
VECTOR_TABLES = ("events", "messages", "memories", "profiles")
# Unlike one another, so that none is taken for a near-duplicate of another.
FACTS = [
    "张三每天早上六点起床跑步",
    "李四的女儿在北京读大学",
    "王五对花生过敏",
    "赵六收藏了很多黑胶唱片",
    "孙七下个月要去冰岛看极光",
    "周八是一名儿科医生",
    "吴九养了一条金毛犬叫旺财",
    "郑十正在学习弹钢琴",
    "群主规定晚上十一点后禁止发言",
    "小明用 Rust 写了一个数据库",
]


def app_settings(db_url: str, concurrency: int = 2) -> Settings:
    return make_settings(
        db_url,
        cognitive={"queue": {**FAST_QUEUE, "concurrency": concurrency}, "extraction": QUIET},
        models={"embedding_check_seconds": 0.2},
    )


def new_model(llm: FakeLLM, settings: Settings) -> Any:
    llm.embedding_dims[NEW] = DIM
    return reembed.target_settings(
        settings.models.embedding,
        provider="openai",
        model=NEW,
        dimensions=DIM,
        api_url=llm.base_url,
    )


def runtime_of(client: AppClient) -> Runtime:
    rt: Runtime = client.app.state.runtime
    return rt


async def sql(db_url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    async with raw_connection(db_url) as conn:
        await register_vector(conn)
        return list(await conn.fetch(query, *args))


def profile(user: str, body: str) -> str:
    return (
        f'---\nentity_type: user\nentity_id: "{user}"\nname: 用户{user}\ntags: []\n'
        f'updated_at: "2026-02-22T10:30:00+08:00"\n---\n{body}\n'
    )


def event_row(tenant: TenantHandle, n: int, text: str, vector: np.ndarray) -> dict[str, Any]:
    return {
        "tenant_id": uuid.UUID(tenant.id),
        "id": f"turn-{n}:1",
        "conversation_key": "g:g1",
        "request_type": "group",
        "group_id": "g1",
        "user_id": "10001",
        "sender_id": "10001",
        "request_id": f"turn-{n}",
        "end_seq": 1,
        "kind": "observation",
        "perspective": "group",
        "text": text,
        "source_text": text,
        "is_absolute": True,
        "warnings": [],
        "occurred_at": datetime.now(UTC) - timedelta(hours=n),
        "timezone": "UTC",
        "location_abs": None,
        "message_ids": [],
        "metadata": {},
        "embedding": vector,
        "job_id": None,
    }


async def write_events(rt: Runtime, tenant: TenantHandle, texts: dict[int, str]) -> None:
    """Events as the historian writes them: with the vector of the model in use."""
    vectors = await rt.embedder.passages(list(texts.values()))
    rows = [
        event_row(tenant, n, text, v) for (n, text), v in zip(texts.items(), vectors, strict=True)
    ]
    async with rt.db.tenant(uuid.UUID(tenant.id)) as session:
        await upsert_events(session, rows)


async def add_memory(client: AppClient, tenant: TenantHandle, content: str) -> int:
    body = {"scope": "MEMBER_IN_GROUP", "group_id": "g1", "user_id": "10001", "content": content}
    response = await client.post("/v1/memories", json=body, headers=tenant.headers)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


async def seed(client: AppClient, tenant: TenantHandle, tag: str) -> None:
    """A few rows of each kind, embedded by the configured (local) model."""
    await write_events(
        runtime_of(client), tenant, {n: f"{tag} 事件{n}: 张三 去了第{n}个城市" for n in range(1, 6)}
    )
    messages = [
        {"message_id": f"m{n}", "sender_id": "10001", "sender_name": "张三",
         "text": f"{tag} 第{n}条消息 聊到了爬山", "sent_at": f"2026-03-01T10:0{n}:00"}
        for n in range(1, 6)
    ]  # fmt: skip
    stored = await client.post(
        "/v1/messages",
        json={"request_type": "group", "group_id": "g1", "messages": messages},
        headers=tenant.headers,
    )
    assert stored.status_code == 202, stored.text
    for fact in ("张三最爱吃芒果", "李四每周三去游泳", "王五在杭州做程序员", "赵六养了两只橘猫"):
        await add_memory(client, tenant, f"{tag} {fact}")
    for user in ("1", "2", "3"):
        put = await client.put(
            f"/v1/profiles/user/{user}",
            json={"document": profile(user, f"{tag} 用户{user} 是一名工程师")},
            headers=tenant.headers,
        )
        assert put.status_code == 200, put.text


async def nothing_unembedded(db_url: str) -> bool:
    rows = await sql(db_url, "SELECT count(*) AS n FROM messages WHERE embedding IS NULL")
    return rows[0]["n"] == 0


def run_ends(rt: Runtime, run_id: int) -> Callable[[], Awaitable[str | None]]:
    async def ended() -> str | None:
        found = await reembed.report(rt.db, run_id)
        assert found is not None
        assert not found.stalled, found.last_error
        return found.run.status if found.run.status in ("done", "cancelled") else None

    return ended


async def passages_by_row(db_url: str) -> dict[str, list[tuple[str, np.ndarray]]]:
    """Each table's rows: the text the service embeds, and the stored vector."""
    sources = {
        "events": "text AS a, NULL AS b",
        "messages": "text AS a, sender_name AS b",
        "memories": "content AS a, NULL AS b",
        "profiles": "body AS a, NULL AS b",
    }
    out: dict[str, list[tuple[str, np.ndarray]]] = {}
    for table, columns in sources.items():
        rows = await sql(db_url, f"SELECT {columns}, embedding FROM {table}")
        embedded = {
            "messages": lambda r: passage_text(r["b"], r["a"]),
            "profiles": lambda r: digest(r["a"]),
        }
        out[table] = [(embedded.get(table, lambda r: r["a"])(r), r["embedding"]) for r in rows]
    return out


async def test_a_run_remakes_every_vector_and_switches_with_writes_in_between(
    db_url: str, llm: FakeLLM
) -> None:
    settings = app_settings(db_url)
    target = new_model(llm, settings)
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        rt = runtime_of(client)
        a, b = await new_tenant(client, "a"), await new_tenant(client, "b")
        await seed(client, a, "A")
        await seed(client, b, "B")
        await wait_for(lambda: nothing_unembedded(db_url))

        # Six batches go through, then the model holds the next ones: the run is under way.
        # The tenants' passes take turns (messages, events, memories, profiles of each), so the
        # first batch of each tenant's messages, events and memories is through, and the
        # profiles' first batches are with the model.
        llm.hold_embeddings(after=6)
        run = await reembed.start(rt.db, settings, target, batch_size=2)
        assert (run.previous_model, run.previous_dimensions) == ("multilingual-e5-small", 384)

        async def under_way() -> bool:
            report = await reembed.report(rt.db, run.id)
            assert report is not None
            return llm.embeddings_waiting > 0 and sum(t.rows_done for t in report.tables) >= 4

        await wait_for(under_way)
        with pytest.raises(Conflict):
            await reembed.start(rt.db, settings, target)

        # Searches still read the old vectors, with the old model.
        before = await client.post(
            "/v1/memories/search",
            json={"query": "谁喜欢吃芒果", "group_id": "g1", "user_id": "10001"},
            headers=a.headers,
        )
        assert before.status_code == 200 and before.json(), before.text

        # Events of both tenants got their first batch through.
        [shadowed] = await sql(
            db_url, "SELECT tenant_id, id FROM events WHERE embedding_next IS NOT NULL LIMIT 1"
        )
        owner, other = (a, b) if str(shadowed["tenant_id"]) == a.id else (b, a)
        # Writes during the run: an event rewritten after its new vector was committed, a
        # memory and a profile changed while their batch is with the model, new rows.
        number = int(shadowed["id"].removeprefix("turn-").split(":")[0])
        await write_events(rt, owner, {number: "事件改写: 张三 其实去了乌鲁木齐"})
        [first] = await sql(
            db_url, "SELECT min(id) AS id FROM memories WHERE tenant_id = $1", uuid.UUID(owner.id)
        )
        patched = await client.patch(
            f"/v1/memories/{first['id']}",
            json={"content": "张三其实受不了芒果，只吃榴莲"},
            headers=owner.headers,
        )
        assert patched.status_code == 200, patched.text
        rewritten = await client.put(
            "/v1/profiles/user/1",
            json={"document": profile("1", "用户1 改行做了厨师")},
            headers=owner.headers,
        )
        assert rewritten.status_code == 200, rewritten.text
        late_memory = await add_memory(client, other, "孙七最近迷上了攀岩")
        late = await client.post(
            "/v1/messages",
            json={"request_type": "group", "group_id": "g1", "messages": [
                {"message_id": "m9", "sender_id": "10002", "sender_name": "李四",
                 "text": "运行中写下的消息", "sent_at": "2026-03-01T11:00:00"}]},
            headers=owner.headers,
        )  # fmt: skip
        assert late.status_code == 202, late.text

        llm.release_embeddings()
        assert await wait_for(run_ends(rt, run.id), timeout=60) == "done"
        finished = await reembed.report(rt.db, run.id)
        assert finished is not None
        # The three rows changed after they were read were embedded again, with their new text.
        assert finished.run.caught_up >= 3
        await wait_for(lambda: nothing_unembedded(db_url))

        async def switched() -> bool:
            return rt.embedder.name == NEW and rt.embedder.dimension == DIM

        await wait_for(switched)  # the running service follows the switch on its own

        # Every vector is the new model's, of its current text.
        for table, rows in (await passages_by_row(db_url)).items():
            assert rows, table
            for text, vector in rows:
                assert vector is not None, (table, text)
                assert np.allclose(vector.to_numpy(), hash_vector(text, DIM), atol=1e-5), (
                    table,
                    text,
                )
        meta = {r["key"]: r["value"] for r in await sql(db_url, "SELECT * FROM memoria_meta")}
        assert (meta["embedding_model"], meta["embedding_dim"]) == (NEW, str(DIM))
        types = await sql(
            db_url,
            "SELECT relname AS t, attname, format_type(atttypid, atttypmod) AS ty"
            " FROM pg_attribute JOIN pg_class ON pg_class.oid = attrelid AND relkind = 'r'"
            " WHERE attnum > 0 AND NOT attisdropped AND attname LIKE 'embedding%'",
        )
        assert {(r["t"], r["attname"], r["ty"]) for r in types} == {
            *((t, "embedding", f"vector({DIM})") for t in VECTOR_TABLES),
            ("event_vectors", "embedding", f"halfvec({DIM})"),
            ("messages", "embedding_half", f"halfvec({DIM})"),
        }
        indexes = {r["indexname"] for r in await sql(db_url, "SELECT indexname FROM pg_indexes")}
        assert {"ix_messages_unembedded", "ix_event_vectors_scan", "ix_messages_vectors"} <= indexes
        triggers = await sql(db_url, "SELECT tgname FROM pg_trigger WHERE tgname LIKE '%reembed%'")
        assert triggers == []
        counts = await sql(
            db_url,
            "SELECT (SELECT count(*) FROM events) AS events,"
            " (SELECT count(*) FROM event_vectors) AS copies",
        )
        assert counts[0]["events"] == counts[0]["copies"] == 10

        # Searches find what they should, by the new model.
        events = await client.post(
            "/v1/events/search",
            json={"query": "事件改写: 张三 其实去了乌鲁木齐", "target_group_id": "g1"},
            headers=owner.headers,
        )
        assert events.status_code == 200, events.text
        top = events.json()["events"][0]
        assert top["id"] == shadowed["id"] and top["similarity"] > 0.999
        memories = await client.post(
            "/v1/memories/search",
            json={"query": "孙七最近迷上了攀岩", "group_id": "g1", "user_id": "10001"},
            headers=other.headers,
        )
        assert memories.status_code == 200, memories.text
        assert memories.json()[0]["id"] == late_memory
        messages = await client.post(
            "/v1/messages/search",
            json={"query": "李四: 运行中写下的消息", "group_id": "g1"},
            headers=owner.headers,
        )
        assert messages.status_code == 200, messages.text
        assert messages.json()["messages"][0]["message_id"] == "m9"
        [body] = await sql(
            db_url,
            "SELECT body FROM profiles WHERE tenant_id = $1 AND entity_id = '1'",
            uuid.UUID(owner.id),
        )
        assert "改行做了厨师" in body["body"]
        profiles = await client.post(
            "/v1/profiles/search", json={"query": digest(body["body"])}, headers=owner.headers
        )
        assert profiles.status_code == 200, profiles.text
        assert profiles.json()[0]["entity_id"] == "1"

    # A restart with the old model still configured uses the stored vectors' model.
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        assert runtime_of(client).embedder.name == NEW
        found = await client.post(
            "/v1/memories/search",
            json={"query": "张三其实受不了芒果，只吃榴莲", "group_id": "g1", "user_id": "10001"},
            headers=owner.headers,
        )
        assert found.status_code == 200 and found.json()[0]["id"] == first["id"]


async def test_a_stopped_worker_resumes_after_the_last_committed_batch(
    db_url: str, llm: FakeLLM
) -> None:
    settings = app_settings(db_url, concurrency=1)
    target = new_model(llm, settings)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        rt = runtime_of(client)
        tenant = await new_tenant(client)
        contents = FACTS
        ids = [await add_memory(client, tenant, c) for c in contents]

        llm.hold_embeddings(after=3)
        run = await reembed.start(rt.db, settings, target, batch_size=2)
        first = rt.start_worker()

        async def fourth_batch_in_hand() -> bool:
            report = await reembed.report(rt.db, run.id)
            assert report is not None
            memories = next(t for t in report.tables if t.table == "memories")
            return llm.embeddings_waiting == 1 and memories.rows_done == 6

        await wait_for(fourth_batch_in_hand)
        await first.stop(timeout=0)  # the job in hand is abandoned mid-batch
        assert rt._worker_task is not None
        await rt._worker_task
        sent_before = [t for r in llm.embedding_requests for t in r["input"]]
        assert sent_before == contents[:8]

        [progress] = await sql(
            db_url, "SELECT cursor, rows_done FROM reembed_progress WHERE table_name = 'memories'"
        )
        assert progress["rows_done"] == 6 and progress["cursor"] == f"[{ids[5]}]"
        shadowed = await sql(
            db_url, "SELECT id FROM memories WHERE embedding_next IS NOT NULL ORDER BY id"
        )
        assert [r["id"] for r in shadowed] == ids[:6]

        llm.release_embeddings()
        rt.start_worker()
        assert await wait_for(run_ends(rt, run.id), timeout=60) == "done"

    sent = Counter(t for r in llm.embedding_requests for t in r["input"])
    # Committed batches were never embedded again; only the abandoned one was.
    assert {c: sent[c] for c in contents} == {
        **{c: 1 for c in contents[:6]},
        **{c: 2 for c in contents[6:8]},
        **{c: 1 for c in contents[8:]},
    }
    rows = await sql(db_url, "SELECT content, embedding FROM memories")
    assert len(rows) == 10
    for row in rows:
        assert np.allclose(row["embedding"].to_numpy(), hash_vector(row["content"], DIM), atol=1e-5)


async def test_a_cancelled_run_leaves_the_stored_vectors_as_they_were(
    db_url: str, llm: FakeLLM
) -> None:
    settings = app_settings(db_url)
    target = new_model(llm, settings)
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        rt = runtime_of(client)
        tenant = await new_tenant(client)
        memory = await add_memory(client, tenant, "张三喜欢在周末钓鱼")
        llm.hold_embeddings(after=0)
        run = await reembed.start(rt.db, settings, target, batch_size=2)

        async def batch_in_hand() -> bool:
            return llm.embeddings_waiting > 0

        await wait_for(batch_in_hand)
        # Cancelling waits for the batch in hand to end before removing the shadow columns.
        cancelling = asyncio.create_task(reembed.cancel(rt.db))
        await asyncio.sleep(0.3)
        llm.release_embeddings()
        cancelled = await cancelling
        assert cancelled.id == run.id
        assert await wait_for(run_ends(rt, run.id)) == "cancelled"

        columns = await sql(
            db_url, "SELECT attname FROM pg_attribute WHERE attname = 'embedding_next'"
        )
        assert columns == []
        meta = {r["key"]: r["value"] for r in await sql(db_url, "SELECT * FROM memoria_meta")}
        assert (meta["embedding_model"], meta["embedding_dim"]) == ("multilingual-e5-small", "384")
        found = await client.post(
            "/v1/memories/search",
            json={"query": "张三周末做什么", "group_id": "g1", "user_id": "10001"},
            headers=tenant.headers,
        )
        assert found.status_code == 200 and found.json()[0]["id"] == memory
        assert rt.embedder.name.endswith("multilingual-e5-small")


async def memoria(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "service",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_the_command_starts_a_run_shows_it_and_waits_for_the_switch(
    db_url: str, llm: FakeLLM
) -> None:
    settings = app_settings(db_url)
    llm.embedding_dims[NEW] = DIM
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}
    env["MEMORIA_DATABASE_URL"] = db_url
    model = ["--model", NEW, "--api-url", llm.base_url]
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        tenant = await new_tenant(client)
        for fact in FACTS[:5]:
            await add_memory(client, tenant, fact)

        # The model is asked first: a wrong dimension changes nothing.
        code, _, err = await memoria("reembed", *model, "--dimensions", "32", env=env)
        assert code == 1 and "64" in err and "--dimensions" in err
        code, out, _ = await memoria("reembed", "--status", env=env)
        assert code == 0 and "no re-embedding" in out

        llm.hold_embeddings(after=2)  # the command's own probe, then one batch
        code, out, err = await memoria(
            "reembed", *model, "--dimensions", str(DIM), "--batch-size", "2", env=env
        )
        assert code == 0, err
        assert "multilingual-e5-small (384) -> small-embed (64)" in out

        async def one_batch_done() -> bool:
            return llm.embeddings_waiting > 0

        await wait_for(one_batch_done)
        code, out, err = await memoria("reembed", *model, "--dimensions", str(DIM), env=env)
        assert code == 1 and "is embedding" in err
        code, out, _ = await memoria("reembed", "--status", env=env)
        assert code == 0 and "embedding, started" in out
        assert "memories" in out and "2 / 5" in out

        llm.release_embeddings()
        code, out, err = await memoria("reembed", "--status", "--wait", env=env)
        assert code == 0, err
        assert "100%" in out and "switched" in out
        assert "model_name = 'small-embed', dimensions = 64" in out
        code, _, err = await memoria("reembed", *model, "--dimensions", str(DIM), env=env)
        assert code == 1 and "already" in err


async def test_a_stalled_run_is_resumed_once_its_cause_is_fixed(db_url: str, llm: FakeLLM) -> None:
    settings = make_settings(
        db_url,
        cognitive={"queue": {**FAST_QUEUE, "job_max_retries": 0}},
        models={"embedding_check_seconds": 0.2},
    )
    target = new_model(llm, settings)
    llm.embedding_dims.clear()  # the model answers with 384 dimensions, not the 64 declared
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        rt = runtime_of(client)
        a, b = await new_tenant(client, "a"), await new_tenant(client, "b")
        for tenant, facts in ((a, FACTS[:3]), (b, FACTS[3:6])):
            for fact in facts:
                await add_memory(client, tenant, fact)
        run = await reembed.start(rt.db, settings, target, batch_size=2)

        async def stalled() -> reembed.RunReport | None:
            report = await reembed.report(rt.db, run.id)
            return report if report is not None and report.stalled else None

        report = await wait_for(stalled)
        assert report.jobs["failed"] == 2 and "64" in (report.last_error or "")
        # One tenant's failed job is deleted outright (an erasure whose pattern matched its
        # payload would do that): its pass is left without any job.
        await sql(
            db_url,
            "DELETE FROM jobs WHERE tenant_id = $1 AND kind = $2",
            uuid.UUID(b.id),
            reembed.BATCH_JOB,
        )

        llm.embedding_dims[NEW] = DIM  # the cause, fixed
        assert await reembed.resume(rt.db, settings) == 2
        assert await wait_for(run_ends(rt, run.id), timeout=60) == "done"
        done = await reembed.report(rt.db, run.id)
        assert done is not None
        memories = next(t for t in done.tables if t.table == "memories")
        assert (memories.rows_done, memories.rows_total) == (6, 6)
    rows = await sql(db_url, "SELECT content, embedding FROM memories")
    assert sorted(r["content"] for r in rows) == sorted(FACTS[:6])
    for row in rows:
        assert np.allclose(row["embedding"].to_numpy(), hash_vector(row["content"], DIM), atol=1e-5)


async def test_without_tenants_the_switch_is_immediate(db_url: str, llm: FakeLLM) -> None:
    settings = app_settings(db_url)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        rt = runtime_of(client)
        run = await reembed.start(rt.db, settings, new_model(llm, settings))
        assert run.status == "done"

        async def followed() -> bool:
            return rt.embedder.name == NEW

        await wait_for(followed)
    meta = {r["key"]: r["value"] for r in await sql(db_url, "SELECT * FROM memoria_meta")}
    assert (meta["embedding_model"], meta["embedding_dim"]) == (NEW, str(DIM))
