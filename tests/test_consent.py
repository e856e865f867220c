"""Consent is recorded on the item: what a person says in one chat reaches their other
conversations only when the bot marks that observation shareable, never because of its words.

Each case runs over HTTP with random ids, names and a random marker word per fact, then looks
for the markers in every read a group conversation of the person has: the context, the memory,
event and profile searches, the profile itself, and the same through the tools.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from alembic import command

from service.app import create_app
from service.db.migrate import alembic_config
from service.profiles.document import Profile, ProfileKey, render
from service.settings import Settings
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
from tests.fake_llm import FakeLLM, Reply, quiet


def _token() -> str:
    return "q" + uuid.uuid4().hex[:10]


def _person() -> tuple[str, str]:
    return f"u{uuid.uuid4().hex[:8]}", f"N{uuid.uuid4().hex[:5]}"


def _private(user: str, name: str) -> dict[str, Any]:
    return {
        "request_type": "private",
        "user_id": user,
        "sender_id": user,
        "sender_name": name,
        "timestamp": "2026-03-01T10:00:00+08:00",
    }


def _in_group(group: str, user: str, name: str) -> dict[str, Any]:
    return {
        "request_type": "group",
        "group_id": group,
        "user_id": user,
        "sender_id": user,
        "sender_name": name,
        "timestamp": "2026-03-02T10:00:00+08:00",
    }


async def _end(client: AppClient, tenant: TenantHandle, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/end", json=body, headers=tenant.headers)
    assert response.status_code == 202, response.text
    job = await until_finished(client, tenant, response.json()["job_id"])
    assert job["status"] == "done", job
    return job


async def _group_reads(
    client: AppClient, tenant: TenantHandle, group: str, user: str, name: str, query: str
) -> dict[str, str]:
    """Every answer a group conversation of ``user`` gets when it asks for ``query``."""
    context = _in_group(group, user, name)
    headers = tenant.headers
    answers = {
        "/v1/context": await client.post(
            "/v1/context", json={**context, "message": query}, headers=headers
        ),
        "/v1/memories/search": await client.post(
            "/v1/memories/search",
            json={"query": query, "group_id": group, "user_id": user},
            headers=headers,
        ),
        "/v1/profiles/search": await client.post(
            "/v1/profiles/search", json={"query": query, "context": context}, headers=headers
        ),
        "/v1/events/search": await client.post(
            "/v1/events/search", json={"query": query, "context": context}, headers=headers
        ),
    }
    for name_, arguments in (
        ("cognitive_search_memories", {"query": query}),
        ("cognitive_search_events", {"query": query}),
        ("cognitive_search_profiles", {"query": query}),
        ("cognitive_get_profile", {"entity_type": "user", "entity_id": user}),
    ):
        answers[f"tool {name_}"] = await client.post(
            "/v1/tools/call",
            json={"name": name_, "arguments": arguments, "context": context},
            headers=headers,
        )
    for path, response in answers.items():
        assert response.status_code == 200, (path, response.text)
    return {path: _shown(response) for path, response in answers.items()}


def _shown(response: Any) -> str:
    """An answer's text, less the question it echoes."""
    body = response.json()
    if isinstance(body, dict):
        body.pop("query", None)
    return json.dumps(body, ensure_ascii=False)


def _leaks(answers: dict[str, str], markers: list[str]) -> list[tuple[str, str]]:
    return [(path, m) for path, text in answers.items() for m in markers if m in text]


