"""Real `localspec rpc-worker` processes on loopback for the RPC tests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from daemonproc import free_port

START_TIMEOUT_S = 60.0


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def worker_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from localspec.cli import main; main()", "rpc-worker", *args]


def start_worker(folder: Path, port: int | None = None) -> Worker:
    """A worker with one thread on `port` (a free one by default), once it accepts connections."""
    port = port or free_port()
    log_path = folder / f"worker-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            worker_command("--port", str(port), "--threads", "1"), stdout=log, stderr=subprocess.STDOUT
        )
    worker = Worker(proc, port, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the worker exited with {proc.returncode}:\n{worker.log()}")
        if "transport" in worker.log():  # llama.cpp's server prints it just before it listens
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    return worker
            except OSError:
                pass
        time.sleep(0.05)
    worker.stop()
    raise AssertionError(f"the worker did not listen within {START_TIMEOUT_S}s:\n{worker.log()}")
