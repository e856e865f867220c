"""``POST /v1/end`` latency and throughput, against the floor of a bare INSERT + COMMIT.

Starts ``memoria serve`` (no worker) on the embedded database with durable commits, then:
  1. the floor: a bare asyncpg INSERT + COMMIT round trip on the same database,
  2. ``end`` from one client in sequence: p50/p95/p99,
  3. ``end`` from 32 concurrent clients: accepted calls per second and latencies,
  4. the same two for a tenant in fast-acknowledge mode (synchronous_commit = off).
The jobs of these calls stay queued. Then, on a fresh ``serve`` each,
  5. ``end`` from one client in sequence without a worker, and with one (in a process of its
     own, and in the API's process) while it works through that backlog, the modes taking
     turns for ``--rounds`` rounds: p50/p95/p99, and p95 against the worker-off figure.

Run: python bench/end_latency.py [--calls 2000] [--clients 32] [--modes off,process,inline]
     [--rounds 2] [--nice N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import asyncpg
from measure import free_port, percentiles, quantile_ms, serve

ROOT = Path(__file__).resolve().parents[1]
ADMIN = "bench-admin"


class Client:
    """A minimal keep-alive HTTP/1.1 client, so the client's own cost stays out of the figures."""

    def __init__(self, port: int, key: str) -> None:
        self.port, self.key = port, key
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict[str, object]) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        data = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {self.key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        ).encode()
        self.writer.write(head + data)
        status_line = await self.reader.readline()
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await self.reader.readexactly(length)
        return int(status_line.split()[1])


def body(n: int, tag: str) -> dict[str, object]:
    return {
        "request_type": "group",
        "group_id": f"g{n % 50}",
        "sender_id": f"{10000 + n % 300}",
        "sender_name": "张三",
        "request_id": f"{tag}-{n}",
        "memo": "回答了关于 asyncio 的问题",
        "observations": ["我明天去北京出差"],
        "timestamp": "2026-02-21T23:30:00+08:00",
    }


async def floor(dsn: str, calls: int) -> list[float]:
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial, body text)")
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        async with conn.transaction():
            await conn.execute("INSERT INTO bench_floor (body) VALUES ($1)", "x" * 200)
        samples.append(time.perf_counter() - started)
    await conn.execute("DROP TABLE bench_floor")
    await conn.close()
    return samples


async def sequential(port: int, key: str, calls: int, tag: str) -> list[float]:
    client = Client(port, key)
    for n in range(50):  # warm up
        await client.post("/v1/end", body(n, tag + "w"))
    samples = []
    for n in range(calls):
        started = time.perf_counter()
        status = await client.post("/v1/end", body(n, tag))
        samples.append(time.perf_counter() - started)
        assert status == 202, status
    return samples


async def concurrent(
    port: int, key: str, calls: int, clients: int, tag: str
) -> tuple[float, list[float]]:
    samples: list[float] = []
    counter = iter(range(calls))

    async def one(client: Client) -> None:
        for n in counter:
            started = time.perf_counter()
            status = await client.post("/v1/end", body(n, tag))
            samples.append(time.perf_counter() - started)
            assert status == 202, status

    pool = [Client(port, key) for _ in range(clients)]
    started = time.perf_counter()
    await asyncio.gather(*(one(c) for c in pool))
    return calls / (time.perf_counter() - started), samples


def request(
    port: int, method: str, path: str, token: str, payload: dict[str, object]
) -> dict[str, object]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(payload).encode(),
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req) as response:
        return dict(json.loads(response.read()))


def wait_ready(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"serve exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("serve never became ready")


def stop(server: subprocess.Popen[bytes]) -> None:
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=90)


async def job_counts(dsn: str) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT status, count(*) AS n FROM jobs GROUP BY status")
    finally:
        await conn.close()
    return {str(row["status"]): int(row["n"]) for row in rows}


