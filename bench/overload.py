"""Overload: offered load at 1×, 2× and 4× of capacity on ``POST /v1/end``.

Open loop: requests are offered at a fixed rate whatever the answers, as bots do. Beyond
``max_inflight_requests`` the service sheds with 503 + Retry-After instead of queueing, so the
latency of what it accepts stays bounded. Prints accepted/s, shed share and p50/p99 of the
accepted calls per level, and the server's peak memory.

Run: python bench/overload.py [--capacity 1700] [--seconds 8] [--inflight 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from end_latency import ADMIN, Client, body, request
from measure import free_port, quantile_ms, serve

ROOT = Path(__file__).resolve().parents[1]


async def offer(
    port: int, key: str, rate: float, seconds: float, tag: str
) -> tuple[float, float, list[float]]:
    idle: asyncio.Queue[Client] = asyncio.Queue()
    for _ in range(512):
        idle.put_nowait(Client(port, key))
    accepted: list[float] = []
    shed = 0
    dropped = 0
    tasks = []

    async def one(n: int) -> None:
        nonlocal shed
        client = await idle.get()
        started = time.perf_counter()
        try:
            status = await client.post("/v1/end", body(n, tag))
        finally:
            idle.put_nowait(client)
        if status == 202:
            accepted.append(time.perf_counter() - started)
        else:
            shed += 1

    begin = time.perf_counter()
    n = 0
    while (now := time.perf_counter()) - begin < seconds:
        due = int((now - begin) * rate)
        while n < due:
            if idle.empty():
                dropped += 1  # the load generator itself is saturated
            tasks.append(asyncio.create_task(one(n)))
            n += 1
        await asyncio.sleep(0.001)
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - begin
    total = len(accepted) + shed
    return len(accepted) / elapsed, shed / total if total else 0.0, accepted


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--capacity", type=float, default=1700, help="end calls/s at saturation")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--inflight", type=int, default=64)
    args = parser.parse_args()
    data_dir = Path(
        tempfile.mkdtemp(
            prefix="bench-overload-", dir=ROOT / "data" if (ROOT / "data").exists() else None
        )
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}
    env.update(
        MEMORIA_DATA_DIR=str(data_dir / "pg"),
        MEMORIA_ADMIN_TOKEN=ADMIN,
        MEMORIA_LOG_LEVEL="WARNING",
        MEMORIA_MAX_INFLIGHT_REQUESTS=str(args.inflight),
    )
    server = serve(port, env)
    peak = 0
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        key = str(
            request(port, "POST", "/admin/tenants", ADMIN, {"name": "overload"})["api_key"]["key"]
        )  # type: ignore[index]
        process = psutil.Process(server.pid)
        print(
            f"max_inflight_requests = {args.inflight}, capacity taken as {args.capacity:.0f} calls/s"
        )
        for factor in (1, 2, 4):
            rate, shed, latencies = await offer(
                port, key, args.capacity * factor, args.seconds, f"x{factor}"
            )
            p50, p99 = quantile_ms(latencies, 0.5), quantile_ms(latencies, 0.99)
            peak = max(peak, process.memory_info().rss)
            print(
                f"offered {factor}× ({args.capacity * factor:6.0f}/s): accepted {rate:6.0f}/s,"
                f" shed {shed:5.1%}, accepted p50 {p50:6.1f} ms, p99 {p99:6.1f} ms"
            )
        print(f"server peak RSS {peak / 2**20:.0f} MiB")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)


if __name__ == "__main__":
    asyncio.run(main())
