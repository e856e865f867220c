"""Large exports run as jobs: 202, a document kept for a while, fetched by its tenant only,
pruned after its retention, and gone with an erasure of the person in it."""

from __future__ import annotations

import io
import json
import random
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator
from typing import IO, Any

import httpx
import pytest

from service.app import create_app
from service.audit import service as audit
from service.client import MemoriaClient, SyncMemoriaClient
from service.db.engine import Database
from service.exports import service as exports
from service.runtime import Runtime
from tests.conftest import (
    ADMIN,
    FAST_QUEUE,
    AppClient,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    until_finished,
    wait_for,
)
from tests.served import create_tenant, served
from tests.test_privacy import (
    GROUP,
    NAME,
    OTHER,
    OTHER_NAME,
    VICTIM,
    leftovers,
    named_in,
    populate,
)


def _runtime(client: AppClient) -> Runtime:
    rt: Runtime = client.app.state.runtime
    return rt


def _without_time(document: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != "generated_at"}


async def test_a_large_export_is_written_by_a_job_and_fetched_by_its_tenant_only(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exports, "CHUNK_CHARS", 300)  # many chunks, each of whole rows
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        tenant = await new_tenant(client)
        other = await new_tenant(client, "other")
        await populate(client, tenant)
        rt = _runtime(client)
        # What the synchronous export says, before the limit is lowered.
        small = await client.get(f"/v1/users/{VICTIM}/export", headers=tenant.headers)
        assert small.status_code == 200
        expected = json.loads(small.content)

        # Hold the worker, so the export is seen pending first.
        assert rt.worker is not None
        await rt.worker.stop(timeout=5)
        rt.settings.export_sync_limit = 0
        response = await client.get(f"/v1/users/{VICTIM}/export", headers=tenant.headers)
        assert response.status_code == 202, response.text
        body = response.json()
        assert body["status_url"] == f"/v1/jobs/{body['job_id']}"
        assert body["export_url"] == f"/v1/exports/{body['export_id']}"
        pending = await client.get(body["export_url"], headers=tenant.headers)
        assert pending.status_code == 409, pending.text
        assert pending.json()["field"] == "export_id" and "not ready" in pending.json()["message"]

        rt.start_worker()
        job = await until_finished(client, tenant, body["job_id"])
        assert job["status"] == "done", job
        assert job["result"]["counts"] == expected["manifest"]["counts"]
        fetched = await client.get(body["export_url"], headers=tenant.headers)
        assert fetched.status_code == 200
        assert fetched.headers["content-type"].startswith("application/json")
        document = json.loads(fetched.content)
        assert _without_time(document) == _without_time(expected)
        assert len(fetched.content) == job["result"]["bytes"]
        async with raw_connection(db_url) as conn:
            chunks = await conn.fetchval(
                "SELECT count(*) FROM export_chunks WHERE export_id = $1", body["export_id"]
            )
        assert chunks > 3

        # Another tenant's key finds nothing there, nor does a wrong id.
        stranger = await client.get(body["export_url"], headers=other.headers)
        assert stranger.status_code == 404 and stranger.json()["field"] == "export_id"
        missing = await client.get(f"/v1/exports/{body['export_id'] + 99}", headers=tenant.headers)
        assert missing.status_code == 404

        # A group's export and the admin's whole-tenant export go the same way.
        group = await client.get("/v1/groups/g7/export", headers=tenant.headers)
        assert group.status_code == 202
        await until_finished(client, tenant, group.json()["job_id"])
        group_doc = json.loads(
            (await client.get(group.json()["export_url"], headers=tenant.headers)).content
        )
        assert group_doc["manifest"]["counts"]["messages"] == 3
        whole = await client.get(f"/admin/tenants/{tenant.id}/export", headers=ADMIN)
        assert whole.status_code == 202, whole.text
        assert whole.json()["status_url"] == whole.json()["export_url"]

        async def tenant_export() -> Any:
            answer = await client.get(whole.json()["export_url"], headers=ADMIN)
            assert answer.status_code in (200, 409), answer.text
            return answer if answer.status_code == 200 else None

        ndjson = await wait_for(tenant_export)
        assert ndjson.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in ndjson.text.splitlines()]
        assert lines[0]["table"] == "tenants"
        messages = [line for line in lines if line["table"] == "messages"]
        assert len(messages) == 4  # three in the group, one in private
        assert (await client.get(group.json()["export_url"], headers=ADMIN)).status_code == 401

        # Erasing the person removes their export and every other export that names them.
        erased = await client.delete(f"/v1/users/{VICTIM}", headers=tenant.headers)
        assert erased.status_code == 200, erased.text
        assert erased.json()["counts"]["exports"] == 3
        gone = await client.get(body["export_url"], headers=tenant.headers)
        assert gone.status_code == 404
        await audit.flush()
    assert await leftovers(db_url, [VICTIM, NAME]) == []


