"""``memoria import undefined``: the original bot's data directory brought into a tenant, run as a
user runs it, checked through the HTTP API; a second run adds nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

from service.app import create_app
from service.db.engine import Database
from service.importer.source import MAX_FILE_BYTES, MAX_HISTORY_BYTES
from service.queue.repository import prune
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    serve_app,
    until_finished,
)
from tests.test_cli import clean_env, memoria

GROUP_JOB = "req-a_1_1771725600000"
PRIVATE_JOB = "req-b_1_1771729200000"


def write(path: Path, content: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    path.write_text(text, encoding="utf-8")


def profile(front: str, body: str) -> str:
    return f"---\n{front.strip()}\n---\n{body}\n"


def bot_data(root: Path) -> Path:
    """A small data directory in the original bot's layout, with the usual mess in it."""
    cognitive = root / "cognitive"
    write(
        root / "end_summaries.json",
        [
            {  # placed by the group's name, known from the queued group job
                "summary": "帮张三解释了 asyncio 的事件循环",
                "timestamp": "2026-02-20T10:00:00+08:00",
                "location": {"type": "group", "name": "Python 学习群"},
            },
            {  # the bot's fallback name for a group without one
                "summary": "给大家整理了周报模板",
                "timestamp": "2026-02-21T09:00:00+08:00",
                "location": {"type": "group", "name": "群100200"},
            },
            {  # a later shape with ids
                "summary": "私聊里给张三推荐了几本书",
                "timestamp": "2026-02-21T12:00:00+08:00",
                "request_type": "private",
                "user_id": 10001,
                "group_id": "",
            },
            "一条没有地点的旧备忘",  # the oldest shape: no time, no place
            {  # the same turn as the pending job (the bot wrote both)
                "summary": "回答了 ChromaDB 的选型问题",
                "timestamp": "2026-02-22T10:00:01+08:00",
                "location": {"type": "group", "name": "Python 学习群"},
            },
        ],
    )
    users, groups = cognitive / "profiles" / "users", cognitive / "profiles" / "groups"
    history = cognitive / "profiles" / "history"
    write(
        history / "user" / "10001" / "20260220100000000000.md",
        profile(
            'entity_type: user\nentity_id: "10001"\nname: 张三\ntags: []', "张三 v1：学 Python。"
        ),
    )
    write(
        history / "user" / "10001" / "20260221100000000000.md",
        profile(
            'entity_type: user\nentity_id: "10001"\nname: 张三\ntags: [Python]',
            "张三 v2：学 Python 和 asyncio。",
        ),
    )
    # The current file as the bot wrote it: naive time, nickname, qq (completed on import).
    write(
        users / "10001.md",
        profile(
            'entity_type: user\nentity_id: "10001"\nnickname: 张三\nqq: "10001"\n'
            "tags:\n  - Python\n  - asyncio\nupdated_at: '2026-02-22T10:30:00'",
            "张三 v3：Python 开发者，专注异步架构。",
        ),
    )
    # Seed 001's shape: user_id-style keys, an epoch time, no entity_type.
    write(
        history / "groups" / "100200" / "20260219080000000000.md",
        profile("group_id: 100200\nname: Python 学习群\nupdated_at: 1771459200", "群 v1：闲聊。"),
    )
    write(
        history / "groups" / "100200" / "20260220080000000000.md",
        profile(
            'entity_type: group\nentity_id: "100200"\nname: Python 学习群\ntags: [Python]\n'
            'updated_at: "2026-02-20T08:00:00+08:00"',
            "群 v2：讨论 Python。",
        ),
    )
    write(
        groups / "100200.md",
        profile(
            'entity_type: group\nentity_id: "100200"\nname: Python 学习群\ntags: [Python, 周报]\n'
            'updated_at: "2026-02-21T08:00:00+08:00"\nsource_event_id: abc_0_1740218400000',
            "群 v3：讨论 Python，每周五交周报。",
        ),
    )
    write(users / "10002.md", "李四喜欢跑步。\n")  # no front matter
    write(
        cognitive / "queues" / "pending" / f"{GROUP_JOB}.json",
        {
            "request_id": "req-a",
            "end_seq": 1,
            "user_id": "10001",
            "group_id": "100200",
            "sender_id": "10001",
            "sender_name": "张三",
            "group_name": "Python 学习群",
            "bot_name": "Undefined",
            "request_type": "group",
            "timestamp_utc": "2026-02-22T02:00:00+00:00",
            "timestamp_local": "2026-02-22T10:00:00+08:00",
            "timestamp_epoch": 1771725600,
            "timezone": "CST",
            "location_abs": "Python 学习群",
            "message_ids": ["m-1"],
            "memo": "回答了 ChromaDB 的选型问题",
            "observations": ["张三在做 QQ 机器人的记忆系统", "张三打算用 pgvector 替换 ChromaDB"],
            "has_observations": True,
            "perspective": "",
            "profile_targets": [],
            "schema_version": "final_v1",
            "source_message": "<content>我打算把 ChromaDB 换成 pgvector</content>",
            "recent_messages": [],
            "force": False,
        },
    )
    write(
        cognitive / "queues" / "failed" / f"{PRIVATE_JOB}.json",
        {
            "request_id": "req-b",
            "end_seq": 1,
            "user_id": 10003,
            "group_id": "",
            "sender_id": 10003,
            "sender_name": "李四",
            "request_type": "private",
            "timestamp_local": "2026-02-22T11:00:00+08:00",
            "memo": "",
            "observations": ["李四下个月搬去杭州"],
            "mood": "cheerful",  # a field this import does not know
            "_retry_count": 3,
            "error": "historian_rewrite: LLM timeout",
        },
    )
    write(cognitive / "queues" / "pending" / "broken.json", '{"request_id": "x", ')
    write(
        cognitive / "chromadb" / "events.json",
        {
            "ids": ["abc_0_1740218400000", "def_0_1740304800000"],
            "documents": [
                "2026-02-18 张三(10001) 在 Python 学习群提议引入 ChromaDB 作为向量库",
                "2026-02-19 李四(10003) 说他养了一只叫豆豆的柯基犬",
            ],
            "metadatas": [
                {
                    "request_id": "abc",
                    "end_seq": 0,
                    "user_id": "10001",
                    "group_id": "100200",
                    "sender_id": "10001",
                    "request_type": "group",
                    "timestamp_utc": "2026-02-18T02:00:00+00:00",
                    "timestamp_epoch": 1771380000,
                    "message_ids": "m-0",
                    "perspective": "group",
                    "is_absolute": True,
                    "schema_version": "final_v1",
                },
                {
                    "user_id": "10003",
                    "group_id": "",
                    "sender_id": "10003",
                    "request_type": "private",
                    "timestamp_local": "2026-02-19T20:00:00+08:00",
                    "is_absolute": "false",
                },
            ],
        },
    )
    return root


