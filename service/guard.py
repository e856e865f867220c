"""Staying up under load: per-key rate limits, and shedding work beyond capacity.

Beyond ``max_inflight_requests`` concurrent requests a process answers 503 at once with
``Retry-After`` instead of queueing without bound (latency and memory stay bounded); a key
over its rate gets 429 with ``Retry-After``.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from service.errors import TooManyRequests
from service.observability import SHED


@dataclass
class RateLimiter:
    """Token buckets per key (an API key, a client address): ``rate`` per second, bursts up
    to ``burst``, for at most ``max_keys`` keys at once."""

    rate: float
    burst: int
    max_keys: int = 100_000
    # What a key names, for the refusal's message; or the whole message.
    of: str = "key"
    refusal: str = ""
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)

    def wait(self, key: str) -> float:
        """Seconds until ``key`` has a token again (0: it has one now); spends nothing."""
        if self.rate <= 0 or key not in self._buckets:
            return 0.0
        tokens, last = self._buckets[key]
        tokens = min(float(self.burst), tokens + (time.monotonic() - last) * self.rate)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def check(self, key: str) -> None:
        """Spend one token of ``key``, or raise ``TooManyRequests`` with the wait."""
        if self.rate <= 0:
            return
        now = time.monotonic()
        tokens, last = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - last) * self.rate)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            raise self.refused((1 - tokens) / self.rate)
        self._buckets[key] = (tokens - 1, now)
        if len(self._buckets) > self.max_keys:
            self._make_room(now)

    def refused(self, wait: float) -> TooManyRequests:
        """The refusal of a key that has a token again in ``wait`` seconds."""
        message = self.refusal or f"rate limit of {self.rate:g} requests/s for this {self.of}"
        return TooManyRequests(message, retry_after=wait)

    def _make_room(self, now: float) -> None:
        # Forget the buckets that have refilled (a new one would be the same), then those
        # with the most tokens left, down to 90% of the cap: a key being held back is the
        # last forgotten. Forgetting every bucket at once would let anyone who can send from
        # enough addresses (or keys) reset the limit of the one being held back.
        level = {
            key: min(float(self.burst), tokens + (now - last) * self.rate)
            for key, (tokens, last) in self._buckets.items()
        }
        kept = heapq.nsmallest(self.max_keys * 9 // 10, level, key=level.__getitem__)
        self._buckets = {k: self._buckets[k] for k in kept if level[k] < self.burst}


def admit(*limits: tuple[RateLimiter, str]) -> None:
    """Spend one token of each (limiter, key), or none of them: ``TooManyRequests`` with the
    longest wait when any has none (a request refused by one limit costs the others
    nothing)."""
    waits = [(limiter.wait(key), limiter) for limiter, key in limits]
    wait, limiter = max(waits, key=lambda w: w[0])
    if wait > 0:
        raise limiter.refused(wait)
    for limiter, key in limits:
        limiter.check(key)


def shedding_middleware(limit: int) -> Callable[[ASGIApp], ASGIApp]:
    """An ASGI wrapper factory: refuse requests beyond ``limit`` in flight with a quick 503.

    Litestar wraps each route separately, so the count lives out here, shared by all.
    """
    inflight = [0]

    def wrap(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != ScopeType.HTTP:
                await app(scope, receive, send)
                return
            if inflight[0] >= limit:
                SHED.labels("inflight").inc()
                body = json.dumps(
                    {
                        "status": 503,
                        "error": "overloaded",
                        "message": "the service is at capacity; retry shortly",
                    }
                ).encode()
                start: Any = {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"retry-after", b"1"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
                end: Any = {"type": "http.response.body", "body": body}
                await send(start)
                await send(end)
                return
            inflight[0] += 1
            try:
                await app(scope, receive, send)
            finally:
                inflight[0] -= 1

        return middleware

    return wrap
