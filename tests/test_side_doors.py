"""No side doors between conversations: keys that cannot collide, write requests that refuse
what they do not know, webhooks that cannot probe the network, private chats that stay
private."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from alembic import command
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from service.app import create_app
from service.db.migrate import alembic_config
from service.errors import Invalid
from service.settings import Settings
from service.todos import webhook
from tests.conftest import (
    FAST_QUEUE,
    AppClient,
    DatabaseFactory,
    TenantHandle,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    until_finished,
    wait_for,
)


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
    for group_id, user_id, body in (("X:Y", "C", "first person"), ("X", "Y:C", "second person")):
        response = await client.put(
            f"/v1/profiles/member/{group_id}/{user_id}",
            json={"document": member_doc(group_id, user_id, body)},
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
    async with raw_connection(url) as conn:
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
        for n, (message_id, conversation) in enumerate((("m1", "p:a"), ("m2", "g:g"))):
            await conn.execute(
                """INSERT INTO messages (tenant_id, conversation_key, message_id, request_type,
                                         text, sent_at)
                   VALUES ($1, $2, $3, 'private', 'x', now())""",
                tenant,
                conversation,
                message_id,
            )
            await conn.execute(
                """INSERT INTO memories (tenant_id, scope, user_id, category, content, evidence)
                   VALUES ($1, 'GLOBAL', 'a', 'FACT', $2, $3::jsonb)""",
                tenant,
                f"memory {n}",
                f'{{"message_ids": ["{message_id}"]}}',
            )
        # (Revision 0029 narrows the rest: tests/test_consent.py.)
        await asyncio.to_thread(command.upgrade, config, "0028_profile_keys")
        scopes = await conn.fetch("SELECT content, scope FROM memories ORDER BY content")
        # Learned in a's private chat: PRIVATE now; learned in a group: GLOBAL still.
        assert [tuple(r) for r in scopes] == [("memory 0", "PRIVATE"), ("memory 1", "GLOBAL")]
        keys = {
            r["profile_key"] for r in await conn.fetch("SELECT profile_key FROM profile_revisions")
        }
        assert keys == {"member:g%3A1:u%252", "user:a:b", "group:g:1"}
        current = await conn.fetch("SELECT profile_key FROM profiles ORDER BY profile_key")
        assert sorted(r["profile_key"] for r in current) == sorted(keys)
    await asyncio.to_thread(command.downgrade, config, "0010")
    async with raw_connection(url) as conn:
        back = await conn.fetchval(
            "SELECT profile_key FROM profile_revisions WHERE profile_key LIKE 'member%'"
        )
        assert back == "member:g:1:u%2"


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


# --- webhooks -----------------------------------------------------------------------------


class _Hook(BaseHTTPRequestHandler):
    hits = 0

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        type(self).hits += 1
        self.send_response(418)
        self.send_header("Content-Length", "0")
        self.end_headers()


async def test_webhooks_to_internal_addresses_are_refused(client: AppClient) -> None:
    """Loopback, private, link-local, multicast and unspecified targets are a 422 when set;
    a public one is kept."""
    tenant = await new_tenant(client)
    for url in (
        "http://127.0.0.1:5432/",
        "http://localhost:8080/x",
        "http://10.1.2.3/hook",
        "http://192.168.0.1/",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:80/",
        "http://[::ffff:127.0.0.1]/",
        "http://0.0.0.0/",
        "http://224.0.0.1/",
    ):
        response = await client.patch(
            "/v1/settings", json={"webhook_url": url}, headers=tenant.headers
        )
        assert response.status_code == 422, url
        assert "webhook_url" in response.text
    ok = await client.patch(
        "/v1/settings", json={"webhook_url": "https://hooks.example.com/t"}, headers=tenant.headers
    )
    assert ok.status_code == 200, ok.text


async def test_malformed_webhook_urls_are_refused_naming_the_field(client: AppClient) -> None:
    """A URL whose host or port cannot be read is a 422 when set: an unclosed IPv6 bracket was
    a 500, and a port out of range or not a number, or a name with a label over 63 characters,
    was kept, and every delivery then failed."""
    tenant = await new_tenant(client)
    for url in (
        "http://[::1",
        "http://[2606:4700::1111/hook",
        "http://hooks.example.com:99999/t",
        "http://hooks.example.com:http/t",
        f"https://{'a' * 64}.example.com/t",
    ):
        response = await client.patch(
            "/v1/settings", json={"webhook_url": url}, headers=tenant.headers
        )
        assert response.status_code == 422, (url, response.text)
        assert response.json()["field"] == "settings.webhook_url"


async def test_a_malformed_webhook_url_kept_from_before_fails_its_delivery_at_once() -> None:
    """Such a URL stored before it was refused when set is refused at delivery, as a target
    the worker may not reach (the job fails for good): it raised ValueError, retried."""
    for url in ("http://hooks.example.com:99999/t", "http://[::1", f"http://{'a' * 64}.org/"):
        with pytest.raises(webhook.Refused):
            await webhook.post(url, {}, timeout=1.0, allow_private=True)


async def test_nat64_addresses_of_internal_ones_are_refused() -> None:
    """An IPv6 address of the NAT64 prefix reaches the IPv4 address it ends with (on an
    IPv6-only network, DNS64 gives every name one): it counts as that address."""
    for address in ("64:ff9b::7f00:1", "64:ff9b::a00:5", "64:ff9b::a9fe:a9fe"):
        assert not webhook.public(ipaddress.ip_address(address)), address
        with pytest.raises(Invalid):
            webhook.check_url(f"http://[{address}]/hook", allow_private=False)
    assert webhook.public(ipaddress.ip_address("64:ff9b::808:808"))


# IPv6 forms that carry an IPv4 address, each as written in a URL, with the one it carries.
CARRYING = {
    "2002:7f00:1::": "127.0.0.1",  # 6to4
    "::127.0.0.1": "127.0.0.1",  # IPv4-compatible
    "::169.254.169.254": "169.254.169.254",
    "::ffff:0:7f00:1": "127.0.0.1",  # IPv4-translated
    "64:ff9b:1::a9fe:a9fe": "169.254.169.254",  # NAT64, local-use prefix
    "2001:0:4136:e378:8000:63bf:80ff:fffe": "127.0.0.1",  # Teredo, its client inverted
}


async def test_ipv6_forms_of_internal_addresses_are_refused(client: AppClient) -> None:
    """A webhook on an IPv6 address that carries a loopback or metadata IPv4 one (6to4,
    compatible, translated, Teredo, local-use NAT64), or on a site-local one, is a 422 naming
    the field; a public IPv6 address, or one carrying a public IPv4 address, is kept."""
    tenant = await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")
    path = uuid.uuid4().hex
    for address in [*CARRYING, "fec0::1", f"fec0::{uuid.uuid4().int & 0xFFFF:x}"]:
        response = await client.patch(
            "/v1/settings",
            json={"webhook_url": f"http://[{address}]/{path}"},
            headers=tenant.headers,
        )
        assert response.status_code == 422, (address, response.text)
        assert response.json()["field"] == "settings.webhook_url", address
    for address in ("2606:4700:4700::1111", "2002:808:808::1", "64:ff9b::808:808"):
        url = f"https://[{address}]:8443/{path}"
        ok = await client.patch("/v1/settings", json={"webhook_url": url}, headers=tenant.headers)
        assert ok.status_code == 200, (address, ok.text)
        assert ok.json()["overrides"]["webhook_url"] == url


# IPv4 networks that are not on the public internet.
INTERNAL_V4 = [
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
        "172.16.0.0/12", "192.0.0.0/29", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15",
        "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
    )
]  # fmt: skip
INTERNAL = st.builds(
    lambda net, n: net[n % net.num_addresses],
    st.sampled_from(INTERNAL_V4),
    st.integers(min_value=0, max_value=2**32 - 1),
)
PUBLIC_V4 = st.sampled_from(["8.8.8.8", "1.1.1.1", "65.54.227.120"]).map(ipaddress.IPv4Address)


def _carrying(form: str, v4: ipaddress.IPv4Address, other: int, rest: int) -> str:
    """An IPv6 address of ``form`` carrying ``v4`` (``other``, a public IPv4 address as an
    integer, and ``rest``, random bits, fill what the form leaves free)."""
    v = int(v4)
    if form == "mapped":
        value = 0xFFFF << 32 | v
    elif form == "translated":
        value = 0xFFFF << 48 | v
    elif form == "compatible":
        value = v
    elif form == "nat64":
        value = 0x64FF9B << 96 | v
    elif form == "6to4":
        value = 0x2002 << 112 | v << 80 | rest & (1 << 80) - 1
    elif form in ("teredo-server", "teredo-client"):
        server, client = (v, other) if form == "teredo-server" else (other, v)
        value = 0x20010000 << 96 | server << 64 | (rest & 0xFFFFFFFF) << 32 | client ^ 0xFFFFFFFF
    else:  # NAT64's local-use prefix at one of its lengths, bits 64 to 71 zero
        length = int(form.removeprefix("nat64-local-"))
        shift = 120 - (length if length <= 64 else length - 8) - 32  # in the 120 bits
        free = ((1 << 72) - 1) & ~(0xFFFFFFFF << shift)
        without_u = 0x64FF9B0001 << 72 | rest & free | v << shift
        value = (without_u >> 56) << 64 | without_u & (1 << 56) - 1
    return str(ipaddress.IPv6Address(value))


FORMS = [
    "mapped", "translated", "compatible", "nat64", "6to4", "teredo-server", "teredo-client",
    "nat64-local-48", "nat64-local-56", "nat64-local-64", "nat64-local-96",
]  # fmt: skip


@given(
    form=st.sampled_from(FORMS),
    v4=INTERNAL,
    other=PUBLIC_V4,
    rest=st.integers(min_value=0, max_value=2**80 - 1),
)
@settings(max_examples=300, deadline=None)
def test_any_internal_ipv4_address_carried_in_ipv6_is_refused(
    form: str, v4: ipaddress.IPv4Address, other: ipaddress.IPv4Address, rest: int
) -> None:
    """Whatever internal IPv4 address an IPv6 form carries, and whatever fills the rest of
    it, the URL on it is refused and a resolved address of it is not reached."""
    address = _carrying(form, v4, int(other), rest)
    assert v4 in webhook.carried(ipaddress.IPv6Address(address)), (form, address)
    assert not webhook.public(ipaddress.ip_address(address)), (form, address)
    with pytest.raises(Invalid):
        webhook.check_url(f"http://[{address}]/hook", allow_private=False)


async def _deliver_to(db_url: str, url_of: Any, **settings: Any) -> tuple[dict[str, Any], int]:
    """Deliver one due todo to the URL ``url_of(port)`` of a loopback hook answering 418,
    the URL written straight into the tenant's settings (as one resolving to loopback only
    later would be); the delivery job and the hook's hits."""
    _Hook.hits = 0
    hook = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    app_settings = make_settings(
        db_url, cognitive={"queue": {**FAST_QUEUE, "job_max_retries": 0}}, **settings
    )
    try:
        async with serve_app(create_app(app_settings, migrate=False, run_worker=True)) as client:
            tenant = await new_tenant(client)
            db = client.app.state.runtime.db
            async with db.system() as session:
                await session.execute(
                    text(
                        "UPDATE tenants SET settings = jsonb_build_object('webhook_url', "
                        "CAST(:url AS text)) WHERE id = CAST(:id AS uuid)"
                    ),
                    {"url": url_of(hook.server_address[1]), "id": tenant.id},
                )
            todo = await client.post(
                "/v1/end",
                json={
                    **PRIVATE,
                    "observations": ["2026-01-01 提醒 u1 交周报"],
                    "timestamp": "2026-01-01T08:00:00+08:00",
                },
                headers=tenant.headers,
            )
            assert todo.status_code == 202, todo.text

            async def delivery() -> dict[str, Any] | None:
                jobs = await client.get("/v1/jobs", headers=tenant.headers)
                done = [
                    j
                    for j in jobs.json()["jobs"]
                    if j["kind"] == "todos.deliver" and j["status"] in ("done", "failed")
                ]
                return done[0] if done else None

            return dict(await wait_for(delivery, timeout=40)), _Hook.hits
    finally:
        hook.shutdown()


