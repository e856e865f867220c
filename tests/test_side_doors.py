"""No side doors between conversations: keys that cannot collide, write requests that refuse
what they do not know, webhooks that cannot probe the network, private chats that stay
private."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
from alembic import command

from service.db.migrate import alembic_config
from service.settings import Settings
from tests.conftest import AppClient, DatabaseFactory, new_tenant, plain_dsn


def member_doc(group_id: str, user_id: str, text: str) -> str:
    return (
        f'---\nentity_type: member\nentity_id: "{user_id}"\ngroup_id: "{group_id}"\n'
        f'name: n\ntags: []\nupdated_at: "2026-02-22T10:30:00+08:00"\n---\n{text}\n'
    )


# --- profile keys -------------------------------------------------------------------------


async def test_member_profiles_with_colons_in_ids_are_two_profiles(client: AppClient) -> None:
    """Member C of group X:Y and member Y:C of group X are two people; each keeps their own
    profile (Matrix ids hold ':')."""
    tenant = await new_tenant(client)
    for group_id, user_id, text in (("X:Y", "C", "first person"), ("X", "Y:C", "second person")):
        response = await client.put(
            f"/v1/profiles/member/{group_id}/{user_id}",
            json={"document": member_doc(group_id, user_id, text)},
            headers=tenant.headers,
        )
        assert response.status_code == 200, response.text
    first = await client.get("/v1/profiles/member/X:Y/C", headers=tenant.headers)
    second = await client.get("/v1/profiles/member/X/Y:C", headers=tenant.headers)
    assert "first person" in first.json()["body"]
    assert "second person" in second.json()["body"]
    assert first.json()["version"] == second.json()["version"] == 1
    listed = await client.get("/v1/profiles/", params={"group_id": "X"}, headers=tenant.headers)
    assert [p["entity_id"] for p in listed.json() if p["entity_type"] == "member"] == ["Y:C"]


async def test_migration_rewrites_member_keys_and_their_revisions(
    databases: DatabaseFactory,
) -> None:
    """A database written with the old keys reads the same profiles after the upgrade: the
    member key is escaped, its revisions move with it, user and group keys stay."""
    url = await databases.create_empty()
    config = alembic_config(url, Settings())
    await asyncio.to_thread(command.upgrade, config, "0010")
    tenant = uuid.uuid4()
    conn = await asyncpg.connect(plain_dsn(url))
    try:
        await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, 't')", tenant)
        rows = [
            ("member:g:1:u%2", "member", "u%2", "g:1"),
            ("user:a:b", "user", "a:b", None),
            ("group:g:1", "group", "g:1", None),
        ]
        for key, kind, entity, group in rows:
            await conn.execute(
                """INSERT INTO profiles (tenant_id, profile_key, entity_type, entity_id, group_id,
                                         name, tags, document, body, version, updated_at)
                   VALUES ($1, $2, $3, $4, $5, 'n', '[]', 'doc', 'body', 2, now())""",
                tenant,
                key,
                kind,
                entity,
                group,
            )
            await conn.execute(
                """INSERT INTO profile_revisions (tenant_id, profile_key, version, document)
                   VALUES ($1, $2, 1, 'old')""",
                tenant,
                key,
            )
        await asyncio.to_thread(command.upgrade, config, "head")
        keys = {
            r["profile_key"] for r in await conn.fetch("SELECT profile_key FROM profile_revisions")
        }
        assert keys == {"member:g%3A1:u%252", "user:a:b", "group:g:1"}
        current = await conn.fetch("SELECT profile_key FROM profiles ORDER BY profile_key")
        assert sorted(r["profile_key"] for r in current) == sorted(keys)
    finally:
        await conn.close()
    await asyncio.to_thread(command.downgrade, config, "0010")
    conn = await asyncpg.connect(plain_dsn(url))
    try:
        back = await conn.fetchval(
            "SELECT profile_key FROM profile_revisions WHERE profile_key LIKE 'member%'"
        )
        assert back == "member:g:1:u%2"
    finally:
        await conn.close()


# --- unknown fields -----------------------------------------------------------------------

PRIVATE = {"request_type": "private", "user_id": "u1", "sender_id": "u1"}


async def test_end_refuses_an_unknown_field_by_name(client: AppClient) -> None:
    """``observation`` (a typo of ``observations``) is a 422 naming it, not a 200 that stores
    nothing; the documented older names still work."""
    tenant = await new_tenant(client)
    response = await client.post(
        "/v1/end", json={**PRIVATE, "observation": ["u1 likes tea"]}, headers=tenant.headers
    )
    assert response.status_code == 422, response.text
    assert "observation" in response.text
    legacy = await client.post(
        "/v1/end",
        json={**PRIVATE, "action_summary": "answered", "new_info": "u1 likes tea"},
        headers=tenant.headers,
    )
    assert legacy.status_code == 202, legacy.text
    assert legacy.json()["memo_recorded"] is True
    assert len(legacy.json()["event_ids"]) == 2


async def test_messages_refuse_unknown_fields_and_keep_shared_context(client: AppClient) -> None:
    """An unknown field of a message or of the batch is named in a 422; the context given once
    at the batch's top level still applies to its messages."""
    tenant = await new_tenant(client)
    message = {"message_id": "m1", "text": "hello", "sent_at": "2026-02-21T10:00:00+08:00"}
    for body, field in (
        ({**PRIVATE, "messages": [{**message, "txt": "typo"}]}, "txt"),
        ({**PRIVATE, "mesages": [message], "messages": [message]}, "mesages"),
    ):
        response = await client.post("/v1/messages", json=body, headers=tenant.headers)
        assert response.status_code == 422, response.text
        assert field in response.text
    stored = await client.post(
        "/v1/messages", json={**PRIVATE, "messages": [message]}, headers=tenant.headers
    )
    assert stored.status_code == 202, stored.text
    assert stored.json()["stored"] == 1
