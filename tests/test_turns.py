"""A turn is its conversation's: the bot's request ids repeat across groups, private chats and
bots, and each conversation's turn is stored; a repeat of one turn is answered as the first
call was, and the same key with another body is refused by name (409 on ``request_id``).

Over HTTP with random ids, with the worker running the offline rules, and across the upgrade
that moved the receipts stored before onto their conversation's keys.
"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import pytest
from alembic import command

from service.app import create_app
from service.db.migrate import alembic_config
from service.settings import Settings
from tests.conftest import (
    ADMIN,
    FAST_QUEUE,
    AppClient,
    DatabaseFactory,
    TenantHandle,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    until_finished,
)


@pytest.fixture
async def offline(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client)


def _id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def _request_id() -> str:
    # A platform's message id: digits, or the "D1:3" of an evaluation's turns.
    return random.choice([str(random.randint(1, 10**6)), f"D{random.randint(1, 99)}:3"])


def _group(group: str, sender: str) -> dict[str, Any]:
    return {
        "request_type": "group",
        "group_id": group,
        "user_id": sender,
        "sender_id": sender,
        "sender_name": _id("N"),
        "timestamp": "2026-03-01T10:00:00+08:00",
    }


def _private(user: str) -> dict[str, Any]:
    return {
        "request_type": "private",
        "user_id": user,
        "sender_id": user,
        "sender_name": _id("N"),
        "timestamp": "2026-03-01T10:00:00+08:00",
    }


async def _post(client: AppClient, tenant: TenantHandle, body: dict[str, Any]) -> Any:
    return await client.post("/v1/end", json=body, headers=tenant.headers)


async def _events(client: AppClient, tenant: TenantHandle, scope: str) -> dict[str, str]:
    response = await client.get(f"/v1/events?{scope}", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return {e["id"]: e["source_text"] for e in response.json()["events"]}


async def _memos(client: AppClient, tenant: TenantHandle, scope: str) -> list[str]:
    response = await client.get(f"/v1/memos?{scope}", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return [m["memo"] for m in response.json()]


async def _jobs(client: AppClient, tenant: TenantHandle) -> list[dict[str, Any]]:
    response = await client.get("/v1/jobs", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return list(response.json()["jobs"])


async def test_one_request_id_in_five_groups_and_a_private_chat_stores_six_turns(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    request_id = _request_id()
    person = _id("u")
    chats = [_group(_id("g"), _id("u")) for _ in range(5)] + [_private(person)]
    scopes = [f"group_id={c['group_id']}" for c in chats[:5]] + [f"user_id={person}"]
    told: list[tuple[str, str, dict[str, Any]]] = []
    for context in chats:
        observation, memo = f"喜欢{_id('q')}", f"回答了{_id('m')}"
        body = {**context, "request_id": request_id, "observations": [observation], "memo": memo}
        response = await _post(client, tenant, body)
        assert response.status_code == 202, response.text
        assert response.json()["duplicate"] is False, response.text
        told.append((observation, memo, response.json()))
    assert len({t[2]["job_id"] for t in told}) == 6
    every_id = [i for t in told for i in t[2]["event_ids"]]
    assert len(set(every_id)) == len(every_id) == 12
    for _, _, accepted in told:
        job = await until_finished(client, tenant, accepted["job_id"])
        assert job["status"] == "done", job
    for scope, (observation, memo, accepted) in zip(scopes, told, strict=True):
        events = await _events(client, tenant, scope)
        assert set(events) == set(accepted["event_ids"]), scope
        assert observation in events[accepted["event_ids"][0]]
        assert await _memos(client, tenant, scope) == [memo]
        for event_id in accepted["event_ids"]:
            one = await client.get(f"/v1/events/{quote(event_id)}", headers=tenant.headers)
            assert one.status_code == 200, one.text
            assert one.json()["request_id"] == request_id


async def test_an_identical_repeat_is_answered_as_the_first_call(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    group = _id("g")
    body = {
        **_group(group, _id("u")),
        "request_id": _request_id(),
        "end_seq": random.randint(1, 9),
        "observations": [f"喜欢{_id('q')}", f"住在{_id('c')}"],
        "memo": f"回答了{_id('m')}",
    }
    first = await _post(client, tenant, body)
    again = await _post(client, tenant, body)
    assert first.status_code == again.status_code == 202, again.text
    assert again.json()["duplicate"] is True
    assert again.json()["job_id"] == first.json()["job_id"]
    assert again.json()["event_ids"] == first.json()["event_ids"]
    assert len(await _jobs(client, tenant)) == 1
    await until_finished(client, tenant, first.json()["job_id"])
    assert set(await _events(client, tenant, f"group_id={group}")) == set(first.json()["event_ids"])
    assert await _memos(client, tenant, f"group_id={group}") == [body["memo"]]


@pytest.mark.parametrize(
    "change",
    [
        {"observations": ["另一件事"]},
        {"sender_id": "another", "user_id": "another"},
        {"memo": "另一个备注"},
        {"observations": [], "memo": "只有备注"},
    ],
)
async def test_the_same_turn_key_with_another_body_is_refused_naming_request_id(
    offline: tuple[AppClient, TenantHandle], change: dict[str, Any]
) -> None:
    client, tenant = offline
    group = _id("g")
    body = {
        **_group(group, _id("u")),
        "request_id": _request_id(),
        "observations": [f"喜欢{_id('q')}"],
        "memo": f"回答了{_id('m')}",
    }
    first = await _post(client, tenant, body)
    assert first.status_code == 202, first.text
    other = await _post(client, tenant, {**body, **change})
    assert other.status_code == 409, other.text
    assert other.json()["field"] == "request_id"
    assert "request_id" in other.json()["message"]
    assert len(await _jobs(client, tenant)) == 1
    assert await _memos(client, tenant, f"group_id={group}") == [body["memo"]]
    # The first call's own repeat is still answered as it was.
    again = await _post(client, tenant, body)
    assert again.status_code == 202 and again.json()["duplicate"] is True
    assert again.json()["event_ids"] == first.json()["event_ids"]


async def test_concurrent_repeats_store_one_turn(
    offline: tuple[AppClient, TenantHandle],
) -> None:
    client, tenant = offline
    group = _id("g")
    body = {
        **_group(group, _id("u")),
        "request_id": _request_id(),
        "observations": [f"喜欢{_id('q')}"],
        "memo": f"回答了{_id('m')}",
    }
    answers = await asyncio.gather(*(_post(client, tenant, body) for _ in range(8)))
    assert [a.status_code for a in answers] == [202] * 8, [a.text for a in answers]
    assert sorted(a.json()["duplicate"] for a in answers) == [False] + [True] * 7
    assert len({a.json()["job_id"] for a in answers}) == 1
    assert len({tuple(a.json()["event_ids"]) for a in answers}) == 1
    assert len(await _jobs(client, tenant)) == 1
    await until_finished(client, tenant, answers[0].json()["job_id"])
    assert set(await _events(client, tenant, f"group_id={group}")) == set(
        answers[0].json()["event_ids"]
    )
    assert await _memos(client, tenant, f"group_id={group}") == [body["memo"]]

    # Racing calls with one key and different bodies: one is stored, the others refused.
    key = {**body, "request_id": _request_id() + "x"}
    notes = [f"备注{_id('m')}" for _ in range(6)]
    racing = await asyncio.gather(*(_post(client, tenant, {**key, "memo": m}) for m in notes))
    assert sorted(a.status_code for a in racing) == [202] + [409] * 5, [a.text for a in racing]
    stored = next(m for m, a in zip(notes, racing, strict=True) if a.status_code == 202)
    assert all(a.json()["field"] == "request_id" for a in racing if a.status_code == 409)
    assert len(await _jobs(client, tenant)) == 2
    memos = await _memos(client, tenant, f"group_id={group}")
    assert sorted(memos) == sorted([body["memo"], stored])


async def test_erasing_a_person_or_a_group_takes_their_turns_receipts(
    offline: tuple[AppClient, TenantHandle], db_url: str
) -> None:
    """A receipt's key names its conversation: a person's private chat, or a group. Erasing
    the person or the group leaves none of their ids in the receipts, and the other
    conversations' receipts keep answering their repeats."""
    client, tenant = offline
    person, group, kept = _id("u"), _id("g"), _id("g")
    request_id = _request_id()
    bodies = [
        {**_private(person), "request_id": request_id, "observations": ["喜欢猫"]},
        {**_group(group, _id("u")), "request_id": request_id, "observations": ["喜欢狗"]},
        {**_group(kept, _id("u")), "request_id": request_id, "observations": ["喜欢鱼"]},
    ]
    for body in bodies:
        accepted = await _post(client, tenant, body)
        assert accepted.status_code == 202, accepted.text
        await until_finished(client, tenant, accepted.json()["job_id"])
    for path in (f"/v1/users/{person}", f"/v1/groups/{group}"):
        erased = await client.delete(path, headers=tenant.headers)
        assert erased.status_code in (200, 202), erased.text
    async with raw_connection(db_url) as conn:
        receipts = await conn.fetch("SELECT dedupe_key, answer::text FROM job_receipts")
    held = " ".join(f"{r['dedupe_key']} {r['answer']}" for r in receipts)
    assert person not in held and group not in held
    again = await _post(client, tenant, bodies[2])
    assert again.status_code == 202 and again.json()["duplicate"] is True, again.text


