"""A worker's own small HTTP listener: ``/healthz``, ``/readyz`` and ``/metrics``.

A ``memoria worker`` process serves no API, yet an orchestrator needs to probe it and
Prometheus to scrape its job counters (which live in that process). The answers mean what
the API's do: the event loop answers; the database answers at this code's migration head.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

if TYPE_CHECKING:
    from service.runtime import Runtime

log = logging.getLogger("service.health")

PROBE_PATHS = ("/healthz", "/readyz", "/metrics")
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}
_JSON = "application/json"


async def serve_probes(runtime: Runtime, host: str, port: int) -> asyncio.Server:
    """Listen on ``host:port`` until the returned server is closed."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            # A probe is one short request; a client that dawdles is dropped.
            request_line = await asyncio.wait_for(reader.readline(), timeout=5)
            while (await asyncio.wait_for(reader.readline(), timeout=5)).strip():
                pass  # headers: nothing in them matters here
            method, target, *_ = request_line.decode("latin-1").split()
            status, content_type, body = await _respond(runtime, method, target.split("?")[0])
            head = (
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + (b"" if method == "HEAD" else body))
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError, UnicodeDecodeError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, host, port)
    log.info("worker probes on %s:%d (%s)", host, port, ", ".join(PROBE_PATHS))
    return server


async def _respond(runtime: Runtime, method: str, path: str) -> tuple[int, str, bytes]:
    if path not in PROBE_PATHS:
        return 404, _JSON, json.dumps({"status": "not found"}).encode()
    if method not in ("GET", "HEAD"):
        return 405, _JSON, json.dumps({"status": "method not allowed"}).encode()
    if path == "/metrics":
        return 200, CONTENT_TYPE_LATEST, generate_latest()
    if path == "/healthz":
        return 200, _JSON, json.dumps({"status": "ok"}).encode()
    ready, detail = await runtime.is_ready()
    body = {"status": "ok" if ready else "unavailable", "detail": detail}
    return (200 if ready else 503), _JSON, json.dumps(body).encode()
