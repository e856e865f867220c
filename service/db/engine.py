"""The engine, and the two kinds of transaction the service opens.

* ``tenant(tenant_id)``: every request and every job's work. The transaction switches to the
  non-owner role ``memoria_app`` and records the tenant in ``app.tenant_id``, so PostgreSQL's
  row-level security hides every other tenant's rows even from a query that forgets its filter.
* ``system()``: the few places that must cross tenants (authenticating a key, creating a tenant,
  claiming jobs from the shared queue). They run as the owning role, which RLS does not restrict.

A process may also have a second ``Database`` on a read replica (``MEMORIA_READ_DATABASE_URL``,
see ``Database.for_reads``): the read routes open ``tenant(..., read_only=True)`` there, with
the same role and tenant binding, so row-level security applies on the replica as on the
primary. Every ``Database`` of a process shares one ``LastUse`` batch, written to the primary.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import asyncpg
from pgvector import Vector
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from service.db.embedded import embedded_url
from service.db.last_use import LastUse
from service.errors import Conflict, Invalid, MemoriaError, Unavailable
from service.settings import Settings

T = TypeVar("T")

log = logging.getLogger(__name__)

APP_ROLE = "memoria_app"

# One round trip: both settings are transaction-local (is_local = true), so they vanish at
# COMMIT/ROLLBACK and a pooled connection never carries one tenant into the next request.
_BIND_TENANT = text(
    "SELECT set_config('role', :role, true), set_config('app.tenant_id', :tenant_id, true),"
    " set_config('synchronous_commit', :synchronous_commit, true)"
)
# The same, and the transaction made read-only (allowed at any point of a transaction, unlike
# going back to read-write): a read route that tried to write would fail here as it would on
# a replica, instead of only once a replica is configured.
_BIND_TENANT_READ_ONLY = text(
    "SELECT set_config('role', :role, true), set_config('app.tenant_id', :tenant_id, true),"
    " set_config('synchronous_commit', :synchronous_commit, true),"
    " set_config('transaction_read_only', 'on', true)"
)

# Where a session opened by a ``Database`` finds the process's ``LastUse`` batch.
LAST_USE = "memoria.last_use"


def _encode_vector(value: Any) -> bytes:
    # Arrays from raw SQL, and the text form SQLAlchemy's Vector type renders in ORM queries.
    if isinstance(value, str):
        value = Vector.from_text(value)
    elif not isinstance(value, Vector):
        value = Vector(value)
    return bytes(value.to_binary())


async def _vector_codec(connection: asyncpg.Connection) -> None:
    await connection.set_type_codec(
        "vector",
        schema="public",
        encoder=_encode_vector,
        decoder=Vector.from_binary,
        format="binary",
    )


async def _uses_citus(connection: asyncpg.Connection) -> bool:
    return bool(
        await connection.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
        )
    )


def _register_vector(dbapi_connection: Any, connection_record: Any) -> None:
    """Binary vector I/O on every new connection (numpy arrays in, pgvector Vectors out), and
    whether the database is a Citus coordinator (see ``citus_bind``)."""
    connection_record.info["citus"] = dbapi_connection.run_async(_uses_citus)
    try:
        dbapi_connection.run_async(_vector_codec)
    except ValueError:
        # Before the first migration the vector type does not exist yet: try again at each
        # checkout, so a process started before the migration (a worker waiting for it)
        # stores vectors once it has run.
        connection_record.info["vector_pending"] = True
    else:
        connection_record.info.pop("vector_pending", None)


def _retry_vector(dbapi_connection: Any, connection_record: Any, connection_proxy: Any) -> None:
    if connection_record.info.get("vector_pending"):
        _register_vector(dbapi_connection, connection_record)


def citus_bind(tenant_id: uuid.UUID) -> str:
    """On Citus, the tenant setting again as a ``SET LOCAL`` statement of its own.

    Row-level security runs on the workers, in the sessions Citus opens to them, which
    ``set_config()`` never reaches; Citus replays a transaction's ``SET LOCAL`` statements
    there (``citus.propagate_set_commands = 'local'``, set for the migrating role by
    ``service.db.citus``). It takes a statement's whole text, so this one travels alone. The
    value is a UUID, never client text.
    """
    return f"SET LOCAL app.tenant_id = '{uuid.UUID(str(tenant_id))}'"


def _on_citus(raw_connection: Any) -> bool:
    return bool(raw_connection.info.get("citus"))


async def uses_citus(session: AsyncSession) -> bool:
    """Whether the session's database is a Citus coordinator (known from its connection)."""
    connection = await session.connection()
    return _on_citus(await connection.get_raw_connection())


