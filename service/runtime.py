"""Everything one process holds: settings, the database, providers, the authenticator, a worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from service.db.engine import Database
from service.db.meta import check_embedding_dimension
from service.db.migrate import (
    alembic_config,
    current_revision,
    shipped_revisions,
    upgrade_to_head_async,
)
from service.embedding import Embedder, build_embedder
from service.guard import RateLimiter
from service.llm import ChatModel, build_chat_model
from service.llm.rerank import Reranker, build_reranker
from service.queue.worker import JobHandler, Periodic, Worker
from service.settings import Settings
from service.tenants.service import Authenticator

log = logging.getLogger("service")


@dataclass
class Runtime:
    """The process's long-lived objects, built once at start."""

    settings: Settings
    db: Database
    embedder: Embedder
    llm: ChatModel | None
    reranker: Reranker | None
    auth: Authenticator
    head: str | None
    known_revisions: frozenset[str] = frozenset()
    limiter: RateLimiter = field(default_factory=lambda: RateLimiter(0, 1))
    worker: Worker | None = None
    _worker_task: asyncio.Task[None] | None = field(default=None, repr=False)

    @classmethod
    def build(cls, settings: Settings, *, db: Database | None = None) -> Runtime:
        """Wire the configured providers (nothing is started yet)."""
        db = db or Database.from_settings(settings)
        head, known = shipped_revisions(alembic_config(db.url, settings))
        return cls(
            settings=settings,
            db=db,
            embedder=build_embedder(settings.models.embedding),
            llm=build_chat_model(settings.models.historian),
            reranker=build_reranker(settings.models.reranker),
            auth=Authenticator(db, settings),
            head=head,
            known_revisions=known,
            limiter=RateLimiter(settings.rate_limit_per_second, settings.rate_limit_burst),
        )

    async def start(self, *, migrate: bool, run_worker: bool) -> None:
        """Migrate if asked, check the schema and the embedder, start the worker if asked."""
        if migrate:
            await upgrade_to_head_async(self.db.url, self.settings)
        if await current_revision(self.db) is None:
            # Not migrated yet: serve anyway; /readyz answers 503 until `memoria migrate` runs.
            log.warning("the database has no schema yet; run `memoria migrate`")
        else:
            async with self.db.system() as session:
                await check_embedding_dimension(
                    session, self.embedder.dimension, self.embedder.name
                )
        warm_up = getattr(self.embedder, "warm_up", None)
        if warm_up is not None:
            await warm_up()
        if run_worker:
            self.start_worker()

    def job_handlers(self) -> dict[str, JobHandler]:
        """The job kinds this process knows how to run."""
        from service.jobs import handlers

        return handlers(self)

    def periodic_tasks(self) -> list[Periodic]:
        """Timed work of the worker (the extraction pause trigger)."""
        from service.jobs import periodic

        return periodic(self)

    def start_worker(self) -> Worker:
        """Run a worker in this process's event loop."""
        self.worker = Worker(
            self.db,
            self.job_handlers(),
            self.settings.cognitive.queue,
            poll_interval=self.settings.cognitive.historian.poll_interval_seconds,
            periodic=self.periodic_tasks(),
        )
        self._worker_task = asyncio.create_task(self.worker.run(), name="worker")
        return self.worker

    async def is_ready(self) -> tuple[bool, str]:
        """Database reachable and migrations at head."""
        try:
            revision = await current_revision(self.db)
        except Exception as exc:
            return False, f"database unreachable: {type(exc).__name__}"
        if revision == self.head:
            return True, "ok"
        if revision is not None and revision not in self.known_revisions:
            # A newer release migrated the database ahead of this replica (a rolling upgrade):
            # migrations only add, so this code keeps working until it is replaced.
            return True, f"database at {revision}, newer than this code's {self.head}"
        return False, f"migrations not at head (database {revision}, code {self.head})"

    async def close(self, timeout: float | None = None) -> None:
        """Stop the worker (finishing or releasing its jobs), then close everything."""
        if self.worker is not None:
            grace = self.settings.cognitive.queue.shutdown_seconds if timeout is None else timeout
            await self.worker.stop(timeout=grace)
        if self._worker_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._worker_task, timeout=10)
        with contextlib.suppress(Exception):
            await self.auth.flush_usage()
        await self.embedder.close()
        if self.llm is not None:
            await self.llm.close()
        if self.reranker is not None:
            await self.reranker.close()
        await self.db.dispose()
