"""Tenants, keys and isolation: through the API, and underneath it by row-level security."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from service.app import create_app
from service.db.engine import Database
from service.errors import Conflict, Unauthorized
from service.jobs import periodic
from service.tenants import service as tenants
from tests.conftest import ADMIN, AppClient, make_settings, new_tenant, raw_connection, serve_app


async def test_admin_creates_tenant_with_a_working_first_key(client: AppClient) -> None:
    response = await client.post("/admin/tenants", json={"name": "群机器人"}, headers=ADMIN)
    assert response.status_code == 201
    body = response.json()
    key = body["api_key"]["key"]
    assert body["tenant_id"] == body["id"]
    assert body["name"] == "群机器人"
    assert key.startswith(body["api_key"]["prefix"] + "_")

    me = await client.get("/v1/tenant", headers={"Authorization": f"Bearer {key}"})
    assert me.status_code == 200
    assert me.json()["tenant_id"] == body["tenant_id"]

    listed = await client.get(f"/admin/tenants/{body['tenant_id']}/keys", headers=ADMIN)
    assert listed.status_code == 200
    assert [k["prefix"] for k in listed.json()] == [body["api_key"]["prefix"]]
    assert "key" not in listed.json()[0]  # the secret is never shown again
    assert key not in listed.text


async def test_admin_routes_need_the_admin_token(client: AppClient) -> None:
    assert (await client.post("/admin/tenants", json={"name": "x"})).status_code == 401
    wrong = {"Authorization": "Bearer not-the-token"}
    assert (
        await client.post("/admin/tenants", json={"name": "x"}, headers=wrong)
    ).status_code == 401
    tenant = await new_tenant(client)
    # A tenant key is not an admin token.
    response = await client.get("/admin/tenants", headers=tenant.headers)
    assert response.status_code == 401


async def test_admin_api_is_disabled_without_a_token(db_url: str) -> None:
    app = create_app(make_settings(db_url, admin_token=None), migrate=False, run_worker=False)
    async with serve_app(app) as client:
        response = await client.post("/admin/tenants", json={"name": "x"}, headers=ADMIN)
        assert response.status_code == 401
        assert "disabled" in response.json()["message"]


async def test_the_tenants_come_a_page_at_a_time(client: AppClient, db_url: str) -> None:
    # One service hosts thousands of bot instances, a tenant each: the list was one answer of
    # every tenant with its settings, and the console read it whole at every admin sign-in.
    # Tenants made in one transaction share their creation time: the id breaks the tie.
    made = (await client.post("/admin/tenants", json={"name": "第一"}, headers=ADMIN)).json()
    async with raw_connection(db_url) as conn:
        await conn.execute(
            "INSERT INTO tenants (id, name, settings, created_at)"
            " SELECT gen_random_uuid(), 'bot ' || n || ' :%/', '{}',"
            " now() + (n / 7) * interval '1 second' FROM generate_series(1, 1233) AS n"
        )
        expected = [
            str(r["id"]) for r in await conn.fetch("SELECT id FROM tenants ORDER BY created_at, id")
        ]
    first = (await client.get("/admin/tenants", headers=ADMIN)).json()
    assert len(first) == 100 and first[0]["id"] == made["id"]
    walked: list[str] = []
    after: str | None = None
    while True:
        query = f"?limit=500&after={after}" if after else "?limit=500"
        page = await client.get("/admin/tenants" + query, headers=ADMIN)
        assert page.status_code == 200, page.text
        walked += [t["id"] for t in page.json()]
        if len(page.json()) < 500:
            break
        after = walked[-1]
    assert walked == expected and len(set(walked)) == 1234
    last = await client.get(f"/admin/tenants?after={walked[-1]}", headers=ADMIN)
    assert last.status_code == 200 and last.json() == []
    for query, name in [
        ("?limit=0", "limit"),
        ("?limit=501", "limit"),
        ("?limit=x", "limit"),
        ("?after=1%3A2", "after"),
        ("?after=..%2F..", "after"),
    ]:
        refused = await client.get("/admin/tenants" + query, headers=ADMIN)
        assert refused.status_code == 422, (query, refused.text)
        assert name in refused.text, (query, refused.text)
    # A tenant erased while the admin pages: its id no longer tells where the page starts.
    gone = await client.get(f"/admin/tenants?after={uuid.uuid4()}", headers=ADMIN)
    assert gone.status_code == 404 and "after" in gone.text
    await tenants_listed_by_the_command_line(db_url, expected)


async def tenants_listed_by_the_command_line(db_url: str, expected: list[str]) -> None:
    db = Database(db_url)
    try:
        async with db.system() as session:
            listed = [t.id async for t in tenants.list_all(session, page=100)]
    finally:
        await db.dispose()
    assert [str(i) for i in listed] == expected


async def test_missing_malformed_and_revoked_keys_get_401(client: AppClient) -> None:
    tenant = await new_tenant(client)
    assert (await client.get("/v1/tenant")).status_code == 401
    for header in ("Bearer", "Basic abc", "Bearer mk_short", "Bearer " + tenant.key + "x", "token"):
        response = await client.get("/v1/tenant", headers={"Authorization": header})
        assert response.status_code == 401, header
        assert response.json()["error"] == "unauthorized"
    # A well-formed key that was never issued.
    forged = tenant.prefix + "_" + "A" * 43
    assert (
        await client.get("/v1/tenant", headers={"Authorization": f"Bearer {forged}"})
    ).status_code == 401

    second = await client.post("/v1/keys", json={"name": "spare"}, headers=tenant.headers)
    assert second.status_code == 201
    spare = {"Authorization": f"Bearer {second.json()['key']}"}
    assert (await client.get("/v1/tenant", headers=spare)).status_code == 200
    revoked = await client.delete(f"/v1/keys/{second.json()['id']}", headers=tenant.headers)
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"] is not None
    assert (await client.get("/v1/tenant", headers=spare)).status_code == 401
    assert (await client.get("/v1/tenant", headers=tenant.headers)).status_code == 200


async def test_a_key_checked_while_its_revocation_commits_is_not_kept(db_url: str) -> None:
    # A request checked between the revocation and its commit reads the key as still good;
    # what it cached then must not outlive the commit by auth_cache_seconds.
    settings = make_settings(db_url, auth_cache_seconds=60)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        await _revoked_while_checked(client)


async def _revoked_while_checked(client: AppClient) -> None:
    tenant = await new_tenant(client)
    second = await client.post("/v1/keys", json={"name": "spare"}, headers=tenant.headers)
    runtime = client.app.state.runtime
    bearer = f"Bearer {second.json()['key']}"
    async with runtime.db.system() as session:
        await tenants.revoke_key(
            session, runtime.auth, uuid.UUID(tenant.id), uuid.UUID(second.json()["id"])
        )
        checked = await runtime.auth.authenticate(bearer)  # before the commit: still good
        assert str(checked.tenant_id) == tenant.id
    with pytest.raises(Unauthorized):
        await runtime.auth.authenticate(bearer)
    spare = {"Authorization": bearer}
    assert (await client.get("/v1/tenant", headers=spare)).status_code == 401


async def test_admin_revocation_takes_effect(client: AppClient) -> None:
    tenant = await new_tenant(client)
    keys = (await client.get(f"/admin/tenants/{tenant.id}/keys", headers=ADMIN)).json()
    response = await client.delete(
        f"/admin/tenants/{tenant.id}/keys/{keys[0]['id']}", headers=ADMIN
    )
    assert response.status_code == 200
    assert (await client.get("/v1/tenant", headers=tenant.headers)).status_code == 401


async def test_keys_used_once_are_not_held_past_their_cache_time(db_url: str) -> None:
    # A tenant minting keys and using each once: a process kept every checked key, with its
    # tenant's settings (a persona of up to 20,000 characters), until it stopped.
    settings = make_settings(db_url, auth_cache_seconds=0.5, max_keys_per_tenant=300)
    async with serve_app(create_app(settings, migrate=False)) as client:
        tenant = await new_tenant(client)
        await client.put("/v1/persona", json={"text": "人设" * 10_000}, headers=tenant.headers)
        for _ in range(200):
            minted = await client.post("/v1/keys", headers=tenant.headers)
            used = {"Authorization": f"Bearer {minted.json()['key']}"}
            assert (await client.get("/v1/tenant", headers=used)).status_code == 200
        auth = client.app.state.runtime.auth
        await asyncio.sleep(0.6)
        assert (await client.get("/v1/tenant", headers=tenant.headers)).status_code == 200
        assert len(auth._cache) == 1  # the key in use, not the 200 used once before


async def test_a_tenant_holds_a_bounded_number_of_keys(db_url: str) -> None:
    # Each key has a rate limit of its own: a tenant minting keys without end had a rate
    # without end, and a table of keys that only grew.
    settings = make_settings(db_url, max_keys_per_tenant=3)
    async with serve_app(create_app(settings, migrate=False)) as client:
        tenant = await new_tenant(client)  # its first key
        made = [await client.post("/v1/keys", headers=tenant.headers) for _ in range(2)]
        assert [m.status_code for m in made] == [201, 201]
        refused = await client.post("/v1/keys", headers=tenant.headers)
        assert refused.status_code == 409 and "at most 3" in refused.json()["message"]
        by_admin = await client.post(f"/admin/tenants/{tenant.id}/keys", headers=ADMIN)
        assert by_admin.status_code == 409
        await client.delete(f"/v1/keys/{made[0].json()['id']}", headers=tenant.headers)
        # One place is free again: the next key takes it.
        again = await client.post("/v1/keys", headers=tenant.headers)
        assert again.status_code == 201
        keys = (await client.get("/v1/keys", headers=tenant.headers)).json()
        assert sum(k["revoked_at"] is None for k in keys) == 3


async def test_revoked_keys_are_forgotten_after_their_retention(db_url: str) -> None:
    # Made and revoked in a loop, keys stay under the cap and the table grew without end.
    settings = make_settings(db_url, revoked_key_retention_days=30)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        tenant = await new_tenant(client)
        made = [(await client.post("/v1/keys", headers=tenant.headers)).json() for _ in range(3)]
        for key in made[:2]:
            await client.delete(f"/v1/keys/{key['id']}", headers=tenant.headers)
        async with raw_connection(db_url) as conn:
            await conn.execute(
                "UPDATE api_keys SET revoked_at = now() - interval '31 days' WHERE id = $1",
                uuid.UUID(made[0]["id"]),
            )
        (prune,) = [p for p in periodic(client.app.state.runtime) if p.name == "key-prune"]
        assert await prune.run() == 1
        kept = {k["id"] for k in (await client.get("/v1/keys", headers=tenant.headers)).json()}
        assert made[0]["id"] not in kept and {made[1]["id"], made[2]["id"]} <= kept
        assert (await client.get("/v1/tenant", headers=tenant.headers)).status_code == 200


async def test_keys_made_and_revoked_in_a_loop_keep_the_table_bounded(db_url: str) -> None:
    # Under the cap of unrevoked keys, a tenant could still make and revoke keys in a loop:
    # each revoked key stayed for its 30 days of retention, in the table and in every
    # listing of the tenant's keys.
    settings = make_settings(db_url, max_keys_per_tenant=4)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        tenant = await new_tenant(client)
        other = await new_tenant(client, "other")
        theirs = (await client.post("/v1/keys", headers=other.headers)).json()
        await client.delete(f"/v1/keys/{theirs['id']}", headers=other.headers)
        revoked = []
        for _ in range(40):
            made = (await client.post("/v1/keys", headers=tenant.headers)).json()
            await client.delete(f"/v1/keys/{made['id']}", headers=tenant.headers)
            revoked.append(made["id"])
        keys = (await client.get("/v1/keys", headers=tenant.headers)).json()
        assert sum(k["revoked_at"] is None for k in keys) == 1  # the first key
        # The last revoked are kept: the 36th to 39th when the 40th was made, and the 40th.
        assert {k["id"] for k in keys if k["revoked_at"]} == set(revoked[-5:])
        assert (await client.get("/v1/tenant", headers=tenant.headers)).status_code == 200
        listed = (await client.get("/v1/keys", headers=other.headers)).json()
        assert theirs["id"] in {k["id"] for k in listed}  # another tenant's are not touched


async def test_keys_made_at_once_take_turns_at_the_cap(db_url: str) -> None:
    # Two keys made at once both counted the keys before either was stored.
    settings = make_settings(db_url, max_keys_per_tenant=2)
    db = Database(db_url, pool_size=2)
    try:
        async with db.system() as session:
            tenant, _ = await tenants.create_tenant(session, "keys at once", {}, settings)

        async def make() -> None:
            async with db.system() as session:
                await tenants.create_key(session, tenant.id, "second", settings)

        async with db.system() as session:
            await tenants.create_key(session, tenant.id, "first", settings)  # 2 of 2
            other = asyncio.create_task(make())
            await asyncio.sleep(0.3)
            assert not other.done()  # it waits for this transaction's end
        with pytest.raises(Conflict):
            await other
    finally:
        await db.dispose()


async def test_key_last_used_time_is_recorded(client: AppClient, db_url: str) -> None:
    tenant = await new_tenant(client)
    assert (await client.get("/v1/tenant", headers=tenant.headers)).status_code == 200
    await client.app.state.runtime.auth.flush_usage()
    keys = (await client.get(f"/admin/tenants/{tenant.id}/keys", headers=ADMIN)).json()
    assert keys[0]["last_used_at"] is not None


async def test_one_tenant_cannot_touch_anothers_keys_or_jobs(client: AppClient) -> None:
    a = await new_tenant(client, "a")
    b = await new_tenant(client, "b")
    b_keys = (await client.get("/v1/keys", headers=b.headers)).json()
    b_key_id = b_keys[0]["id"]

    # A sees only its own keys, and B's key id is "not found" for A, not "forbidden".
    a_keys = (await client.get("/v1/keys", headers=a.headers)).json()
    assert b_key_id not in {k["id"] for k in a_keys}
    response = await client.delete(f"/v1/keys/{b_key_id}", headers=a.headers)
    assert response.status_code == 404
    assert (await client.get("/v1/tenant", headers=b.headers)).status_code == 200

    # B's job is invisible to A and cannot be retried by A.
    runtime = client.app.state.runtime
    from service.queue.repository import enqueue

    async with runtime.db.tenant(uuid.UUID(b.id)) as session:
        job_id, _ = await enqueue(session, uuid.UUID(b.id), "test.noop", {"secret": "b-only"})
    assert (await client.get(f"/v1/jobs/{job_id}", headers=a.headers)).status_code == 404
    assert (await client.post(f"/v1/jobs/{job_id}/retry", headers=a.headers)).status_code == 404
    a_jobs = (await client.get("/v1/jobs", headers=a.headers)).json()["jobs"]
    assert a_jobs == []
    b_jobs = (await client.get("/v1/jobs", headers=b.headers)).json()["jobs"]
    assert [j["id"] for j in b_jobs] == [job_id]

    # A's settings change does not change B's.
    patched = await client.patch(
        "/v1/settings", json={"query": {"auto_top_k": 7}}, headers=a.headers
    )
    assert patched.status_code == 200
    assert (await client.get("/v1/settings", headers=b.headers)).json()["query"]["auto_top_k"] == 3


async def test_row_level_security_hides_other_tenants_from_raw_sql(
    client: AppClient, db_url: str
) -> None:
    a = await new_tenant(client, "a")
    b = await new_tenant(client, "b")
    runtime = client.app.state.runtime
    from service.queue.repository import enqueue

    for tenant in (a, b):
        async with runtime.db.tenant(uuid.UUID(tenant.id)) as session:
            await enqueue(session, uuid.UUID(tenant.id), "test.noop", {"owner": tenant.id})

    async with raw_connection(db_url) as conn:
        async with conn.transaction():
            await conn.execute("SET LOCAL ROLE memoria_app")
            await conn.execute(f"SET LOCAL app.tenant_id = '{a.id}'")
            # No WHERE clause at all: the policy alone keeps B out.
            tenants = await conn.fetch("SELECT id FROM tenants")
            keys = await conn.fetch("SELECT tenant_id FROM api_keys")
            jobs = await conn.fetch("SELECT tenant_id, payload FROM jobs")
            assert {str(r["id"]) for r in tenants} == {a.id}
            assert {str(r["tenant_id"]) for r in keys} == {a.id}
            assert {str(r["tenant_id"]) for r in jobs} == {a.id}
            # Nor can A write rows into B, or move its rows there.
            updated = await conn.execute(f"UPDATE jobs SET priority = 9 WHERE tenant_id = '{b.id}'")
            assert updated == "UPDATE 0"
            deleted = await conn.execute("DELETE FROM api_keys")
            assert deleted == "DELETE 1"  # A's own key only
        async with conn.transaction():
            await conn.execute("SET LOCAL ROLE memoria_app")
            await conn.execute(f"SET LOCAL app.tenant_id = '{a.id}'")
            try:
                await conn.execute(f"INSERT INTO jobs (tenant_id, kind) VALUES ('{b.id}', 'x')")
                raise AssertionError("insert into another tenant was allowed")
            except asyncpg.InsufficientPrivilegeError:
                pass
        async with conn.transaction():
            # With no tenant bound, the application role sees nothing at all.
            await conn.execute("SET LOCAL ROLE memoria_app")
            assert await conn.fetchval("SELECT count(*) FROM jobs") == 0
            assert await conn.fetchval("SELECT count(*) FROM api_keys") == 0
    # B is untouched by everything A tried.
    assert (await client.get("/v1/tenant", headers=b.headers)).status_code == 200
    assert len((await client.get("/v1/jobs", headers=b.headers)).json()["jobs"]) == 1


async def test_tenant_settings_override_takes_effect_without_restart(
    client: AppClient,
) -> None:
    tenant = await new_tenant(client)
    before = (await client.get("/v1/settings", headers=tenant.headers)).json()
    assert before["query"]["auto_top_k"] == 3
    assert before["cognitive_enabled"] is True
    patched = await client.patch(
        "/v1/settings",
        json={"cognitive_enabled": False, "query": {"auto_top_k": 5, "time_decay_boost": 0.5}},
        headers=tenant.headers,
    )
    assert patched.status_code == 200, patched.text
    after = (await client.get("/v1/settings", headers=tenant.headers)).json()
    assert after["query"]["auto_top_k"] == 5
    assert after["query"]["time_decay_boost"] == 0.5
    assert after["cognitive_enabled"] is False
    # null restores the deployment default for that key
    reset = await client.patch(
        "/v1/settings", json={"query": {"auto_top_k": None}}, headers=tenant.headers
    )
    assert reset.json()["query"]["auto_top_k"] == 3
    assert reset.json()["query"]["time_decay_boost"] == 0.5


async def test_bad_settings_are_refused_naming_the_field(client: AppClient) -> None:
    tenant = await new_tenant(client)
    response = await client.patch(
        "/v1/settings", json={"query": {"auto_top_k": -1}}, headers=tenant.headers
    )
    assert response.status_code == 422
    assert response.json()["field"] == "settings.query.auto_top_k"
    response = await client.patch(
        "/v1/settings", json={"query": {"no_such": 1}}, headers=tenant.headers
    )
    assert response.status_code == 422
    assert response.json()["field"] == "settings.query.no_such"
    # Nothing was stored by the refused calls.
    assert (await client.get("/v1/settings", headers=tenant.headers)).json()["overrides"] == {}
    response = await client.post(
        "/admin/tenants",
        json={"name": "x", "settings": {"query": {"auto_top_k": "many"}}},
        headers=ADMIN,
    )
    assert response.status_code == 422
    assert response.json()["field"] == "settings.query.auto_top_k"


async def test_the_admin_token_acts_within_the_tenant_it_names(client: AppClient) -> None:
    from service.audit import service as audit

    tenant = await new_tenant(client, "acme")
    other = await new_tenant(client, "other")
    acting = {**ADMIN, "X-Memoria-Tenant": tenant.id}
    me = (await client.get("/v1/tenant", headers=acting)).json()
    assert (me["tenant_id"], me["name"], me["key_prefix"]) == (tenant.id, "acme", "admin")

    memory = {"scope": "GROUP", "group_id": "g1", "content": "群规禁止发广告"}
    created = await client.post("/v1/memories", json=memory, headers=acting)
    assert created.status_code == 201, created.text
    mine = (await client.get("/v1/memories?group_id=g1", headers=tenant.headers)).json()
    assert [m["id"] for m in mine] == [created.json()["id"]]
    assert (await client.get("/v1/memories?group_id=g1", headers=other.headers)).json() == []
    history = await client.get(f"/v1/memories/{created.json()['id']}/history", headers=acting)
    assert history.json()[0]["cause"]["key_prefix"] == "admin"
    await audit.flush()
    entries = (await client.get(f"/admin/audit?tenant_id={tenant.id}", headers=ADMIN)).json()
    assert [(e["actor"], e["route"]) for e in entries] == [("admin", "/v1/memories")]

    # Only the admin token may name a tenant; the tenant must exist.
    wrong = {"Authorization": "Bearer not-the-token", "X-Memoria-Tenant": tenant.id}
    assert (await client.get("/v1/tenant", headers=wrong)).status_code == 401
    crossing = {**tenant.headers, "X-Memoria-Tenant": other.id}
    assert (await client.get("/v1/memories?group_id=g1", headers=crossing)).status_code == 401
    unknown = await client.get(
        "/v1/tenant", headers={**ADMIN, "X-Memoria-Tenant": str(uuid.uuid4())}
    )
    assert unknown.status_code == 404 and unknown.json()["field"] == "X-Memoria-Tenant"
    malformed = await client.get("/v1/tenant", headers={**ADMIN, "X-Memoria-Tenant": "acme"})
    assert malformed.status_code == 422 and malformed.json()["field"] == "X-Memoria-Tenant"
    # Without the header the admin token is no tenant key.
    assert (await client.get("/v1/tenant", headers=ADMIN)).status_code == 401