async def test_a_secret_told_in_private_stays_there_whatever_its_words(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    """The phrases people add when they tell a secret name everyone ("千万不要告诉大家"), and so
    does the one that shares; words decide nothing, and without a mark all stays private."""
    client, tenant = offline
    user, name = _person()
    group = f"g{uuid.uuid4().hex[:8]}"
    markers = [_token() for _ in range(5)]
    said = [
        f"{name}({user})在偷偷准备{markers[0]}，千万不要告诉大家",
        f"{name}({user})的{markers[1]}计划不可以公开",
        f"{name} ({user}) is planning {markers[2]}, don't share this with the group",
        f"{name}({user})喜欢{markers[3]}，可以告诉大家",
        f"{name} ({user}) loves {markers[4]}, you can tell everyone",
    ]
    await _end(client, tenant, **_private(user, name), observations=said, force=True)
    # The person is in a group too: a turn there makes them one of its members.
    await _end(
        client, tenant, **_in_group(group, user, name), observations=[f"{name}来了"], force=True
    )
    answers = await _group_reads(client, tenant, group, user, name, " ".join(markers))
    assert _leaks(answers, markers) == []
    # Remembered all the same, where it was said.
    at_home = await client.post(
        "/v1/context",
        json={**_private(user, name), "message": " ".join(markers)},
        headers=tenant.headers,
    )
    assert all(m in _shown(at_home) for m in markers), at_home.text
    # Handed as the private chat's events or its PRIVATE memories (an event and the memory
    # made from it are shown once).
    handed = at_home.json()["memories"] + at_home.json()["events"]
    assert handed and all(
        i["id"].startswith(f"event:p:{user}:") or i["meta"]["scope"] == "PRIVATE" for i in handed
    )


async def test_only_the_marked_observation_reaches_the_persons_groups(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    """One turn, two facts, one marked: the marked one is the person's everywhere, the other
    stays in the private chat; a marked one that is sensitive stays there too."""
    client, tenant = offline
    user, name = _person()
    group = f"g{uuid.uuid4().hex[:8]}"
    cat, secret, phone = _token(), _token(), _token()
    await _end(
        client,
        tenant,
        **_private(user, name),
        observations=[
            {"text": f"{name}({user})喜欢猫，猫叫{cat}", "shareable": True},
            f"{name}({user})的秘密项目代号是{secret}",
            {"text": f"{name}({user})的手机号是13812345678，暗号{phone}", "shareable": "yes"},
        ],
        force=True,
    )
    await _end(
        client, tenant, **_in_group(group, user, name), observations=[f"{name}来了"], force=True
    )
    answers = await _group_reads(client, tenant, group, user, name, f"{cat} {secret} {phone}")
    assert _leaks(answers, [secret, phone]) == []
    assert cat in answers["/v1/context"] and cat in answers["tool cognitive_get_profile"]
    # Another person's private chat sees none of it.
    other, other_name = _person()
    theirs = await client.post(
        "/v1/context",
        json={**_private(other, other_name), "message": f"{cat} {secret}"},
        headers=tenant.headers,
    )
    assert cat not in _shown(theirs) and secret not in _shown(theirs)


async def test_the_model_cannot_file_an_unmarked_item_as_global(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    """Consent is per item, not per job: a turn with one shareable item does not let the
    model file the other one, or one it names no item for, as GLOBAL."""
    client, tenant = online
    user, name = _person()
    group = f"g{uuid.uuid4().hex[:8]}"
    cat, secret, loose = _token(), _token(), _token()
    texts = [f"{name}({user})喜欢猫{cat}", f"{name}({user})的秘密项目代号是{secret}"]

    def memory_step(request: dict[str, Any]) -> Reply:
        if request["tools"][0]["function"]["name"] != "add_memory":
            return quiet(request)
        if any(m["role"] == "tool" for m in request["messages"]):
            return Reply(content="done")
        return Reply(
            tool_calls=[
                (
                    "add_memory",
                    {"content": texts[0], "scope": "GLOBAL", "category": "PREFERENCE", "item": 0},
                ),
                (
                    "add_memory",
                    {"content": texts[1], "scope": "GLOBAL", "category": "FACT", "item": 1},
                ),
                (
                    "add_memory",
                    {
                        "content": f"{name}({user})说了{loose}",
                        "scope": "GLOBAL",
                        "category": "FACT",
                    },
                ),
            ]
        )

    llm.default = memory_step
    job = await _end(
        client,
        tenant,
        **_private(user, name),
        observations=[{"text": texts[0], "shareable": True}, texts[1]],
        force=True,
    )
    notes = " | ".join(job["result"]["notes"])
    assert notes.count("marked shareable") == 2, notes
    assert job["result"]["memory"] == {"added": 1}
    llm.default = quiet
    await _end(
        client, tenant, **_in_group(group, user, name), observations=[f"{name}来了"], force=True
    )
    answers = await _group_reads(client, tenant, group, user, name, f"{cat} {secret} {loose}")
    assert _leaks(answers, [secret, loose]) == []
    assert cat in answers["/v1/memories/search"]
    # What the model was shown says which item may be shared.
    prompt = next(
        r["messages"][1]["content"]
        for r in llm.chat_requests
        if r["tools"][0]["function"]["name"] == "add_memory"
    )
    shown = [json.loads(x) for x in prompt.splitlines() if x.startswith('{"item"')]
    assert [s.get("shareable", False) for s in shown] == [True, False]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"observations": [{"text": "x", "shareable": True, "scope": "GLOBAL"}]}, "scope"),
        ({"observations": [{"shareable": True}]}, "text must be a string"),
        ({"observations": [{"text": "x", "shareable": "maybe"}]}, "shareable must be"),
        ({"observations": ["a", "b"], "shareable": [2]}, "no observation 2"),
        ({"observations": ["a"], "shareable": [-1]}, "no observation -1"),
        ({"observations": [7]}, "string or an object"),
    ],
)
async def test_a_malformed_consent_mark_is_refused_by_name(
    offline: tuple[AppClient, TenantHandle], body: dict[str, Any], named: str
) -> None:
    client, tenant = offline
    user, name = _person()
    response = await client.post(
        "/v1/end", json={**_private(user, name), **body}, headers=tenant.headers
    )
    assert response.status_code == 422, response.text
    assert named in response.text
    listed = await client.get(f"/v1/memories?user_id={user}", headers=tenant.headers)
    assert listed.json() == []


