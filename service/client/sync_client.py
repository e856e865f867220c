"""``SyncMemoriaClient``: the routes sent with ``httpx.Client``, the plans of ``core`` blocking."""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from service.client import core
from service.client.requests import Call
from service.client.routes import Routes
from service.queue.schemas import JobInfo

T = TypeVar("T")


class SyncMemoriaClient(Routes):
    """The blocking client (``httpx.Client``), for scripts and threads; ``with`` or ``close()``."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | httpx.Timeout = 30.0,
        transport: httpx.BaseTransport | None = None,
        max_retries: int = 3,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url,
            headers=core.client_headers(api_key),
            timeout=timeout,
            transport=transport,
        )
        self._retry = core.RetryPolicy(max_retries, backoff_base, backoff_cap)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def wait_for_job(self, job_id: int, *, timeout: float = 60.0, interval: float = 0.2) -> JobInfo:
        """Poll a job until it is ``done`` or ``failed``; ``TimeoutError`` past ``timeout``."""
        return core.drive(core.wait_for_job(job_id, timeout, interval, self._retry), self._perform)

    def _run(self, call: Call[T]) -> T:
        return core.drive(core.run_call(call, self._retry), self._perform)

    def _perform(self, step: core.Step) -> Any:
        if isinstance(step, core.Send):
            return self._send(step.call, step.request_id)
        if isinstance(step, core.Sleep):
            return self._sleep(step.seconds)
        return self._clock()

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _clock(self) -> float:
        return time.monotonic()

    def _send(self, call: Call[T], request_id: str) -> T | core.Accepted:
        request = self._http.build_request(
            call.method,
            call.path,
            params=call.params,
            json=call.body,
            headers=core.send_headers(call, request_id),
        )
        response = self._http.send(request, stream=True)
        try:
            if call.sink is not None and core.streams_into_sink(call, response):
                written = 0
                for chunk in response.iter_bytes():
                    call.sink.write(chunk)
                    written += len(chunk)
                return written  # type: ignore[return-value]  # Call[int] by construction
            response.read()
            return core.read_answer(call, response)
        finally:
            response.close()