def _legacy_payload(
    context: dict[str, Any], request_id: str, observations: list[str], ids: list[str]
) -> str:
    return json.dumps(
        {
            "context": context,
            "request_id": request_id,
            "end_seq": 1,
            "moment": "2026-03-01T10:00:00+08:00",
            "timezone": "Asia/Shanghai",
            "memo": "",
            "observations": observations,
            "event_ids": ids,
        },
        ensure_ascii=False,
    )


async def test_the_upgrade_keys_the_receipts_by_conversation_and_keeps_old_event_ids(
    databases: DatabaseFactory,
) -> None:
    """Receipts made before: of a job still kept, of a pruned job whose events remain, of a
    memo alone, and of nothing left. After the upgrade a repeat of each kept turn is still
    answered as its first call was, with its old event ids, which still read the events;
    the same request id in another conversation is a turn of its own."""
    url = await databases.create_empty()
    config = alembic_config(url, Settings())
    await asyncio.to_thread(command.upgrade, config, "0032_llm_budgets")
    tenant = uuid.uuid4()
    group, other_group, memo_group = _id("g"), _id("g"), _id("g")
    sender, person = _id("u"), _id("u")
    kept, pruned, memo_only, gone = (f"{_request_id()}%{n}" for n in range(4))
    group_context = {k: v for k, v in _group(group, sender).items() if k != "timestamp"}
    async with raw_connection(url) as conn:
        await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, 't')", tenant)
        for event_id, key, kind, group_id, user, request_id, text in (
            (f"{kept}:1", f"g:{group}", "group", group, sender, kept, "喜欢爬山"),
            (f"{pruned}:1", f"p:{person}", "private", None, person, pruned, "住在杭州"),
        ):
            await conn.execute(
                "INSERT INTO events (tenant_id, id, conversation_key, request_type, group_id,"
                " user_id, sender_id, request_id, end_seq, kind, perspective, text, source_text,"
                " is_absolute, occurred_at, timezone)"
                " VALUES ($1, $2, $3, $4, $5, $6, $6, $7, 1, 'observation', 'third', $8, $8,"
                " true, now(), 'UTC')",
                tenant, event_id, key, kind, group_id, user, request_id, text,
            )  # fmt: skip
        await conn.execute(
            "INSERT INTO memos (tenant_id, conversation_key, request_type, group_id, user_id,"
            " sender_id, request_id, end_seq, memo, said_at)"
            " VALUES ($1, $2, 'group', $3, $4, $4, $5, 1, '记下了', now())",
            tenant, f"g:{memo_group}", memo_group, sender, memo_only,
        )  # fmt: skip
        job = await conn.fetchval(
            "INSERT INTO jobs (tenant_id, kind, payload, status, dedupe_key, finished_at)"
            " VALUES ($1, 'historian.end', $2::jsonb, 'done', $3, now()) RETURNING id",
            tenant,
            _legacy_payload(group_context, kept, ["喜欢爬山"], [f"{kept}:1"]),
            f"end:{kept}:1",
        )
        for key, job_id, answer in (
            (f"end:{kept}:1", job, [f"{kept}:1"]),
            (f"end:{pruned}:1", job + 100, [f"{pruned}:1"]),
            (f"end:{memo_only}:1", job + 101, [f"{memo_only}:1:memo"]),
            (f"end:{gone}:1", job + 102, [f"{gone}:1"]),
        ):
            await conn.execute(
                "INSERT INTO job_receipts (tenant_id, dedupe_key, job_id, answer)"
                " VALUES ($1, $2, $3, $4::jsonb)",
                tenant, key, job_id, json.dumps(answer),
            )  # fmt: skip
        await asyncio.to_thread(command.upgrade, config, "head")
        receipts = await conn.fetch("SELECT dedupe_key, job_id FROM job_receipts")
        jobs = await conn.fetch("SELECT dedupe_key FROM jobs")

    def esc(value: str) -> str:
        return value.replace("%", "%25").replace(":", "%3A")

    assert {r["dedupe_key"]: r["job_id"] for r in receipts} == {
        f"end:g:{group}:{esc(kept)}:1": job,
        f"end:p:{person}:{esc(pruned)}:1": job + 100,
        f"end:g:{memo_group}:{esc(memo_only)}:1": job + 101,
    }
    assert [r["dedupe_key"] for r in jobs] == [f"end:g:{group}:{esc(kept)}:1"]

    settings = make_settings(url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        made = await client.post(f"/admin/tenants/{tenant}/keys", json={}, headers=ADMIN)
        assert made.status_code == 201, made.text
        handle = TenantHandle(id=str(tenant), key=made.json()["key"], prefix="")
        for event_id in (f"{kept}:1", f"{pruned}:1"):
            old = await client.get(f"/v1/events/{quote(event_id)}", headers=handle.headers)
            assert old.status_code == 200, old.text
            assert old.json()["id"] == event_id
        repeats = [
            ({**_group(group, sender), "request_id": kept}, job, [f"{kept}:1"]),
            ({**_private(person), "request_id": pruned}, job + 100, [f"{pruned}:1"]),
        ]
        for context, job_id, ids in repeats:
            again = await _post(client, handle, {**context, "observations": ["x"]})
            assert again.status_code == 202, again.text
            assert again.json()["duplicate"] is True
            assert (again.json()["job_id"], again.json()["event_ids"]) == (job_id, ids)
        # The same request id in another group is that group's own turn.
        fresh = await _post(
            client,
            handle,
            {**_group(other_group, _id("u")), "request_id": kept, "observations": ["喜欢下棋"]},
        )
        assert fresh.status_code == 202 and fresh.json()["duplicate"] is False, fresh.text
        assert fresh.json()["event_ids"] == [f"g:{other_group}:{esc(kept)}:1.1"]
