"""``POST /v1/end`` latency and throughput, against the floor of a bare INSERT + COMMIT.

Starts ``memoria serve`` (no worker) on the embedded database with durable commits, then:
  1. the floor: a bare asyncpg INSERT + COMMIT round trip on the same database,
  2. ``end`` from one client in sequence: p50/p95/p99,
  3. ``end`` from 32 concurrent clients: accepted calls per second and latencies,
  4. the same two for a tenant in fast-acknowledge mode (synchronous_commit = off).

Run: python bench/end_latency.py [--calls 2000] [--clients 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import asyncpg
from measure import free_port, percentiles, serve

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


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=32)
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
    server = serve(port, env)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        durable = request(port, "POST", "/admin/tenants", ADMIN, {"name": "bench"})
        fast = request(port, "POST", "/admin/tenants", ADMIN, {"name": "bench-fast"})
        fast_key = str(fast["api_key"]["key"])  # type: ignore[index]
        request(port, "PATCH", "/v1/settings", fast_key, {"fast_ack": True})
        dsn = f"postgresql://postgres@/postgres?host={data_dir / 'pg'}"

        floor_samples = await floor(dsn, 1000)
        print(f"floor: bare asyncpg INSERT + COMMIT     {percentiles(floor_samples)}")
        for label, key in (("durable", durable["api_key"]["key"]), ("fast-ack", fast_key)):  # type: ignore[index]
            seq = await sequential(port, str(key), args.calls, f"s-{label}")
            print(f"end, 1 client in sequence ({label:8}) {percentiles(seq)}")
            rate, con = await concurrent(port, str(key), args.calls * 2, args.clients, f"c-{label}")
            print(
                f"end, {args.clients} clients ({label:8})          {percentiles(con)}"
                f"  → {rate:7.0f} calls/s"
            )
        ratio = statistics.median(seq) / statistics.median(floor_samples)
        print(f"(last block's sequential p50 is {ratio:.2f}× the floor's p50)")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