async def run_import(db_url: str, *args: str) -> tuple[str, str]:
    result = await asyncio.to_thread(
        memoria, "import", "undefined", *args, env=clean_env(MEMORIA_DATABASE_URL=db_url)
    )
    assert result.returncode == 0, result.stderr
    return result.stdout, result.stderr


def counts(summary: str) -> dict[str, tuple[int, int]]:
    """{stage: (new, already there)} from the summary's table."""
    found = {}
    for line in summary.splitlines():
        parts = line.split()
        if parts and parts[0] in ("profiles", "events", "memos", "jobs") and parts[1].isdigit():
            found[parts[0]] = (int(parts[1]), int(line.split(",")[-1].split()[0]))
    return found


async def visible(client: AppClient, tenant: TenantHandle) -> dict[str, Any]:
    """What a tenant sees through the API of everything the import touches."""
    h = tenant.headers
    context = await client.post(
        "/v1/context",
        json={"request_type": "group", "group_id": "100200", "message": "周报怎么写？"},
        headers=h,
    )
    assert context.status_code == 200, context.text
    user = await client.get("/v1/profiles/user/10001", headers=h)
    group = await client.get("/v1/profiles/group/100200", headers=h)
    user_revisions = await client.get("/v1/profiles/user/10001/revisions", headers=h)
    group_revisions = await client.get("/v1/profiles/group/100200/revisions", headers=h)
    jobs = await client.get("/v1/jobs", headers=h)
    private_memos = await client.get("/v1/memos", params={"user_id": "10001"}, headers=h)
    return {
        "group_memos": [m["text"] for m in context.json()["memos"]],
        "private_memos": [m["memo"] for m in private_memos.json()],
        "user": user.json(),
        "group": group.json(),
        "user_revisions": user_revisions.json(),
        "group_revisions": group_revisions.json(),
        "no_front_matter": (await client.get("/v1/profiles/user/10002", headers=h)).status_code,
        "jobs": jobs.json()["jobs"],
    }


