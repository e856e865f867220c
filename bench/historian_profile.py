"""Where an ``end`` job's time goes: the historian's worker in this process, its steps timed
and every SQL statement counted, optionally under cProfile.

Queues the throughput benchmark's jobs (``bench/historian_throughput.py``), runs a worker in
this process until they are done, and prints: jobs/s, this process's CPU milliseconds per job,
wall milliseconds per job spent in each step (run with ``--concurrency 1`` for steps that add
up to the job), SQL statements per job by kind (transactions: BEGIN/COMMIT are not counted;
each transaction has one ``SELECT set_config``), and with ``--cprofile`` the functions with
the most own time. The scripted LLM runs in a child process, so its work is not counted here.

Run: python bench/historian_profile.py [--jobs 1000] [--mode rules|llm] [--embedder hash|local]
     [--concurrency 8] [--cprofile] [--top 30]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import importlib
import io
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import event

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.historian_throughput import drained, enqueue
from bench.measure import ROOT
from service.db.embedded import embedded_url, stop_embedded
from service.db.engine import Database
from service.db.migrate import upgrade_to_head
from service.jobs import build_runtime
from service.settings import Settings
from service.tenants.service import TenantContext, create_tenant
from tests.conftest import plain_dsn

_WORDS = re.compile(r"[A-Za-z_]+")

# The steps timed: "module:Class.method" or "module:function" (coroutines); those missing in
# this version of the code are left out.
STEPS = [
    "service.queue.worker:Worker._claim",
    "service.queue.worker:Worker._run_job",
    "service.queue.worker:Worker._run_batch",
    "service.historian.service:Historian._rewrite",
    "service.historian.service:Historian._prepare_profiles",
    "service.historian.service:Historian._plan_memories",
    "service.embedding:CurrentEmbedder.passages",
    "service.events.repository:upsert_events",
    "service.historian.profiles:ProfileMerger.write",
    "service.historian.profiles:ProfileMerger.write_many",
    "service.historian.service:Historian._write",
    "service.historian.service:Historian._begin",
    "service.historian.memories:MemoryKeeper.retrieve",
    "service.historian.memories:MemoryKeeper.apply",
    "service.queue.repository:complete",
    "service.queue.repository:complete_many",
]

# The scripted LLM in a process of its own (its HTTP work must not count as the worker's).
_SERVE_LLM = """
import sys
from bench.historian_throughput import echo_drafts
from tests.fake_llm import FakeLLM
llm = FakeLLM().start()
llm.default = echo_drafts
print(llm.base_url, flush=True)
sys.stdin.read()
"""


@contextmanager
def fake_llm() -> Iterator[str]:
    """The scripted OpenAI-compatible server in a child process; yields its base URL."""
    child = subprocess.Popen(
        [sys.executable, "-c", _SERVE_LLM],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        yield child.stdout.readline().strip()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=10)


def statement_kind(statement: str) -> str:
    """A short name for a statement: its first keyword and the table it works on."""
    words = _WORDS.findall(statement)
    if not words:
        return "?"
    head = words[0].upper()
    lowered = [w.lower() for w in words]
    for marker in ("into", "update", "from"):
        if marker in lowered[:40]:
            index = lowered.index(marker)
            if index + 1 < len(words):
                return f"{head} {words[index + 1]}"
    return head


def time_steps(steps: list[str], calls: list[tuple[str, float, float]]) -> dict[str, list[float]]:
    """Wrap each step found so that its wall time is recorded: name → [seconds, calls], and
    each call as (name, start in epoch seconds, seconds) in ``calls``."""
    spent: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for step in steps:
        module_name, _, path = step.partition(":")
        owner: Any = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent, None)
        original = getattr(owner, name, None) if owner is not None else None
        if original is None:
            continue

        def timed(original: Callable[..., Any], label: str) -> Callable[..., Any]:
            @functools.wraps(original)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                started, begun = time.perf_counter(), time.time()
                try:
                    return await original(*args, **kwargs)
                finally:
                    entry = spent[label]
                    seconds = time.perf_counter() - started
                    entry[0] += seconds
                    entry[1] += 1
                    calls.append(("step " + label, begun, seconds))

            return wrapper

        setattr(owner, name, timed(original, path))
        # Modules that imported the function by name keep the original: patch them too.
        if not parents:
            for module in list(sys.modules.values()):
                if module is not owner and getattr(module, name, None) is original:
                    setattr(module, name, getattr(owner, name))
    return spent


async def run(args: argparse.Namespace, llm_url: str) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    url = embedded_url(data_dir / "pg")
    embedding: dict[str, Any] = {}
    if args.embedder == "hash":
        embedding = {
            "provider": "openai",
            "api_url": llm_url,
            "model_name": "hash-384",
            "dimensions": 384,
        }
    models: dict[str, Any] = {"embedding": embedding}
    if args.mode == "llm":
        models["historian"] = {"api_url": llm_url, "model_name": "bench"}
    queue = {"concurrency": args.concurrency, "claim_batch": args.concurrency}
    settings = Settings(database_url=url, models=models, cognitive={"queue": queue})
    await asyncio.to_thread(upgrade_to_head, url, settings)
    db = Database(url)
    async with db.system() as session:
        row, _ = await create_tenant(session, "bench", {}, settings)
    tenant = TenantContext(row.id, "bench", None, None, {}, settings)
    await enqueue(db, tenant, settings, args.jobs)
    await db.dispose()

    runtime = build_runtime(settings)
    statements: Counter[str] = Counter()
    # Every statement's kind, start (epoch seconds) and wall time, to compare the windows.
    timed: list[tuple[str, float, float]] = []

    def count(*event_args: Any) -> None:
        statement, many, context = event_args[2], event_args[5], event_args[4]
        kind = statement_kind(statement) + (" (many)" if many else "")
        statements[kind] += 1
        context._bench_started = (kind, time.time())

    def finish(*event_args: Any) -> None:
        kind, begun = getattr(event_args[4], "_bench_started", ("?", time.time()))
        timed.append((kind, begun, time.time() - begun))

    event.listen(runtime.db.engine.sync_engine, "before_cursor_execute", count)
    event.listen(runtime.db.engine.sync_engine, "after_cursor_execute", finish)
    spent = time_steps(STEPS, timed)
    profiler = cProfile.Profile()
    try:
        await runtime.start(migrate=False, run_worker=False)
        statements.clear()
        started, cpu = time.perf_counter(), time.process_time()
        if args.cprofile:
            profiler.enable()
        runtime.start_worker()
        await drained(plain_dsn(url), args.jobs)
        profiler.disable()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        windows = await finish_windows(plain_dsn(url), min(args.window, args.jobs // 2))
        await runtime.close(timeout=5)
    finally:
        stop_embedded()
        shutil.rmtree(data_dir, ignore_errors=True)
    jobs = args.jobs
    print(
        f"{args.mode} historian, {args.embedder} embedder, concurrency {args.concurrency}:"
        f" {jobs} jobs in {wall:.1f} s = {jobs / wall:.1f} jobs/s;"
        f" worker {1000 * cpu / jobs:.1f} ms CPU per job"
    )
    print("wall ms per job in each step (calls per job):")
    for label, (seconds, calls) in sorted(spent.items(), key=lambda kv: -kv[1][0]):
        print(f"  {1000 * seconds / jobs:8.2f}  ({calls / jobs:.2f})  {label}")
    print(f"SQL statements per job: {sum(statements.values()) / jobs:.2f}")
    for kind, n in statements.most_common():
        print(f"  {n / jobs:6.2f}  {kind}")
    print_windows(timed, windows)
    if args.cprofile:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())


async def finish_windows(dsn: str, window: int) -> dict[str, tuple[float, float, int]]:
    """The first and the last ``window`` jobs to finish: name → (from, to, jobs), epoch seconds."""
    connection = await asyncpg.connect(dsn)
    try:
        began = await connection.fetchval("SELECT extract(epoch FROM min(started_at)) FROM jobs")
        finished = [
            float(r[0])
            for r in await connection.fetch(
                "SELECT extract(epoch FROM finished_at) FROM jobs WHERE status = 'done'"
                " ORDER BY finished_at"
            )
        ]
    finally:
        await connection.close()
    if len(finished) < 2 * window or window == 0:
        return {}
    return {
        "first": (float(began), finished[window - 1], window),
        "last": (finished[-window - 1], finished[-1], window),
    }


def print_windows(
    timed: list[tuple[str, float, float]], windows: dict[str, tuple[float, float, int]]
) -> None:
    """SQL wall ms per job by statement kind in the first and the last window: which
    statement grows as the tables do."""
    if not windows:
        return
    per_job: dict[str, dict[str, float]] = {name: defaultdict(float) for name in windows}
    for kind, begun, seconds in timed:
        for name, (start, end, jobs) in windows.items():
            if start <= begun <= end:
                per_job[name][kind] += 1000 * seconds / jobs
    first, last = per_job["first"], per_job["last"]
    rates = {name: jobs / max(end - start, 1e-9) for name, (start, end, jobs) in windows.items()}
    print(
        f"jobs/s: first window {rates['first']:.1f}, last window {rates['last']:.1f}"
        f" (ratio {rates['last'] / rates['first']:.2f})"
    )
    print(
        "SQL and step wall ms per job, first window -> last window (concurrent statements"
        " overlap; the steps include their statements):"
    )
    sql_first = sum(v for k, v in first.items() if not k.startswith("step "))
    sql_last = sum(v for k, v in last.items() if not k.startswith("step "))
    print(f"  {sql_first:8.2f} -> {sql_last:8.2f}  all SQL")
    for kind in sorted(set(first) | set(last), key=lambda k: -(last[k] - first[k])):
        print(f"  {first[kind]:8.2f} -> {last[kind]:8.2f}  {kind}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--mode", choices=("rules", "llm"), default="llm")
    parser.add_argument("--embedder", choices=("local", "hash"), default="hash")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--window", type=int, default=1000)
    args = parser.parse_args()
    with fake_llm() as url:
        await run(args, url)


if __name__ == "__main__":
    asyncio.run(main())
