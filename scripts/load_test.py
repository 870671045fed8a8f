"""Load test for a running daemon: concurrent streaming clients, checked token for token. Not a CI test.

    python scripts/load_test.py [--socket PATH | --url URL --token T] [--clients 8] [--duration 120]

1. Runs each request alone (greedy and seeded sampling) to get its reference output.
2. Runs `--clients` threads for `--duration` seconds, each streaming those requests in a
   loop, and checks every stream's token ids and text equal the reference: nothing lost,
   duplicated or mixed between concurrent streams.
3. Reports throughput, errors, mismatches, the daemon's memory at start and end, and the
   latency the client saw beyond the engine's own (its stats for the same run).
4. With `--in-process TARGET`, first runs the same requests here and through the daemon,
   alternately, with plain decoding: the API's overhead on the first token and per token.

Exit status 1 when any stream failed or differed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from localspec.client import Client
from localspec.errors import LocalspecError
from localspec.paths import Paths
from localspec.process.pidfile import daemon_pid, pid_file_for
from localspec.types import (
    ChatMessage,
    GenerationRequest,
    GenerationResult,
    Method,
    SamplingParams,
    SpecParams,
)

PROMPTS = ("hello world", "def main(self):", "one two three", "print the code", "class Draft:", "return None")


def requests(
    max_tokens: int, methods: tuple[Method, ...] = ("auto", "ngram", "draft", "none")
) -> list[GenerationRequest]:
    """Chats and raw completions, greedy and seeded sampling, over the speculation methods.

    Greedy output is the same whatever the method (speculation is lossless); a seeded
    sample is reproducible for a fixed method, so sampled requests never use `auto`,
    whose choices may depend on what it has learned from earlier requests.
    """
    out = []
    for i, prompt in enumerate(PROMPTS):
        greedy = i % 2 == 0
        sampling = SamplingParams() if greedy else SamplingParams(temperature=0.8, top_p=0.95, seed=100 + i)
        choices = methods if greedy else tuple(m for m in methods if m != "auto") or ("none",)
        spec = SpecParams(choices[i % len(choices)], 4)
        chat = (ChatMessage("user", prompt),)
        out.append(
            GenerationRequest(messages=chat, max_tokens=max_tokens, sampling=sampling, speculative=spec)
        )
        out.append(
            GenerationRequest(prompt=prompt, max_tokens=max_tokens, sampling=sampling, speculative=spec)
        )
    return out


@dataclass
class Tally:
    """What the client threads saw; one lock guards it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    streams: int = 0
    tokens: int = 0
    mismatches: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    first_token_overhead_ms: list[float] = field(default_factory=list)
    per_token_overhead_ms: list[float] = field(default_factory=list)


def timed_stream(client: Client, request: GenerationRequest) -> tuple[GenerationResult, float, float]:
    """The result, the client's time to first chunk, and its total time (seconds)."""
    start = time.perf_counter()
    first = 0.0
    for event in client.stream(request):
        if first == 0.0:
            first = time.perf_counter() - start
        if isinstance(event, GenerationResult):
            return event, first, time.perf_counter() - start
    raise LocalspecError("stream ended without a result")


def record(
    tally: Tally, result: GenerationResult, first: float, total: float, reference: GenerationResult
) -> None:
    st = result.stats
    with tally.lock:
        tally.streams += 1
        tally.tokens += st.tokens
        if (result.token_ids, result.text) != (reference.token_ids, reference.text):
            tally.mismatches += 1
        # Time the client waited beyond what the engine spent (ttft includes the prompt's decode).
        tally.first_token_overhead_ms.append((first - st.ttft_s) * 1000)
        if st.tokens > 1:
            client_gen, engine_gen = total - first, st.elapsed_s - st.ttft_s
            tally.per_token_overhead_ms.append((client_gen - engine_gen) * 1000 / (st.tokens - 1))


def worker(
    client: Client,
    work: list[tuple[GenerationRequest, GenerationResult]],
    offset: int,
    deadline: float,
    tally: Tally,
) -> None:
    i = offset
    while time.monotonic() < deadline:
        request, reference = work[i % len(work)]
        i += 1
        try:
            result, first, total = timed_stream(client, request)
        except LocalspecError as exc:
            with tally.lock:
                tally.errors[type(exc).__name__] += 1
            continue
        record(tally, result, first, total, reference)


