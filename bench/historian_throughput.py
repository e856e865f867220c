"""Historian throughput at volume: ``end`` jobs per second, and whether the pace holds.

10,000 ``end`` jobs (the default) from 20 people in 3 groups over four months, each a
first-person chat line, a fifth with a bot memo, now and then a move or a new job; they are
queued first, then drained by worker processes. Two historians: the rules alone, and the
scripted OpenAI-compatible LLM with zero latency (it echoes the rule drafts, which pass the
gate, and leaves profiles and memories as they are). Prints jobs/s over the first 1,000 and
the last 1,000 jobs and overall, and the largest profile at the end.

The embedder is the local default; ``--embedder hash`` uses the scripted server's hash
vectors instead, which measures the historian's own work without the model's.

Beside the rates, which depend on what else the machine runs, it prints the CPU seconds per
job of the worker processes and of PostgreSQL (its server processes, those that ended
included), which do not, and the load average while it ran.

Run: python bench/historian_throughput.py [--jobs 10000] [--mode rules|llm|both]
     [--workers 1] [--concurrency 8] [--batch-size 32] [--embedder local|hash]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import ROOT
from service.db.embedded import embedded_url, stop_embedded
from service.db.engine import Database
from service.db.migrate import upgrade_to_head
from service.ends.schemas import EndRequest
from service.ends.service import accept_end
from service.settings import Settings
from service.tenants.service import TenantContext, create_tenant
from tests.conftest import plain_dsn
from tests.fake_llm import FakeLLM, Reply, tool
from tests.test_volume import CITIES, DOINGS, PLACES

START = datetime(2026, 1, 1, 8, tzinfo=UTC)
WINDOW = 1000
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """A process's CPU seconds (user + system) from /proc; with ``children``, those of its
    children that ended too. 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command: state, ppid, …; utime, stime, cutime, cstime are fields 14–17.
    used = int(fields[11]) + int(fields[12])
    if children:
        used += int(fields[13]) + int(fields[14])
    return used / TICKS


def postgres_cpu(data_dir: Path) -> float:
    """CPU seconds of a PostgreSQL server so far: the postmaster, the backends that ended
    (counted in its children's time) and those still running."""
    try:
        postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    total = cpu_seconds(postmaster, children=True)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                total += cpu_seconds(int(entry.name))
    return total


def echo_drafts(request: dict[str, Any]) -> Reply:
    """Answer submit_rewrite with each item's rule draft (absolute already, so it passes);
    answer the profile and memory steps with "no change" (no tool call)."""
    if request["tools"][0]["function"]["name"] != "submit_rewrite":
        return Reply(content="no change")
    prompt = request["messages"][1]["content"]
    items = [json.loads(line) for line in prompt.splitlines() if line.startswith('{"index"')]
    return tool(
        "submit_rewrite", {"rewrites": [{"index": i["index"], "text": i["draft"]} for i in items]}
    )


def request(n: int, rng: random.Random, tag: str) -> EndRequest:
    """Call ``n``: one of 20 people in one of 3 groups, a new line every few minutes."""
    person = n % 20
    if n % 101 == 0:
        line = f"我搬到{rng.choice(CITIES)}了"
    elif n % 103 == 0:
        line = f"我在{rng.choice(['字节', '阿里', '腾讯'])}上班"
    else:
        line = f"我{rng.choice(['今天', '昨天', ''])}在{rng.choice(PLACES)}{rng.choice(DOINGS)}"
    body: dict[str, Any] = {
        "request_type": "group",
        "group_id": f"g{person % 3}",
        "sender_id": f"{10000 + person}",
        "sender_name": f"成员{person}",
        "bot_id": "20002",
        "bot_name": "小助手",
        "request_id": f"{tag}-{n}",
        "timestamp": (START + timedelta(minutes=17 * n)).isoformat(),
        "observations": [f"{line}，第{n}条"],
    }
    if n % 5 == 0:
        body["memo"] = f"我记下了你说的第{n}条"
    return EndRequest.model_validate(body)


async def enqueue(db: Database, tenant: TenantContext, settings: Settings, count: int) -> None:
    """Queue ``count`` end calls, as the API would."""
    rng, tag = random.Random(14), uuid.uuid4().hex[:6]
    requests = [request(n, rng, tag) for n in range(count)]
    for start in range(0, count, 16):
        batch = requests[start : start + 16]
        await asyncio.gather(*(accept_end(db, tenant, r, settings) for r in batch))


async def drained(
    dsn: str, count: int, sample: Callable[[], tuple[float, float]] | None = None
) -> list[tuple[int, float, float]]:
    """Wait until every job is done or failed. With ``sample`` (CPU seconds of the worker and
    of PostgreSQL so far), every half second's (jobs finished, worker CPU, PostgreSQL CPU)."""
    connection = await asyncpg.connect(dsn)
    samples: list[tuple[int, float, float]] = []
    try:
        while True:
            done = await connection.fetchval(
                "SELECT count(*) FROM jobs WHERE status IN ('done', 'failed')"
            )
            if sample is not None:
                samples.append((done, *sample()))
            if done >= count:
                return samples
            await asyncio.sleep(0.5)
    finally:
        await connection.close()


