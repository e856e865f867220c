"""Profiles: documents, revisions, rollback, merges by the historian (offline, LLM), search."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo

import pytest

from service.app import create_app
from service.db.engine import Database
from service.embedding import build_embedder
from service.historian.profiles import ProfileMerger, Target
from service.importer.undefined import read_source
from service.profiles import repository
from service.profiles.document import Profile, ProfileKey, parse, render
from service.profiles.service import Fact
from service.settings import EmbeddingModelSettings, Settings
from service.tenants.service import create_tenant
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

DOC = """---
entity_type: user
entity_id: "10001"
name: "张三 \\"老张\\""
tags: ["Python", '架构师']
updated_at: "2026-02-22T10:30:00+08:00"
source_event_id: "req-1:1"
---
# 用户侧写
张三是一名 Python 开发者。

---

上面那条横线是正文的一部分：「引号」"quotes" 'single'.
"""

CONTEXT = {
    "request_type": "group",
    "group_id": "g1",
    "group_name": "Python 群",
    "sender_id": "10001",
    "sender_name": "张三",
    "bot_id": "20002",
    "bot_name": "小助手",
    "timestamp": "2026-02-21T23:30:00+08:00",
}


def doc(version_note: str, name: str = "张三") -> str:
    return (
        f'---\nentity_type: user\nentity_id: "10001"\nname: {name}\ntags: []\n'
        f'updated_at: "2026-02-22T10:30:00+08:00"\n---\n{version_note}\n'
    )


# "Billion laughs": each anchor lists the one before nine times; 700 characters of front
# matter that name a value of 9**7 items.
LAUGHS = "l0: &l0 [ha, ha, ha, ha, ha, ha, ha, ha, ha]\n" + "".join(
    f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]\n" for n in range(1, 7)
)


@pytest.fixture
async def online(db_url: str, llm: FakeLLM) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(
        db_url, cognitive={"queue": {**FAST_QUEUE, "job_max_retries": 0}}, **llm_settings(llm)
    )
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client)


async def hand_over(client: AppClient, tenant: TenantHandle, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/end", json={**CONTEXT, **body}, headers=tenant.headers)
    assert response.status_code == 202, response.text
    return await until_finished(client, tenant, response.json()["job_id"])


def test_front_matter_parses_and_renders() -> None:
    profile = parse(DOC, expected=ProfileKey("user", "10001"))
    assert profile.name == '张三 "老张"'
    assert profile.tags == ["Python", "架构师"]
    assert profile.updated_at == datetime(2026, 2, 22, 10, 30, tzinfo=ZoneInfo("Asia/Shanghai"))
    assert profile.source_event_id == "req-1:1"
    assert "---\n\n上面那条横线" in profile.body
    again = parse(render(profile))
    assert (again.key, again.name, again.tags, again.body.strip()) == (
        profile.key,
        profile.name,
        profile.tags,
        profile.body.strip(),
    )
    # Numeric-looking ids stay strings through a render.
    assert 'entity_id: "10001"' in render(profile)


async def test_put_round_trips_the_exact_text(client: AppClient) -> None:
    tenant = await new_tenant(client)
    response = await client.put(
        "/v1/profiles/user/10001", json={"document": DOC}, headers=tenant.headers
    )
    assert response.status_code == 200, response.text
    got = (await client.get("/v1/profiles/user/10001", headers=tenant.headers)).json()
    assert got["document"] == DOC
    assert got["name"] == '张三 "老张"' and got["tags"] == ["Python", "架构师"]
    assert got["version"] == 1 and got["source_event_id"] == "req-1:1"


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ("no front matter at all", "document"),
        ("---\nentity_type: [unclosed\n---\nbody\n", "document"),
        (
            '---\nentity_type: user\nentity_id: "10001"\ntags: []\n'
            'updated_at: "2026-02-22T10:30:00+08:00"\n---\nbody\n',
            "document.name",
        ),
        (doc("body").replace('entity_id: "10001"', 'entity_id: "99999"'), "document.entity_id"),
        (doc("").replace("\n\n", "\n"), "document"),
        (doc("body").replace("tags: []", "tags: {a: 1}"), "document.tags"),
        (doc("body").replace("tags: []", f"tags: [{'x' * 50}]"), "document.tags"),
        (doc("body").replace("+08:00", ""), "document.updated_at"),
        (
            doc("body").replace("2026-02-22T10:30:00+08:00", "0001-01-01T00:00:00+14:00"),
            "document.updated_at",
        ),
        (doc("body", name="*l6").replace("---\n", f"---\n{LAUGHS}", 1), "document"),
        (doc("body", name="{first: 张, last: 三}"), "document.name"),
        (doc("body", name="!!binary 5byg5LiJ"), "document.name"),
        (
            doc("body").replace("tags: []", "tags: []\nsource_event_id: [a, b]"),
            "document.source_event_id",
        ),
        # Values YAML reads as dates or numbers that name none: no day, no offset, no number.
        (doc("body").replace("tags: []", "tags: []\nbirthday: 2026-02-30"), "document"),
        (doc("body").replace("tags: []", "tags: [2026-13-01]"), "document"),
        (doc("body").replace("tags: []", "tags: []\nseen: 2026-03-01 10:00:00+25:00"), "document"),
        (doc("body").replace("tags: []", "tags: []\nage: !!int ''"), "document"),
        (doc("body").replace("tags: []", "tags: []\nage: !!float x"), "document"),
    ],
)
async def test_invalid_documents_are_refused(client: AppClient, document: str, field: str) -> None:
    tenant = await new_tenant(client)
    response = await client.put(
        "/v1/profiles/user/10001", json={"document": document}, headers=tenant.headers
    )
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field
    assert (await client.get("/v1/profiles/user/10001", headers=tenant.headers)).status_code == 404


async def test_revisions_keep_the_newest_five_and_rollback(client: AppClient) -> None:
    tenant = await new_tenant(client)
    for n in range(1, 8):
        response = await client.put(
            "/v1/profiles/user/10001", json={"document": doc(f"第 {n} 版")}, headers=tenant.headers
        )
        assert response.json()["version"] == n
    revisions = (
        await client.get("/v1/profiles/user/10001/revisions", headers=tenant.headers)
    ).json()
    assert [r["version"] for r in revisions] == [6, 5, 4, 3, 2]
    assert revisions[0]["document"] == doc("第 6 版")
    assert revisions[0]["replaced_by"]["by"] == "api"

    rolled = await client.post(
        "/v1/profiles/user/10001/rollback", json={"version": 3}, headers=tenant.headers
    )
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["document"] == doc("第 3 版")
    assert rolled.json()["version"] == 8
    revisions = (
        await client.get("/v1/profiles/user/10001/revisions", headers=tenant.headers)
    ).json()
    assert revisions[0]["version"] == 7
    assert revisions[0]["replaced_by"] == {
        **revisions[0]["replaced_by"],
        "by": "rollback",
        "to_version": 3,
    }
    gone = await client.post(
        "/v1/profiles/user/10001/rollback", json={"version": 1}, headers=tenant.headers
    )
    assert gone.status_code == 404


async def test_revisions_come_a_page_at_a_time(client: AppClient, db_url: str) -> None:
    tenant = await new_tenant(client)
    h = tenant.headers
    put = await client.put("/v1/profiles/user/10001", json={"document": doc("现在")}, headers=h)
    assert put.status_code in (200, 201), put.text
    # A profile changed 1,234 times over months, every text kept.
    async with raw_connection(db_url) as conn:
        await conn.execute(
            "UPDATE profiles SET version = 1235 WHERE tenant_id = $1 AND profile_key = 'user:10001'",
            uuid.UUID(tenant.id),
        )
        await conn.execute(
            "INSERT INTO profile_revisions (tenant_id, profile_key, version, document)"
            " SELECT $1, 'user:10001', v, '第 ' || v || ' 版' FROM generate_series(1, 1234) AS v",
            uuid.UUID(tenant.id),
        )
    url = "/v1/profiles/user/10001/revisions"

    first = (await client.get(url, headers=h)).json()
    assert [r["version"] for r in first] == list(range(1234, 1184, -1))  # the newest 50
    assert first[0]["document"] == "第 1234 版"
    walked: list[int] = []
    params: dict[str, int] = {"limit": 500}
    while page := (await client.get(url, params=params, headers=h)).json():
        assert len(page) <= 500
        walked += [r["version"] for r in page]
        params["before"] = page[-1]["version"]
    assert walked == list(range(1234, 0, -1))
    member = await client.get(
        "/v1/profiles/member/g1/10001/revisions", params={"limit": 1}, headers=h
    )
    assert member.status_code == 404  # the listing pages; the profile is still looked up

    for path in (url, "/v1/profiles/member/g1/10001/revisions"):
        for name, value in (
            ("before", "1234|x"),
            ("before", "0"),
            ("before", str(2**31)),
            ("before", "' OR 1=1 --"),
            ("limit", "0"),
            ("limit", "501"),
            ("limit", "-1"),
        ):
            response = await client.get(path, params={name: value}, headers=h)
            assert response.status_code == 422, (path, name, value, response.text)
            assert response.json()["field"] == name, response.text


async def test_if_match_protects_against_lost_updates(client: AppClient) -> None:
    tenant = await new_tenant(client)
    await client.put(
        "/v1/profiles/user/10001", json={"document": doc("一")}, headers=tenant.headers
    )
    stale = await client.put(
        "/v1/profiles/user/10001",
        json={"document": doc("二")},
        headers={**tenant.headers, "If-Match": "0"},
    )
    assert stale.status_code == 409
    fresh = await client.put(
        "/v1/profiles/user/10001",
        json={"document": doc("二")},
        headers={**tenant.headers, "If-Match": '"1"'},
    )
    assert fresh.status_code == 200 and fresh.json()["version"] == 2
    current = (await client.get("/v1/profiles/user/10001", headers=tenant.headers)).json()
    assert current["document"] == doc("二")
    # What only looks like a version number is refused by name, and changes nothing.
    for odd in ("²".encode("latin-1"), b"9" * 5000):
        refused = await client.put(
            "/v1/profiles/user/10001",
            json={"document": doc("三")},
            headers={**tenant.headers, "If-Match": odd},
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["field"] == "If-Match"
    current = (await client.get("/v1/profiles/user/10001", headers=tenant.headers)).json()
    assert (current["version"], current["document"]) == (2, doc("二"))


async def test_offline_merge_builds_a_dated_list_and_skips_duplicates(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    await hand_over(client, tenant, request_id="a", observations=["我是后端工程师，主要写 Go"])
    await hand_over(
        client, tenant, request_id="b", observations=["我对花生过敏", "我是后端工程师,主要写Go"]
    )
    member = (await client.get("/v1/profiles/member/g1/10001", headers=tenant.headers)).json()
    assert member["name"] == "张三"
    lines = [line for line in member["body"].splitlines() if line.startswith("- ")]
    # Where someone works is a standing fact: its line stands for the kind, not in the log.
    assert lines == [
        "- 工作：张三(10001)是后端工程师，主要写 Go（2026-02-21）",
        "- 2026-02-21: 张三(10001)对花生过敏",
    ]
    assert member["version"] == 2
    assert member["source_event_id"].startswith("g:g1:b:1.")
    # Facts learned in a group stay out of the global user profile offline.
    assert (await client.get("/v1/profiles/user/10001", headers=tenant.headers)).status_code == 404
    # A group-wide fact reaches the group profile.
    await hand_over(client, tenant, request_id="c", observations=["群规：禁止发广告"])
    group = (await client.get("/v1/profiles/group/g1", headers=tenant.headers)).json()
    assert "禁止发广告" in group["body"] and group["name"] == "Python 群"


@pytest.mark.parametrize("name", ["张三\x7f", "张\x85三", "张三\x9b31m"])
async def test_a_display_name_holding_control_characters_keeps_merging(
    offline: tuple[AppClient, TenantHandle], name: str
) -> None:
    """A chat user's display name is any text: the profile written under it reads back with
    that name, so the next merge goes on from it (and does not rename it again)."""
    client, tenant = offline
    await hand_over(
        client, tenant, request_id="a", observations=["我是后端工程师"], sender_name=name
    )
    job = await hand_over(
        client, tenant, request_id="b", observations=["我喜欢跑步"], sender_name=name
    )
    assert job["status"] == "done", job
    await hand_over(client, tenant, request_id="c", memo="回答了问题", sender_name=name)
    member = (await client.get("/v1/profiles/member/g1/10001", headers=tenant.headers)).json()
    assert member["name"] == name and member["version"] == 2
    assert "后端工程师" in member["body"] and "跑步" in member["body"]
    assert parse(member["document"]).name == name


async def test_the_longest_ids_of_colons_and_percents_keep_their_profiles(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    """Ids are up to 128 characters of anything but '/': in a profile's key each ':' and '%'
    is escaped to three, so a member of such a group is a key of some 780 characters. Kept
    in 300, the end job of every turn of that member failed for good."""
    client, tenant = offline
    group, sender = ":" * 128, "%" * 64 + ":" * 64
    turn = {"group_id": group, "sender_id": sender, "observations": ["我是后端工程师"]}
    assert (await hand_over(client, tenant, request_id="a", **turn))["status"] == "done"
    job = await hand_over(
        client, tenant, request_id="b", **{**turn, "observations": ["我喜欢跑步"]}
    )
    assert job["status"] == "done", job
    member = await client.get(
        f"/v1/profiles/member/{quote(group, safe='')}/{quote(sender, safe='')}",
        headers=tenant.headers,
    )
    assert member.status_code == 200, member.text
    assert "后端工程师" in member.json()["body"] and "跑步" in member.json()["body"]
    revisions = await client.get(
        f"/v1/profiles/member/{quote(group, safe='')}/{quote(sender, safe='')}/revisions",
        headers=tenant.headers,
    )
    assert revisions.status_code == 200 and len(revisions.json()) >= 1


async def test_a_new_display_name_is_taken_without_the_llm(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    await client.put(
        "/v1/profiles/member/g1/10001",
        json={
            "document": doc("老成员").replace(
                "entity_type: user", "entity_type: member\ngroup_id: g1"
            )
        },
        headers=tenant.headers,
    )
    llm.script(
        tool("submit_rewrite", {"rewrites": [{"index": 0, "text": "小助手(20002)回答了问题"}]})
    )
    job = await hand_over(client, tenant, request_id="n1", memo="回答了问题", sender_name="张三丰")
    assert job["result"]["profile_llm_calls"] == 0
    assert len(llm.chat_requests) == 1  # the rewrite only
    member = (await client.get("/v1/profiles/member/g1/10001", headers=tenant.headers)).json()
    assert member["name"] == "张三丰" and member["version"] == 2
    assert "老成员" in member["body"]


async def test_front_matter_too_deep_to_render_is_refused_and_merges_go_on(
    offline: tuple[AppClient, TenantHandle], tmp_path: Path
) -> None:
    client, tenant = offline
    member = doc("老成员").replace("entity_type: user", "entity_type: member\ngroup_id: g1")
    deep = member.replace("tags: []", f"tags: []\nnotes: {'[' * 400}{']' * 400}")
    url = "/v1/profiles/member/g1/10001"
    response = await client.put(url, json={"document": deep}, headers=tenant.headers)
    # Stored, it broke every later render of the profile: each job of the person failed.
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "document"
    assert (await client.put(url, json={"document": member}, headers=tenant.headers)).is_success
    job = await hand_over(client, tenant, observations=["张三(10001)在 2026-02-20 搬到了上海"])
    assert job["status"] == "done", job
    assert "上海" in (await client.get(url, headers=tenant.headers)).json()["body"]
    # The importer leaves such a file out, naming it, instead of failing the whole run.
    users = tmp_path / "profiles" / "users"
    users.mkdir(parents=True)
    (users / "10001.md").write_text(deep.replace("member", "user"), encoding="utf-8")
    source = read_source(tmp_path, "Asia/Shanghai")
    assert source.profiles == []
    assert [s.origin for s in source.skipped] == ["profiles/users/10001.md"]


async def test_a_profile_stored_before_todays_checks_still_merges(
    db_url: str, offline: tuple[AppClient, TenantHandle]
) -> None:
    client, tenant = offline
    # Accepted by an earlier release: a name given as a list, a part repeated by alias.
    legacy = (
        doc("老成员", name="[张三, 老张]")
        .replace("entity_type: user", "entity_type: member\ngroup_id: g1")
        .replace("tags: []", "tags: []\nseen: &days [周一, 周三]\nalso: *days")
    )
    db = Database(db_url)
    async with db.tenant(uuid.UUID(tenant.id)) as session:
        profile = parse(legacy, stored=True)
        await repository.write(
            session,
            uuid.UUID(tenant.id),
            profile,
            legacy,
            None,
            expected=None,
            replaced_by={},
            keep=5,
        )
    await db.dispose()
    job = await hand_over(client, tenant, observations=["张三(10001)在 2026-02-20 搬到了上海"])
    assert job["status"] == "done", job
    url = "/v1/profiles/member/g1/10001"
    body = (await client.get(url, headers=tenant.headers)).json()["body"]
    assert "老成员" in body and "上海" in body


async def test_the_llm_reads_then_updates(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    member_doc = (
        '---\nentity_type: member\nentity_id: "10001"\ngroup_id: "g1"\nname: 张三\n'
        'tags: ["后端工程师"]\nupdated_at: "2026-01-01T00:00:00+08:00"\n---\n'
        "# 成员侧写\n张三是群里的 Go 后端工程师，对花生过敏。\n"
    )
    llm.script(
        tool("submit_rewrite", {"rewrites": [{"index": 0, "text": "张三(10001)对花生过敏"}]}),
        tool("read_profile", {"entity_type": "member", "entity_id": "10001", "group_id": "g1"}),
        tool(
            "update_profile",
            {
                "entity_type": "member",
                "entity_id": "10001",
                "group_id": "g1",
                "document": member_doc,
            },
        ),
        Reply(content="done"),
    )
    job = await hand_over(client, tenant, request_id="llm-1", observations=["我对花生过敏"])
    assert job["status"] == "done", job
    assert job["result"]["profile_llm_calls"] == 3
    tool_results = [m for m in llm.chat_requests[2]["messages"] if m["role"] == "tool"]
    assert "no profile yet" in tool_results[0]["content"]
    assert 'entity_id: "10001"' in tool_results[0]["content"]
    member = (await client.get("/v1/profiles/member/g1/10001", headers=tenant.headers)).json()
    assert "对花生过敏" in member["body"] and member["tags"] == ["后端工程师"]
    assert member["source_event_id"] == "g:g1:llm-1:1.1"
    # updated_at is system-owned (the event's time), not what the model wrote.
    assert datetime.fromisoformat(member["updated_at"]) == datetime.fromisoformat(
        "2026-02-21T23:30:00+08:00"
    )
    assert 'updated_at: "2026-02-21T23:30:00+08:00"' in member["document"]
    # The model was offered the member, the group and the user, and changed only the member.
    assert (await client.get("/v1/profiles/group/g1", headers=tenant.headers)).status_code == 404


async def test_malformed_llm_output_is_refused_and_leaves_the_profile(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    client, tenant = online
    llm.script(
        tool("submit_rewrite", {"rewrites": [{"index": 0, "text": "张三(10001)喜欢 Rust"}]}),
        tool(
            "update_profile",
            {
                "entity_type": "member",
                "entity_id": "10001",
                "group_id": "g1",
                "document": "just text, no front matter",
            },
        ),
        tool(
            "update_profile",
            {"entity_type": "group", "entity_id": "other-group", "document": doc("x")},
        ),
        tool(
            "update_profile",
            {
                "entity_type": "member",
                "entity_id": "10001",
                "group_id": "g1",
                "document": doc("张三喜欢 Rust")
                .replace("entity_type: user", "entity_type: member")
                .replace("tags: []", "group_id: g1\ntags: []\nbirthday: 2026-02-30"),
            },
        ),
        Reply(content="I give up"),
    )
    job = await hand_over(client, tenant, request_id="bad-1", observations=["我喜欢 Rust"])
    assert job["status"] == "done"
    notes = job["result"]["notes"]
    assert any("front matter" in n for n in notes)
    assert any("not a target" in n for n in notes)
    assert any("day is out of range" in n for n in notes)
    refusal = next(m for m in llm.chat_requests[2]["messages"] if m["role"] == "tool")["content"]
    assert refusal.startswith("refused")
    assert (
        await client.get("/v1/profiles/member/g1/10001", headers=tenant.headers)
    ).status_code == 404
    assert (
        await client.get("/v1/profiles/group/other-group", headers=tenant.headers)
    ).status_code == 404


async def test_two_merges_at_once_lose_nothing(db_url: str) -> None:
    settings = Settings(database_url=db_url)
    db = Database(db_url)
    embedder = build_embedder(EmbeddingModelSettings())
    merger = ProfileMerger(embedder, None, settings)
    async with db.system() as session:
        tenant, _ = await create_tenant(session, "race", {}, settings)
    key = ProfileKey("member", "10001", "g1")
    moment = datetime(2026, 2, 21, 23, 30, tzinfo=ZoneInfo("Asia/Shanghai"))
    both_read = asyncio.Barrier(2)
    real_get_many = repository.get_many
    reads = 0

    async def get_then_wait(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        rows = await real_get_many(*args, **kwargs)
        reads += 1
        if reads <= 2:
            await both_read.wait()  # both merges hold the same stale version before writing
        return rows

    async def merge(fact: str) -> dict[str, int]:
        async with db.tenant(tenant.id) as session:
            target = Target(key, "张三", [Fact(fact, "2026-02-21")])
            return await merger.write(
                session, tenant.id, [target], {}, moment, {"by": "test"}, model_decided=False
            )

    repository.get_many = get_then_wait  # type: ignore[assignment]
    try:
        await asyncio.gather(merge("张三(10001)喜欢 Rust"), merge("张三(10001)住在杭州"))
    finally:
        repository.get_many = real_get_many  # type: ignore[assignment]
    async with db.tenant(tenant.id) as session:
        row = await repository.get(session, tenant.id, key)
    assert row is not None
    assert "喜欢 Rust" in row["body"] and "住在杭州" in row["body"]
    assert row["version"] == 2
    await embedder.close()
    await db.dispose()


async def test_search_by_meaning_keeps_members_in_their_group(client: AppClient) -> None:
    tenant = await new_tenant(client)
    member = lambda gid, uid, body: (  # noqa: E731
        f'---\nentity_type: member\nentity_id: "{uid}"\ngroup_id: "{gid}"\nname: n{uid}\n'
        f'tags: []\nupdated_at: "2026-02-22T10:30:00+08:00"\n---\n{body}\n'
    )
    await client.put(
        "/v1/profiles/member/g1/1",
        json={"document": member("g1", "1", "喜欢摄影和单反相机")},
        headers=tenant.headers,
    )
    await client.put(
        "/v1/profiles/member/g2/2",
        json={"document": member("g2", "2", "摄影爱好者，常拍风景")},
        headers=tenant.headers,
    )
    await client.put(
        "/v1/profiles/user/3",
        json={"document": doc("一位专业的厨师，擅长川菜").replace('"10001"', '"3"')},
        headers=tenant.headers,
    )
    await client.put(
        "/v1/profiles/user/10001", json={"document": doc("职业摄影师")}, headers=tenant.headers
    )

    hits = (
        await client.post(
            "/v1/profiles/search",
            json={"query": "谁喜欢拍照？", "group_id": "g1"},
            headers=tenant.headers,
        )
    ).json()
    keys = [(h["entity_type"], h["entity_id"], h["group_id"]) for h in hits]
    assert ("member", "1", "g1") in keys
    assert all(group in (None, "g1") for _, _, group in keys)  # never g2's member
    assert keys[0] in {("member", "1", "g1"), ("user", "10001", None)}
    plain = (
        await client.post(
            "/v1/profiles/search",
            json={"query": "厨师", "entity_type": "user"},
            headers=tenant.headers,
        )
    ).json()
    assert plain[0]["entity_id"] == "3"
    assert all(h["entity_type"] == "user" for h in plain)
    # Without a group, no member profile at all.
    anywhere = (
        await client.post("/v1/profiles/search", json={"query": "摄影"}, headers=tenant.headers)
    ).json()
    assert all(h["entity_type"] != "member" for h in anywhere)


async def test_a_conversations_profiles_are_listed(client: AppClient) -> None:
    tenant = await new_tenant(client)
    other = await new_tenant(client, "other")

    def document(entity: str, body: str) -> str:
        return (
            f"---\n{entity}name: n\ntags: []\n"
            f'updated_at: "2026-02-22T10:30:00+08:00"\n---\n{body}\n'
        )

    for path, entity in (
        ("member/g1/2", 'entity_type: member\nentity_id: "2"\ngroup_id: "g1"\n'),
        ("member/g1/1", 'entity_type: member\nentity_id: "1"\ngroup_id: "g1"\n'),
        ("member/g2/1", 'entity_type: member\nentity_id: "1"\ngroup_id: "g2"\n'),
        ("group/g1", 'entity_type: group\nentity_id: "g1"\n'),
        ("group/g10", 'entity_type: group\nentity_id: "g10"\n'),
        ("user/1", 'entity_type: user\nentity_id: "1"\n'),
    ):
        response = await client.put(
            f"/v1/profiles/{path}",
            json={"document": document(entity, path)},
            headers=tenant.headers,
        )
        assert response.status_code == 200, response.text

    async def listed(query: str, headers: dict[str, str]) -> list[tuple[str, str, str | None]]:
        response = await client.get(f"/v1/profiles?{query}", headers=headers)
        assert response.status_code == 200, response.text
        return [(p["entity_type"], p["entity_id"], p["group_id"]) for p in response.json()]

    # A group's own profile first, then its members'; never another group's.
    assert await listed("group_id=g1", tenant.headers) == [
        ("group", "g1", None),
        ("member", "1", "g1"),
        ("member", "2", "g1"),
    ]
    assert await listed("user_id=1", tenant.headers) == [("user", "1", None)]
    assert await listed("group_id=g1", other.headers) == []
    for query in ("", "group_id=g1&user_id=1"):
        response = await client.get(f"/v1/profiles?{query}", headers=tenant.headers)
        assert response.status_code == 422 and response.json()["field"] == "group_id"


async def test_remembered_messages_reach_the_members_profile_offline(db_url: str) -> None:
    settings = make_settings(
        db_url, cognitive={"queue": FAST_QUEUE, "extraction": {"every_n_messages": 100}}
    )
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        tenant = await new_tenant(client)
        response = await client.post(
            "/v1/messages",
            json={
                "request_type": "group",
                "group_id": "g1",
                "messages": [
                    {
                        "message_id": "1",
                        "sender_id": "10001",
                        "sender_name": "张三",
                        "text": "今天好热",
                        "sent_at": "2026-03-01T10:00:00+08:00",
                    },
                    {
                        "message_id": "2",
                        "sender_id": "10001",
                        "sender_name": "张三",
                        "text": "记住：我对花生过敏",
                        "sent_at": "2026-03-01T10:01:00+08:00",
                    },
                ],
            },
            headers=tenant.headers,
        )
        [job_id] = response.json()["extraction_job_ids"]
        job = await until_finished(client, tenant, job_id)
        assert job["result"]["messages"] == 2
        member = (await client.get("/v1/profiles/member/g1/10001", headers=tenant.headers)).json()
        assert "- 2026-03-01: 张三(10001)对花生过敏" in member["body"]
        assert "好热" not in member["body"]


async def test_a_word_holding_remember_or_note_asks_nothing_offline(db_url: str) -> None:
    settings = make_settings(
        db_url, cognitive={"queue": FAST_QUEUE, "extraction": {"every_n_messages": 100}}
    )
    lines = [
        "I bought a notebook yesterday",
        "I remembered my keys",
        "see the keynote",
        "Please remember that I moved to Berlin",
    ]
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        tenant = await new_tenant(client)
        response = await client.post(
            "/v1/messages",
            json={
                "request_type": "group",
                "group_id": "g1",
                "messages": [
                    {
                        "message_id": str(n),
                        "sender_id": "10001",
                        "sender_name": "Anna",
                        "text": text,
                        "sent_at": f"2026-03-01T10:0{n}:00+08:00",
                    }
                    for n, text in enumerate(lines)
                ],
            },
            headers=tenant.headers,
        )
        [job_id] = response.json()["extraction_job_ids"]
        job = await until_finished(client, tenant, job_id)
        assert job["result"]["messages"] == 4
        member = (await client.get("/v1/profiles/member/g1/10001", headers=tenant.headers)).json()
        facts = [line for line in member["body"].splitlines() if line.startswith("- ")]
        # Only the one asking; before, "abook", "Ied Anna (10001)'s keys" and "the key" too.
        assert len(facts) == 1 and "Anna (10001) moved to Berlin" in facts[0], facts


def test_render_keeps_extra_front_matter_keys() -> None:
    profile = Profile(
        ProfileKey("group", "g1"),
        "群",
        [],
        datetime(2026, 1, 1, tzinfo=ZoneInfo("UTC")),
        None,
        "正文",
        {"mood": "calm"},
    )
    assert parse(render(profile)).extra == {"mood": "calm"}


async def test_another_tenant_cannot_see_or_change_a_profile(client: AppClient) -> None:
    a = await new_tenant(client, "a")
    b = await new_tenant(client, "b")
    await client.put(
        "/v1/profiles/user/10001", json={"document": doc("B 的秘密")}, headers=b.headers
    )
    assert (await client.get("/v1/profiles/user/10001", headers=a.headers)).status_code == 404
    revisions = await client.get("/v1/profiles/user/10001/revisions", headers=a.headers)
    assert revisions.status_code == 404
    rollback = await client.post(
        "/v1/profiles/user/10001/rollback", json={"version": 1}, headers=a.headers
    )
    assert rollback.status_code == 404
    found = await client.post("/v1/profiles/search", json={"query": "秘密"}, headers=a.headers)
    assert found.json() == []
    # A writing "the same" profile creates A's own; B's is untouched.
    await client.put("/v1/profiles/user/10001", json={"document": doc("A 的")}, headers=a.headers)
    theirs = (await client.get("/v1/profiles/user/10001", headers=b.headers)).json()
    assert "B 的秘密" in theirs["body"] and theirs["version"] == 1
