"""``POST /v1/end``: the hand-over contract (idempotency, empty calls, old names, bad context)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from service.ends.service import event_ids
from service.queue import repository
from service.runtime import Runtime
from tests.conftest import AppClient, TenantHandle, new_tenant

GROUP = {
    "request_type": "group",
    "group_id": "100200",
    "group_name": "Python 群",
    "user_id": "10001",
    "sender_id": "10001",
    "sender_name": "张三",
    "timestamp": "2026-02-21T23:30:00+08:00",
}


@pytest.fixture
async def tenant(client: AppClient) -> TenantHandle:
    return await new_tenant(client)


async def end(client: AppClient, tenant: TenantHandle, **body: Any) -> Any:
    return await client.post("/v1/end", json={**GROUP, **body}, headers=tenant.headers)


def test_event_ids_are_deterministic() -> None:
    assert event_ids("g:7", "r1", 1, 1, False) == ["g:7:r1:1.1"]
    assert event_ids("p:u", "r1", 2, 3, True) == [
        "p:u:r1:2.1",
        "p:u:r1:2.2",
        "p:u:r1:2.3",
        "p:u:r1:2.memo",
    ]
    assert event_ids("g:7", "r1", 1, 0, True) == ["g:7:r1:1.memo"]
    # Ids are escaped, so that no two turns of any conversations share an event id.
    assert event_ids("g:a:b", "c", 1, 1, False) == ["g:a%3Ab:c:1.1"]
    assert event_ids("g:a", "b:c", 1, 1, False) == ["g:a:b%3Ac:1.1"]
    assert event_ids("g:a%3Ab", "c", 1, 1, False) == ["g:a%253Ab:c:1.1"]


async def test_end_is_accepted_with_job_and_event_ids(
    client: AppClient, tenant: TenantHandle
) -> None:
    response = await end(
        client, tenant, request_id="req-1", memo="帮张三修了 bug", observations=["我明天去北京"]
    )
    assert response.status_code == 202
    body = response.json()
    assert body["enqueued"] is True
    assert body["event_ids"] == ["g:100200:req-1:1.1", "g:100200:req-1:1.memo"]
    assert body["memo_recorded"] is True
    job = (await client.get(f"/v1/jobs/{body['job_id']}", headers=tenant.headers)).json()
    assert job["kind"] == "historian.end" and job["status"] == "queued"
    memos = (await client.get("/v1/memos?group_id=100200", headers=tenant.headers)).json()
    assert [m["memo"] for m in memos] == ["帮张三修了 bug"]


async def test_end_is_idempotent(client: AppClient, tenant: TenantHandle) -> None:
    first = await end(client, tenant, request_id="req-2", end_seq=3, observations=["a", "b"])
    again = await end(client, tenant, request_id="req-2", end_seq=3, observations=["a", "b"])
    assert first.status_code == again.status_code == 202
    assert again.json()["job_id"] == first.json()["job_id"]
    assert again.json()["event_ids"] == first.json()["event_ids"]
    assert first.json()["event_ids"] == ["g:100200:req-2:3.1", "g:100200:req-2:3.2"]
    assert again.json()["duplicate"] is True
    jobs = (await client.get("/v1/jobs", headers=tenant.headers)).json()["jobs"]
    assert len(jobs) == 1
    # Another end_seq of the same request is another hand-over.
    other = await end(client, tenant, request_id="req-2", end_seq=4, observations=["c"])
    assert other.json()["job_id"] != first.json()["job_id"]


async def test_empty_end_writes_nothing(client: AppClient, tenant: TenantHandle) -> None:
    response = await end(client, tenant, memo="", observations=["  ", ""])
    assert response.status_code == 200
    assert response.json()["enqueued"] is False
    assert (await client.get("/v1/jobs", headers=tenant.headers)).json()["jobs"] == []
    assert (await client.get("/v1/memos?group_id=100200", headers=tenant.headers)).json() == []


async def test_legacy_field_names(client: AppClient, tenant: TenantHandle) -> None:
    response = await end(
        client,
        tenant,
        request_id="old-1",
        action_summary="回答了问题",
        new_info="张三喜欢 Rust",
        force="TrUe",
    )
    assert response.status_code == 202
    job = (await client.get(f"/v1/jobs/{response.json()['job_id']}", headers=tenant.headers)).json()
    assert job["status"] == "queued"
    assert response.json()["event_ids"] == ["g:100200:old-1:1.1", "g:100200:old-1:1.memo"]
    summary_only = await end(client, tenant, request_id="old-2", summary="只写了总结")
    assert summary_only.status_code == 202
    assert summary_only.json()["event_ids"] == ["g:100200:old-2:1.memo"]
    memos = (await client.get("/v1/memos?group_id=100200", headers=tenant.headers)).json()
    assert {m["memo"] for m in memos} == {"回答了问题", "只写了总结"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"group_id": None}, "group_id"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"request_type": "channel"}, "request_type"),
        ({"force": "perhaps"}, "force"),
        ({"end_seq": 0}, "end_seq"),
        ({"timestamp": "yesterday-ish"}, "timestamp"),
        ({"observations": [{"words": "not a field"}]}, "observations"),
        ({"observations": [{"text": ["not a string"]}]}, "observations"),
    ],
)
async def test_bad_context_is_refused_naming_the_field(
    client: AppClient, tenant: TenantHandle, body: dict[str, Any], field: str
) -> None:
    response = await end(client, tenant, **{"observations": ["x"], **body})
    assert response.status_code == 422, response.text
    payload = response.json()
    assert field in payload["message"] or field in (payload.get("field") or "")
    assert (await client.get("/v1/jobs", headers=tenant.headers)).json()["jobs"] == []


async def test_private_chat_needs_a_user(client: AppClient, tenant: TenantHandle) -> None:
    response = await client.post(
        "/v1/end", json={"request_type": "private", "memo": "hi"}, headers=tenant.headers
    )
    assert response.status_code == 422
    assert "user_id" in response.text


async def test_switched_off_keeps_the_memo_log_and_queues_nothing(
    client: AppClient, tenant: TenantHandle
) -> None:
    await client.patch("/v1/settings", json={"cognitive_enabled": False}, headers=tenant.headers)
    response = await end(client, tenant, request_id="off-1", memo="记下了", observations=["x"])
    assert response.status_code == 200
    assert response.json() == {
        **response.json(),
        "enqueued": False,
        "memo_recorded": True,
        "cognitive_enabled": False,
    }
    assert (await client.get("/v1/jobs", headers=tenant.headers)).json()["jobs"] == []
    memos = (await client.get("/v1/memos?group_id=100200", headers=tenant.headers)).json()
    assert [m["memo"] for m in memos] == ["记下了"]


async def test_a_repeat_after_the_job_is_pruned_makes_no_second_job(client: AppClient) -> None:
    rt: Runtime = client.app.state.runtime
    first_tenant = await new_tenant(client, "first")
    second_tenant = await new_tenant(client, "second")
    turn = {"request_id": "turn:50%:a", "end_seq": 2, "observations": ["a", "b"]}
    first = (await end(client, first_tenant, **turn)).json()
    # The job ran and was done long ago: the queue's retention of done jobs has passed.
    async with rt.db.system() as session:
        await session.execute(
            text("UPDATE jobs SET status = 'done', finished_at = now() - interval '3 days'")
        )
        queue = rt.settings.cognitive.queue
        await repository.prune(
            session,
            queue.done_retention_hours * 3600,
            queue.failed_max_age_days,
            queue.failed_max_files,
            queue.receipt_retention_days,
        )
    jobs = (await client.get("/v1/jobs", headers=first_tenant.headers)).json()["jobs"]
    assert jobs == []

    again = await end(client, first_tenant, **turn)
    assert again.status_code == 202
    assert again.json()["job_id"] == first["job_id"]
    assert again.json()["event_ids"] == first["event_ids"]
    assert first["event_ids"] == ["g:100200:turn%3A50%25%3Aa:2.1", "g:100200:turn%3A50%25%3Aa:2.2"]
    assert again.json()["duplicate"] is True
    jobs = (await client.get("/v1/jobs", headers=first_tenant.headers)).json()["jobs"]
    assert jobs == []
    # The same ids from another tenant are its own hand-over, and so are keys that would
    # match the first tenant's only as a pattern.
    for request_id in ("turn:50%:a", "turn:5_%", "turn:%"):
        other = (await end(client, second_tenant, **{**turn, "request_id": request_id})).json()
        assert other["duplicate"] is False and other["job_id"] != first["job_id"]
    jobs = (await client.get("/v1/jobs", headers=second_tenant.headers)).json()["jobs"]
    assert len(jobs) == 3


async def test_a_repeat_after_the_receipts_retention_is_a_new_hand_over(
    client: AppClient, tenant: TenantHandle
) -> None:
    rt: Runtime = client.app.state.runtime
    queue = rt.settings.cognitive.queue
    first = (await end(client, tenant, request_id="turn-9", observations=["a"])).json()
    async with rt.db.system() as session:
        # Done, pruned, and its receipt a day older than the receipts' retention.
        age = queue.receipt_retention_days + 1
        await session.execute(
            text("UPDATE jobs SET status = 'done', finished_at = now() - interval '3 days'")
        )
        await session.execute(
            text("UPDATE job_receipts SET created_at = now() - make_interval(days => :age)"),
            {"age": int(age)},
        )
        await repository.prune(session, 86400, 30, 500, queue.receipt_retention_days)
    again = (await end(client, tenant, request_id="turn-9", observations=["a"])).json()
    assert again["duplicate"] is False and again["job_id"] != first["job_id"]