async def while_draining(
    env: dict[str, str], dsn: str, key: str, calls: int, tag: str
) -> tuple[list[float], dict[str, int], dict[str, int]]:
    """``end`` from one client in sequence on a fresh ``serve``: without its worker (``off``),
    or with it (``process``, ``inline``) while it works through the queued backlog."""
    mode = tag.split("-")[0]
    port = free_port()
    worker = mode != "off"
    server = serve(port, {**env, "MEMORIA_WORKER_MODE": mode} if worker else env, worker=worker)
    try:
        wait_ready(port, server)
        first = await job_counts(dsn)
        if worker:  # measure once the worker has its model loaded and is taking jobs
            deadline = time.monotonic() + 120
            while (await job_counts(dsn)).get("done", 0) < first.get("done", 0) + 5:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the {mode} worker processed no job in 120 s")
                await asyncio.sleep(0.2)
        before = await job_counts(dsn)
        samples = await sequential(port, key, calls, f"w-{tag}")
        after = await job_counts(dsn)
    finally:
        stop(server)
    return samples, before, after


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument(
        "--modes",
        default="off,process,inline",
        help="worker settings compared while the backlog drains (off, process, inline)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="turns of the modes")
    parser.add_argument(
        "--nice", type=int, help="the worker process's lower priority (default: the setting's)"
    )
    args = parser.parse_args()

    data_dir = Path(
        tempfile.mkdtemp(
            prefix="bench-end-", dir=ROOT / "data" if (ROOT / "data").exists() else None
        )
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}
    env.update(
        MEMORIA_DATA_DIR=str(data_dir / "pg"),
        MEMORIA_ADMIN_TOKEN=ADMIN,
        MEMORIA_LOG_LEVEL="WARNING",
    )
    if args.nice is not None:
        env["MEMORIA_WORKER_NICE"] = str(args.nice)
    dsn = f"postgresql://postgres@/postgres?host={data_dir / 'pg'}"
    try:
        # 1. Without a worker: the floor, then sequential and concurrent calls. Their jobs
        #    stay queued: the backlog the workers below work through.
        server = serve(port, env)
        try:
            wait_ready(port, server)
            durable = request(port, "POST", "/admin/tenants", ADMIN, {"name": "bench"})
            durable_key = str(durable["api_key"]["key"])  # type: ignore[index]
            fast = request(port, "POST", "/admin/tenants", ADMIN, {"name": "bench-fast"})
            fast_key = str(fast["api_key"]["key"])  # type: ignore[index]
            request(port, "PATCH", "/v1/settings", fast_key, {"fast_ack": True})

            floor_samples = await floor(dsn, 1000)
            print(f"floor: bare asyncpg INSERT + COMMIT     {percentiles(floor_samples)}")
            for label, key in (("durable", durable_key), ("fast-ack", fast_key)):
                seq = await sequential(port, key, args.calls, f"s-{label}")
                print(f"end, 1 client in sequence ({label:8}) {percentiles(seq)}")
                rate, con = await concurrent(port, key, args.calls * 2, args.clients, f"c-{label}")
                print(
                    f"end, {args.clients} clients ({label:8})          {percentiles(con)}"
                    f"  → {rate:7.0f} calls/s"
                )
            ratio = statistics.median(seq) / statistics.median(floor_samples)
            print(f"(last block's sequential p50 is {ratio:.2f}× the floor's p50)")
        finally:
            stop(server)

        # 2. The bot must not wait for the historian: the same sequential calls on a fresh
        #    `serve` without a worker, and with one while it drains the backlog. The modes
        #    take turns, round after round, so that a neighbour's load falls on all of them.
        print("\nend, 1 client in sequence (durable), fresh serve each, backlog draining:")
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        pooled: dict[str, list[float]] = {mode: [] for mode in modes}
        for round_ in range(1, args.rounds + 1):
            for mode in modes:
                samples, before, after = await while_draining(
                    env, dsn, durable_key, args.calls, f"{mode}-{round_}"
                )
                pooled[mode] += samples
                drained = after.get("done", 0) - before.get("done", 0)
                print(
                    f"  round {round_}, worker {mode:8} {percentiles(samples)}"
                    f"  [{drained} jobs done meanwhile, {after.get('queued', 0)} still queued]"
                )
        p95_off = quantile_ms(pooled["off"], 0.95) if "off" in pooled else None
        print("all rounds:")
        for mode, samples in pooled.items():
            p95 = quantile_ms(samples, 0.95)
            versus = f"  p95 {p95 / p95_off:4.2f}× off" if p95_off and mode != "off" else ""
            print(f"  worker {mode:8} {percentiles(samples)}{versus}")
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
