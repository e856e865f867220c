"""What the benchmarks share: latency percentiles, a free local port, a served API."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def quantile_ms(samples: list[float], q: float) -> float:
    """The ``q`` quantile of latencies in seconds, in milliseconds (nan without samples)."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def percentiles(samples: list[float]) -> str:
    """p50, p95 and p99 of latencies in seconds, as one line."""
    return "  ".join(
        f"p{round(q * 100)} {quantile_ms(samples, q):6.2f} ms" for q in (0.50, 0.95, 0.99)
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(port: int, env: dict[str, str], *, worker: bool = False) -> subprocess.Popen[bytes]:
    """``memoria serve`` in a process of its own, quiet; without its worker unless asked."""
    return subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--port", str(port)]
        + ([] if worker else ["--no-worker"]),
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
