"""``POST /v1/todos``: a bot adds a todo of the conversation it serves. The todo lives where
the context says (a group's in that group, a private chat's in that chat), goes through the
lifecycle the historian's do, and is refused, naming the field, when malformed."""

from __future__ import annotations

import random
import uuid
from datetime import datetime
from typing import Any

import httpx

from tests.conftest import AppClient, TenantHandle, new_tenant


def some_id() -> str:
    return str(random.randrange(10**8, 10**10))


def in_group(group: str, user: str) -> dict[str, Any]:
    return {"request_type": "group", "group_id": group, "sender_id": user, "user_id": user}


def in_private(user: str) -> dict[str, Any]:
    return {"request_type": "private", "user_id": user, "sender_id": user}


async def add(client: AppClient, tenant: TenantHandle, **body: Any) -> httpx.Response:
    return await client.post("/v1/todos", json=body, headers=tenant.headers)


async def context_todos(
    client: AppClient, tenant: TenantHandle, context: dict[str, Any]
) -> list[str]:
    """The todos' texts a conversation's context shows."""
    response = await client.post(
        "/v1/context", json={**context, "message": "有什么要做的"}, headers=tenant.headers
    )
    assert response.status_code in (200, 201), response.text
    return [item["text"] for item in response.json()["todos"]]


def assert_refused(response: httpx.Response, field: str) -> None:
    assert response.status_code in (400, 422), response.text
    assert field in str(response.json().get("field")), response.text


async def test_a_group_todo_is_shown_in_that_group_and_nowhere_else(client: AppClient) -> None:
    tenant = await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")
    group, other_group, user = some_id(), some_id(), some_id()
    task = f"提交周报 {uuid.uuid4().hex[:6]}"
    created = await add(client, tenant, **in_group(group, user), description=task)
    assert created.status_code == 201, created.text
    todo = created.json()
    assert todo["description"] == task and todo["status"] == "PENDING"
    assert todo["group_id"] == group and todo["user_id"] is None
    assert todo["creator_id"] == user

    listed = await client.get(f"/v1/todos?group_id={group}", headers=tenant.headers)
    assert [t["id"] for t in listed.json()] == [todo["id"]]
    assert listed.json()[0] == todo
    assert any(task in text for text in await context_todos(client, tenant, in_group(group, user)))
    # Not in another group of the same person, nor in their private chat.
    assert not any(
        task in t for t in await context_todos(client, tenant, in_group(other_group, user))
    )
    assert not any(task in t for t in await context_todos(client, tenant, in_private(user)))
    elsewhere = await client.get(f"/v1/todos?group_id={other_group}", headers=tenant.headers)
    assert elsewhere.json() == []


async def test_a_private_todo_is_shown_to_its_person_alone(client: AppClient) -> None:
    tenant = await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")
    user, someone, group = some_id(), some_id(), some_id()
    task = f"复诊挂号 {uuid.uuid4().hex[:6]}"
    created = await add(client, tenant, **in_private(user), description=task)
    assert created.status_code == 201, created.text
    assert created.json()["user_id"] == user and created.json()["group_id"] is None
    assert any(task in t for t in await context_todos(client, tenant, in_private(user)))
    assert not any(task in t for t in await context_todos(client, tenant, in_private(someone)))
    assert not any(task in t for t in await context_todos(client, tenant, in_group(group, user)))
    mine = await client.get(f"/v1/todos?user_id={user}", headers=tenant.headers)
    assert [t["description"] for t in mine.json()] == [task]


async def test_a_todo_goes_through_its_lifecycle(client: AppClient) -> None:
    tenant = await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")
    group, user = some_id(), some_id()
    task = f"订会议室 {uuid.uuid4().hex[:6]}"
    todo = (
        await add(
            client,
            tenant,
            **in_group(group, user),
            description=task,
            trigger_time="2020-01-01T09:00:00+08:00",
        )
    ).json()
    due = await client.get(f"/v1/todos/due?group_id={group}", headers=tenant.headers)
    assert [t["id"] for t in due.json()] == [todo["id"]]

    done = await client.patch(
        f"/v1/todos/{todo['id']}", json={"status": "COMPLETED"}, headers=tenant.headers
    )
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "COMPLETED" and done.json()["completed_at"] is not None
    assert not any(task in t for t in await context_todos(client, tenant, in_group(group, user)))
    pending = await client.get(f"/v1/todos?group_id={group}&status=PENDING", headers=tenant.headers)
    assert pending.json() == []
    # A finished todo is not cancelled; reopened, it is.
    refused = await client.patch(
        f"/v1/todos/{todo['id']}", json={"status": "CANCELLED"}, headers=tenant.headers
    )
    assert_refused(refused, "status")


