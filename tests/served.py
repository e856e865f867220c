"""The app under uvicorn on a loopback port, in a thread: for clients that need a real socket
(the blocking client, an MCP server in another process)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from service.app import create_app
from service.settings import Settings
from tests.conftest import ADMIN


@contextmanager
def served(settings: Settings, *, run_worker: bool = True) -> Iterator[str]:
    """Serve the app on 127.0.0.1 (a free port) with its worker; yields the base URL."""
    app = create_app(settings, migrate=False, run_worker=run_worker)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the app did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def create_tenant(base_url: str, name: str = "acme") -> str:
    """A new tenant through the admin API; returns its API key."""
    response = httpx.post(f"{base_url}/admin/tenants", json={"name": name}, headers=ADMIN)
    assert response.status_code == 201, response.text
    return str(response.json()["api_key"]["key"])