async def test_a_webhook_resolving_to_loopback_is_not_called(db_url: str) -> None:
    """At delivery the resolved address is checked: the worker never POSTs to loopback, and
    the job's error does not tell what answers there."""
    job, hits = await _deliver_to(db_url, lambda port: f"http://localhost:{port}/hook")
    assert hits == 0
    assert job["status"] == "failed"
    assert "418" not in (job["last_error"] or "")


async def test_a_failed_delivery_does_not_report_the_answer(db_url: str) -> None:
    """Allowed by the operator, a loopback hook is called; its status stays out of the job."""
    job, hits = await _deliver_to(
        db_url, lambda port: f"http://127.0.0.1:{port}/hook", webhook_allow_private=True
    )
    assert hits == 1
    assert job["status"] == "failed"
    assert "418" not in (job["last_error"] or "")
    assert "did not accept" in (job["last_error"] or "")


async def test_a_webhook_that_drips_its_answer_is_cut_at_the_timeout() -> None:
    """The delivery's timeout bounds the whole answer: a target that sends a byte every 0.2 s
    (each read well within the timeout) would otherwise hold the job for 10 s."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def drip() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n")
            for _ in range(50):
                if stop.wait(0.2):
                    return
                conn.sendall(b".")

    threading.Thread(target=drip, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/hook"
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            await webhook.post(url, {"event": "todo.due"}, timeout=1.0, allow_private=True)
    finally:
        stop.set()
        server.close()
    assert time.monotonic() - started < 5


async def test_a_webhook_answering_without_end_is_not_read_to_its_end() -> None:
    """Its status is what a delivery needs: an answer of gigabytes was read into the worker's
    memory for as long as the timeout allowed, and the delivery then failed as timed out."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()
    sent = 0

    def flood() -> None:
        nonlocal sent
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n")
            chunk = b"x" * 65536
            # 32 MB then silence: enough to tell, little enough for the test machine.
            while sent < 32 * 1024 * 1024 and not stop.is_set():
                try:
                    conn.sendall(chunk)
                except OSError:
                    return
                sent += len(chunk)
            stop.wait(10)

    threading.Thread(target=flood, daemon=True).start()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/hook"
    try:
        response = await webhook.post(url, {"event": "todo.due"}, timeout=3.0, allow_private=True)
    finally:
        stop.set()
        server.close()
    assert response.status_code == 200