async def test_a_time_without_offset_is_on_the_conversations_clocks(client: AppClient) -> None:
    tenant = await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")
    group, user = some_id(), some_id()
    body = {**in_group(group, user), "timezone": "America/New_York"}
    todo = (
        await add(client, tenant, **body, description="交房租", trigger_time="2026-12-01T09:00:00")
    ).json()
    # 09:00 in New York (UTC-5 in December), not on the tenant's or the server's clocks.
    when = datetime.fromisoformat(todo["trigger_time"])
    assert when == datetime.fromisoformat("2026-12-01T14:00:00+00:00"), todo["trigger_time"]


async def test_bad_input_is_refused_naming_the_field(client: AppClient) -> None:
    tenant = await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")
    group, user = some_id(), some_id()
    here = in_group(group, user)
    assert_refused(await add(client, tenant, **here, description=""), "description")
    assert_refused(await add(client, tenant, **here, description="  \n "), "description")
    assert_refused(await add(client, tenant, **here, description="x" * 2001), "description")
    assert_refused(
        await add(client, tenant, **here, description="开会", trigger_time="明天早上"),
        "trigger_time",
    )
    assert_refused(
        await add(
            client, tenant, **here, description="开会", trigger_time="0001-01-01T00:00+14:00"
        ),
        "trigger_time",
    )
    assert_refused(await add(client, tenant, **here), "description")
    no_group = await add(client, tenant, request_type="group", sender_id=user, description="开会")
    assert no_group.status_code in (400, 422), no_group.text
    assert "group_id" in no_group.text
    assert_refused(
        await add(client, tenant, **here, description="开会", priority="high"), "priority"
    )
    listed = await client.get(f"/v1/todos?group_id={group}", headers=tenant.headers)
    assert listed.json() == []


async def test_another_tenant_cannot_see_or_change_the_todo(client: AppClient) -> None:
    tenant = await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")
    other = await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")
    group, user = some_id(), some_id()
    task = f"买咖啡豆 {uuid.uuid4().hex[:6]}"
    todo = (await add(client, tenant, **in_group(group, user), description=task)).json()
    theirs = await client.get(f"/v1/todos?group_id={group}", headers=other.headers)
    assert theirs.status_code == 200 and theirs.json() == []
    assert not any(task in t for t in await context_todos(client, other, in_group(group, user)))
    changed = await client.patch(
        f"/v1/todos/{todo['id']}", json={"status": "CANCELLED"}, headers=other.headers
    )
    assert changed.status_code == 404, changed.text
    mine = await client.get(f"/v1/todos?group_id={group}", headers=tenant.headers)
    assert [t["status"] for t in mine.json()] == ["PENDING"]


async def test_a_retried_call_makes_one_todo_and_one_delivery(client: AppClient) -> None:
    """A bot whose call timed out sends it again, sometimes twice at once: one todo, one
    reminder. Another due time, another conversation, or the same task after the first was
    done are each a todo of their own."""
    import asyncio

    tenant = await new_tenant(client, f"t-{uuid.uuid4().hex[:8]}")
    group, user = some_id(), some_id()
    body = {
        **in_group(group, user),
        "description": "提醒我交周报",
        "trigger_time": "2027-03-02T15:00:00+08:00",
    }
    first = await add(client, tenant, **body)
    assert first.status_code == 201, first.text
    again = await asyncio.gather(*(add(client, tenant, **body) for _ in range(4)))
    assert [r.status_code for r in again] == [200] * 4, [r.text for r in again]
    assert {r.json()["id"] for r in again} == {first.json()["id"]}
    assert await context_todos(client, tenant, in_group(group, user)) == ["提醒我交周报"]

    # Concurrent first calls race for the same todo: one is made.
    fresh = {**body, "description": "提醒我订会议室"}
    raced = await asyncio.gather(*(add(client, tenant, **fresh) for _ in range(4)))
    assert sorted(r.status_code for r in raced) == [200, 200, 200, 201], [r.text for r in raced]
    assert len({r.json()["id"] for r in raced}) == 1

    later = await add(client, tenant, **{**body, "trigger_time": "2027-03-09T15:00:00+08:00"})
    elsewhere = await add(client, tenant, **{**body, **in_group(some_id(), user)})
    assert later.status_code == elsewhere.status_code == 201
    done = await client.patch(
        f"/v1/todos/{first.json()['id']}", json={"status": "COMPLETED"}, headers=tenant.headers
    )
    assert done.status_code == 200, done.text
    anew = await add(client, tenant, **body)
    assert anew.status_code == 201 and anew.json()["id"] != first.json()["id"]
    listed = await client.get(f"/v1/todos?group_id={group}", headers=tenant.headers)
    assert len(listed.json()) == 4, listed.json()
