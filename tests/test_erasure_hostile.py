"""Erasure, export, forgetting and the audit trail against a hostile chat user or tenant."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.app import create_app
from service.audit import service as audit
from tests.conftest import (
    ADMIN,
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
)

G = {"request_type": "group", "group_id": "g1", "bot_id": "bot"}


@pytest.fixture
async def running(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(db_url, export_sync_limit=0, audit_failure_window_seconds=60)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        yield client, await new_tenant(client)


async def say(client: AppClient, tenant: TenantHandle, *lines: tuple[str, str, str]) -> None:
    messages = [
        {"message_id": f"m{i}", "sender_id": s, "sender_name": n, "text": t}
        for i, (s, n, t) in enumerate(lines)
    ]
    r = await client.post("/v1/messages", json={**G, "messages": messages}, headers=tenant.headers)
    assert r.status_code == 202, r.text


async def rows(db_url: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    async with raw_connection(db_url) as conn:
        return [dict(r) for r in await conn.fetch(sql, *args)]


async def others(db_url: str) -> str:
    """Everything that is not the erasure's own record, as one comparable text."""
    parts = []
    for table in ("messages", "memories", "memos", "jobs", "events", "profiles"):
        found = await rows(db_url, f"SELECT to_jsonb(x)::text AS j FROM {table} AS x ORDER BY 1")
        parts.append(json.dumps([r["j"] for r in found]))
    return "\n".join(parts)