async def test_import_brings_the_bots_data_once(db_url: str, tmp_path: Path) -> None:
    data = bot_data(tmp_path / "data")
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        tenant = await new_tenant(client, "undefined-bot")

        # A dry run reads and counts, and writes nothing.
        dry, _ = await run_import(db_url, str(data), "--tenant", tenant.id, "--dry-run")
        assert "would import" in dry and "(dry run: nothing was written)" in dry
        assert counts(dry) == {
            "profiles": (2, 0),
            "events": (2, 0),
            "memos": (3, 0),
            "jobs": (2, 0),
        }
        nothing = await visible(client, tenant)
        assert nothing["group_memos"] == [] and nothing["jobs"] == []
        assert "error" in nothing["user"]

        summary, progress = await run_import(db_url, str(data), "--tenant", tenant.id)
        assert counts(summary) == {
            "profiles": (2, 0),
            "events": (2, 0),
            "memos": (3, 0),
            "jobs": (2, 0),
        }
        assert "(4 older revisions)" in summary and "(1 had failed in the bot)" in summary
        skipped = summary.split("skipped:")[1]
        assert "cognitive/queues/pending/broken.json: malformed JSON" in skipped
        assert "cognitive/profiles/users/10002.md: no YAML front matter" in skipped
        assert "end_summaries.json[3]: names no conversation" in skipped
        assert "end_summaries.json[4]: the same turn as the queued job" in skipped
        assert "jobs: unknown fields ignored: mood (1)" in summary
        assert "profiles  [" in progress and "2/2" in progress and "jobs      [" in progress

        seen = await visible(client, tenant)
        # The memo log: the group's three turns (two from end_summaries.json, one from the
        # pending job), in time order; the private one in its own conversation.
        assert seen["group_memos"] == [
            "帮张三解释了 asyncio 的事件循环",
            "给大家整理了周报模板",
            "回答了 ChromaDB 的选型问题",
        ]
        assert seen["private_memos"] == ["私聊里给张三推荐了几本书"]
        # Profiles: the current file is the newest version, the snapshots older revisions in
        # time order; the bot's naive time and nickname were completed into valid front matter.
        user, group = seen["user"], seen["group"]
        assert (
            user["version"] == 3
            and user["body"].strip() == "张三 v3：Python 开发者，专注异步架构。"
        )
        assert user["name"] == "张三" and user["tags"] == ["Python", "asyncio"]
        assert 'updated_at: "2026-02-22T10:30:00+08:00"' in user["document"]  # the tenant's zone
        assert user["updated_at"] == "2026-02-22T02:30:00Z"
        assert [r["version"] for r in seen["user_revisions"]] == [2, 1]
        assert "张三 v2" in seen["user_revisions"][0]["document"]
        assert "张三 v1" in seen["user_revisions"][1]["document"]
        assert seen["user_revisions"][0]["replaced_by"]["by"] == "import"
        assert group["version"] == 3 and "每周五交周报" in group["body"]
        assert group["source_event_id"] == "abc_0_1740218400000"
        assert ["群 v2" in r["document"] for r in seen["group_revisions"]] == [True, False]
        assert "群 v1" in seen["group_revisions"][1]["document"]
        assert seen["no_front_matter"] == 404
        # Both jobs are queued again, the failed one too.
        assert sorted(j["status"] for j in seen["jobs"]) == ["queued", "queued"]
        # The exported events, embedded again, are found by meaning in their conversations.
        h = tenant.headers
        dog = await client.post(
            "/v1/events/search", json={"query": "谁养了狗？", "target_user_id": "10003"}, headers=h
        )
        assert dog.status_code == 200, dog.text
        assert [e["id"] for e in dog.json()["events"]] == ["def_0_1740304800000"]
        assert dog.json()["events"][0]["is_absolute"] is False
        chroma = await client.post(
            "/v1/events/search",
            json={"query": "向量库选型", "target_group_id": "100200"},
            headers=h,
        )
        assert chroma.json()["events"][0]["id"] == "abc_0_1740218400000"
        old = (await client.get("/v1/events/abc_0_1740218400000", headers=h)).json()
        assert old["occurred_at"] == "2026-02-18T02:00:00Z"
        assert old["message_ids"] == ["m-0"] and old["metadata"]["imported_from"] == "undefined"

        # Run again: everything is found, nothing is added.
        again, _ = await run_import(db_url, str(data), "--tenant", tenant.id)
        assert counts(again) == {
            "profiles": (0, 2),
            "events": (0, 2),
            "memos": (0, 3),
            "jobs": (0, 2),
        }
        assert await visible(client, tenant) == seen

    # A worker turns the queued jobs into events, as if the bot's historian had run.
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        for job in seen["jobs"]:
            assert (await until_finished(client, tenant, job["id"]))["status"] == "done"
        h = tenant.headers
        for event_id in (f"g:100200:{GROUP_JOB}:1.{n}" for n in ("1", "2", "memo")):
            event = await client.get(f"/v1/events/{event_id}", headers=h)
            assert event.status_code == 200, event_id
            assert event.json()["occurred_at"] == "2026-02-22T02:00:00Z"
        moved = (await client.get(f"/v1/events/p:10003:{PRIVATE_JOB}:1.1", headers=h)).json()
        assert "杭州" in moved["text"] and moved["user_id"] == "10003"

    # Once the jobs are done and pruned from the queue, and their receipts too, their turns
    # still count as imported (by their memo and events).
    db = Database(db_url, pool_size=1)
    try:
        async with db.system() as session:
            assert await prune(session, 0, 0, 0, 0) >= 2
    finally:
        await db.dispose()
    last, _ = await run_import(db_url, str(data), "--tenant", tenant.id)
    assert counts(last)["jobs"] == (0, 2)


