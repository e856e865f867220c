"""Fuzz the whole HTTP API from its own OpenAPI document: values it allows and values it
forbids, for every operation. No answer may be a 5xx, and every answer must be documented:
its status code, content type and body.

The app runs behind uvicorn on a loopback port for the whole module (one startup, real HTTP,
the real body limit). Schemathesis' own pytest parametrization is not used: it renames tests
through pytest internals that pytest 9 changed, and ends an ASGI app's lifespan after each test.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
import uvicorn
from hypothesis import HealthCheck, Phase
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.app import create_app
from tests.conftest import ADMIN, DatabaseFactory, make_settings

# Small and repeatable for CI; FUZZ_EXAMPLES=500 FUZZ_SEED=random for a deeper hunt.
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "20"))
RANDOM = os.environ.get("FUZZ_SEED") == "random"

# The operations to fuzz, known at collection time from an app that is never started (the URL
# is never connected to); the test itself fuzzes the document the running app serves.
_UNUSED_DB = "postgresql://unused@127.0.0.1:9/unused"
_DOCUMENT = create_app(make_settings(_UNUSED_DB), migrate=False, run_worker=False).openapi_schema
_DOCUMENT_PATHS = _DOCUMENT.to_schema()["paths"]


def _breakable(operation: dict[str, Any]) -> bool:
    """Whether the document forbids some input: a body, or a parameter other than a free path
    string (any text is a valid path string)."""
    return "requestBody" in operation or any(
        p["in"] != "path" or p["schema"] != {"type": "string"}
        for p in operation.get("parameters", [])
    )


# Every operation with values the document allows; those with an input to break also with
# values it forbids.
CASES = [
    pytest.param(mode, f"{method.upper()} {path}", id=f"{mode.value}-{method.upper()} {path}")
    for path, item in _DOCUMENT_PATHS.items()
    for method, operation in item.items()
    if method in ("get", "put", "post", "patch", "delete")
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or _breakable(operation)
]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


class Fuzzer:
    """The served app, its document, an HTTP session and a tenant's key."""

    def __init__(self, base_url: str, schema: schemathesis.BaseSchema, key: str) -> None:
        self.base_url = base_url
        self.schema = schema
        self.session = requests.Session()
        self.tenant = {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
async def fuzz_db(databases: DatabaseFactory) -> str:
    return await databases.create()


@pytest.fixture(scope="module")
def fuzzer(fuzz_db: str) -> Iterator[Fuzzer]:
    """The app behind uvicorn on a loopback port, in a thread with its own event loop."""
    app = create_app(make_settings(fuzz_db), migrate=False, run_worker=False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        created = requests.post(
            f"{base_url}/admin/tenants", json={"name": "fuzz"}, headers=ADMIN, timeout=30
        )
        assert created.status_code == 201, created.text
        schema = schemathesis.openapi.from_url(f"{base_url}/schema/openapi.json")
        assert schema.raw_schema["paths"] == _DOCUMENT_PATHS
        yield Fuzzer(base_url, schema, created.json()["api_key"]["key"])
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.mark.parametrize(("mode", "label"), CASES)
def test_operation(fuzzer: Fuzzer, mode: GenerationMode, label: str) -> None:
    """No 5xx, and only documented answers, for one operation and one kind of input."""
    method, path = label.split(" ", 1)
    operation = fuzzer.schema[path][method]
    headers = ADMIN if path.startswith("/admin") else fuzzer.tenant

    @hypothesis.settings(
        max_examples=EXAMPLES,
        derandomize=not RANDOM,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case: schemathesis.Case) -> None:
        case.call_and_validate(
            base_url=fuzzer.base_url,
            session=fuzzer.session,
            headers=headers,
            checks=CHECKS,
            timeout=30,
        )

    fuzz()