def normalize_url(url: str) -> str:
    """Accept ``postgres://`` and ``postgresql://`` URLs and use the asyncpg driver."""
    for prefix in ("postgres://", "postgresql://", "postgresql+psycopg://"):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    return url


def resolve_database_url(settings: Settings) -> str:
    """``MEMORIA_DATABASE_URL`` when set, else the embedded server under ``MEMORIA_DATA_DIR``."""
    if settings.database_url:
        return normalize_url(settings.database_url)
    return embedded_url(settings.data_dir)


# Each statement planned for its own parameters. asyncpg prepares every statement, and after
# five runs PostgreSQL may keep one generic plan for all parameters; for the searches, whose
# selectivity depends on the conversation and the question (a rare term or a common one, a
# group of 600 messages or of 50,000), that plan was four times slower: MemDaily's archive
# search p50 99 -> 22 ms a statement. Planning them costs about 2 ms.
#
# And none compiled to machine code: PostgreSQL compiles a statement whose estimated cost
# passes jit_above_cost (100,000) where its build has JIT, as the compose file's image does,
# which costs tens of milliseconds each run and pays back only on scans of seconds. A busy
# group's searches come near: the lexical side of the context in a group of 50,000 events
# is estimated at 98,000, the archive's term statistics of 50,000 messages at 49,000, and
# both grow with the group (2026-11).
SERVER_SETTINGS = {"plan_cache_mode": "force_custom_plan", "jit": "off"}


