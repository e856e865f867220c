"""The ``memoria`` command: serve, worker, migrate, tenants, keys, jobs, export, import,
reembed, mcp."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

import uvicorn
from sqlalchemy import text
from sqlalchemy.engine import make_url

from service import mcp_server
from service.apidocs import CONSOLE_PATH, DOCS_PATH, service_version
from service.app import create_app
from service.db.embedded import stop_embedded
from service.db.engine import Database, resolve_database_url
from service.db.migrate import upgrade_to_head
from service.embedding import LOCAL_MODEL, build_embedder, vector_space
from service.errors import ConfigurationError, MemoriaError
from service.health.probes import serve_probes
from service.importer.coerce import parse_chat
from service.importer.service import import_undefined
from service.jobs import build_runtime
from service.observability import configure_logging
from service.privacy.service import export_stream, export_tenant
from service.queue.repository import status_counts
from service.reembed import service as reembed
from service.reembed.service import RunReport
from service.runtime import Runtime
from service.server import server_config
from service.settings import EmbeddingModelSettings, Settings, load_settings
from service.tenants.service import create_key, create_tenant, list_all, revoke_by_prefix

log = logging.getLogger("service.cli")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memoria", description="Memoria memory service")
    parser.add_argument("--config", help="TOML settings file (default: $MEMORIA_CONFIG)")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the API (and, by default, a worker)")
    serve.add_argument("--host", help="bind address (default $MEMORIA_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default $MEMORIA_PORT or 8080)")
    serve.add_argument("--no-worker", action="store_true", help="do not run a worker")
    serve.add_argument("--no-migrate", action="store_true", help="do not apply migrations at start")

    worker = commands.add_parser("worker", help="run background workers only")
    worker.add_argument("--concurrency", type=int, help="jobs at a time (default from settings)")
    worker.add_argument(
        "--health-port", type=int, help="serve /healthz, /readyz and /metrics on this port"
    )
    worker.add_argument(
        "--health-host", default="127.0.0.1", help="bind address of --health-port (127.0.0.1)"
    )
    # How `serve` runs its worker process: exit when orphaned, yield the CPU to the API.
    worker.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    worker.add_argument("--nice", type=int, default=0, help=argparse.SUPPRESS)

    commands.add_parser("migrate", help="apply database migrations (alembic upgrade head)")

    tenants = commands.add_parser("tenants", help="manage tenants").add_subparsers(
        dest="action", required=True
    )
    create = tenants.add_parser("create", help="create a tenant and print its first API key")
    create.add_argument("name")
    tenants.add_parser("list", help="list tenants")

    keys = commands.add_parser("keys", help="manage API keys").add_subparsers(
        dest="action", required=True
    )
    key_create = keys.add_parser("create", help="create an API key for a tenant")
    key_create.add_argument("tenant", help="tenant id")
    key_create.add_argument("--name", default="", help="a label for the key")
    revoke = keys.add_parser("revoke", help="revoke the key with this visible prefix")
    revoke.add_argument("prefix", help="e.g. mk_ab12cd34ef")

    commands.add_parser("jobs", help="job counts by status and the oldest queued job's age")

    export = commands.add_parser("export", help="export a person, a group or a whole tenant")
    export.add_argument("--tenant", required=True, help="tenant id")
    subject = export.add_mutually_exclusive_group()
    subject.add_argument("--user", help="a person's user id (JSON document)")
    subject.add_argument("--group", help="a group id (JSON document)")
    export.add_argument("--out", required=True, help="file to write (NDJSON for a whole tenant)")

    imports = commands.add_parser(
        "import", help="import another memory system's data into a tenant (idempotent)"
    )
    imports.add_argument(
        "format", choices=["undefined"], help="undefined: the original bot's data directory"
    )
    imports.add_argument("data_dir", help="the bot's data/ directory")
    imports.add_argument("--tenant", required=True, help="tenant id")
    imports.add_argument("--dry-run", action="store_true", help="read and count, write nothing")
    imports.add_argument(
        "--events", help="a JSON export of the bot's ChromaDB events (default: found in DATA_DIR)"
    )
    imports.add_argument(
        "--memo-conversation",
        help="group:ID or private:ID for end_summaries.json entries that name no conversation",
    )
    reembed = commands.add_parser(
        "reembed",
        help="remake every stored vector with another embedding model, then switch to it",
    )
    reembed.add_argument("--model", help="the new model's name")
    reembed.add_argument(
        "--dimensions", type=int, help="its vectors' dimension (default: as configured)"
    )
    reembed.add_argument(
        "--provider",
        choices=["local", "openai"],
        help="default: openai when --api-url is given, else as configured",
    )
    reembed.add_argument("--api-url", help="its OpenAI-compatible API, e.g. http://host/v1")
    reembed.add_argument(
        "--batch-size", type=int, help="rows per job (default: models.embedding.batch_size)"
    )
    action = reembed.add_mutually_exclusive_group()
    action.add_argument("--status", action="store_true", help="show the newest run's progress")
    action.add_argument(
        "--cancel", action="store_true", help="stop the run; the stored vectors stay as they are"
    )
    action.add_argument("--resume", action="store_true", help="retry the run's failed jobs")
    reembed.add_argument("--wait", action="store_true", help="show progress until the run ends")

    mcp = commands.add_parser(
        "mcp",
        help="serve the memory tools over the Model Context Protocol, for one API key and one"
        " conversation (--group-id or --user-id)",
    )
    mcp.add_argument("--api-url", required=True, help="the Memoria API, e.g. http://127.0.0.1:8080")
    mcp.add_argument(
        "--api-key",
        help="the tenant's API key (mk_…); better MEMORIA_API_KEY in the environment, which"
        " other users cannot read in the process list",
    )
    mcp.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="bind address for --transport http")
    mcp.add_argument(
        "--port",
        type=int,
        default=8765,
        help="port for --transport http (/mcp); clients send 'Authorization: Bearer <token>', the"
        " token from MEMORIA_MCP_TOKEN or, when unset, made at start and printed to stderr",
    )
    # The conversation is the server's, never a tool argument: the model cannot pick another.
    mcp.add_argument("--group-id", help="the conversation: this group (or --user-id)")
    mcp.add_argument("--user-id", help="the conversation: a private chat with this person")
    mcp.add_argument("--sender-id", help="who sends the messages (in a group: the member)")
    mcp.add_argument("--bot-id", help="the bot's own id")
    mcp.add_argument("--bot-name", help="the bot's name")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``memoria`` console script."""
    code = _run(argv)
    if _embedding_in_flight():
        _exit_now(code)
    return code


