"""The HTTP server in front of the app: uvicorn, with bounds on what one client can hold.

uvicorn closes a kept-alive connection left idle, but sets no deadline on a request's headers:
a client that opens connections and sends a few bytes of headers now and then holds each one
for ever, and enough of them use up the process's file descriptors while no request has yet
reached the app (so neither the rate limits nor the in-flight cap see them). Here a request's
headers must arrive within ``header_timeout_seconds`` of the connection being opened (or of
its first byte, on a kept-alive connection), or the connection gets a 408 and is closed; and
past ``max_connections`` open at once a new connection gets a 503 and is closed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.observability import SHED
from service.settings import Settings


def _answer(status: int, reason: str, error: str, message: str) -> bytes:
    """A whole HTTP/1.1 response with a JSON error body, closing the connection."""
    body = json.dumps({"status": status, "error": error, "message": message}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
    )
    if status == 503:
        head += "retry-after: 1\r\n"
    return head.encode() + b"\r\n" + body


def guarded_protocol(header_timeout: float, max_connections: int) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with a deadline on each request's headers and a cap on
    the connections open at once."""
    too_slow = _answer(
        408,
        "Request Timeout",
        "request_timeout",
        f"the request's headers did not arrive within {header_timeout:g} s",
    )
    full = _answer(
        503,
        "Service Unavailable",
        "overloaded",
        f"the service has {max_connections} connections open; retry shortly",
    )

    class GuardedProtocol(HttpToolsProtocol):
        _header_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                SHED.labels("connections").inc()
                transport.write(full)
                transport.close()
                return
            self._await_headers()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            # The first request's deadline runs from the connection; a later one's from its
            # first byte (uvicorn's keep-alive timeout covers the wait before it).
            if self._header_deadline is None:
                self._await_headers()

        def on_headers_complete(self) -> None:
            self._headers_arrived()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._headers_arrived()
            super().connection_lost(exc)

        def _await_headers(self) -> None:
            self._header_deadline = self.loop.call_later(header_timeout, self._headers_late)

        def _headers_arrived(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_late(self) -> None:
            self._header_deadline = None
            SHED.labels("header_timeout").inc()
            if not self.transport.is_closing():
                self.transport.write(too_slow)
                self.transport.close()

    return GuardedProtocol


def server_config(app: Any, settings: Settings, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for serving ``app`` as ``settings`` say (``options`` added)."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=guarded_protocol(settings.header_timeout_seconds, settings.max_connections),
        # Our logging (configure_logging) stays, levels included: uvicorn's lines come out in
        # the same format, its start-up narration only at DEBUG (the announcement says it all).
        log_config=None,
        log_level=None,
        access_log=False,
        timeout_graceful_shutdown=int(settings.cognitive.queue.shutdown_seconds) + 10,
        **options,
    )
