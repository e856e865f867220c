"""When rows were last used, recorded off the read path.

Reading a memory or presenting an API key counts as using it (forgetting spares what is
used; an operator sees which keys are alive). Writing that on every read would make each
read request a write, which a read replica refuses and which costs the primary a WAL record
per request. Instead a read records the ids here, in memory, and a background task writes
them to the primary in batches: every ``every_seconds``, as soon as ``max_ids`` are waiting,
and at shutdown. A crash loses at most the last batch of "last used" times, never data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession


class Primary(Protocol):
    """The database the batch is written to (a ``Database``): its owner's transactions."""

    def system(self) -> AbstractAsyncContextManager[AsyncSession]: ...


log = logging.getLogger(__name__)

# The tables whose rows carry ``last_used_at`` and a ``(tenant_id, id)`` key. Table names are
# spliced into SQL, so only these are accepted.
TABLES = ("memories", "api_keys")

# Waiting ids kept while the primary cannot be written, or is slow to be; beyond this the oldest
# batch is dropped, and the ids read meanwhile are not noted (a "last used" time is a hint,
# not data worth memory without bound).
_KEEP_ON_FAILURE = 100_000


def _touch_sql(table: str) -> str:
    # Never move a time backwards: another process may have written a later use already.
    return (
        f"UPDATE {table} SET last_used_at = :at"
        " WHERE tenant_id = :tenant_id AND id = ANY(:ids)"
        " AND (last_used_at IS NULL OR last_used_at < :at)"
    )


class LastUse:
    """An in-process batch of "row used at" times, written to the primary database."""

    def __init__(self, db: Primary, *, every_seconds: float = 5.0, max_ids: int = 1000) -> None:
        self._db = db
        self._every = every_seconds
        self._max = max_ids
        # (table, tenant) -> id -> the latest time it was used
        self._waiting: dict[tuple[str, uuid.UUID], dict[int | uuid.UUID, datetime]] = {}
        self._count = 0
        self._full = False  # new ids are not noted (see ``record``); said once a batch
        self._timer: asyncio.Task[None] | None = None
        self._flushing: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def waiting(self) -> int:
        """How many ids wait for the next flush."""
        return self._count

    def record(
        self,
        table: str,
        tenant_id: uuid.UUID,
        ids: Iterable[int | uuid.UUID],
        at: datetime | None = None,
    ) -> None:
        """Note that rows of ``table`` were used now (or ``at``); written by the next flush."""
        if table not in TABLES:
            raise ValueError(f"no last-used time is kept for table {table!r}")
        when = at or datetime.now(UTC)
        ids = list(ids)
        if not ids:
            # A read that used nothing (no memory matched) leaves no empty batch behind.
            return
        batch = self._waiting.get((table, tenant_id))
        for row_id in ids:
            previous = batch.get(row_id) if batch is not None else None
            if previous is None and self._count >= _KEEP_ON_FAILURE:
                # A write that hangs (a primary slow to answer) holds the flush while every
                # read adds its ids: a new one waits only while there is room.
                if not self._full:
                    log.warning("last-used times not noted: %d wait to be written", self._count)
                    self._full = True
                continue
            if batch is None:
                batch = self._waiting[(table, tenant_id)] = {}
            if previous is None:
                self._count += 1
            if previous is None or previous < when:
                batch[row_id] = when
        if not self._count:
            return
        self._start_timer()
        if self._count >= self._max and (self._flushing is None or self._flushing.done()):
            self._flushing = asyncio.get_running_loop().create_task(
                self._flush_logged(), name="last-use-flush"
            )

    async def flush(self) -> None:
        """Write every waiting time to the primary now (tests, shutdown, a full batch)."""
        async with self._lock:
            waiting, self._waiting, self._count = self._waiting, {}, 0
            self._full = False
            try:
                await self._write(waiting)
            except BaseException:
                self._put_back(waiting)
                raise

    async def close(self) -> None:
        """Stop the timer and write what waits (at shutdown; a failure is logged)."""
        for task in (self._timer, self._flushing):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._timer = self._flushing = None
        await self._flush_logged()

    async def _write(
        self, waiting: dict[tuple[str, uuid.UUID], dict[int | uuid.UUID, datetime]]
    ) -> None:
        if not waiting:
            return
        async with self._db.system() as session:
            for (table, tenant_id), used in waiting.items():
                # One statement per table and tenant (one shard on Citus); the batch's latest
                # time stands for all its rows: a few seconds' precision is plenty here.
                await session.execute(
                    text(_touch_sql(table)),
                    {"at": max(used.values()), "tenant_id": tenant_id, "ids": list(used)},
                )

    def _put_back(
        self, waiting: dict[tuple[str, uuid.UUID], dict[int | uuid.UUID, datetime]]
    ) -> None:
        if self._count + sum(len(v) for v in waiting.values()) > _KEEP_ON_FAILURE:
            log.warning("dropping a batch of last-used times: the primary stays unwritable")
            return
        for (table, tenant_id), used in waiting.items():
            for row_id, when in used.items():
                self._waiting.setdefault((table, tenant_id), {})
                current = self._waiting[(table, tenant_id)].get(row_id)
                if current is None:
                    self._count += 1
                if current is None or current < when:
                    self._waiting[(table, tenant_id)][row_id] = when

    async def _flush_logged(self) -> None:
        try:
            await self.flush()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("writing last-used times failed (kept for the next try): %s", exc)

    def _start_timer(self) -> None:
        if self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(
                self._tick(), name="last-use-timer"
            )

    async def _tick(self) -> None:
        while self._count:
            await asyncio.sleep(self._every)
            await self._flush_logged()
