"""The Litestar application factory."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Litestar, Router
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from service.apidocs import SwaggerPage, docs_router, landing, service_version
from service.audit.routes import audit_log
from service.audit.service import audit_middleware
from service.console.routes import console
from service.ends.routes import EndController
from service.events.routes import EventController
from service.exports.routes import AdminExportController, ExportController
from service.guard import shedding_middleware
from service.health.routes import healthz, metrics, readyz
from service.http import (
    MemoriaRequest,
    body_drain_middleware,
    document_errors,
    error_response,
    provide_session,
    provide_tenant,
    refuse_nul_parameters,
    request_id_middleware,
)
from service.jobs import build_runtime
from service.memories.routes import MemoryController
from service.messages.routes import MessageController
from service.observability import metrics_middleware
from service.privacy.routes import PrivacyController, TenantPrivacyController
from service.profiles.routes import ProfileController
from service.queue.routes import JobController
from service.recall.routes import RecallController
from service.runtime import Runtime
from service.settings import Settings, load_settings
from service.tenants.routes import AdminController, BotController, TenantController
from service.todos.routes import TodoController

log = logging.getLogger("service")


def create_app(
    settings: Settings | None = None,
    *,
    runtime: Runtime | None = None,
    migrate: bool | None = None,
    run_worker: bool | None = None,
    worker_process: bool = False,
) -> Litestar:
    """Build the app. The runtime starts (migrations, worker) when the app starts; the worker
    runs in the app's event loop, or with ``worker_process`` in a child process."""
    settings = settings or (runtime.settings if runtime else load_settings())
    rt = runtime or build_runtime(settings)
    do_migrate = settings.auto_migrate if migrate is None else migrate
    do_worker = settings.run_worker if run_worker is None else run_worker

    async def on_startup(app: Litestar) -> None:
        await rt.start(migrate=do_migrate, run_worker=do_worker, worker_process=worker_process)

    async def on_shutdown(app: Litestar) -> None:
        await rt.close()

    v1 = Router(
        path="/",
        route_handlers=[
            TenantController,
            BotController,
            JobController,
            EndController,
            EventController,
            MessageController,
            ProfileController,
            MemoryController,
            TodoController,
            RecallController,
            PrivacyController,
            ExportController,
        ],
        dependencies={
            "tenant": Provide(provide_tenant),
            "session": Provide(provide_session),
        },
    )
    app = Litestar(
        route_handlers=[
            landing,
            healthz,
            readyz,
            metrics,
            console,
            AdminController,
            TenantPrivacyController,
            AdminExportController,
            audit_log,
            v1,
        ],
        dependencies=_dependencies(rt),
        on_startup=[on_startup],
        on_shutdown=[on_shutdown],
        exception_handlers={Exception: error_response},
        middleware=[
            shedding_middleware(settings.max_inflight_requests),
            body_drain_middleware(settings.max_body_bytes),
            request_id_middleware,
            metrics_middleware,
            audit_middleware,
        ],
        request_max_body_size=settings.max_body_bytes,
        request_class=MemoriaRequest,
        before_request=refuse_nul_parameters,
        openapi_config=OpenAPIConfig(
            title="Memoria",
            version=service_version(),
            description="Multi-tenant long-term memory for chat bots.",
            render_plugins=[SwaggerPage()],
            openapi_router=docs_router(),
        ),
        state=_state(rt),
        debug=False,
        # Logging is the process's (configure_logging): one format for every logger.
        logging_config=None,
    )
    document_errors(app)
    return app


def _state(rt: Runtime) -> State:
    # The runtime for tests and tools that reach into a running app; the settings for the
    # error handler, which gets no dependencies.
    return State({"runtime": rt, "settings": rt.settings})


def _dependencies(rt: Runtime) -> dict[str, Provide]:
    """What routes get of the process, by name (see ``service.http``)."""

    def value(thing: Any) -> Provide:
        def provide() -> Any:
            return thing

        return Provide(provide, use_cache=True, sync_to_thread=False)

    return {
        "db": value(rt.db),
        # The read routes' database: the replica when one is configured, else ``db``.
        "read_db": value(rt.read_db or rt.db),
        "settings": value(rt.settings),
        "embedder": value(rt.embedder),
        "reranker": value(rt.reranker),
        "auth": value(rt.auth),
        "limiter": value(rt.limiter),
        "tenant_limiter": value(rt.tenant_limiter),
        "failed_auth": value(rt.failed_auth),
        "readiness": value(rt.is_ready),
    }