def _embedding_in_flight() -> bool:
    """True when the local embedder's thread is still computing a chunk nobody awaits any
    more (a stop or an interrupt cancelled the work it was for)."""
    return any(t.name.startswith("embed") and t.is_alive() for t in threading.enumerate())


def _exit_now(code: int) -> NoReturn:
    """Leave without the interpreter's join of the embedding thread, which would wait for its
    chunk (many seconds on a busy machine) only to throw the vectors away. What the exit
    hooks would do that matters is done here: the embedded server is stopped if this process
    was the last to use it, and the output is flushed."""
    stop_embedded()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "mcp":
        return _mcp(args)  # a client of the HTTP API: no service settings, no database
    try:
        settings = load_settings(args.config)
    except (FileNotFoundError, ValueError) as exc:
        print(f"memoria: bad configuration: {exc}", file=sys.stderr)
        return 2
    configure_logging(_log_level(settings, args.command), settings.log_format)
    if args.command not in CREATES_DATABASE and (refusal := _no_data(settings)):
        print(f"memoria: {refusal}", file=sys.stderr)
        return 1
    if args.command not in ("serve", "worker"):
        # SIGTERM stops a one-shot command as Ctrl-C does: its work is cancelled between two
        # statements, the embedding thread stops at its next chunk, and the exit hooks run
        # (an embedded server this command started is stopped).
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        if args.command == "serve":
            return _serve(settings, args)
        if args.command == "worker":
            return asyncio.run(_worker(settings, args))
        if args.command == "migrate":
            return _migrate(settings)
        if args.command == "reembed":
            return asyncio.run(_reembed(settings, args))
        return asyncio.run(_admin(settings, args))
    except MemoriaError as exc:
        print(f"memoria: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# Only these make a database where there is none: every other command works on the service's
# data, and one run from another folder would otherwise start an empty server there.
CREATES_DATABASE = ("serve", "migrate")


def _no_data(settings: Settings) -> str | None:
    """Why a command that works on the service's data cannot run here, or ``None``.

    The embedded server keeps its data under ``data_dir`` (``MEMORIA_DATA_DIR``, relative to
    the working folder as ``serve`` reads it); a folder without a PostgreSQL data directory
    holds no service's data. A database at ``database_url`` is checked once connected.
    """
    if settings.database_url:
        return None
    where = settings.data_dir.resolve()
    if (where / "PG_VERSION").is_file():
        return None
    return (
        f"no Memoria database in {where} (MEMORIA_DATA_DIR, default ./data/pg under the folder "
        "`memoria serve` runs in; or MEMORIA_DATABASE_URL); `memoria migrate` creates one"
    )


async def _require_schema(db: Database, settings: Settings) -> None:
    """Refuse, in one line, a database that holds no Memoria schema (never migrated)."""
    async with db.system() as session:
        found = await session.scalar(text("SELECT to_regclass('alembic_version') IS NOT NULL"))
    if not found:
        where = (
            make_url(settings.database_url).render_as_string(hide_password=True)
            if settings.database_url
            else str(settings.data_dir.resolve())
        )
        raise ConfigurationError(
            f"the database at {where} holds no Memoria schema; `memoria migrate` creates it"
        )


def _log_level(settings: Settings, command: str) -> str:
    """The services log at the configured level; a one-shot command (tenants, jobs, import…)
    prints its own output and only warnings besides, unless a level was asked for."""
    if command in ("serve", "worker") or "log_level" in settings.model_fields_set:
        return settings.log_level
    return "WARNING"


def _serve(settings: Settings, args: argparse.Namespace) -> int:
    if args.host:
        settings.host = args.host
    if args.port is not None:
        settings.port = args.port
    # Built here, before the app starts: an embedded database is started once, by this
    # process, and a worker process only connects to it.
    runtime = build_runtime(settings, config=args.config)
    app = create_app(
        runtime=runtime,
        migrate=not args.no_migrate and settings.auto_migrate,
        run_worker=not args.no_worker and settings.run_worker,
        worker_process=settings.worker_mode == "process",
    )
    # uvicorn turns SIGTERM into a graceful shutdown (the app's shutdown hook stops the worker
    # and the pool), then re-raises the signal to the handler that was there before it. That
    # handler must exit normally rather than die by the signal, so that the exit hooks run and
    # stop the embedded database.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    config = server_config(app, settings)
    server = _AnnouncingServer(config, lambda url: _announce(settings, runtime, url))
    runtime.on_fatal = lambda: setattr(server, "should_exit", True)
    try:
        server.run()
    finally:
        if runtime.worker_process is not None:
            # Stopped by the shutdown hook, unless uvicorn never ran it (a failed bind).
            runtime.worker_process.kill()
    if runtime.fatal is not None:
        print(f"memoria: {runtime.fatal}", file=sys.stderr)
        return 1
    return 0 if server.started else 1


class _AnnouncingServer(uvicorn.Server):
    """uvicorn's server, saying where it listens once the socket is bound and the app started."""

    def __init__(self, config: uvicorn.Config, announce: Callable[[str], None]) -> None:
        super().__init__(config)
        self._announce = announce

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started:
            return
        host, port = self.config.host, self.config.port
        for server in self.servers:
            for sock in server.sockets:
                host, port = sock.getsockname()[:2]  # the real port when 0 was asked for
                break
        self._announce(_base_url(str(host), int(port)))


def _base_url(host: str, port: int) -> str:
    # A wildcard address is not one to browse to: the loopback reaches it on this machine.
    shown = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(host, host)  # noqa: S104
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def _announce(settings: Settings, runtime: Runtime, url: str) -> None:
    """Where the service is, once it answers: its URL, console, docs, data, worker."""
    if settings.database_url:
        database = make_url(settings.database_url).render_as_string(hide_password=True)
    else:
        database = f"embedded PostgreSQL, data in {settings.data_dir.resolve()}"
    process = runtime.worker_process
    if process is not None and process.pid is not None:
        worker = f"a child process (pid {process.pid})"
    elif runtime.worker is not None:
        worker = "in this process"
    else:
        worker = "none here (run `memoria worker`)"
    fields = {
        "url": url,
        "console": f"{url}{CONSOLE_PATH}",
        "docs": f"{url}{DOCS_PATH}",
        "database": database,
        "worker": worker,
        "version": service_version(),
        "pid": os.getpid(),
    }
    if settings.log_format == "json":
        log.info("memoria is ready on %s", url, extra={"fields": fields})
        return
    lines = [
        f"memoria {fields['version']} is ready on {url} (pid {os.getpid()})",
        f"  console   {fields['console']}",
        f"  API docs  {fields['docs']}",
        f"  database  {database}",
        f"  worker    {worker}",
        "  stop with Ctrl-C",
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)


def _mcp(args: argparse.Namespace) -> int:
    # stdout is the protocol's channel under stdio: logs go to stderr, warnings only.
    configure_logging("WARNING", "text")
    conversation = mcp_server.Conversation(
        group_id=args.group_id,
        user_id=args.user_id,
        sender_id=args.sender_id,
        bot_id=args.bot_id,
        bot_name=args.bot_name,
    )
    api_key = args.api_key or os.environ.get("MEMORIA_API_KEY")
    if not api_key:
        print("memoria mcp: set MEMORIA_API_KEY (or pass --api-key)", file=sys.stderr)
        return 2
    try:
        conversation.context()
    except ValueError as exc:
        print(f"memoria mcp: {exc}", file=sys.stderr)
        return 2
    token = None
    if args.transport == "http":
        print(
            f"memoria mcp: listening on http://{args.host}:{args.port}/mcp"
            f" for the API at {args.api_url}",
            file=sys.stderr,
            flush=True,
        )
        # From the environment (never the command line, which other users can read), or new.
        token = os.environ.get("MEMORIA_MCP_TOKEN") or secrets.token_urlsafe(32)
        if not os.environ.get("MEMORIA_MCP_TOKEN"):
            print(
                f"memoria mcp: clients send 'Authorization: Bearer {token}'",
                file=sys.stderr,
                flush=True,
            )
    try:
        asyncio.run(
            mcp_server.serve(
                args.api_url,
                api_key,
                conversation,
                transport=args.transport,
                host=args.host,
                port=args.port,
                token=token,
            )
        )
    except KeyboardInterrupt:
        return 130
    return 0


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _migrate(settings: Settings) -> int:
    upgrade_to_head(resolve_database_url(settings), settings)
    print("database is at the newest migration")
    return 0


async def _worker(settings: Settings, args: argparse.Namespace) -> int:
    if args.concurrency:
        settings.cognitive.queue.concurrency = args.concurrency
    if args.nice:
        os.nice(args.nice)
    runtime = build_runtime(settings)
    # The historian's rare searches load the query path when they first need it.
    await runtime.start(migrate=False, run_worker=False, answers_queries=False)
    worker = runtime.start_worker()
    probes = None
    if args.health_port is not None:
        probes = await serve_probes(runtime, args.health_host, args.health_port)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    orphaned = None
    if args.parent_pid is not None:
        orphaned = asyncio.create_task(_until_orphaned(args.parent_pid, stopped))
    task = runtime._worker_task
    assert task is not None
    waiter = asyncio.create_task(stopped.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    # The loop outlives database outages; if it ended on its own, something is broken: exit
    # non-zero so that a supervisor restarts the process and the failure is seen.
    died = task.done() and not stopped.is_set()
    if died:
        error = None if task.cancelled() else task.exception()
        log.error("worker %s: the worker loop ended unexpectedly", worker.id, exc_info=error)
    log.info("worker %s: shutting down", worker.id)
    if probes is not None:
        probes.close()
    await runtime.close()
    waiter.cancel()
    if orphaned is not None:
        orphaned.cancel()
    return 1 if died else 0


async def _until_orphaned(parent_pid: int, stopped: asyncio.Event) -> None:
    """Stop a `serve` worker process whose parent is gone (killed without its shutdown): a
    worker nobody supervises must not outlive the service."""
    while os.getppid() == parent_pid:  # noqa: ASYNC110 (nothing signals a parent's death)
        await asyncio.sleep(1.0)
    log.warning("the serving process %d is gone; the worker process stops", parent_pid)
    stopped.set()


async def _admin(settings: Settings, args: argparse.Namespace) -> int:
    db = Database.from_settings(settings)
    try:
        await _require_schema(db, settings)
        handler = _ADMIN[(args.command, getattr(args, "action", None))]
        await handler(db, settings, args)
    finally:
        await db.dispose()
    return 0


async def _tenants_create(db: Database, settings: Settings, args: argparse.Namespace) -> None:
    async with db.system() as session:
        tenant, key = await create_tenant(session, args.name, {}, settings)
    print(f"tenant_id: {tenant.id}")
    print(f"api_key:   {key.key}")
    print("(the key is shown only this once)")


async def _tenants_list(db: Database, settings: Settings, args: argparse.Namespace) -> None:
    async with db.system() as session:
        async for tenant in list_all(session):
            print(f"{tenant.id}  {tenant.created_at:%Y-%m-%d %H:%M}  {tenant.name}")


async def _keys_create(db: Database, settings: Settings, args: argparse.Namespace) -> None:
    try:
        tenant_id = uuid.UUID(args.tenant)
    except ValueError:
        raise MemoriaError(f"not a tenant id: {args.tenant}") from None
    async with db.system() as session:
        key = await create_key(session, tenant_id, args.name, settings)
    print(f"api_key: {key.key}")
    print(f"prefix:  {key.prefix}")


async def _keys_revoke(db: Database, settings: Settings, args: argparse.Namespace) -> None:
    async with db.system() as session:
        key = await revoke_by_prefix(session, args.prefix)
    print(f"revoked {key.prefix} of tenant {key.tenant_id}")


async def _jobs(db: Database, settings: Settings, args: argparse.Namespace) -> None:
    async with db.system() as session:
        counts, oldest = await status_counts(session)
    for status, count in counts.items():
        print(f"{status:8} {count}")
    print(f"oldest queued: {f'{oldest:.1f}s' if oldest is not None else '-'}")


async def _export(db: Database, settings: Settings, args: argparse.Namespace) -> None:
    try:
        tenant_id = uuid.UUID(args.tenant)
    except ValueError:
        raise MemoriaError(f"not a tenant id: {args.tenant}") from None
    if args.user:
        chunks = export_stream(db, tenant_id, "user", args.user)
    elif args.group:
        chunks = export_stream(db, tenant_id, "group", args.group)
    else:
        chunks = export_tenant(db, tenant_id)
    written = items = 0
    with Path(args.out).open("wb") as out:  # noqa: ASYNC230 (a CLI, one file)
        async for chunk in chunks:
            out.write(chunk)
            written += len(chunk)
            items += 1
            if items % 200 == 0:
                print(
                    f"\rexporting… {items} items, {written / 1e6:.1f} MB", end="", file=sys.stderr
                )
    print(f"\rexported {items} items, {written / 1e6:.2f} MB to {args.out}", file=sys.stderr)


async def _import(db: Database, settings: Settings, args: argparse.Namespace) -> None:
    try:
        tenant_id = uuid.UUID(args.tenant)
    except ValueError:
        raise MemoriaError(f"not a tenant id: {args.tenant}") from None
    memo_chat = parse_chat(args.memo_conversation) if args.memo_conversation else None
    # The stored vectors' model, which a re-embedding may have changed from the configured one.
    async with db.system() as session:
        embedding, warning = await reembed.settle(session, settings.models.embedding)
    if warning:
        log.warning("%s", warning)
    embedder = build_embedder(embedding)
    try:
        report = await import_undefined(
            db,
            settings,
            embedder,
            tenant_id,
            Path(args.data_dir),
            dry_run=args.dry_run,
            events_file=Path(args.events) if args.events else None,
            memo_chat=memo_chat,
            progress=ProgressBar(),
        )
    finally:
        await embedder.close()
    print(report.summary())


class ProgressBar:
    """A plain-text progress bar on stderr, one line per stage."""

    WIDTH = 30

    def __init__(self) -> None:
        self._shown: tuple[str, int] | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        """Show ``done`` of ``total`` for a stage (redrawn only when the bar moves)."""
        filled = self.WIDTH * done // total if total else self.WIDTH
        if self._shown == (stage, filled) and done < total:
            return
        self._shown = (stage, filled)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        end = "\n" if done >= total else ""
        print(f"\r{stage:<9} [{bar}] {done}/{total}", end=end, file=sys.stderr, flush=True)


async def _reembed(settings: Settings, args: argparse.Namespace) -> int:
    db = Database.from_settings(settings)
    try:
        await _require_schema(db, settings)
        if args.cancel:
            run = await reembed.cancel(db)
            print(f"cancelled run {run.id}; the stored vectors stay {run.previous_model!r}")
            return 0
        if args.resume:
            print(f"{await reembed.resume(db, settings)} job(s) queued again")
            report = await reembed.report(db)
            return await _follow(db, report.run.id) if args.wait and report else 0
        if args.status:
            report = await reembed.report(db)
            if report is None:
                print("no re-embedding has been run")
                return 0
            if args.wait:
                return await _follow(db, report.run.id)
            print(_describe(report))
            return 0
        target = _reembed_target(settings, args)
        await reembed.check_startable(db, target)
        await _probe(target)
        run = await reembed.start(db, settings, target, args.batch_size)
        print(
            f"run {run.id}: {run.previous_model} ({run.previous_dimensions}) -> {run.model_name}"
            f" ({run.dimensions}), {run.batch_size} rows a job; the workers (`memoria serve`,"
            " `memoria worker`) do the work, searches use the old vectors until the switch"
        )
        return await _follow(db, run.id) if args.wait else 0
    finally:
        await db.dispose()


def _reembed_target(settings: Settings, args: argparse.Namespace) -> EmbeddingModelSettings:
    provider = args.provider or ("openai" if args.api_url else settings.models.embedding.provider)
    if provider == "local":
        if args.model not in (None, LOCAL_MODEL):
            raise MemoriaError(f"the local provider has one model, {LOCAL_MODEL}")
    elif not args.model:
        raise MemoriaError("give --model (or --status, --cancel, --resume)")
    return reembed.target_settings(
        settings.models.embedding,
        provider=provider,
        model=args.model,
        dimensions=args.dimensions,
        api_url=args.api_url,
    )


async def _probe(target: EmbeddingModelSettings) -> None:
    """Embed one text with the new model before anything changes: a wrong URL, name or
    dimension is reported here rather than by failing jobs."""
    model, dimensions = vector_space(target)
    embedder = build_embedder(target)
    try:
        [vector] = await embedder.passages(["memoria"])
    except ConfigurationError as exc:
        raise MemoriaError(f"{exc.message} (give the model's --dimensions)") from exc
    except Exception as exc:
        raise MemoriaError(f"the model {model!r} did not answer: {exc}") from exc
    finally:
        await embedder.close()
    if len(vector) != dimensions:
        raise MemoriaError(f"the model {model!r} made {len(vector)} dimensions, not {dimensions}")


def _describe(report: RunReport) -> str:
    run = report.run
    lines = [
        f"run {run.id}: {run.previous_model} ({run.previous_dimensions}) -> {run.model_name}"
        f" ({run.dimensions}), {run.status}, started {run.started_at:%Y-%m-%d %H:%M:%S}"
        + (f", finished {run.finished_at:%Y-%m-%d %H:%M:%S}" if run.finished_at else "")
    ]
    for table in report.tables:
        state = "done" if table.passes_open == 0 and run.status != "cancelled" else ""
        lines.append(f"  {table.table:<9} {table.rows_done:>10,} / {table.rows_total:<10,} {state}")
    lines.append(f"  written during the run, caught up: {run.caught_up:,}")
    jobs = report.jobs
    lines.append(
        f"  jobs: {jobs['queued']} queued, {jobs['running']} running, {jobs['failed']} failed"
    )
    if report.last_error:
        lines.append(f"  last error: {report.last_error}")
    if report.stalled:
        lines.append("  stalled: fix the cause above, then `memoria reembed --resume`")
    return "\n".join(lines)


async def _follow(db: Database, run_id: int) -> int:
    """A progress bar until the run is switched (0), cancelled or stalled (1)."""
    tty = sys.stdout.isatty()
    shown = ""
    while True:
        report = await reembed.report(db, run_id)
        if report is None:
            raise MemoriaError(f"run {run_id} is gone")
        done = sum(t.rows_done for t in report.tables)
        total = max(sum(t.rows_total for t in report.tables), 1)
        width = 30
        filled = min(width, width * done // total)
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {min(100, 100 * done // total):3d}%"
            f"  {done:,}/{total:,} rows  {report.run.status}"
        )
        if line != shown:
            print(f"\r{line}" if tty else line, end="" if tty else "\n", flush=True)
            shown = line
        if report.run.status in ("done", "cancelled") or report.stalled:
            if tty:
                print()
            print(_describe(report))
            break
        await asyncio.sleep(1.0)
    run = report.run
    if run.status != "done":
        return 1
    print(
        f"switched: the stored vectors are {run.model_name} ({run.dimensions} dimensions), and"
        f" running services embed with it. Set [models.embedding] provider = {run.provider!r},"
        f" model_name = {run.model_name!r}, dimensions = {run.dimensions}"
        + (f", api_url = {run.api_url!r}" if run.api_url else "")
        + " to match."
    )
    return 0


_ADMIN: dict[
    tuple[str, Any], Callable[[Database, Settings, argparse.Namespace], Awaitable[None]]
] = {
    ("tenants", "create"): _tenants_create,
    ("tenants", "list"): _tenants_list,
    ("keys", "create"): _keys_create,
    ("keys", "revoke"): _keys_revoke,
    ("jobs", None): _jobs,
    ("export", None): _export,
    ("import", None): _import,
}

if __name__ == "__main__":
    sys.exit(main())
