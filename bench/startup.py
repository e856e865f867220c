"""How long `memoria serve` takes, with no configuration, to answer /readyz with 200.

Run: python bench/startup.py  (a fresh data directory, then a second start that reuses it)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from measure import free_port


def time_to_ready(data_dir: Path) -> float:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORIA_")}
    env["MEMORIA_DATA_DIR"] = str(data_dir)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit("serve exited before it was ready")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        return time.monotonic() - started
            except OSError:
                time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "pg"
        first = time_to_ready(data_dir)
        second = time_to_ready(data_dir)
    print(f"serve → /readyz 200, fresh data directory (initdb + migrations): {first:.2f} s")
    print(f"serve → /readyz 200, second start reusing the data:             {second:.2f} s")


if __name__ == "__main__":
    main()