async def test_erasing_someone_never_deletes_or_changes_others_data(
    running: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = running
    await say(
        client,
        tenant,
        ("u-is", "is", "hello"),
        ("u-bob", "Bob", "Bob is from Paris"),
        ("u-alice", "Alice", "Alice has 2 cats (and 100% * of them)"),
    )
    await client.post(
        "/v1/memories",
        json={"scope": "GROUP", "group_id": "g1", "content": "Alice has 2 cats .. (really)"},
        headers=tenant.headers,
    )
    for n in range(3):
        end = {**G, "sender_id": "u-alice", "request_id": f"a{n}", "memo": "Alice has 2 cats"}
        assert (await client.post("/v1/end", json=end, headers=tenant.headers)).status_code == 202
    before = await others(db_url)
    # Nobody with these ids has any data: nothing may change.
    for subject in ("2", "*", "(", "%25", "...", "_", "%5C", "cats"):
        receipt = await client.delete(f"/v1/users/{subject}", headers=tenant.headers)
        assert receipt.status_code == 200, (subject, receipt.text)
    assert await others(db_url) == before
    # "is" has data; Bob's sentence is Bob's, and "is" is an ordinary word.
    receipt = await client.delete("/v1/users/u-is", headers=tenant.headers)
    assert receipt.json()["counts"]["messages"] == 1
    texts = {r["text"] for r in await rows(db_url, "SELECT text FROM messages")}
    assert texts == {"Bob is from Paris", "Alice has 2 cats (and 100% * of them)"}
    assert len(await rows(db_url, "SELECT id FROM jobs WHERE kind = 'historian.end'")) == 3


async def test_a_person_named_like_front_matter_can_be_erased(
    running: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = running
    await say(client, tenant, ("updated_at", "tags", "hi"), ("u2", "Ruth", "tags: is here"))
    document = (
        '---\nentity_type: group\nentity_id: "g1"\nname: tags\ntags: [tags]\n'
        'updated_at: "2026-01-01T00:00:00+08:00"\n---\ntags and Ruth run the group.\n'
    )
    put = await client.put(
        "/v1/profiles/group/g1", json={"document": document}, headers=tenant.headers
    )
    assert put.status_code == 200, put.text
    receipt = await client.delete("/v1/users/updated_at", headers=tenant.headers)
    assert receipt.status_code == 200, receipt.text
    profile = (await client.get("/v1/profiles/group/g1", headers=tenant.headers)).json()
    # The group is named "tags" too: the name is not known to be the person's, so it stays.
    assert profile["body"].strip() == "tags and Ruth run the group."
    texts = {r["text"] for r in await rows(db_url, "SELECT text FROM messages")}
    assert texts == {"tags: is here"}


async def test_mentions_are_redacted_in_place_and_hashes_are_keyed(
    running: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = running
    await say(
        client,
        tenant,
        ("73019", "甄士隐", "我家住在姑苏"),
        ("55502", "贾雨村", "甄士隐资助了我"),
    )
    receipt = await client.delete("/v1/users/73019", headers=tenant.headers)
    assert receipt.status_code == 200
    texts = {r["text"] for r in await rows(db_url, "SELECT text FROM messages")}
    assert texts == {"[已删除用户]资助了我"}
    secret = (await rows(db_url, "SELECT value FROM memoria_meta WHERE key = 'privacy_secret'"))[0][
        "value"
    ]
    [stone] = await rows(db_url, "SELECT subject_hash FROM erasures")
    message = f"{tenant.id}:user:73019".encode()
    assert stone["subject_hash"] != hashlib.sha256(message).hexdigest()
    assert stone["subject_hash"] == hmac.new(secret.encode(), message, "sha256").hexdigest()
    await audit.flush()
    entries = await rows(db_url, "SELECT targets FROM audit_log WHERE outcome = 'erasure'")
    assert entries and all("73019" not in e["targets"] for e in entries)
    assert json.loads(entries[0]["targets"])["subject"] == stone["subject_hash"]


async def test_export_of_metacharacter_subjects(
    running: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    _, tenant = running
    settings = make_settings(db_url)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as streaming:
        for n in range(2):
            document = (
                f'---\nentity_type: member\nentity_id: "x"\ngroup_id: "g1"\nname: X\ntags: []\n'
                f'updated_at: "2026-01-0{n + 1}T00:00:00+08:00"\n---\nversion {n}\n'
            )
            r = await streaming.put(
                "/v1/profiles/member/g1/x", json={"document": document}, headers=tenant.headers
            )
            assert r.status_code == 200, r.text
        for subject in ("%5C", "_", "%25"):
            response = await streaming.get(f"/v1/users/{subject}/export", headers=tenant.headers)
            assert response.status_code == 200
            exported = json.loads(response.content)  # a whole document, not a cut-off one
            assert exported["profile_revisions"] == [] and exported["profiles"] == []
        mine = json.loads(
            (await streaming.get("/v1/users/x/export", headers=tenant.headers)).content
        )
        assert len(mine["profile_revisions"]) == 1


async def test_forget_by_query_spares_unrelated_memories(
    running: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = running
    contents = ["我家的猫叫咪咪", "周末去爬山", "我喜欢喝咖啡", "明天要开会", "Alice has 2 cats"]
    ids = {}
    for content in contents:
        r = await client.post(
            "/v1/memories",
            json={"scope": "GROUP", "group_id": "g1", "content": content},
            headers=tenant.headers,
        )
        ids[r.json()["id"]] = content
    preview = await client.post(
        "/v1/memories/forget", json={"query": "猫", "dry_run": True}, headers=tenant.headers
    )
    assert [ids[i] for i in preview.json()["changed"]] == ["我家的猫叫咪咪"]
    assert len((await client.get("/v1/memories?group_id=g1", headers=tenant.headers)).json()) == 5
    forgot = await client.post("/v1/memories/forget", json={"query": "猫"}, headers=tenant.headers)
    assert [ids[i] for i in forgot.json()["changed"]] == ["我家的猫叫咪咪"]
    left = (await client.get("/v1/memories?group_id=g1", headers=tenant.headers)).json()
    assert sorted(m["content"] for m in left if m["is_active"]) == sorted(contents[1:])


async def test_exports_are_fetched_only_by_who_asked(
    running: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = running
    await say(client, tenant, ("u1", "Ann", "hello"))
    whole = await client.get(f"/admin/tenants/{tenant.id}/export", headers=ADMIN)
    assert whole.status_code == 202
    tenant_export = whole.json()["export_id"]
    assert (
        await client.get(f"/v1/exports/{tenant_export}", headers=tenant.headers)
    ).status_code == 404
    second = (
        await client.post(f"/admin/tenants/{tenant.id}/keys", json={"name": "other"}, headers=ADMIN)
    ).json()
    other = {"Authorization": f"Bearer {second['key']}"}
    mine = (await client.get("/v1/users/u1/export", headers=tenant.headers)).json()["export_id"]
    assert (await client.get(f"/v1/exports/{mine}", headers=other)).status_code == 404
    # Its own: not ready yet (no worker here), but there.
    assert (await client.get(f"/v1/exports/{mine}", headers=tenant.headers)).status_code == 409


async def test_the_audit_actor_is_who_authenticated_and_failures_are_bounded(
    running: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    client, tenant = running
    forged = "Bearer mk_forged0000_" + "x" * 43
    raw = [("authorization", f"Bearer {tenant.key}"), ("authorization", forged)]
    response = await client.post(
        "/v1/memories",
        json={"scope": "GROUP", "group_id": "g1", "content": "x"},
        headers=raw,
    )
    assert response.status_code == 201, response.text
    statuses = []
    for _ in range(40):
        bad = await client.get("/v1/memories", headers={"Authorization": forged})
        statuses.append(bad.status_code)
    assert statuses[0] == 401 and statuses[-1] == 429
    assert "too many failed authentications from this address" in bad.text
    assert int(bad.headers["retry-after"]) >= 1
    # A valid key from the same address still works.
    assert (await client.get("/v1/tenant", headers=tenant.headers)).status_code == 200
    await audit.flush()
    written = await rows(db_url, "SELECT actor, status FROM audit_log ORDER BY id")
    assert {"actor": tenant.prefix, "status": 201} in written
    assert all(r["actor"] != "mk_forged0000" for r in written)
    assert sum(1 for r in written if r["status"] == 401) == 1
