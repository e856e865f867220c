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

from sqlalchemy import event

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.historian_throughput import drained, enqueue
from bench.measure import ROOT
from service.db.embedded import embedded_url, stop_embedded
from service.db.engine import Database
from service.db.migrate import upgrade_to_head
from service.runtime import Runtime
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


def time_steps(steps: list[str]) -> dict[str, list[float]]:
    """Wrap each step found so that its wall time is recorded: name → [seconds, calls]."""
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
                started = time.perf_counter()
                try:
                    return await original(*args, **kwargs)
                finally:
                    entry = spent[label]
                    entry[0] += time.perf_counter() - started
                    entry[1] += 1

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

    runtime = Runtime.build(settings)
    statements: Counter[str] = Counter()

    def count(*event_args: Any) -> None:
        statement, many = event_args[2], event_args[5]
        statements[statement_kind(statement) + (" (many)" if many else "")] += 1

    event.listen(runtime.db.engine.sync_engine, "before_cursor_execute", count)
    spent = time_steps(STEPS)
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
    if args.cprofile:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--mode", choices=("rules", "llm"), default="llm")
    parser.add_argument("--embedder", choices=("local", "hash"), default="hash")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    with fake_llm() as url:
        await run(args, url)


if __name__ == "__main__":
    asyncio.run(main())
