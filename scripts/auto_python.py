"""Where auto's own Python falls in a request: the prompt phase, the reply's first step, the rest.

    .venv/bin/python scripts/auto_python.py --max-tokens 24                 # the 1.5B, all 31 prompts
    .venv/bin/python scripts/auto_python.py --target T.gguf --kinds code_edit --memory 0

Runs the bench set in-process with `auto` (greedy, no prompt cache, the n-gram memory across
requests on unless --memory 0, as the daemon runs it) and times the policy's own calls with
perf_counter: prepare() (the prompt-side work, done while the target reads the prompt), the
first step's choose(), and every later choose(), whose time sits between the tokens a user
watches and counts in decode tokens/s. A step over --slow-ms is listed: one long stall between
two tokens is what a user sees as a stutter. Times are Python's only, not llama.cpp's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from localspec.auto.policy import AutoPolicy
from localspec.engine.benchset import load_selected
from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.speculative import StepContext
from localspec.engine.worker import Engine
from localspec.errors import UserInputError
from localspec.types import GenerationRequest, SpecParams

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"


class Timings:
    """Seconds per call of the policy's prepare(), first choose() and later choose()s, per prompt."""

    def __init__(self) -> None:
        self.prepare: list[float] = []
        self.first: list[float] = []
        self.rest: list[float] = []
        self.slow: list[tuple[float, str, int]] = []  # (seconds, prompt, reply tokens so far)
        self.prompt = ""


def instrument(timings: Timings, slow_s: float) -> Callable[[], None]:
    """Wrap AutoPolicy's prepare and choose with timers; returns the function that unwraps them."""
    prepare, choose = AutoPolicy.prepare, AutoPolicy.choose

    def timed_prepare(self: AutoPolicy, prompt: Sequence[int]) -> None:
        started = time.perf_counter()
        try:
            prepare(self, prompt)
        finally:
            timings.prepare.append(time.perf_counter() - started)

    def timed_choose(self: AutoPolicy, ctx: StepContext) -> Any:
        first = not self.steps  # no step chosen yet in this request
        started = time.perf_counter()
        try:
            return choose(self, ctx)
        finally:
            spent = time.perf_counter() - started
            (timings.first if first else timings.rest).append(spent)
            if not first and spent > slow_s:
                timings.slow.append((spent, timings.prompt, len(ctx.tokens) - ctx.prompt_len))

    AutoPolicy.prepare = timed_prepare  # type: ignore[method-assign]
    AutoPolicy.choose = timed_choose  # type: ignore[method-assign]

    def restore() -> None:
        AutoPolicy.prepare, AutoPolicy.choose = prepare, choose  # type: ignore[method-assign]

    return restore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--target", type=Path, default=ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    )
    ap.add_argument("--draft", type=Path, default=None, help="a draft model auto may weigh (default: none)")
    ap.add_argument("--prompts", type=Path, default=ROOT / "scripts" / "bench_set.json")
    ap.add_argument("--kinds", default="", help="comma-separated kinds (default: all)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--memory", type=int, default=16384, help="n-gram memory tokens (0: off)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--gpu-layers", type=int, default=None)
    ap.add_argument("--slow-ms", type=float, default=1.0, help="list later steps slower than this")
    args = ap.parse_args()
    try:
        prompts = load_selected(args.prompts, args.kinds)
    except UserInputError as exc:
        sys.exit(str(exc))
    load = LoadOptions(n_ctx=4096, n_threads=args.threads, gpu_layers=args.gpu_layers)
    config = EngineConfig(
        target=args.target,
        draft=args.draft,
        load=load,
        draft_gpu_layers=args.gpu_layers,
        ngram_memory_tokens=args.memory,
    )
    timings = Timings()
    restore = instrument(timings, args.slow_ms / 1000)
    try:
        with Engine(config) as engine:
            engine.wait_ready()
            for prompt in prompts:
                timings.prompt = prompt.name
                request = GenerationRequest(
                    tuple(prompt.messages),
                    max_tokens=args.max_tokens,
                    speculative=SpecParams(method="auto"),
                    cache_prompt=False,
                )
                engine.generate(request)
    finally:
        restore()
    report(timings, len(prompts))


def report(t: Timings, requests: int) -> None:
    def per_request(xs: list[float]) -> str:
        return f"{sum(xs) / requests * 1e3:.2f} ms"

    print(f"{requests} requests; auto's Python per request:")
    print(f"  prepare (prompt phase)   {per_request(t.prepare)}")
    print(f"  first step               {per_request(t.first)}")
    print(
        f"  later steps              {per_request(t.rest)} over {len(t.rest) / requests:.0f} steps "
        f"(median {statistics.median(t.rest) * 1e6:.0f} us, longest {max(t.rest) * 1e3:.2f} ms)"
    )
    print(f"  later steps over the slow mark: {len(t.slow)}")
    for spent, name, at in sorted(t.slow, reverse=True)[:10]:
        print(f"    {spent * 1e3:7.2f} ms  {name} at reply token {at}")


if __name__ == "__main__":
    main()
