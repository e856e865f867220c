"""What a client does around its requests, written once for both clients and free of I/O.

A call's retries, a job wait and a large export are *plans*: generators that yield the steps
they need (``Send`` a request, ``Sleep``, read the ``Clock``) and receive each step's outcome,
or have its exception thrown into them. ``MemoriaClient`` performs the steps with ``await``,
``SyncMemoriaClient`` by blocking; every decision (which answers to retry, how long to wait,
when a wait times out, what a finished export job leads to) is taken here, so the two clients
cannot drift apart.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import ValidationError

from service.client.errors import MemoriaAPIError
from service.client.requests import Call, job_call, parse_streamed
from service.queue.schemas import JobInfo

T = TypeVar("T")

USER_AGENT = "memoria-client/0.1"
RETRY_STATUSES = frozenset({429, 503})
# Connection failures where nothing reached the service: safe to send again, whatever the method.
RETRY_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout)
# How long an export call waits for the job writing a large export.
EXPORT_WAIT_SECONDS = 3600.0
EXPORT_POLL_SECONDS = 0.5


@dataclass(frozen=True)
class Send:
    """Send ``call`` once; the outcome is its result, an ``Accepted``, or a raised error."""

    call: Call[Any]
    request_id: str


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds``; the outcome is ``None``."""

    seconds: float


@dataclass(frozen=True)
class Clock:
    """Read the monotonic clock; the outcome is its value in seconds."""


@dataclass(frozen=True)
class Accepted:
    """A 202 answer to a streamed call: a job writes the large export first."""

    body: Any


Step = Send | Sleep | Clock
Plan = Generator[Step, Any, T]


@dataclass(frozen=True)
class RetryPolicy:
    """When to try a call again, and after how long."""

    max_retries: int
    base: float
    cap: float

    def delay(self, attempt: int, error: MemoriaAPIError | None) -> float | None:
        """Seconds to wait before try ``attempt + 1``, or ``None`` to give up."""
        if attempt >= self.max_retries:
            return None
        if error is not None and error.retry_after is not None:
            # The server said when; waiting longer than the cap is the caller's decision.
            return error.retry_after if error.retry_after <= self.cap else None
        # Full jitter: many bots shed by one overloaded service do not come back in step.
        return random.uniform(0, min(self.cap, self.base * 2**attempt))  # noqa: S311


def client_headers(api_key: str) -> dict[str, str]:
    """The headers every request of a client carries."""
    return {"Authorization": f"Bearer {api_key}", "User-Agent": USER_AGENT}


def send_headers(call: Call[Any], request_id: str) -> dict[str, str]:
    """The headers of one request: its logical call's id, and the call's own."""
    return {"X-Request-ID": request_id, **(call.headers or {})}


def streams_into_sink(call: Call[Any], response: httpx.Response) -> bool:
    """Whether the transport streams this answer's body into the call's sink (else reads it)."""
    return call.sink is not None and response.is_success and response.status_code != 202


def read_answer(call: Call[T], response: httpx.Response) -> T | Accepted:
    """The outcome of a read answer: its parsed result, an ``Accepted`` export, or the error.

    The service answers every route itself, never with a redirect: a 3xx comes from something
    in front of it (a proxy, a login page, ``http://`` sent to ``https://``), and neither it
    nor a success whose body is not JSON holds an answer to parse.
    """
    if not response.is_success:
        raise MemoriaAPIError.from_response(response)
    try:
        if call.sink is not None:  # not streamed: a large export, written by a job first
            return Accepted(response.json())
        return call.parse(response)
    except json.JSONDecodeError:
        raise MemoriaAPIError.not_json(response) from None
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise MemoriaAPIError.not_json(response) from None
        raise


def run_call(call: Call[T], retry: RetryPolicy) -> Plan[T]:
    """One logical call: tries under one request id, 429/503 and connect errors retried."""
    # One request id for all tries: the service's logs tie them together, and a retried write
    # is a duplicate it recognizes.
    request_id = uuid.uuid4().hex
    attempt = 0
    while True:
        error: MemoriaAPIError | None = None
        try:
            return (yield from _attempt(call, request_id, retry))
        except MemoriaAPIError as exc:
            if exc.status not in RETRY_STATUSES:
                if call.recover is not None:
                    return call.recover(exc)
                raise
            error = exc
        except RETRY_ERRORS:
            if attempt >= retry.max_retries:
                raise
        delay = retry.delay(attempt, error)
        if delay is None:
            assert error is not None
            raise error
        attempt += 1
        yield Sleep(delay)


def wait_for_job(job_id: int, timeout: float, interval: float, retry: RetryPolicy) -> Plan[JobInfo]:
    """Poll a job until it is ``done`` or ``failed``; ``TimeoutError`` past ``timeout``."""
    deadline = (yield Clock()) + timeout
    while True:
        job = yield from run_call(job_call(job_id), retry)
        if job.status in ("done", "failed"):
            return job
        if (yield Clock()) > deadline:
            raise TimeoutError(f"job {job_id} is still {job.status} after {timeout}s")
        yield Sleep(interval)


def _attempt(call: Call[T], request_id: str, retry: RetryPolicy) -> Plan[T]:
    """One try of a call; a large export's wait and fetch belong to the try that started it."""
    outcome = yield Send(call, request_id)
    if isinstance(outcome, Accepted):
        written: T = yield from _export_later(outcome.body, call, request_id, retry)
        return written
    result: T = outcome
    return result


def _export_later(accepted: Any, call: Call[Any], request_id: str, retry: RetryPolicy) -> Plan[Any]:
    """A large export: wait for its job, then stream what it wrote."""
    job_id = int(accepted["job_id"])
    job = yield from wait_for_job(job_id, EXPORT_WAIT_SECONDS, EXPORT_POLL_SECONDS, retry)
    if job.status != "done":
        raise MemoriaAPIError(
            409,
            "conflict",
            f"the export's job {job.id} failed: {job.last_error}",
            "export_id",
            request_id,
        )
    fetch = Call("GET", str(accepted["export_url"]), parse_streamed, sink=call.sink)
    return (yield from _attempt(fetch, request_id, retry))


def drive(plan: Plan[T], perform: Callable[[Step], Any]) -> T:
    """Run a plan to its end, performing each step with the blocking ``perform``."""
    outcome: Any = None
    failure: Exception | None = None
    while True:
        try:
            step = plan.send(outcome) if failure is None else plan.throw(failure)
        except StopIteration as finished:
            result: T = finished.value
            return result
        try:
            outcome, failure = perform(step), None
        except Exception as exc:  # the plan decides: retry, recover, or let it rise
            outcome, failure = None, exc


async def drive_async(plan: Plan[T], perform: Callable[[Step], Awaitable[Any]]) -> T:
    """Run a plan to its end, awaiting each step with ``perform`` (``drive``, for asyncio)."""
    outcome: Any = None
    failure: Exception | None = None
    while True:
        try:
            step = plan.send(outcome) if failure is None else plan.throw(failure)
        except StopIteration as finished:
            result: T = finished.value
            return result
        try:
            outcome, failure = await perform(step), None
        except Exception as exc:  # the plan decides: retry, recover, or let it rise
            outcome, failure = None, exc