async def test_memos_without_a_place_go_where_told_and_bad_input_is_refused(
    db_url: str, tmp_path: Path
) -> None:
    env = clean_env(MEMORIA_DATABASE_URL=db_url)
    created = await asyncio.to_thread(memoria, "tenants", "create", "old-bot", env=env)
    tenant_id = created.stdout.split("tenant_id:")[1].split()[0]
    data = tmp_path / "data"
    write(data / "end_summaries.json", ["查了天气", "讲了个笑话", "查了天气", "道了晚安"])

    summary, _ = await run_import(
        db_url, str(data), "--tenant", tenant_id, "--memo-conversation", "group:777"
    )
    assert counts(summary)["memos"] == (4, 0)
    assert "memos without a readable time (dated by the file): 4" in summary
    again, _ = await run_import(
        db_url, str(data), "--tenant", tenant_id, "--memo-conversation", "group:777"
    )
    assert counts(again)["memos"] == (0, 4)
    settings = make_settings(db_url)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        key = created.stdout.split("api_key:")[1].split()[0]
        memos = await client.get(
            "/v1/memos", params={"group_id": "777"}, headers={"Authorization": f"Bearer {key}"}
        )
        # Newest first: the oldest shape has no times, so the file's order stands for them.
        assert [m["memo"] for m in memos.json()] == [
            "道了晚安",
            "查了天气",
            "讲了个笑话",
            "查了天气",
        ]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return memoria("import", "undefined", *args, env=env)

    failures = await asyncio.gather(
        asyncio.to_thread(run, str(tmp_path / "nowhere"), "--tenant", tenant_id),
        asyncio.to_thread(run, str(data), "--tenant", str(uuid.uuid4())),
        asyncio.to_thread(run, str(data), "--tenant", "nope"),
        asyncio.to_thread(run, str(data), "--tenant", tenant_id, "--memo-conversation", "777"),
    )
    assert all(f.returncode == 1 for f in failures), [f.stderr for f in failures]
    nowhere, stranger, nope, unplaced = (f.stderr for f in failures)
    assert "no such directory" in nowhere
    assert "no tenant" in stranger
    assert "not a tenant id" in nope
    assert "group:ID or private:ID" in unplaced


