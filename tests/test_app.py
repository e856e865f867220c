"""The app's contract with every client: probes, JSON errors, limits, the OpenAPI document."""

from __future__ import annotations

import gc
import logging
import weakref

import pytest
from litestar.exceptions import (
    HTTPException,
    InternalServerException,
    ServiceUnavailableException,
)

from service.app import create_app
from service.errors import ConfigurationError
from tests.conftest import (
    ADMIN,
    AppClient,
    DatabaseFactory,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
)


async def test_health_and_readiness(client: AppClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ok"


async def test_not_ready_before_migrations(databases: DatabaseFactory) -> None:
    url = await databases.create_empty()
    async with serve_app(create_app(make_settings(url), migrate=False, run_worker=False)) as client:
        assert (await client.get("/healthz")).status_code == 200
        ready = await client.get("/readyz")
        assert ready.status_code == 503
        assert "migrations" in ready.json()["detail"]


async def test_serve_applies_migrations_at_start(databases: DatabaseFactory) -> None:
    url = await databases.create_empty()
    async with serve_app(create_app(make_settings(url), migrate=True, run_worker=False)) as client:
        assert (await client.get("/readyz")).status_code == 200
        await new_tenant(client)


async def test_unknown_route_is_a_json_404_with_request_id(client: AppClient) -> None:
    response = await client.get("/v1/no-such-thing")
    assert response.status_code == 404
    body = response.json()
    assert body["error"] == "not_found"
    assert body["request_id"] == response.headers["x-request-id"]


async def test_client_request_id_is_echoed(client: AppClient) -> None:
    response = await client.get("/healthz", headers={"X-Request-ID": "bot-42:turn-7"})
    assert response.headers["x-request-id"] == "bot-42:turn-7"
    # An id that could smuggle header content is replaced, not echoed.
    response = await client.get("/healthz", headers={"X-Request-ID": "a" * 300})
    assert response.headers["x-request-id"] != "a" * 300


async def test_oversized_body_gets_413(db_url: str) -> None:
    settings = make_settings(db_url, max_body_bytes=4096)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        response = await client.post("/admin/tenants", json={"name": "x" * 5000}, headers=ADMIN)
        assert response.status_code == 413
        assert response.json()["error"] == "payload_too_large"
        listed = await client.get("/admin/tenants", headers=ADMIN)
        assert listed.json() == []


async def test_validation_errors_name_the_field(client: AppClient) -> None:
    response = await client.post("/admin/tenants", json={"name": ""}, headers=ADMIN)
    assert response.status_code == 422
    assert response.json()["field"] == "name"
    response = await client.post("/admin/tenants", json={"nom": "x"}, headers=ADMIN)
    assert response.status_code == 422
    response = await client.post(
        "/admin/tenants",
        content=b"{not json",
        headers={**ADMIN, "Content-Type": "application/json"},
    )
    assert 400 <= response.status_code < 500
    tenant = await new_tenant(client)
    response = await client.get("/v1/jobs?status=sleeping", headers=tenant.headers)
    assert response.status_code == 422
    assert response.json()["field"] == "status"


async def test_internal_errors_hide_details_and_carry_a_logged_request_id(
    client: AppClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tenant = await new_tenant(client)
    from service.tenants import repository

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(repository, "list_keys", broken)
    with caplog.at_level(logging.ERROR, logger="service.http"):
        response = await client.get("/v1/keys", headers=tenant.headers)
    assert response.status_code == 500
    body = response.json()
    assert "secret internal detail" not in response.text
    assert "Traceback" not in response.text
    assert body["request_id"] == response.headers["x-request-id"]
    assert body["request_id"] in body["message"]
    assert any(body["request_id"] in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "error",
    [
        HTTPException(status_code=500, detail="raised as an answer"),
        InternalServerException(),
        ServiceUnavailableException(),
        ConfigurationError("an embedder of the wrong width"),
    ],
    ids=["HTTPException", "InternalServerException", "503", "ConfigurationError"],
)
async def test_a_server_error_raised_on_purpose_is_logged_like_an_unexpected_one(
    client: AppClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
) -> None:
    tenant = await new_tenant(client)
    from service.tenants import repository

    async def broken(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(repository, "list_keys", broken)
    with caplog.at_level(logging.ERROR, logger="service.http"):
        response = await client.get("/v1/keys", headers=tenant.headers)
    assert response.status_code >= 500
    request_id = response.json()["request_id"]
    (logged,) = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged.levelno == logging.ERROR
    assert logged.exc_info is not None and logged.exc_info[1] is error


async def test_openapi_document_and_page(client: AppClient) -> None:
    document = (await client.get("/schema/openapi.json")).json()
    assert "/admin/tenants" in document["paths"]
    assert "/v1/jobs" in document["paths"]
    page = await client.get("/schema")
    assert page.status_code == 200
    assert "html" in page.headers["content-type"]


async def test_start_refuses_an_embedder_of_another_dimension(db_url: str, llm) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(
        db_url,
        models={
            "embedding": {
                "provider": "openai",
                "api_url": llm.base_url,
                "model_name": "big-embedder",
                "dimensions": 1536,
            }
        },
    )
    app = create_app(settings, migrate=False, run_worker=False)
    with pytest.raises(ConfigurationError) as raised:
        async with serve_app(app):
            pass
    assert "memoria reembed" in str(raised.value)
    assert "384" in str(raised.value)


async def test_a_database_migrated_by_a_newer_release_still_counts_as_ready(
    client: AppClient, db_url: str
) -> None:
    async with raw_connection(db_url) as conn:
        await conn.execute("UPDATE alembic_version SET version_num = '9999_from_the_future'")
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert "newer" in ready.json()["detail"]
        # An older, known revision is not ready: this code needs the newer schema.
        await conn.execute("DELETE FROM alembic_version")
        assert (await client.get("/readyz")).status_code == 503


class _Node:
    """An object in a reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


async def test_what_start_loads_is_out_of_the_collectors_way_until_close(settings) -> None:  # type: ignore[no-untyped-def]
    # A full collection during a request walks what requests made, not every library and
    # model object loaded at start (60-70 ms a time, every few searches of a big group).
    gc.unfreeze()
    garbage = _Node()
    collected = weakref.ref(garbage)
    del garbage
    app = create_app(settings, migrate=False, run_worker=False)
    async with serve_app(app) as http:
        runtime = app.state.runtime
        assert (await http.get("/readyz")).status_code == 200
        tracked = {id(thing) for thing in gc.get_objects()}
        loaded = [runtime, runtime.db, runtime.auth, app, app.routes]
        assert not any(id(thing) in tracked for thing in loaded)
        assert gc.get_freeze_count() > 10_000
        # Garbage of before the start was freed, not set aside for good.
        assert collected() is None
        # What a request makes is the collector's.
        made = _Node()
        assert id(made) in {id(thing) for thing in gc.get_objects()}
    # Closed: what was set aside is the collector's again (a test process starts many apps).
    assert gc.get_freeze_count() == 0
    assert id(runtime) in {id(thing) for thing in gc.get_objects()}


async def test_requests_over_time_leave_what_start_set_aside_alone(settings) -> None:  # type: ignore[no-untyped-def]
    # Hundreds of searches, each with new words: what they make is collected, nothing is set
    # aside again, and the collectable heap does not grow with them.
    app = create_app(settings, migrate=False, run_worker=False)
    async with serve_app(app) as http:
        tenant = await new_tenant(http)
        messages = [
            {
                "message_id": f"m{n}",
                "sender_id": f"u{n % 9}",
                "text": f"第{n}天去了西湖第{n % 13}号码头",
            }
            for n in range(200)
        ]
        body = {"request_type": "group", "group_id": "g:%1", "messages": messages}
        assert (await http.post("/v1/messages", json=body, headers=tenant.headers)).is_success
        frozen = gc.get_freeze_count()

        async def searches(first: int, count: int) -> None:
            for n in range(first, first + count):
                question = {"query": f"第{n}天在哪个码头 {n}", "group_id": "g:%1", "top_k": 5}
                response = await http.post(
                    "/v1/messages/search", json=question, headers=tenant.headers
                )
                assert response.status_code == 200, response.text

        await searches(0, 50)
        gc.collect()
        settled = len(gc.get_objects())
        await searches(50, 300)
        gc.collect()
        # (Set-aside objects may still be freed when their last reference goes.)
        assert gc.get_freeze_count() <= frozen
        assert len(gc.get_objects()) - settled < 5_000
