"""Historian throughput: ``end`` jobs per second for one and for two worker processes.

The LLM is the scripted OpenAI-compatible server with zero latency (it echoes the rule
drafts, which pass the gate), the embedder is the local default. Prints jobs/s and the
average number of LLM calls per job.

Run: python bench/historian_throughput.py [--jobs 600] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.db.embedded import embedded_url
from service.db.engine import Database
from service.db.migrate import upgrade_to_head
from service.ends.schemas import EndRequest
from service.ends.service import accept_end
from service.settings import Settings
from service.tenants.service import TenantContext, create_tenant
from tests.fake_llm import FakeLLM, Reply, tool

ROOT = Path(__file__).resolve().parents[1]


def echo_drafts(request: dict[str, Any]) -> Reply:
    """Answer submit_rewrite with each item's rule draft (absolute already, so it passes);
    answer the profile step with "no change" (no tool call)."""
    if request["tools"][0]["function"]["name"] != "submit_rewrite":
        return Reply(content="no change")
    prompt = request["messages"][1]["content"]
    items = [json.loads(line) for line in prompt.splitlines() if line.startswith('{"index"')]
    return tool(
        "submit_rewrite", {"rewrites": [{"index": i["index"], "text": i["draft"]} for i in items]}
    )


async def enqueue(
    db: Database, tenant: TenantContext, settings: Settings, count: int, tag: str
) -> None:
    for n in range(count):
        request = EndRequest.model_validate(
            {
                "request_type": "group",
                "group_id": f"g{n % 20}",
                "sender_id": f"{10000 + n % 200}",
                "sender_name": "张三",
                "bot_id": "20002",
                "bot_name": "小助手",
                "request_id": f"{tag}-{n}",
                "timestamp": "2026-02-21T23:30:00+08:00",
                "memo": "我帮你查了明天北京的天气",
                "observations": ["我明天去北京出差"],
            }
        )
        await accept_end(db, tenant, request, settings)


async def wait_done(db: Database, count: int) -> float:
    from sqlalchemy import text

    started = time.perf_counter()
    while True:
        async with db.system() as session:
            done = (
                await session.execute(
                    text("SELECT count(*) FROM jobs WHERE status IN ('done', 'failed')")
                )
            ).scalar_one()
        if done >= count:
            return time.perf_counter() - started
        await asyncio.sleep(0.05)


async def llm_calls(db: Database) -> tuple[float, float]:
    from sqlalchemy import text

    query = text(
        "SELECT avg((result->>'llm_calls')::int), avg((result->>'profile_llm_calls')::int)"
        " FROM jobs WHERE status = 'done'"
    )
    async with db.system() as session:
        rewrite, profile = (await session.execute(query)).one()
    return float(rewrite or 0), float(profile or 0)


async def run(workers: int, jobs: int, concurrency: int, llm: FakeLLM) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="bench-historian-"))
    url = embedded_url(data_dir / "pg")
    settings = Settings(database_url=url)
    await asyncio.to_thread(upgrade_to_head, url, settings)
    db = Database(url)
    async with db.system() as session:
        row, _ = await create_tenant(session, "bench", {}, settings)
    tenant = TenantContext(row.id, "bench", None, None, {}, settings)
    await enqueue(db, tenant, settings, jobs, uuid.uuid4().hex[:6])
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}
    env.update(
        MEMORIA_DATABASE_URL=url,
        MEMORIA_MODELS__HISTORIAN__API_URL=llm.base_url,
        MEMORIA_MODELS__HISTORIAN__MODEL_NAME="bench",
        MEMORIA_COGNITIVE__QUEUE__CONCURRENCY=str(concurrency),
        MEMORIA_COGNITIVE__QUEUE__CLAIM_BATCH=str(concurrency),
        MEMORIA_LOG_LEVEL="WARNING",
        # Several processes on 2 cores: one engine thread each, or they oversubscribe the CPU.
        MEMORIA_MODELS__EMBEDDING__THREADS="1" if workers > 1 else "0",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "service", "worker"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(workers)
    ]
    try:
        elapsed = await wait_done(db, jobs)
        calls = await llm_calls(db)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
        await db.dispose()
        from service.db.embedded import stop_embedded

        stop_embedded()
        shutil.rmtree(data_dir, ignore_errors=True)
    print(
        f"{workers} worker process(es), concurrency {concurrency}: {jobs} end jobs in {elapsed:5.1f} s"
        f" → {jobs / elapsed:6.1f} jobs/s; LLM calls per job: rewrite {calls[0]:.2f},"
        f" profile step {calls[1]:.2f}"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    llm = FakeLLM().start()
    llm.default = echo_drafts
    try:
        for workers in (1, 2):
            await run(workers, args.jobs, args.concurrency, llm)
    finally:
        llm.stop()


if __name__ == "__main__":
    asyncio.run(main())
