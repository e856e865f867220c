"""``MemoriaClient``: the routes sent with ``httpx.AsyncClient``, the plans of ``core`` awaited."""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from service.client import core
from service.client.requests import Call
from service.client.routes import Routes
from service.queue.schemas import JobInfo

T = TypeVar("T")


class MemoriaClient(Routes):
    """The async client (``httpx.AsyncClient``); use it as ``async with``, or ``aclose()``."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float | httpx.Timeout = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
        max_retries: int = 3,
        backoff_base: float = 0.5,
        backoff_cap: float = 30.0,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=core.client_headers(api_key),
            timeout=timeout,
            transport=transport,
        )
        self._retry = core.RetryPolicy(max_retries, backoff_base, backoff_cap)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def wait_for_job(
        self, job_id: int, *, timeout: float = 60.0, interval: float = 0.2
    ) -> JobInfo:
        """Poll a job until it is ``done`` or ``failed``; ``TimeoutError`` past ``timeout``."""
        return await core.drive_async(
            core.wait_for_job(job_id, timeout, interval, self._retry), self._perform
        )

    async def _run(self, call: Call[T]) -> T:
        return await core.drive_async(core.run_call(call, self._retry), self._perform)

    async def _perform(self, step: core.Step) -> Any:
        if isinstance(step, core.Send):
            return await self._send(step.call, step.request_id)
        if isinstance(step, core.Sleep):
            return await self._sleep(step.seconds)
        return self._clock()

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def _clock(self) -> float:
        return time.monotonic()

    async def _send(self, call: Call[T], request_id: str) -> T | core.Accepted:
        request = self._http.build_request(
            call.method,
            call.path,
            params=call.params,
            json=call.body,
            headers=core.send_headers(call, request_id),
        )
        response = await self._http.send(request, stream=True)
        try:
            if call.sink is not None and core.streams_into_sink(call, response):
                written = 0
                async for chunk in response.aiter_bytes():
                    call.sink.write(chunk)
                    written += len(chunk)
                return written  # type: ignore[return-value]  # Call[int] by construction
            await response.aread()
            return core.read_answer(call, response)
        finally:
            await response.aclose()