class Database:
    """The engine and session factory of one process (or of its read replica)."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 20,
        max_overflow: int = 10,
        last_use: LastUse | None = None,
        last_use_seconds: float = 5.0,
        last_use_max_ids: int = 1000,
    ) -> None:
        self.url = normalize_url(url)
        # A replica's Database is given the primary's batch: last-used times go to the primary.
        self.last_use = last_use or LastUse(
            self, every_seconds=last_use_seconds, max_ids=last_use_max_ids
        )
        self._owns_last_use = last_use is None
        self.engine: AsyncEngine = create_async_engine(
            self.url,
            pool_size=pool_size,
            max_overflow=max_overflow,
            pool_pre_ping=True,
            pool_recycle=1800,
            connect_args={"server_settings": SERVER_SETTINGS},
        )
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        # Requests holding a transaction may open a second one (``second_tenant``), at most
        # this many at once: the rest of the pool serves requests that wait for no second
        # connection, so those that wait for one can never hold every connection between them.
        self._seconds_free = (pool_size + max_overflow) // 2
        event.listen(self.engine.sync_engine, "connect", _register_vector)
        event.listen(self.engine.sync_engine, "checkout", _retry_vector)

    @classmethod
    def from_settings(cls, settings: Settings) -> Database:
        """Build the process's database from settings."""
        return cls(
            resolve_database_url(settings),
            pool_size=settings.db_pool_size,
            max_overflow=settings.db_max_overflow,
            last_use_seconds=settings.last_used_flush_seconds,
            last_use_max_ids=settings.last_used_flush_ids,
        )

    @classmethod
    def for_reads(cls, settings: Settings, primary: Database) -> Database:
        """The database of the read routes: the replica at ``MEMORIA_READ_DATABASE_URL`` (its
        own pool, the primary's last-used batch), or ``primary`` itself when none is set."""
        if not settings.read_database_url:
            return primary
        return cls(
            settings.read_database_url,
            pool_size=settings.db_pool_size,
            max_overflow=settings.db_max_overflow,
            last_use=primary.last_use,
        )

    @asynccontextmanager
    async def tenant(
        self, tenant_id: uuid.UUID, *, durable: bool = True, read_only: bool = False
    ) -> AsyncIterator[AsyncSession]:
        """A transaction confined to one tenant by row-level security; commits on success.

        ``durable=False`` commits without waiting for the WAL flush (a tenant's opt-in fast
        acknowledgement): a database crash may lose the last fraction of a second of such
        commits, never corrupt anything. ``read_only`` refuses any write (the read routes'
        transactions, which a replica may serve).
        """
        async with self._transaction() as session:
            params = {
                "role": APP_ROLE,
                "tenant_id": str(tenant_id),
                "synchronous_commit": "on" if durable else "off",
            }
            await session.execute(_BIND_TENANT_READ_ONLY if read_only else _BIND_TENANT, params)
            if await uses_citus(session):
                await session.execute(text(citus_bind(tenant_id)))
            yield session

    @asynccontextmanager
    async def second_tenant(
        self, tenant_id: uuid.UUID, *, read_only: bool = False
    ) -> AsyncIterator[AsyncSession | None]:
        """Another tenant transaction (see ``tenant``) for a request that already holds one,
        to read beside it; None while half the pool already serves as such (the caller then
        reads on its own transaction)."""
        if self._seconds_free <= 0:
            yield None
            return
        self._seconds_free -= 1
        try:
            async with self.tenant(tenant_id, read_only=read_only) as session:
                yield session
        finally:
            self._seconds_free += 1

    def read_beside(
        self, tenant_id: uuid.UUID, read: Callable[[AsyncSession], Awaitable[T]]
    ) -> Beside[T]:
        """``read`` started on a second read-only transaction (``second_tenant``), to run
        beside what the request's own transaction reads meanwhile. Awaited, it gives what
        ``read`` found as soon as it has (the transaction then ends on its own), or None when
        no second one was free (the caller then reads on its own). Whoever starts it ends it
        with ``settled``: its transaction must end before the request's does."""
        found: asyncio.Future[T | None] = asyncio.get_running_loop().create_future()

        async def beside() -> None:
            try:
                async with self.second_tenant(tenant_id, read_only=True) as other:
                    found.set_result(None if other is None else await read(other))
            except BaseException as exc:
                if not found.done():
                    if isinstance(exc, asyncio.CancelledError):
                        found.cancel()
                    else:
                        found.set_exception(exc)
                raise

        return Beside(found, asyncio.ensure_future(beside()))

    @asynccontextmanager
    async def tenant_connection(
        self, tenant_id: uuid.UUID, *, durable: bool = True
    ) -> AsyncIterator[asyncpg.Connection]:
        """The hot path's tenant transaction: the raw asyncpg connection, three round trips.

        BEGIN and the tenant binding travel in one simple-protocol message (the values are a
        UUID and constants, never client text), then the caller's statement, then COMMIT.
        Row-level security applies exactly as in ``tenant()``.
        """
        bind = (
            f"BEGIN; SELECT set_config('role', '{APP_ROLE}', true),"
            f" set_config('app.tenant_id', '{uuid.UUID(str(tenant_id))}', true),"
            f" set_config('synchronous_commit', '{'on' if durable else 'off'}', true)"
        )
        try:
            async with self.engine.connect() as conn:
                raw = await conn.get_raw_connection()
                driver: asyncpg.Connection = raw.driver_connection
                await driver.execute(bind)
                if _on_citus(raw):
                    await driver.execute(citus_bind(tenant_id))
                try:
                    yield driver
                except BaseException:
                    if not driver.is_closed():
                        await driver.execute("ROLLBACK")
                    raise
                await driver.execute("COMMIT")
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            error = translate_db_error(exc)
            if error is exc:
                raise
            raise error from exc
        except OSError as exc:
            raise Unavailable("the database is unreachable; retry shortly") from exc

    @asynccontextmanager
    async def system(self) -> AsyncIterator[AsyncSession]:
        """A transaction as the owning role, for the few cross-tenant operations."""
        async with self._transaction() as session:
            yield session

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[AsyncSession]:
        try:
            async with self.sessions() as session, session.begin():
                session.info[LAST_USE] = self.last_use
                yield session
        except DBAPIError as exc:
            error = translate_db_error(exc)
            if error is exc:
                raise
            raise error from exc
        except OSError as exc:
            raise Unavailable("the database is unreachable; retry shortly") from exc

    async def ping(self) -> None:
        """Raise ``Unavailable`` unless the database answers."""
        async with self.system() as session:
            await session.execute(text("SELECT 1"))

    async def dispose(self) -> None:
        """Write the waiting last-used times (if this is the primary), close every pooled
        connection."""
        if self._owns_last_use:
            await self.last_use.close()
        await self.engine.dispose()