async def test_the_end_tool_records_consent_as_the_end_call_does(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    user, name = _person()
    shared, kept = _token(), _token()
    response = await client.post(
        "/v1/tools/call",
        json={
            "name": "end",
            "arguments": {
                "observations": [f"{name}({user})喜欢{shared}", f"{name}({user})害怕{kept}"],
                "shareable": [0],
                "force": True,
            },
            "context": _private(user, name),
        },
        headers=tenant.headers,
    )
    assert response.status_code == 200, response.text
    job = await until_finished(client, tenant, response.json()["result"]["job_id"])
    assert job["status"] == "done", job
    scopes = {
        m["content"]: m["scope"]
        for m in (await client.get(f"/v1/memories?user_id={user}", headers=tenant.headers)).json()
    }
    assert sorted(scopes.values()) == ["GLOBAL", "PRIVATE"]
    assert next(s for c, s in scopes.items() if shared in c) == "GLOBAL"


async def test_a_private_chat_builds_a_profile_only_that_chat_reads(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    """What the person tells the bot in private builds their private profile: their own
    private chat reads it; no group of theirs, no other person and no search across
    conversations (even where the tenant lets tools cross groups) ever does."""
    client, tenant = offline
    user, name = _person()
    other, other_name = _person()
    group = f"g{uuid.uuid4().hex[:8]}"
    plan, told = _token(), _token()
    await _end(
        client,
        tenant,
        **_private(user, name),
        observations=[f"{name}({user})在准备考研，目标是{plan}"],
        force=True,
    )
    sent = await client.post(
        "/v1/messages",
        json={
            "messages": [
                {
                    "message_id": uuid.uuid4().hex,
                    "request_type": "private",
                    "user_id": user,
                    "sender_id": user,
                    "sender_name": name,
                    "text": f"记住：我最喜欢的书是{told}",
                    "sent_at": "2026-03-01T11:00:00+08:00",
                }
            ]
        },
        headers=tenant.headers,
    )
    assert sent.status_code in (200, 202), sent.text

    async def built() -> dict[str, Any] | None:
        got = await client.get(f"/v1/profiles/private/{user}", headers=tenant.headers)
        return got.json() if got.status_code == 200 and told in got.text else None

    profile = await wait_for(built)
    assert plan in profile["document"] and told in profile["document"]
    assert (
        await client.get(f"/v1/profiles/user/{user}", headers=tenant.headers)
    ).status_code == 404
    at_home = await client.post(
        "/v1/context",
        json={**_private(user, name), "message": "我的目标是什么"},
        headers=tenant.headers,
    )
    assert plan in at_home.json()["private_profile"]["text"]
    assert "<private_profile" in at_home.json()["prompt"]

    await _end(
        client, tenant, **_in_group(group, user, name), observations=[f"{name}来了"], force=True
    )
    settings = await client.patch(
        "/v1/settings", json={"query": {"allow_cross_group_tools": True}}, headers=tenant.headers
    )
    assert settings.status_code == 200, settings.text
    answers = await _group_reads(client, tenant, group, user, name, f"考研 {plan} {told}")
    for path, arguments in (
        ("/v1/profiles/search", {"query": f"考研 {plan}"}),
        ("/v1/profiles/search", {"query": f"考研 {plan}", "entity_type": "private"}),
    ):
        theirs = await client.post(
            path, json={**arguments, "context": _private(other, other_name)}, headers=tenant.headers
        )
        assert theirs.status_code == 200, theirs.text
        answers[f"{path} {arguments} of another person"] = _shown(theirs)
    assert _leaks(answers, [plan, told]) == []

    erased = await client.delete(f"/v1/users/{user}", headers=tenant.headers)
    assert erased.status_code in (200, 202), erased.text
    gone = await client.get(f"/v1/profiles/private/{user}", headers=tenant.headers)
    assert gone.status_code == 404


async def test_the_upgrade_narrows_what_words_made_global(databases: DatabaseFactory) -> None:
    """A GLOBAL memory the historian made before consent was recorded goes to the narrowest
    visibility its sources fit: its person's private chat, or the person in the group it was
    learned in, or where that cannot be told, the private chat; one written as GLOBAL through
    the API (no such evidence) stays."""
    url = await databases.create_empty()
    config = alembic_config(url, Settings())
    await asyncio.to_thread(command.upgrade, config, "0028_profile_keys")
    tenant = uuid.uuid4()
    user = f"u{uuid.uuid4().hex[:6]}"
    group, other = f"g{uuid.uuid4().hex[:6]}", f"g{uuid.uuid4().hex[:6]}"
    async with raw_connection(url) as conn:
        await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, 't')", tenant)
        for event_id, key, kind, group_id in (
            ("e-private", f"p:{user}", "private", None),
            ("e-group", f"g:{group}", "group", group),
            ("e-other", f"g:{other}", "group", other),
        ):
            await conn.execute(
                "INSERT INTO events (tenant_id, id, conversation_key, request_type, group_id,"
                " user_id, sender_id, request_id, end_seq, kind, perspective, text, source_text,"
                " is_absolute, occurred_at, timezone)"
                " VALUES ($1, $2, $3, $4, $5, $6, $6, $2, 1, 'observation', 'third', 'x', 'x',"
                " true, now(), 'UTC')",
                tenant, event_id, key, kind, group_id, user,
            )  # fmt: skip
        for message_id, key, kind, group_id in (
            ("m-private", f"p:{user}", "private", None),
            ("m-group", f"g:{group}", "group", group),
        ):
            await conn.execute(
                "INSERT INTO messages (tenant_id, conversation_key, message_id, request_type,"
                " group_id, user_id, sender_id, text, sent_at)"
                " VALUES ($1, $2, $3, $4, $5, $6, $6, 'x', now())",
                tenant, key, message_id, kind, group_id, user,
            )  # fmt: skip
        evidences = {
            "private event": {"event_ids": ["e-private"]},
            "private message": {"message_ids": ["m-private"]},
            "group event": {"event_ids": ["e-group"]},
            "group message": {"message_ids": ["m-group"]},
            "two groups": {"event_ids": ["e-other", "e-group"]},
            "the api": {},
            "unknown ids": {"event_ids": ["e-gone"], "message_ids": ["m-gone"]},
        }
        for content, evidence in evidences.items():
            await conn.execute(
                "INSERT INTO memories (tenant_id, scope, user_id, category, content, evidence)"
                " VALUES ($1, 'GLOBAL', $2, 'FACT', $3, $4::jsonb)",
                tenant, user, content, json.dumps(evidence),
            )  # fmt: skip
        await asyncio.to_thread(command.upgrade, config, "head")
        rows = await conn.fetch("SELECT content, scope, group_id, user_id FROM memories")
    found = {r["content"]: (r["scope"], r["group_id"], r["user_id"]) for r in rows}
    assert found == {
        "private event": ("PRIVATE", None, user),
        "private message": ("PRIVATE", None, user),
        "group event": ("MEMBER_IN_GROUP", group, user),
        "group message": ("MEMBER_IN_GROUP", group, user),
        "two groups": ("MEMBER_IN_GROUP", min(group, other), user),
        "the api": ("GLOBAL", None, user),
        "unknown ids": ("PRIVATE", None, user),
    }


def _document(kind: str, person: str, name: str, body: str, source: str | None) -> str:
    when = datetime(2026, 3, 1, tzinfo=UTC)
    return render(Profile(ProfileKey(kind, person), name, [], when, source, body))


async def test_the_upgrade_moves_what_the_historian_wrote_to_user_profiles_to_private(
    databases: DatabaseFactory,
) -> None:
    """A user profile the historian wrote (its lines may have come from a private chat, and
    which cannot be told) becomes its person's private profile, or joins the one they have,
    with its revisions; one written only through the API stays. Read back over HTTP."""
    url = await databases.create_empty()
    config = alembic_config(url, Settings())
    await asyncio.to_thread(command.upgrade, config, "0029_consent_marks")
    (alone, alone_name), (both, both_name), (api, api_name) = _person(), _person(), _person()
    secret, older, told, mine, set_by_api = (_token() for _ in range(5))
    settings = make_settings(url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        tenant = await new_tenant(client)
        async with raw_connection(url) as conn:
            rows = [
                ("user", alone, alone_name, f"偷偷准备{secret}", "e-1", 2),
                ("user", both, both_name, f"喜欢{told}", "e-2", 1),
                ("private", both, both_name, f"只在私聊说过{mine}", "e-3", 1),
                ("user", api, api_name, f"运营写的{set_by_api}", None, 1),
            ]
            for kind, person, name, body, source, version in rows:
                document = _document(kind, person, name, body, source)
                await conn.execute(
                    "INSERT INTO profiles (tenant_id, profile_key, entity_type, entity_id, name,"
                    " document, body, source_event_id, version, updated_at)"
                    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, now())",
                    uuid.UUID(tenant.id), f"{kind}:{person}", kind, person, name, document,
                    body, source, version,
                )  # fmt: skip
            await conn.execute(
                "INSERT INTO profile_revisions (tenant_id, profile_key, version, document)"
                " VALUES ($1, $2, 1, $3)",
                uuid.UUID(tenant.id), f"user:{alone}",
                _document("user", alone, alone_name, f"更早的{older}", "e-0"),
            )  # fmt: skip
        await asyncio.to_thread(command.upgrade, config, "head")

        async def profile(kind: str, person: str) -> dict[str, Any] | None:
            found = await client.get(f"/v1/profiles/{kind}/{person}", headers=tenant.headers)
            assert found.status_code in (200, 404), found.text
            return found.json() if found.status_code == 200 else None

        assert await profile("user", alone) is None
        moved = await profile("private", alone)
        assert moved is not None and secret in moved["body"], moved
        assert moved["document"].startswith('---\nentity_type: "private"\n'), moved["document"]
        history = await client.get(
            f"/v1/profiles/private/{alone}/revisions", headers=tenant.headers
        )
        assert history.status_code == 200, history.text
        [revision] = history.json()
        assert older in revision["document"]
        assert revision["document"].startswith('---\nentity_type: "private"\n')

        assert await profile("user", both) is None
        joined = await profile("private", both)
        assert joined is not None and mine in joined["body"] and told in joined["body"]
        assert joined["document"].rstrip().endswith(f"喜欢{told}"), joined["document"]

        kept = await profile("user", api)
        assert kept is not None and set_by_api in kept["body"]
        assert await profile("private", api) is None


async def test_a_memory_the_model_makes_of_one_item_is_erased_only_with_its_sayer(
    online: tuple[AppClient, TenantHandle], llm: FakeLLM
) -> None:
    """In a batch of two people's messages, a memory the model says it made of the second
    one's message survives the erasure of the first, and goes with the second's."""
    client, tenant = online
    group = f"g{uuid.uuid4().hex[:8]}"
    (first, first_name), (second, second_name) = _person(), _person()
    said_first, said_second = _token(), _token()

    def memory_step(request: dict[str, Any]) -> Reply:
        if request["tools"][0]["function"]["name"] != "add_memory":
            return quiet(request)
        if any(m["role"] == "tool" for m in request["messages"]):
            return Reply(content="done")
        prompt = request["messages"][1]["content"]
        items = [json.loads(x) for x in prompt.splitlines() if x.startswith('{"item"')]
        numbered = next(i["item"] for i in items if said_second in json.dumps(i))
        content = f"{second_name}({second})养了一只叫{said_second}的猫"
        return Reply(
            tool_calls=[
                (
                    "add_memory",
                    {
                        "content": content,
                        "scope": "MEMBER_IN_GROUP",
                        "category": "FACT",
                        "user_id": second,
                        "item": numbered,
                    },
                )
            ]
        )

    llm.default = memory_step
    messages = [
        (first, first_name, f"记住：我下周去{said_first}出差"),
        (second, second_name, f"记住：我的猫叫{said_second}"),
    ]
    sent = await client.post(
        "/v1/messages",
        json={
            "messages": [
                {
                    "message_id": uuid.uuid4().hex,
                    "request_type": "group",
                    "group_id": group,
                    "user_id": who,
                    "sender_id": who,
                    "sender_name": name,
                    "text": said,
                    "sent_at": f"2026-03-01T11:0{n}:00+08:00",
                }
                for n, (who, name, said) in enumerate(messages)
            ]
        },
        headers=tenant.headers,
    )
    assert sent.status_code in (200, 202), sent.text

    async def remembered() -> list[dict[str, Any]] | None:
        found = await client.get(
            f"/v1/memories?group_id={group}&user_id={second}", headers=tenant.headers
        )
        kept = [m for m in found.json() if said_second in m["content"]]
        return kept or None

    await wait_for(remembered)
    erased = await client.delete(f"/v1/users/{first}", headers=tenant.headers)
    assert erased.status_code == 200, erased.text
    assert await remembered(), "erasing the first sender took the second one's memory"
    erased = await client.delete(f"/v1/users/{second}", headers=tenant.headers)
    assert erased.status_code == 200, erased.text
    assert await remembered() is None
