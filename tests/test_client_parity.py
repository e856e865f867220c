"""The async and the blocking client behave the same around their requests: the same scripted
answers give the same tries, the same waits, the same job-wait timeout and the same export."""

from __future__ import annotations

import io
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from service.client import MemoriaAPIError, MemoriaClient, SyncMemoriaClient

BASE = "http://memoria.test"
Answer = int | tuple[int, str] | Exception


@dataclass
class Script:
    """A scripted service: answers in order, then 200; what was asked and how long was waited."""

    answers: Sequence[Answer]
    seen: list[httpx.Request] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        index = len(self.seen) - 1
        answer = self.answers[index] if index < len(self.answers) else 200
        if isinstance(answer, Exception):
            raise answer
        if answer == 200:
            return httpx.Response(200, json={"tenant_id": "t", "name": "acme", "key_prefix": "k"})
        status, retry_after = answer if isinstance(answer, tuple) else (answer, None)
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        body = {"status": status, "error": "busy", "message": "try later"}
        return httpx.Response(status, json=body, headers=headers)


class FakeTime:
    """A clock that only moves when the client sleeps, so waits are exact and instant."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def clock(self) -> float:
        return self.now


def sync_client(
    handler: Callable[[httpx.Request], httpx.Response], fake: FakeTime, **options: Any
) -> SyncMemoriaClient:
    client = SyncMemoriaClient(BASE, "mk_a", transport=httpx.MockTransport(handler), **options)
    client._sleep = fake.sleep  # type: ignore[method-assign]
    client._clock = fake.clock  # type: ignore[method-assign]
    return client


def async_client(
    handler: Callable[[httpx.Request], httpx.Response], fake: FakeTime, **options: Any
) -> MemoriaClient:
    client = MemoriaClient(BASE, "mk_a", transport=httpx.MockTransport(handler), **options)
    client._sleep = fake.async_sleep  # type: ignore[method-assign]
    client._clock = fake.clock  # type: ignore[method-assign]
    return client


async def run(client: SyncMemoriaClient | MemoriaClient, method: str, *args: Any, **kw: Any) -> Any:
    """Call one of the client's methods (awaited for the async one), then close the client."""
    try:
        if isinstance(client, MemoriaClient):
            return await getattr(client, method)(*args, **kw)
        return getattr(client, method)(*args, **kw)
    finally:
        if isinstance(client, MemoriaClient):
            await client.aclose()
        else:
            client.close()


FAILURES: list[Answer] = [
    (429, "2"),
    httpx.ConnectError("refused"),
    503,  # no Retry-After: a jittered backoff
    (503, "1.5"),
]


async def test_both_clients_retry_the_same_failures_with_the_same_waits() -> None:
    runs = []
    for make in (sync_client, async_client):
        script, fake = Script(FAILURES), FakeTime()
        random.seed(20260221)  # the same jitter draws for both
        client = make(script.handler, fake, max_retries=5, backoff_base=1.0)
        tenant = await run(client, "tenant")
        assert tenant["name"] == "acme"
        runs.append((script, fake))

    (sync_script, sync_time), (async_script, async_time) = runs
    assert len(sync_script.seen) == len(async_script.seen) == 5
    assert sync_time.waits == async_time.waits
    waits = sync_time.waits
    assert len(waits) == 4 and waits[0] == 2.0 and waits[3] == 1.5
    # The two without a hint are the jittered backoff of tries 2 and 3.
    assert 0 <= waits[1] <= 2 and 0 <= waits[2] <= 4
    for script in (sync_script, async_script):
        assert len({request.headers["x-request-id"] for request in script.seen}) == 1


@pytest.mark.parametrize(
    ("answers", "status"),
    [
        ([503, 503, 503, 503], 503),
        ([(429, "600")], 429),  # a Retry-After past the cap is not waited for
        ([503, 409], 409),  # not retried: the conflict is the answer
    ],
)
async def test_both_clients_give_up_alike(answers: list[Answer], status: int) -> None:
    outcomes = []
    for make in (sync_client, async_client):
        script, fake = Script(answers), FakeTime()
        random.seed(7)
        client = make(script.handler, fake, max_retries=2, backoff_cap=30.0)
        with pytest.raises(MemoriaAPIError) as failed:
            await run(client, "tenant")
        outcomes.append((failed.value.status, len(script.seen), fake.waits))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == status


async def test_connect_errors_past_the_retries_rise_from_both_clients() -> None:
    for make in (sync_client, async_client):
        script, fake = Script([httpx.ConnectError("refused")] * 5), FakeTime()
        client = make(script.handler, fake, max_retries=2, backoff_base=0.01)
        with pytest.raises(httpx.ConnectError):
            await run(client, "tenant")
        assert len(script.seen) == 3 and len(fake.waits) == 2


def job(job_id: int, status: str, last_error: str | None = None) -> dict[str, Any]:
    return {
        "id": job_id,
        "kind": "export",
        "status": status,
        "priority": 0,
        "attempts": 1,
        "max_attempts": 3,
        "run_after": "2026-02-21T23:30:00+08:00",
        "last_error": last_error,
        "result": None,
        "created_at": "2026-02-21T23:30:00+08:00",
        "started_at": None,
        "finished_at": None,
    }