def paired_overhead(client: Client, target: Path, n_ctx: int, rounds: int = 10) -> None:
    """The same requests in-process and through the daemon, alternately: what the API adds."""
    from localspec.engine.config import EngineConfig, LoadOptions
    from localspec.engine.worker import Engine
    from localspec.settings import load_settings

    first_ms: list[float] = []
    token_ms: list[float] = []
    load = LoadOptions(n_ctx=n_ctx, n_threads=load_settings().threads)  # LOCALSPEC_THREADS, as the daemon
    with Engine(EngineConfig(target=target, load=load)) as engine:
        engine.wait_ready()
        for _ in range(rounds):
            # Plain decoding on both sides: the difference is the API alone.
            for request in requests(64, methods=("none",)):
                start = time.perf_counter()
                handle = engine.submit(request)
                local_first = 0.0
                for _chunk in handle:
                    local_first = local_first or time.perf_counter() - start
                local_total = time.perf_counter() - start
                remote, remote_first, remote_total = timed_stream(client, request)
                assert handle.result is not None and remote.token_ids == handle.result.token_ids
                first_ms.append((remote_first - local_first) * 1000)
                if remote.stats.tokens > 1:
                    token_ms.append((remote_total - local_total) * 1000 / remote.stats.tokens)
    print("API overhead against in-process generation, paired runs:")
    print(f"  first token: {ms(first_ms)}")
    print(f"  per token (whole request, amortised): {ms(token_ms)}")


def daemon_rss_mb(socket_path: Path | None) -> float | None:
    pid = daemon_pid(pid_file_for(socket_path)) if socket_path is not None else None
    if not pid:
        return None
    return psutil.Process(pid).memory_info().rss / 2**20


def make_client(args: argparse.Namespace) -> Client:
    if args.url:
        return Client(base_url=args.url, token=args.token)
    return Client(socket_path=args.socket or Paths.from_env().socket_path)


def ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"median {statistics.median(ordered):.3f} ms, p95 {p95:.3f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--socket", type=Path, help="daemon socket (default: the one `localspec serve` uses)")
    parser.add_argument("--url", help="or a TCP base URL, e.g. http://127.0.0.1:8977")
    parser.add_argument("--token", help="bearer token for --url")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of concurrent load")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--in-process", type=Path, metavar="TARGET", help="also compare with TARGET run here")
    args = parser.parse_args()
    socket_path = None if args.url else (args.socket or Paths.from_env().socket_path)

    with make_client(args) as probe:
        health = probe.wait_ready(30)
        print(f"daemon: {health.model}, draft {health.draft}, methods {', '.join(health.methods)}")
        work = [(r, probe.generate(r)) for r in requests(args.max_tokens)]  # references, one at a time
        if args.in_process is not None:
            paired_overhead(probe, args.in_process, health.n_ctx or 2048)
    rss_start = daemon_rss_mb(socket_path)
    tally = Tally()
    deadline = time.monotonic() + args.duration
    clients = [make_client(args) for _ in range(args.clients)]
    threads = [
        threading.Thread(target=worker, args=(c, work, i * 3, deadline, tally)) for i, c in enumerate(clients)
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    for c in clients:
        c.close()
    rss_end = daemon_rss_mb(socket_path)

    print(f"{args.clients} clients for {elapsed:.1f} s: {tally.streams} streams, {tally.tokens} tokens")
    print(f"throughput: {tally.tokens / elapsed:.1f} tokens/s, {tally.streams / elapsed:.2f} streams/s")
    print(f"mismatches against the request run alone: {tally.mismatches}")
    print(f"errors: {dict(tally.errors) or 'none'}")
    if rss_start is not None and rss_end is not None:
        print(f"daemon RSS: {rss_start:.1f} MiB at start, {rss_end:.1f} MiB at end")
    print("client time beyond the engine's own under load (waiting for the one engine, templating, HTTP):")
    print(f"  first token: {ms(tally.first_token_overhead_ms)}")
    print(f"  per streamed token: {ms(tally.per_token_overhead_ms)}")
    return 1 if tally.mismatches or tally.errors else 0


if __name__ == "__main__":
    sys.exit(main())