async def test_files_that_cannot_be_read_whole_are_skipped_beside_the_good_ones(
    db_url: str, tmp_path: Path
) -> None:
    data = bot_data(tmp_path / "data")
    cognitive = data / "cognitive"
    # A FIFO nobody writes to, a link to a device without end, and files too big to read whole
    # (sparse: they take no room on disk).
    os.mkfifo(cognitive / "queues" / "pending" / "stuck.json")
    (cognitive / "profiles" / "users" / "10009.md").symlink_to("/dev/zero")
    (cognitive / "queues" / "failed" / "dir.json").mkdir()
    with (cognitive / "queues" / "pending" / "huge.json").open("wb") as file:
        file.truncate(MAX_FILE_BYTES + 1)
    extra = tmp_path / "events.json"
    with extra.open("wb") as file:
        file.truncate(MAX_HISTORY_BYTES + 1)
    env = clean_env(MEMORIA_DATABASE_URL=db_url)
    created = await asyncio.to_thread(memoria, "tenants", "create", "odd-files", env=env)
    tenant_id = created.stdout.split("tenant_id:")[1].split()[0]

    def run(*args: str) -> str:
        result = memoria("import", "undefined", str(data), "--tenant", tenant_id, *args, env=env)
        assert result.returncode == 0, result.stderr
        return result.stdout

    # Within the timeout: a FIFO or /dev/zero read whole would hold it for good.
    summary = await asyncio.to_thread(run)
    assert counts(summary) == {
        "profiles": (2, 0),
        "events": (2, 0),
        "memos": (3, 0),
        "jobs": (2, 0),
    }
    skipped = summary.split("skipped:")[1]
    assert "cognitive/queues/pending/stuck.json: not a regular file (a FIFO)" in skipped
    assert "cognitive/profiles/users/10009.md: not a regular file (a character device)" in skipped
    assert "cognitive/queues/failed/dir.json: not a regular file (a directory)" in skipped
    assert "cognitive/queues/pending/huge.json: larger than 4 MiB" in skipped
    assert "cognitive/queues/pending/broken.json: malformed JSON" in skipped  # as before

    # An events export given by name is the history's cap, and is reported like the others.
    summary = await asyncio.to_thread(run, "--events", str(extra))
    assert counts(summary)["events"] == (0, 0)
    assert f"{extra}: larger than 256 MiB" in summary.split("skipped:")[1]


async def test_a_big_history_is_planned_on_statistics_that_count_it(
    db_url: str, tmp_path: Path
) -> None:
    """1,500 exported events of one group imported into a new service: the group's first
    turn after it must be planned on statistics that count them (the fresh tables' say one
    row, where nested loops over the whole conversation cost seconds). A second run, which
    adds nothing, analyzes nothing."""
    import numpy as np
    from sqlalchemy import event, text

    from service.importer.service import import_undefined
    from service.settings import Settings
    from service.tenants.service import create_tenant
    from tests.test_read_latency import SeededModel

    ids = [f"ev{n}_0_{1771380000000 + n * 60_000}" for n in range(1_500)]
    write(
        tmp_path / "data" / "cognitive" / "chromadb" / "events.json",
        {
            "ids": ids,
            "documents": [f"2026-02-18 成员{n % 40} 说第{n}次去西湖边划船" for n in range(1_500)],
            "metadatas": [
                {
                    "group_id": "1002%:..",
                    "sender_id": str(10000 + n % 40),
                    "request_type": "group",
                    "timestamp_epoch": 1771380000 + n * 60,
                }
                for n in range(1_500)
            ],
        },
    )
    db = Database(db_url)
    analyses: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().startswith("ANALYZE"):
            analyses.append(statement.split()[-1])

    event.listen(db.engine.sync_engine, "before_cursor_execute", count)
    try:
        async with db.system() as session:
            tenant, _ = await create_tenant(session, "history", {}, Settings())
        model = SeededModel(np.zeros(384, dtype=np.float32))
        report = await import_undefined(db, Settings(), model, tenant.id, tmp_path / "data")  # type: ignore[arg-type]
        assert report.imported["events"] == 1_500
        async with db.system() as session:
            for table in ("events", "event_vectors"):
                plan = await session.execute(
                    text(
                        f"EXPLAIN (FORMAT JSON) SELECT 1 FROM {table} WHERE tenant_id = :t"
                        " AND conversation_key = 'g:1002%:..'"
                    ),
                    {"t": tenant.id},
                )
                estimated = plan.scalar_one()[0]["Plan"]["Plan Rows"]
                assert 750 <= estimated <= 3_000, (table, estimated)
        assert sorted(analyses) == ["event_vectors", "events"]

        analyses.clear()
        again = await import_undefined(db, Settings(), model, tenant.id, tmp_path / "data")  # type: ignore[arg-type]
        assert again.imported["events"] == 0 and analyses == []
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", count)
        await db.dispose()