async def test_a_job_wait_times_out_the_same_way_in_both_clients() -> None:
    results = []
    for make in (sync_client, async_client):
        polls: list[str] = []

        def running(request: httpx.Request, polls: list[str] = polls) -> httpx.Response:
            polls.append(request.url.path)
            return httpx.Response(200, json=job(7, "running"))

        fake = FakeTime()
        client = make(running, fake)
        with pytest.raises(TimeoutError) as late:
            await run(client, "wait_for_job", 7, timeout=1.0, interval=0.3)
        results.append((str(late.value), polls, fake.waits))
    assert results[0] == results[1]
    message, polls, waits = results[0]
    assert message == "job 7 is still running after 1.0s"
    # Polled at 0, 0.3, 0.6, 0.9 and 1.2 seconds: the last one is past the deadline.
    assert polls == ["/v1/jobs/7"] * 5 and waits == pytest.approx([0.3] * 4)


async def test_a_job_wait_rides_out_a_busy_poll_and_returns_the_finished_job() -> None:
    for make in (sync_client, async_client):
        seen: list[str] = []

        def handler(request: httpx.Request, seen: list[str] = seen) -> httpx.Response:
            answer = ["queued", 503, "running", "failed"][len(seen)]
            seen.append(str(answer))
            if answer == 503:
                return httpx.Response(503, json={"error": "busy"}, headers={"Retry-After": "4"})
            return httpx.Response(200, json=job(9, str(answer), "disk full"))

        fake = FakeTime()
        client = make(handler, fake)
        finished = await run(client, "wait_for_job", 9, timeout=60, interval=0.5)
        assert finished.status == "failed" and finished.last_error == "disk full"
        assert fake.waits == [0.5, 4.0, 0.5]


def export_service(
    final_status: str,
) -> tuple[Callable[[httpx.Request], httpx.Response], list[str]]:
    """A service whose export is large: 202, a job polled twice, then the document."""
    asked: list[str] = []
    polls = iter(["running", final_status])

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode()
        asked.append(f"{request.method} {path}")
        if path == "/v1/users/u%2F1/export":
            return httpx.Response(202, json={"job_id": 3, "export_url": "/v1/exports/11"})
        if path == "/v1/jobs/3":
            return httpx.Response(200, json=job(3, next(polls), "worker lost"))
        if path == "/v1/exports/11":
            return httpx.Response(200, content=b'{"user_id": "u/1", "events": []}')
        return httpx.Response(404, json={"error": "not_found", "message": "no route"})

    return handler, asked


async def test_a_large_export_waits_for_its_job_alike_in_both_clients() -> None:
    runs = []
    for make in (sync_client, async_client):
        handler, asked = export_service("done")
        fake, out = FakeTime(), io.BytesIO()
        client = make(handler, fake)
        written = await run(client, "export_user", "u/1", out)
        assert written == len(out.getvalue()) and out.getvalue().startswith(b'{"user_id"')
        runs.append((asked, fake.waits, out.getvalue()))
    assert runs[0] == runs[1]
    assert runs[0][0] == [
        "GET /v1/users/u%2F1/export",
        "GET /v1/jobs/3",
        "GET /v1/jobs/3",
        "GET /v1/exports/11",
    ]


async def test_a_failed_export_job_is_the_same_conflict_in_both_clients() -> None:
    errors = []
    for make in (sync_client, async_client):
        handler, asked = export_service("failed")
        client = make(handler, FakeTime())
        with pytest.raises(MemoriaAPIError) as failed:
            await run(client, "export_user", "u/1", io.BytesIO())
        errors.append((failed.value.status, failed.value.field, failed.value.message, asked))
    assert errors[0] == errors[1]
    assert errors[0][:2] == (409, "export_id") and "worker lost" in errors[0][2]
    assert "GET /v1/exports/11" not in errors[0][3]


async def test_many_calls_each_retried_once_keep_their_own_request_ids() -> None:
    for make in (sync_client, async_client):
        seen: list[httpx.Request] = []

        def every_other(request: httpx.Request, seen: list[httpx.Request] = seen) -> httpx.Response:
            seen.append(request)
            if len(seen) % 2:
                return httpx.Response(503, json={"error": "busy"}, headers={"Retry-After": "0"})
            return httpx.Response(200, json={"name": "acme"})

        fake = FakeTime()
        client = make(every_other, fake)
        for _ in range(150):
            if isinstance(client, MemoriaClient):
                assert (await client.tenant())["name"] == "acme"
            else:
                assert client.tenant()["name"] == "acme"
        if isinstance(client, MemoriaClient):
            await client.aclose()
        else:
            client.close()
        ids = [request.headers["x-request-id"] for request in seen]
        assert len(seen) == 300 and fake.waits == [0.0] * 150
        assert all(ids[i] == ids[i + 1] for i in range(0, 300, 2))
        assert len(set(ids)) == 150


async def test_the_blocking_client_works_inside_a_running_event_loop() -> None:
    script = Script([503])
    with sync_client(script.handler, FakeTime()) as client:
        assert client.tenant()["name"] == "acme"
    assert len(script.seen) == 2