# SQLSTATE classes that mean "the server or the connection is gone", not "your data is wrong".
_UNAVAILABLE_SQLSTATES = ("08", "53", "57P")


def translate_db_error(exc: BaseException) -> MemoriaError | BaseException:
    """Turn a database exception into the service's error hierarchy (the one place that does)."""
    if isinstance(exc, asyncpg.InterfaceError | asyncpg.ConnectionDoesNotExistError):
        return Unavailable("the database connection was lost; retry shortly")
    if isinstance(exc, asyncpg.PostgresError):
        return _from_sqlstate(str(getattr(exc, "sqlstate", "") or ""), exc) or exc
    orig: Any = getattr(exc, "orig", None)
    sqlstate = _sqlstate(orig)
    if isinstance(exc, InterfaceError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        return Unavailable("the database connection was lost; retry shortly")
    if isinstance(exc, IntegrityError):
        return Conflict("the write conflicts with existing data")
    translated = _from_sqlstate(sqlstate, orig)
    if translated is not None:
        return translated
    if isinstance(exc, OperationalError):
        return Unavailable("the database is unavailable; retry shortly")
    return exc


def _sqlstate(orig: Any) -> str:
    # A value the driver cannot even encode (an integer over 64 bits) reaches SQLAlchemy
    # without a code; the driver's own exception, its cause, carries one (22000).
    for error in (orig, getattr(orig, "__cause__", None)):
        code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if code:
            return str(code)
    return ""


def _from_sqlstate(sqlstate: str, orig: Any) -> MemoriaError | None:
    if sqlstate.startswith(_UNAVAILABLE_SQLSTATES):
        return Unavailable("the database is unavailable; retry shortly")
    if sqlstate == "55P03":  # a lock not had within lock_timeout: busy now, fine later
        return Unavailable("a table is busy (a lock wait timed out); retry shortly")
    if sqlstate.startswith("23"):  # integrity constraint violation
        return Conflict("the write conflicts with existing data")
    if sqlstate.startswith("22"):  # data exception: a value the column cannot hold
        return Invalid("a value could not be stored: " + _first_line(orig))
    return None


def _first_line(orig: Any) -> str:
    return str(orig).strip().splitlines()[0] if orig is not None else ""


class Beside(Generic[T]):
    """A read on a second transaction (``Database.read_beside``): awaiting it gives what it
    found, while ``ended`` still closes its transaction (a COMMIT's round trip the request
    need not wait for)."""

    def __init__(self, found: asyncio.Future[T | None], ended: asyncio.Future[None]) -> None:
        self.found = found
        self.ended = ended

    def __await__(self) -> Generator[Any, None, T | None]:
        return self.found.__await__()


async def settled(beside: Beside[Any] | None) -> None:
    """Wait until ``beside``'s transaction has ended, however it ends: a read still running
    is cancelled first, one that has found its rows is left to close its transaction. A
    caller cancelled meanwhile (at a forced shutdown, or by a server that cancels a request
    whose client hung up; uvicorn lets it finish) still waits for that, then is cancelled:
    the COMMIT is not broken off (SQLAlchemy would throw the connection away), and the
    connection is back in the pool before the request ends."""
    if beside is None:
        return
    if not beside.found.done():
        beside.ended.cancel()
    cancelled: asyncio.CancelledError | None = None
    while not beside.ended.done():
        try:
            await asyncio.wait([beside.ended])  # a cancelled wait leaves ``ended`` be
        except asyncio.CancelledError as exc:
            cancelled = exc
    if not beside.ended.cancelled():
        beside.ended.exception()  # seen: ``found`` carries what the request needs of it
    if not beside.found.done():  # cancelled before it started
        beside.found.cancel()
    elif not beside.found.cancelled():
        beside.found.exception()  # seen: the request ends as its own reads did
    if cancelled is not None:
        raise cancelled