def window_cpu(samples: list[tuple[int, float, float]], count: int) -> str:
    """CPU ms per job of the worker and of PostgreSQL over the first and the last WINDOW
    jobs (from the half-second samples): which side grows when the pace falls."""
    window = min(WINDOW, count // 2)

    def per_job(low: int, high: int) -> tuple[float, float]:
        start = max((s for s in samples if s[0] <= low), key=lambda s: s[0], default=samples[0])
        end = min((s for s in samples if s[0] >= high), key=lambda s: s[0], default=samples[-1])
        jobs = max(end[0] - start[0], 1)
        return 1000 * (end[1] - start[1]) / jobs, 1000 * (end[2] - start[2]) / jobs

    first, last = per_job(0, window), per_job(count - window, count)
    return (
        f"worker {first[0]:.1f} -> {last[0]:.1f} ms, PostgreSQL {first[1]:.1f} -> {last[1]:.1f}"
        f" ms (first {window} -> last {window} jobs)"
    )


async def report(dsn: str) -> dict[str, Any]:
    """Jobs/s over the first and the last WINDOW jobs to finish and overall, failures, LLM
    calls per job, and the largest profile."""
    connection = await asyncpg.connect(dsn)
    try:
        finished = [
            r["finished_at"]
            for r in await connection.fetch(
                "SELECT finished_at FROM jobs WHERE status = 'done' ORDER BY finished_at"
            )
        ]
        began = await connection.fetchval("SELECT min(started_at) FROM jobs")
        failed = await connection.fetchval("SELECT count(*) FROM jobs WHERE status = 'failed'")
        calls = await connection.fetchval(
            "SELECT avg((result->>'llm_calls')::int) FROM jobs WHERE status = 'done'"
        )
        largest = await connection.fetchval(
            "SELECT coalesce(max(length(document)), 0) FROM profiles"
        )
    finally:
        await connection.close()
    window = min(WINDOW, len(finished) // 2)

    def rate(first: datetime, last: datetime, jobs: int) -> float:
        return jobs / max((last - first).total_seconds(), 1e-9)

    return {
        "first": rate(began, finished[window - 1], window),
        "last": rate(finished[-window - 1], finished[-1], window),
        "overall": rate(began, finished[-1], len(finished)),
        "window": window,
        "failed": failed,
        "llm_calls": float(calls or 0),
        "largest": int(largest),
    }


async def run(args: argparse.Namespace, mode: str, llm: FakeLLM) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="bench-historian-"))
    url = embedded_url(data_dir / "pg")
    embedding: dict[str, Any] = {}
    if args.embedder == "hash":
        embedding = {
            "provider": "openai",
            "api_url": llm.base_url,
            "model_name": "hash-384",
            "dimensions": 384,
        }
    settings = Settings(database_url=url, models={"embedding": embedding})
    await asyncio.to_thread(upgrade_to_head, url, settings)
    db = Database(url)
    async with db.system() as session:
        row, _ = await create_tenant(session, "bench", {}, settings)
    tenant = TenantContext(row.id, "bench", None, None, {}, settings)
    started = time.perf_counter()
    await enqueue(db, tenant, settings, args.jobs)
    queued = time.perf_counter() - started
    await db.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}
    env.update(
        MEMORIA_DATABASE_URL=url,
        MEMORIA_COGNITIVE__QUEUE__CONCURRENCY=str(args.concurrency),
        MEMORIA_COGNITIVE__QUEUE__CLAIM_BATCH=str(args.concurrency),
        MEMORIA_COGNITIVE__QUEUE__BATCH_SIZE=str(args.batch_size),
        MEMORIA_LOG_LEVEL="WARNING",
        # Several processes on 2 cores: one engine thread each, or they oversubscribe the CPU.
        MEMORIA_MODELS__EMBEDDING__THREADS="1" if args.workers > 1 else "0",
    )
    if mode == "llm":
        env.update(
            MEMORIA_MODELS__HISTORIAN__API_URL=llm.base_url,
            MEMORIA_MODELS__HISTORIAN__MODEL_NAME="bench",
        )
    for key, value in embedding.items():
        env[f"MEMORIA_MODELS__EMBEDDING__{key.upper()}"] = str(value)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "service", "worker"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(args.workers)
    ]
    dsn = plain_dsn(url)
    pg_before = postgres_cpu(data_dir / "pg")

    def sample() -> tuple[float, float]:
        return sum(cpu_seconds(p.pid) for p in procs), postgres_cpu(data_dir / "pg")

    try:
        samples = await drained(dsn, args.jobs, sample)
        worker_cpu = sum(cpu_seconds(proc.pid) for proc in procs)
        pg_cpu = postgres_cpu(data_dir / "pg") - pg_before
        load = os.getloadavg()[0]
        figures = await report(dsn)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
        stop_embedded()
        shutil.rmtree(data_dir, ignore_errors=True)
    print(
        f"{mode:5} historian, {args.embedder} embedder, {args.workers} worker(s) ×"
        f" {args.concurrency}: {args.jobs} jobs (queued in {queued:.0f} s);"
        f" first {figures['window']} {figures['first']:6.1f} jobs/s,"
        f" last {figures['window']} {figures['last']:6.1f} jobs/s"
        f" (ratio {figures['last'] / figures['first']:.2f}),"
        f" overall {figures['overall']:6.1f} jobs/s; failed {figures['failed']};"
        f" LLM calls/job {figures['llm_calls']:.2f}; largest profile {figures['largest']} chars",
        flush=True,
    )
    print(
        f"      CPU per job: worker {1000 * worker_cpu / args.jobs:.1f} ms (start-up included),"
        f" PostgreSQL {1000 * pg_cpu / args.jobs:.1f} ms; load average {load:.1f}"
        f" on {os.cpu_count()} cores; {window_cpu(samples, args.jobs)}",
        flush=True,
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--mode", choices=("rules", "llm", "both"), default="both")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--embedder", choices=("local", "hash"), default="local")
    args = parser.parse_args()
    llm = FakeLLM().start()
    llm.default = echo_drafts
    try:
        for mode in ("rules", "llm") if args.mode == "both" else (args.mode,):
            await run(args, mode, llm)
    finally:
        llm.stop()


if __name__ == "__main__":
    asyncio.run(main())