async def test_an_export_that_grows_past_its_bytes_in_the_request_is_written_by_a_job(
    db_url: str,
) -> None:
    # The size check counts a person's own rows; others' messages naming them are found as
    # the document is read, and there can be thousands: a document of any size was read in
    # the request. Past export_sync_bytes, the reading stops and a job writes it.
    settings = make_settings(
        db_url, export_sync_bytes=4000, cognitive={"queue": FAST_QUEUE, "enabled": False}
    )
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        tenant = await new_tenant(client)
        sent = await client.post(
            "/v1/messages", json={**GROUP, "messages": named_in(60)}, headers=tenant.headers
        )
        assert sent.status_code == 202, sent.text
        response = await client.get(f"/v1/users/{VICTIM}/export", headers=tenant.headers)
        assert response.status_code == 202, response.text
        job = await until_finished(client, tenant, response.json()["job_id"])
        assert job["status"] == "done", job
        fetched = await client.get(response.json()["export_url"], headers=tenant.headers)
        written = json.loads(fetched.content)
        _runtime(client).settings.export_sync_bytes = 10**9
        now = await client.get(f"/v1/users/{VICTIM}/export", headers=tenant.headers)
        assert now.status_code == 200 and len(now.content) > 4000
        assert _without_time(written) == _without_time(json.loads(now.content))
        assert all(f"第{n}次" in fetched.text for n in range(60))