async def test_numbers_json_has_no_word_for_are_skipped_beside_the_good_ones(
    db_url: str, tmp_path: Path
) -> None:
    """Python's json writes a float that is not a number as NaN or Infinity, which jsonb
    cannot hold: the record holding one is skipped by name, the rest imported."""
    data = bot_data(tmp_path / "data")
    cognitive = data / "cognitive"
    events = cognitive / "chromadb" / "events.json"
    exported = json.loads(events.read_text(encoding="utf-8"))
    exported["metadatas"][0]["confidence"] = float("nan")
    events.write_text(json.dumps(exported, ensure_ascii=False), encoding="utf-8")
    job = cognitive / "queues" / "pending" / f"{GROUP_JOB}.json"
    record = json.loads(job.read_text(encoding="utf-8"))
    record["recent_messages"] = [{"text": "hi", "score": float("inf")}]
    job.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    env = clean_env(MEMORIA_DATABASE_URL=db_url)
    created = await asyncio.to_thread(memoria, "tenants", "create", "nan-bot", env=env)
    tenant_id = created.stdout.split("tenant_id:")[1].split()[0]

    summary, _ = await run_import(db_url, str(data), "--tenant", tenant_id)
    assert counts(summary)["events"] == (1, 0)
    assert counts(summary)["jobs"] == (1, 0)
    skipped = summary.split("skipped:")[1]
    assert "cognitive/chromadb/events.json[0]: metadata.confidence:" in skipped
    assert f"cognitive/queues/pending/{GROUP_JOB}.json: recent_messages.0.score:" in skipped


async def test_text_json_escapes_as_lone_surrogates_is_skipped_beside_the_good_ones(
    db_url: str, tmp_path: Path
) -> None:
    """A JSON escape of half a UTF-16 pair (\\ud83d without its \\ude00) reads as no
    character UTF-8 can write: the record holding one is skipped by name, the rest imported."""
    data = bot_data(tmp_path / "data")
    cognitive = data / "cognitive"
    events = cognitive / "chromadb" / "events.json"
    exported = json.loads(events.read_text(encoding="utf-8"))
    exported["documents"][0] += " \ud83d"
    events.write_text(json.dumps(exported), encoding="utf-8")  # ASCII: escaped as \ud83d
    env = clean_env(MEMORIA_DATABASE_URL=db_url)
    created = await asyncio.to_thread(memoria, "tenants", "create", "half-pair-bot", env=env)
    tenant_id = created.stdout.split("tenant_id:")[1].split()[0]

    summary, _ = await run_import(db_url, str(data), "--tenant", tenant_id)
    assert counts(summary)["events"] == (1, 0)
    assert counts(summary)["jobs"] == (2, 0)
    assert "cognitive/chromadb/events.json[0]: document:" in summary.split("skipped:")[1]


async def test_front_matter_naming_no_real_day_is_skipped_beside_the_good_ones(
    db_url: str, tmp_path: Path
) -> None:
    """YAML reads 2026-02-30 as a date it cannot build: the profile holding one is skipped by
    name, the rest imported."""
    data = bot_data(tmp_path / "data")
    users = data / "cognitive" / "profiles" / "users"
    (users / "10003.md").write_text(
        '---\nentity_type: user\nentity_id: "10003"\nname: 王五\nbirthday: 2026-02-30\n---\n'
        "王五喜欢下棋。\n",
        encoding="utf-8",
    )
    env = clean_env(MEMORIA_DATABASE_URL=db_url)
    created = await asyncio.to_thread(memoria, "tenants", "create", "no-such-day", env=env)
    tenant_id = created.stdout.split("tenant_id:")[1].split()[0]

    summary, _ = await run_import(db_url, str(data), "--tenant", tenant_id)
    assert counts(summary)["profiles"] == (2, 0)
    assert "cognitive/profiles/users/10003.md: " in summary.split("skipped:")[1]
