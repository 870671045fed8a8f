"""Tokens/s of `none` and `auto` with the target on RPC workers, as the network's round trip grows.

Starts the workers (`localspec rpc-worker`, loopback), then for each round-trip time puts a
delaying TCP proxy in front of each worker and loads the target through the proxies (the
draft stays local). `tc netem` would be the real thing, but it needs the sch_netem kernel
module (absent on the development machine: "Specified qdisc kind is unknown") and, outside a
private network namespace, would delay every loopback user of the machine; the proxy delays
only this benchmark's traffic. It holds each chunk of bytes for half the round trip in each
direction (latency, not bandwidth: chunks in flight overlap), and reports the round trip it
actually added (its own forwarding lateness included) and how many round trips (answers the
client waited for) a generated token cost, so the table says what was measured. "direct"
connects to the workers without the proxy. Each round trip loads the target anew with a
fresh calibration folder, so `auto` plans with V(n) measured through that network.

    .venv/bin/python scripts/rpc_bench.py --local --rtt-ms direct,0,1,5,20 --max-tokens 128 --prompts 8
    .venv/bin/python scripts/rpc_bench.py --rtt-ms 0,5 --max-tokens 16 --prompts 1   # a quick check
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from localspec.engine.bench import decode_tps, load_prompts
from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.isolated import open_engine
from localspec.types import GenerationRequest, SamplingParams, SpecParams

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
TARGET = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
PROMPTS = ROOT / "scripts" / "bench_prompts.json"


@dataclass
class Turns:
    """Round trips on one connection: each time the worker answers after the client has sent."""

    count: int = 0
    last: str = "down"
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sent(self, direction: str) -> None:
        with self.lock:
            if direction == "down" and self.last == "up":
                self.count += 1
            self.last = direction


@dataclass
class Pipe:
    """One direction of a proxied connection: chunks held `delay_s` each, in order."""

    delay_s: float
    direction: str
    turns: Turns
    lateness: list[float] = field(default_factory=list)  # seconds past due when each chunk was sent

    def run(self, src: socket.socket, dst: socket.socket) -> None:
        due: deque[tuple[float, bytes]] = deque()
        ready = threading.Condition()
        done = threading.Event()
        sender = threading.Thread(target=self._send, args=(dst, due, ready, done), daemon=True)
        sender.start()
        while data := _recv(src):
            with ready:
                due.append((time.perf_counter() + self.delay_s, data))
                ready.notify()
        done.set()
        with ready:
            ready.notify()
        sender.join()
        _shutdown(dst)

    def _send(
        self,
        dst: socket.socket,
        due: deque[tuple[float, bytes]],
        ready: threading.Condition,
        done: threading.Event,
    ) -> None:
        while True:
            with ready:
                while not due and not done.is_set():
                    ready.wait()
                if not due:
                    return
                at, data = due.popleft()
            wait = at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            try:
                dst.sendall(data)
            except OSError:
                return
            self.lateness.append(time.perf_counter() - at)
            self.turns.sent(self.direction)


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(1 << 20)
    except OSError:
        return b""


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # the other side is gone already
        sock.shutdown(socket.SHUT_WR)


class DelayProxy:
    """127.0.0.1:<port> -> the worker, adding `rtt_s` to every round trip."""

    def __init__(self, upstream: int, rtt_s: float) -> None:
        self.upstream, self.rtt_s = upstream, rtt_s
        self.pipes: list[Pipe] = []  # client -> worker, worker -> client, per connection
        self.turns: list[Turns] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            worker = socket.create_connection(("127.0.0.1", self.upstream))
            for s in (client, worker):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as ggml-rpc's sockets
            turns = Turns()
            up, down = Pipe(self.rtt_s / 2, "up", turns), Pipe(self.rtt_s / 2, "down", turns)
            self.pipes += [up, down]
            self.turns.append(turns)
            threading.Thread(target=up.run, args=(client, worker), daemon=True).start()
            threading.Thread(target=down.run, args=(worker, client), daemon=True).start()

    def round_trips(self) -> int:
        """Answers from the worker that the client waited for, so far (each pays the round trip)."""
        return sum(t.count for t in self.turns)

    def reset_lateness(self) -> None:
        for pipe in self.pipes:
            pipe.lateness.clear()

    def added_rtt_ms(self) -> float | None:
        """The round trip actually added since the last reset, in ms: the asked one plus the proxy's
        own lateness (the median chunk's, each way: sleeping and forwarding on a busy machine)."""
        late = [x for p in self.pipes for x in p.lateness]
        return 1000 * (self.rtt_s + 2 * statistics.median(late)) if late else None

    def close(self) -> None:
        self._server.close()


def start_workers(n: int, threads: int) -> list[tuple[subprocess.Popen[bytes], int]]:
    workers = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [
            sys.executable,
            "-m",
            "localspec.cli",
            "rpc-worker",
            "--port",
            str(port),
            "--threads",
            str(threads),
        ]
        cmd = [sys.executable, "-c", "from localspec.cli import main; main()", *cmd[3:]]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        workers.append((proc, port))
    for proc, port in workers:
        _wait_listening(proc, port)
    return workers


def _wait_listening(proc: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"worker on port {port} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"worker on port {port} did not listen within 60 s")


def measure(args: argparse.Namespace, endpoints: tuple[str, ...], proxies: list[DelayProxy]) -> list[dict]:
    """One load of the target on `endpoints` (none for local); each method over the prompts."""
    prompts = list(load_prompts(args.prompts_file).values())[: args.prompts]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rpc-bench-") as cache:
        load = LoadOptions(n_ctx=args.ctx, n_threads=args.threads, rpc=endpoints)
        config = EngineConfig(args.target, args.draft, "auto", load=load, cache_dir=Path(cache))
        started = time.perf_counter()
        with open_engine(config) as engine:
            engine.wait_ready()
            load_s = time.perf_counter() - started
            for method in args.methods:
                before = sum(p.round_trips() for p in proxies)
                for proxy in proxies:
                    proxy.reset_lateness()
                tokens, seconds, speeds = 0, 0.0, []
                for text in prompts:
                    request = GenerationRequest(
                        prompt=text,
                        max_tokens=args.max_tokens,
                        sampling=SamplingParams(temperature=0.0),
                        speculative=SpecParams(method),
                        cache_prompt=False,
                    )
                    stats = engine.generate(request).stats
                    tokens += stats.tokens
                    seconds += stats.elapsed_s - stats.ttft_s
                    speeds.append(decode_tps(stats))
                trips = sum(p.round_trips() for p in proxies) - before
                added = [a for p in proxies if (a := p.added_rtt_ms()) is not None]
                rows.append(
                    {
                        "method": method,
                        "tokens": tokens,
                        "decode_tps": round((tokens - len(prompts)) / seconds, 2) if seconds > 0 else 0.0,
                        "median_prompt_tps": round(statistics.median(speeds), 2),
                        "added_rtt_ms": round(statistics.fmean(added), 2) if added else None,
                        "round_trips_per_token": round(trips / tokens, 1) if proxies and tokens else None,
                        "load_and_calibrate_s": round(load_s, 1),
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", type=Path, default=TARGET)
    parser.add_argument("--draft", type=Path, default=DRAFT)
    parser.add_argument(
        "--rtt-ms", default="direct,0,1,5,20", help="Round-trip times to add, in ms; direct: no proxy."
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="Threads for each worker and for the draft.")
    parser.add_argument("--methods", default="none,auto")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=8, help="How many prompts of the file to run.")
    parser.add_argument("--prompts-file", type=Path, default=PROMPTS)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--local", action="store_true", help="Also a row with no RPC at all.")
    parser.add_argument("--json", action="store_true", help="One JSON object per row.")
    args = parser.parse_args()
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    rtts = [x.strip() for x in args.rtt_ms.split(",") if x.strip()]
    workers = start_workers(args.workers, args.threads)
    try:
        if args.local:
            for row in measure(args, (), []):
                _print(args, {"rtt_ms": "local (no RPC)", **row})
        for rtt in rtts:
            if rtt == "direct":
                proxies = []
                endpoints = tuple(f"127.0.0.1:{port}" for _, port in workers)
            else:
                proxies = [DelayProxy(port, float(rtt) / 1000) for _, port in workers]
                endpoints = tuple(f"127.0.0.1:{p.port}" for p in proxies)
            for row in measure(args, endpoints, proxies):
                _print(args, {"rtt_ms": rtt, **row})
            for proxy in proxies:
                proxy.close()
    finally:
        for proc, _ in workers:
            proc.kill()
            proc.wait()


def _print(args: argparse.Namespace, row: dict) -> None:
    if args.json:
        print(json.dumps(row), flush=True)
    else:
        print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
