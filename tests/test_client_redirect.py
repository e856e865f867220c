"""Both clients against a real HTTP server that is not the service: a redirect or a body that
is not JSON is a ``MemoriaAPIError`` naming what answered, never a ``JSONDecodeError`` or an
empty export."""

from __future__ import annotations

import io
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from service.client import MemoriaAPIError, MemoriaClient, SyncMemoriaClient


class Scripted(BaseHTTPRequestHandler):
    """Answers every request with the server's one scripted status, headers and body."""

    def _answer(self) -> None:
        status, headers, body = self.server.answer  # type: ignore[attr-defined]
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def url(httpd: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{httpd.server_address[1]}"


async def call_both(base: str, method: str, *args: Any) -> list[BaseException]:
    """The error each client raises for one call (none raised is a failure)."""
    raised: list[BaseException] = []
    with SyncMemoriaClient(base, "mk_x", max_retries=0) as sync:
        try:
            getattr(sync, method)(*args)
        except Exception as exc:
            raised.append(exc)
        else:
            pytest.fail(f"the blocking client's {method} answered")
    async with MemoriaClient(base, "mk_x", max_retries=0) as client:
        try:
            await getattr(client, method)(*args)
        except Exception as exc:
            raised.append(exc)
        else:
            pytest.fail(f"the async client's {method} answered")
    return raised


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_with_an_empty_body_is_an_api_error(
    server: ThreadingHTTPServer, status: int
) -> None:
    target = f"https://login.example/{uuid.uuid4().hex}"
    server.answer = (status, {"Location": target}, b"")  # type: ignore[attr-defined]
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("get_event", (f"{uuid.uuid4().hex}:1",)),
        ("memos", ()),
        ("export_user", (uuid.uuid4().hex, io.BytesIO())),
    ]
    for method, args in calls:
        for error in await call_both(url(server), method, *args):
            assert isinstance(error, MemoriaAPIError), (method, repr(error))
            assert error.status == status
            assert target in error.message


async def test_a_success_that_is_not_json_is_an_api_error(server: ThreadingHTTPServer) -> None:
    page = f"<html>{uuid.uuid4().hex}</html>".encode()
    server.answer = (200, {"Content-Type": "text/html"}, page)  # type: ignore[attr-defined]
    for error in await call_both(url(server), "get_event", f"{uuid.uuid4().hex}:1"):
        assert isinstance(error, MemoriaAPIError), repr(error)
        assert error.error == "not_json"
        assert page.decode() in error.message
