"""Everything one process holds: settings, the database, providers, the authenticator, a worker."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from service.audit.service import FailedAuthentications
from service.db.embedded import EmbeddedSupervisor, RestartPolicy
from service.db.engine import Database
from service.db.migrate import (
    alembic_config,
    current_revision,
    shipped_revisions,
    upgrade_to_head_async,
)
from service.embedding import CurrentEmbedder, build_embedder, vector_space
from service.errors import ConfigurationError
from service.guard import RateLimiter
from service.llm import ChatModel, build_chat_model
from service.llm.rerank import Reranker, build_reranker
from service.privacy import keys as privacy_keys
from service.queue.process import WorkerProcess, worker_command, worker_environment
from service.queue.worker import BatchHandler, JobHandler, Periodic, Worker
from service.reembed.service import settle, stored_space
from service.settings import Settings
from service.tenants.budget import budgeted
from service.tenants.service import Authenticator

log = logging.getLogger("service")


def settle_heap() -> None:
    """Set what is loaded by now (libraries, the app, the model's vocabulary: over 100,000
    objects) aside from the garbage collector. A request allocates thousands of objects (a big
    group's search reads thousands of rows); surviving young collections, they trigger full
    ones, and each full collection walked everything loaded: 60-70 ms, a pause in every few
    searches of a 50,000-message group. Garbage is collected first, so that none is set
    aside."""
    gc.collect()
    gc.freeze()


@dataclass
class JobKinds:
    """What a worker runs: a handler per job kind, and work on a timer."""

    handlers: dict[str, JobHandler]
    periodic: list[Periodic]
    # Kinds claimed and run many at a time (each also has its one-job handler above).
    batch_handlers: dict[str, BatchHandler] = field(default_factory=dict)


# Binds job kinds to their handlers for a runtime: ``service.jobs.wiring``, the one module that
# knows every aggregate's jobs. Passed in, so this module needs none of them.
JobWiring = Callable[["Runtime"], JobKinds]


@dataclass
class Runtime:
    """The process's long-lived objects, built once at start."""

    settings: Settings
    db: Database
    embedder: CurrentEmbedder
    llm: ChatModel | None
    reranker: Reranker | None
    auth: Authenticator
    head: str | None
    # The read routes' database: a replica's (MEMORIA_READ_DATABASE_URL), else ``db`` itself.
    read_db: Database | None = None
    known_revisions: frozenset[str] = frozenset()
    limiter: RateLimiter = field(default_factory=lambda: RateLimiter(0, 1))
    tenant_limiter: RateLimiter = field(default_factory=lambda: RateLimiter(0, 1, of="tenant"))
    failed_auth: FailedAuthentications = field(
        default_factory=lambda: FailedAuthentications(Settings())
    )
    worker: Worker | None = None
    worker_process: WorkerProcess | None = None
    config: str | Path | None = None
    wiring: JobWiring | None = None
    on_close: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # Called once the embedded database is lost for good (serve stops on it); ``fatal`` says why.
    on_fatal: Callable[[], None] | None = None
    fatal: str | None = None
    database_supervisor: EmbeddedSupervisor | None = None
    _worker_task: asyncio.Task[None] | None = field(default=None, repr=False)
    _model_watch: asyncio.Task[None] | None = field(default=None, repr=False)
    _stored_space: tuple[str, int] | None = field(default=None, repr=False)
    _warm_queries: bool = field(default=True, repr=False)

    @classmethod
    def build(
        cls,
        settings: Settings,
        *,
        db: Database | None = None,
        config: str | Path | None = None,
        wiring: JobWiring | None = None,
    ) -> Runtime:
        """Wire the configured providers (nothing is started yet). ``config`` is the settings
        file, read again by a worker process; ``wiring`` gives the job kinds a worker of this
        process runs (none: this process runs no worker in its event loop)."""
        db = db or Database.from_settings(settings)
        privacy_keys.configure(settings)
        head, known = shipped_revisions(alembic_config(db.url, settings))
        return cls(
            settings=settings,
            db=db,
            embedder=CurrentEmbedder(
                build_embedder(settings.models.embedding), settings.models.embedding
            ),
            llm=budgeted(
                build_chat_model(settings.models.historian), db, settings.models.historian
            ),
            reranker=build_reranker(settings.models.reranker),
            auth=Authenticator(db, settings),
            head=head,
            read_db=Database.for_reads(settings, db),
            known_revisions=known,
            limiter=RateLimiter(settings.rate_limit_per_second, settings.rate_limit_burst),
            tenant_limiter=RateLimiter(
                settings.tenant_rate_limit_per_second,
                settings.tenant_rate_limit_burst,
                of="tenant",
            ),
            failed_auth=FailedAuthentications(settings),
            config=config,
            wiring=wiring,
        )

    async def start(
        self,
        *,
        migrate: bool,
        run_worker: bool,
        worker_process: bool = False,
        answers_queries: bool = True,
    ) -> None:
        """Migrate if asked, check the schema and the embedder, start the worker if asked: in
        this event loop, or with ``worker_process`` in a child process, once the schema is
        migrated. A process that ``answers_queries`` (not a worker alone) loads the query
        path of a local model at start."""
        self._warm_queries = answers_queries
        if self.settings.database_url is None:
            # The embedded server is this process's to bring back if it dies.
            self.database_supervisor = EmbeddedSupervisor(
                self.settings.data_dir, RestartPolicy.of(self.settings.embedded), self._give_up
            )
            self.database_supervisor.start()
        if migrate:
            await upgrade_to_head_async(self.db.url, self.settings)
        if await current_revision(self.db) is None:
            # Not migrated yet: serve anyway; /readyz answers 503 until `memoria migrate` runs.
            log.warning("the database has no schema yet; run `memoria migrate`")
        else:
            await self.settle_embedder()
        await self.embedder.warm_up(queries=self._warm_queries)
        settle_heap()
        self._model_watch = asyncio.create_task(self._watch_model(), name="model-watch")
        if run_worker:
            if worker_process:
                await self.start_worker_process()
            else:
                self.start_worker()

    async def settle_embedder(self) -> None:
        """Embed with the model of the stored vectors (after a re-embedding, not necessarily
        the configured one); refuse a model whose vectors could not be stored."""
        async with self.db.system() as session:
            chosen, warning = await settle(session, self.settings.models.embedding)
            self._stored_space = await stored_space(session)
        if warning:
            log.warning("%s", warning)
        if vector_space(chosen) != vector_space(self.embedder.settings):
            log.warning("embedding with %r from now on", vector_space(chosen)[0])
            self.embedder.use(build_embedder(chosen), chosen)

    async def _watch_model(self) -> None:
        """Follow a re-embedding's switch: the stored vectors' model changes, so does ours."""
        while True:
            await asyncio.sleep(self.settings.models.embedding_check_seconds)
            try:
                async with self.db.system() as session:
                    stored = await stored_space(session)
                if stored is not None and stored != self._stored_space:
                    self._stored_space = stored  # one warning per change, not one per look
                    await self.settle_embedder()
                    await self.embedder.warm_up(queries=self._warm_queries)
                    settle_heap()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("checking the stored vectors' model failed: %s", exc)

    def job_kinds(self) -> JobKinds:
        """The job kinds this process knows how to run, and its timed work."""
        if self.wiring is None:
            raise ConfigurationError("this runtime was built without job handlers (wiring)")
        return self.wiring(self)

    def start_worker(self) -> Worker:
        """Run a worker in this process's event loop."""
        kinds = self.job_kinds()
        self.worker = Worker(
            self.db,
            kinds.handlers,
            self.settings.cognitive.queue,
            poll_interval=self.settings.cognitive.historian.poll_interval_seconds,
            periodic=kinds.periodic,
            batch_handlers=kinds.batch_handlers,
        )
        self._worker_task = asyncio.create_task(self.worker.run(), name="worker")
        return self.worker

    async def start_worker_process(self) -> WorkerProcess:
        """Run ``memoria worker`` as a supervised child on this process's database."""
        queue = self.settings.cognitive.queue
        self.worker_process = WorkerProcess(
            worker_command(os.getpid(), self.config, self.settings.worker_nice),
            worker_environment(
                self.db.url, embedding_threads=self.settings.models.embedding.threads
            ),
            # The child's own shutdown: the jobs in hand's grace, then closing its pools.
            stop_seconds=queue.shutdown_seconds + 15,
        )
        await self.worker_process.start()
        return self.worker_process

    def _give_up(self, reason: str) -> None:
        self.fatal = reason
        if self.on_fatal is not None:
            self.on_fatal()

    async def is_ready(self) -> tuple[bool, str]:
        """Database reachable and migrations at head."""
        supervisor = self.database_supervisor
        if supervisor is not None and (down := supervisor.describe()) is not None:
            return False, down
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
        if self.database_supervisor is not None:
            # The embedded server is about to be stopped on purpose, not to be brought back.
            await self.database_supervisor.stop()
        if self.worker_process is not None:
            await self.worker_process.stop()
        if self.worker is not None:
            grace = self.settings.cognitive.queue.shutdown_seconds if timeout is None else timeout
            await self.worker.stop(timeout=grace)
        if self._worker_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._worker_task, timeout=10)
        if self._model_watch is not None:
            self._model_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._model_watch
        for close in self.on_close:
            with contextlib.suppress(Exception):
                await close()
        with contextlib.suppress(Exception):
            await self.auth.flush_usage()
        await self.embedder.close()
        if self.llm is not None:
            await self.llm.close()
        if self.reranker is not None:
            await self.reranker.close()
        if self.read_db is not None and self.read_db is not self.db:
            await self.read_db.dispose()
        await self.db.dispose()
        # What start set aside is the collector's again (a test process starts many runtimes).
        gc.unfreeze()
