"""Slow clients against the real server (uvicorn as ``serve`` configures it, on a loopback
port): a connection whose headers never finish is closed at the header timeout, and past the
connection cap a new one is turned away at once, while whole requests are answered."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest
import uvicorn

from service.app import create_app
from service.server import server_config
from service.settings import Settings
from tests.conftest import make_settings

HEADER_TIMEOUT = 1.0
CAP = 12


@dataclass(frozen=True)
class Served:
    port: int
    server: uvicorn.Server

    def open_connections(self) -> int:
        return len(self.server.server_state.connections)


@contextmanager
def serving(settings: Settings) -> Iterator[Served]:
    """The app under ``serve``'s server configuration on a free loopback port."""
    app = create_app(settings, migrate=False, run_worker=False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(server_config(app, settings))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive(), "the server did not start"
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield Served(port, server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def partial_request(port: int) -> socket.socket:
    """A connection that has sent a request line and one header line, and no end of them."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn.sendall(f"GET /healthz HTTP/1.1\r\nHost: x\r\nX-{uuid.uuid4().hex}: ".encode())
    return conn


def answer_and_close(conn: socket.socket, wait: float) -> bytes | None:
    """What the server sent before closing ``conn``, or None if it is still open after
    ``wait`` seconds."""
    conn.settimeout(0.2)
    received = b""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            chunk = conn.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    return None


def healthz(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code


@pytest.fixture
def served(db_url: str) -> Iterator[Served]:
    settings = make_settings(db_url, header_timeout_seconds=HEADER_TIMEOUT, max_connections=CAP)
    with serving(settings) as served:
        yield served


@pytest.fixture
def port(served: Served) -> int:
    return served.port


def test_a_connection_whose_headers_never_end_is_closed(port: int) -> None:
    """Connections that send part of their headers get a 408 and are closed at the header
    timeout; a whole request meanwhile is answered."""
    slow = [partial_request(port) for _ in range(8)]
    assert healthz(port) == 200
    for conn in slow:
        answer = answer_and_close(conn, wait=HEADER_TIMEOUT + 4)
        assert answer is not None, "a connection without headers is still open"
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b"headers did not arrive" in answer
        conn.close()
    assert healthz(port) == 200


def test_dripping_header_bytes_does_not_move_the_deadline(port: int) -> None:
    """A byte of header now and then, for three times the timeout: the connection is closed
    at the timeout all the same, not kept open by each byte."""
    conn = partial_request(port)
    closed = False
    deadline = time.monotonic() + 3 * HEADER_TIMEOUT
    while time.monotonic() < deadline and not closed:
        time.sleep(HEADER_TIMEOUT / 5)
        try:
            conn.sendall(b"a")
        except OSError:
            closed = True
    # Closed by now, not a timeout after the last byte.
    assert closed or answer_and_close(conn, wait=HEADER_TIMEOUT / 2) is not None
    conn.close()


def test_a_kept_alive_connection_that_stalls_in_its_next_headers_is_closed(port: int) -> None:
    """After a whole request on a kept-alive connection, the next request's headers have the
    same deadline, from their first byte."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    first = conn.recv(65536)
    assert first.startswith(b"HTTP/1.1 200 "), first
    conn.sendall(f"GET /healthz HTTP/1.1\r\nX-{uuid.uuid4().hex}: ".encode())
    answer = answer_and_close(conn, wait=HEADER_TIMEOUT + 4)
    conn.close()
    assert answer is not None, "the kept-alive connection is still open"
    assert answer.startswith(b"HTTP/1.1 408 "), answer


def test_connections_past_the_cap_are_turned_away(served: Served) -> None:
    """With the cap's worth of connections held open, one more gets a 503 and is closed at
    once; once the held ones time out, whole requests are answered again."""
    held = [partial_request(served.port) for _ in range(CAP)]
    deadline = time.monotonic() + HEADER_TIMEOUT / 2
    while served.open_connections() < CAP:
        assert time.monotonic() < deadline, "the held connections were not accepted"
        time.sleep(0.01)
    extra = socket.create_connection(("127.0.0.1", served.port), timeout=5)
    answer = answer_and_close(extra, wait=HEADER_TIMEOUT + 4)
    extra.close()
    assert answer is not None, "a connection past the cap was kept open"
    assert answer.startswith(b"HTTP/1.1 503 "), answer
    assert b"retry-after: 1" in answer.lower()
    for conn in held:
        assert answer_and_close(conn, wait=HEADER_TIMEOUT + 4) is not None
        conn.close()
    assert healthz(served.port) == 200