async def test_a_webhook_on_an_internationalized_name_is_delivered() -> None:
    """A name in another script goes out as DNS has it (IDNA), in the Host header too: it
    resolved, then every delivery failed building the request (a Host header must be ASCII).
    Fullwidth 'localhost' is such a name, and resolves here."""
    hosts: list[str] = []

    class Hook(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            hosts.append(self.headers["Host"])
            self.send_response(204)
            self.end_headers()

    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    port = hook.server_address[1]
    try:
        response = await webhook.post(
            f"http://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54:{port}/hook",
            {"event": "todo.due"},
            timeout=5.0,
            allow_private=True,
        )
    finally:
        hook.shutdown()
    assert response.status_code == 204
    assert hosts == [f"localhost:{port}"]


# --- what is private stays private --------------------------------------------------------


@pytest.fixture
async def offline(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(
        db_url,
        cognitive={"queue": FAST_QUEUE, "extraction": {"check_interval_seconds": 0.2}},
    )
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client)


ALICE_PRIVATE = {
    "request_type": "private",
    "user_id": "alice",
    "sender_id": "alice",
    "sender_name": "Alice",
    "timestamp": "2026-03-01T10:00:00+08:00",
}
ALICE_IN_GROUP = {
    "request_type": "group",
    "group_id": "hikers",
    "sender_id": "alice",
    "sender_name": "Alice",
    "timestamp": "2026-03-02T10:00:00+08:00",
}


async def _end(client: AppClient, tenant: TenantHandle, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/end", json=body, headers=tenant.headers)
    assert response.status_code == 202, response.text
    return await until_finished(client, tenant, response.json()["job_id"])


async def test_private_confidences_do_not_reach_groups(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    """What Alice tells the bot in private (a diagnosis, her phone number) is remembered in
    that chat, and injected in no group she is in: neither as a memory nor in her profile."""
    client, tenant = offline
    job = await _end(
        client,
        tenant,
        **ALICE_PRIVATE,
        request_id="confide",
        observations=[
            "Alice(alice)在2025年被确诊为HIV阳性",
            "Alice(alice)的手机号是13812345678",
        ],
        force=True,
    )
    assert job["status"] == "done", job
    in_group = await client.post(
        "/v1/context",
        json={**ALICE_IN_GROUP, "message": "Alice 的手机号和身体情况"},
        headers=tenant.headers,
    )
    assert in_group.status_code == 200, in_group.text
    prompt = in_group.json()["prompt"]
    assert "HIV" not in prompt and "13812345678" not in prompt
    assert in_group.json()["memories"] == [] and in_group.json()["user_profile"] is None
    at_home = await client.post(
        "/v1/context",
        json={**ALICE_PRIVATE, "message": "我的手机号和身体情况"},
        headers=tenant.headers,
    )
    # Handed as the private chat's event or its PRIVATE memory (an event and the memory made
    # from it are shown once).
    handed = at_home.json()["memories"] + at_home.json()["events"]
    assert handed and all(
        i["id"].startswith("event:p:alice:") or i["meta"]["scope"] == "PRIVATE" for i in handed
    )
    assert "13812345678" in at_home.json()["prompt"]


async def test_what_the_person_lets_be_known_reaches_groups(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    """A fact the bot marks shareable (and not sensitive) becomes GLOBAL and part of the
    person's profile."""
    client, tenant = offline
    await _end(
        client,
        tenant,
        **ALICE_PRIVATE,
        request_id="share",
        observations=[{"text": "Alice(alice)是一名 Python 开发者", "shareable": True}],
        force=True,
    )
    in_group = await client.post(
        "/v1/context", json={**ALICE_IN_GROUP, "message": "谁会 Python"}, headers=tenant.headers
    )
    assert [m["meta"]["scope"] for m in in_group.json()["memories"]] == ["GLOBAL"]
    assert "Python" in in_group.json()["user_profile"]["text"]


async def test_global_memories_and_user_profiles_refuse_sensitive_data(
    client: AppClient,
) -> None:
    """``POST /v1/memories`` keeps a phone number, an e-mail or an id number out of GLOBAL (a
    private memory may hold it), and a user profile keeps them out too."""
    tenant = await new_tenant(client)
    for content in (
        "alice 的手机号是 13812345678",
        "alice 的邮箱是 alice@example.com",
        "alice 的身份证号是 110101199003074514",
        "alice was diagnosed with diabetes in 2024",
    ):
        response = await client.post(
            "/v1/memories/",
            json={"scope": "GLOBAL", "user_id": "alice", "content": content},
            headers=tenant.headers,
        )
        assert response.status_code == 422, content
        assert "content" in response.text
    private = await client.post(
        "/v1/memories/",
        json={"scope": "PRIVATE", "user_id": "alice", "content": "alice 的手机号是 13812345678"},
        headers=tenant.headers,
    )
    assert private.status_code == 201, private.text
    document = (
        '---\nentity_type: user\nentity_id: "alice"\nname: Alice\ntags: []\n'
        'updated_at: "2026-02-22T10:30:00+08:00"\n---\nAlice 的手机号是 13812345678\n'
    )
    response = await client.put(
        "/v1/profiles/user/alice", json={"document": document}, headers=tenant.headers
    )
    assert response.status_code == 422, response.text


async def test_a_personal_fact_in_a_group_stream_stays_with_its_sender(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    """ "记住我对猫毛过敏" in a group's message stream, among other people's messages, is a
    memory of its sender in that group, not one of the whole group."""
    client, tenant = offline
    batch = {
        "request_type": "group",
        "group_id": "cats",
        "messages": [
            {
                "message_id": "m1",
                "sender_id": "bob",
                "sender_name": "Bob",
                "text": "今天天气不错",
                "sent_at": "2026-03-01T10:00:00+08:00",
            },
            {
                "message_id": "m2",
                "sender_id": "carol",
                "sender_name": "Carol",
                "text": "记住我对猫毛过敏",
                "sent_at": "2026-03-01T10:01:00+08:00",
            },
        ],
    }
    response = await client.post("/v1/messages", json=batch, headers=tenant.headers)
    assert response.status_code == 202, response.text
    [job_id] = response.json()["extraction_job_ids"]
    assert (await until_finished(client, tenant, job_id))["status"] == "done"
    memories = (await client.get("/v1/memories/?group_id=cats", headers=tenant.headers)).json()
    allergy = [m for m in memories if "过敏" in m["content"]]
    assert [(m["scope"], m["user_id"]) for m in allergy] == [("MEMBER_IN_GROUP", "carol")]