async def test_exports_expire_and_are_pruned(db_url: str) -> None:
    settings = make_settings(db_url, export_sync_limit=0, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        tenant = await new_tenant(client)
        await populate(client, tenant)
        response = await client.get("/v1/groups/g7/export", headers=tenant.headers)
        assert response.status_code == 202
        await until_finished(client, tenant, response.json()["job_id"])
        url = response.json()["export_url"]
        assert (await client.get(url, headers=tenant.headers)).status_code == 200
        # The Python client waits for the job and streams what it wrote.
        transport = httpx.ASGITransport(app=client.app)
        async with MemoriaClient("http://memoria.test", tenant.key, transport=transport) as api:
            out = io.BytesIO()
            written = await api.export_user(VICTIM, out)
        assert written == len(out.getvalue())
        assert json.loads(out.getvalue())["subject"] == {"kind": "user", "id": VICTIM}
        async with raw_connection(db_url) as conn:
            await conn.execute("UPDATE exports SET expires_at = now() - interval '1 second'")
            # Past its retention it cannot be fetched, even before the prune runs.
            assert (await client.get(url, headers=tenant.headers)).status_code == 404
            assert await exports.prune(_runtime(client).db) == 2
            assert await conn.fetchval("SELECT count(*) FROM exports") == 0
            assert await conn.fetchval("SELECT count(*) FROM export_chunks") == 0


async def test_a_tenant_asking_for_exports_in_a_loop_stores_a_bounded_number(
    db_url: str,
) -> None:
    # Each large export is stored for export_retention_hours: a tenant asking for its whole
    # data in a loop stored it again each time, filling the shared disk. Asked again while
    # written, the same export comes back; past the cap, 429 until the first expires.
    settings = make_settings(db_url, export_sync_limit=0, max_exports_per_tenant=3)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        tenant = await new_tenant(client)
        said = [
            {"message_id": str(n), "sender_id": who, "sender_name": name, "text": "早上好"}
            for n, (who, name) in enumerate([(VICTIM, NAME), (OTHER, OTHER_NAME)] * 2)
        ]
        await client.post("/v1/messages", json={**GROUP, "messages": said}, headers=tenant.headers)
        group = [await client.get("/v1/groups/g7/export", headers=tenant.headers) for _ in range(5)]
        assert {r.status_code for r in group} == {202}
        assert len({(r.json()["export_url"], r.json()["job_id"]) for r in group}) == 1
        # Its job failed for good: asked again, the same export, its job run again.
        async with raw_connection(db_url) as conn:
            failed = "UPDATE jobs SET status = 'failed', attempts = max_attempts WHERE id = $1"
            await conn.execute(failed, group[0].json()["job_id"])
            retried = await client.get("/v1/groups/g7/export", headers=tenant.headers)
            assert retried.json()["job_id"] == group[0].json()["job_id"]
            status = await conn.fetchval(
                "SELECT status FROM jobs WHERE id = $1", group[0].json()["job_id"]
            )
        assert status == "queued"
        # Another key asks for its own (only the asker may fetch an export).
        second = (await client.post("/v1/keys", headers=tenant.headers)).json()["key"]
        theirs = await client.get(
            "/v1/groups/g7/export", headers={"Authorization": f"Bearer {second}"}
        )
        assert theirs.status_code == 202 and theirs.json()["job_id"] != group[0].json()["job_id"]
        person = await client.get(f"/v1/users/{VICTIM}/export", headers=tenant.headers)
        assert person.status_code == 202
        refused = await client.get(f"/v1/users/{OTHER}/export", headers=tenant.headers)
        assert refused.status_code == 429 and "at most 3 exports" in refused.text
        assert 23 * 3600 < int(refused.headers["retry-after"]) <= 24 * 3600
        other = await new_tenant(client, "other")
        await client.post("/v1/messages", json={**GROUP, "messages": said}, headers=other.headers)
        assert (await client.get("/v1/groups/g7/export", headers=other.headers)).status_code == 202
        async with raw_connection(db_url) as conn:
            await conn.execute(
                "UPDATE exports SET expires_at = now() - interval '1 second' WHERE id = $1",
                int(group[0].json()["export_url"].rsplit("/", 1)[1]),
            )
            stored = await conn.fetchval(
                "SELECT count(*) FROM exports WHERE tenant_id = $1", tenant.id
            )
        assert stored == 3
        # One has expired: there is room for the next.
        again = await client.get(f"/v1/users/{OTHER}/export", headers=tenant.headers)
        assert again.status_code == 202, again.text


def test_the_blocking_client_waits_for_a_large_export(db_url: str) -> None:
    settings = make_settings(db_url, export_sync_limit=0, cognitive={"queue": FAST_QUEUE})
    with served(settings) as base_url, SyncMemoriaClient(base_url, create_tenant(base_url)) as api:
        api.store_messages(
            {
                "request_type": "group",
                "group_id": "g7",
                "messages": [{"message_id": "1", "sender_id": VICTIM, "text": "我家住在姑苏城外"}],
            }
        )
        out = io.BytesIO()
        written = api.export_group("g7", out)
        assert written == len(out.getvalue())
        assert json.loads(out.getvalue())["manifest"]["counts"]["messages"] == 1
        assert api.list_jobs().jobs[0].kind == exports.EXPORT_JOB  # it did go through a job


async def test_a_download_paused_after_its_first_bytes_holds_no_database_connection(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sent as it was read, a document held its transaction, and a pooled connection, for as
    # long as its client took to read it: thirty slow readers held the whole pool.
    monkeypatch.setattr(exports, "CHUNK_CHARS", 300)  # a job's document in many chunks
    # A document made now, sent in many blocks.
    monkeypatch.setattr(exports, "SEND_BYTES", 100, raising=False)
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    streams = Database(db_url, pool_size=2, max_overflow=0)  # the downloads' alone
    try:
        async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
            tenant = await new_tenant(client)
            await populate(client, tenant)
            rt = _runtime(client)
            tenant_id = uuid.UUID(tenant.id)
            answer = await client.get(f"/v1/users/{VICTIM}/export", headers=tenant.headers)
            expected = _without_time(json.loads(answer.content))

            async def paused(document: AsyncIterator[bytes]) -> dict[str, Any]:
                first = await anext(document)
                assert streams.engine.pool.checkedout() == 0  # none held while the client waits
                rest = b"".join([block async for block in document])
                return _without_time(json.loads(first + rest))

            async with streams.tenant(tenant_id) as session:
                now = await exports.export_now_or_later(
                    session, streams, tenant_id, "user", VICTIM, rt.settings, requested_by=None
                )
            assert not isinstance(now, exports.ExportJob)
            assert await paused(now) == expected

            rt.settings.export_sync_limit = 0
            later = await client.get(f"/v1/users/{VICTIM}/export", headers=tenant.headers)
            assert later.status_code == 202, later.text
            job = await until_finished(client, tenant, later.json()["job_id"])
            assert job["status"] == "done", job
            written = exports.content(streams, tenant_id, later.json()["export_id"])
            assert await paused(written) == expected
    finally:
        await streams.dispose()


class _Disk:
    """A spool's file on disk that notes which thread each of its writes, reads and seeks
    ran on."""

    def __init__(self, file: IO[bytes], threads: list[int]) -> None:
        self.file, self.threads = file, threads

    def write(self, data: bytes) -> int:
        self.threads.append(threading.get_ident())
        return self.file.write(data)

    def read(self, size: int = -1) -> bytes:
        self.threads.append(threading.get_ident())
        return self.file.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        self.threads.append(threading.get_ident())
        return self.file.seek(offset, whence)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)


async def test_a_document_spooled_past_memory_goes_to_disk_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On the event loop, each write and read of the spool's file stalled every other request
    # of the process while the disk worked.
    monkeypatch.setattr(exports, "SPOOL_MEMORY_BYTES", 2**20)
    threads: list[int] = []
    make_file = tempfile.TemporaryFile
    monkeypatch.setattr(tempfile, "TemporaryFile", lambda **kw: _Disk(make_file(**kw), threads))
    rows = random.Random(7)
    parts = [rows.randbytes(rows.randint(1, 100_000)) for _ in range(100)]  # about 5 MiB

    async def document() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    spool = exports.Spool()
    assert await spool.fill(document())
    sent = b"".join([block async for block in spool.blocks()])
    assert sent == b"".join(parts)
    assert threads  # it did go to disk
    assert threading.get_ident() not in threads
