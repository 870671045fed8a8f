"""Synthetic traces and machines for replayed runs (no model): a code edit copies most of its
prompt, fresh prose copies nothing; the curves are this CPU's and a GPU-like flat one."""

from __future__ import annotations

import numpy as np

from localspec.auto.costmodel import K_MAX, Curve
from localspec.auto.policy import AutoPolicy, OnlineCosts
from localspec.auto.replay import Machine, Replayed, SimClock, Trace, TraceDrafter, replay
from localspec.engine.drafters.ngram import NgramDrafter
from localspec.engine.speculative import FixedPolicy

MS = 1e-3
# This CPU (llama-bench, 2 threads, Qwen2.5-Coder-1.5B): V(4) ~ 2.5 V(1), V(9) ~ 6.4 V(1).
CPU = Curve.from_points({1: 34 * MS, 2: 51 * MS, 4: 85 * MS, 9: 218 * MS, 16: 388 * MS}, K_MAX + 1)
GPU = Curve(tuple((5.0 + 0.1 * (n - 1)) * MS for n in range(1, K_MAX + 2)))
RNG_VOCAB = 5000


def machine(curve: Curve, draft_ratio: float = 0.0, overhead: float = 0.0) -> Machine:
    draft = curve.scaled(draft_ratio) if draft_ratio else None
    return Machine(curve, draft, step_overhead=overhead)


def copy_trace(n: int = 160) -> Trace:
    rng = np.random.default_rng(1)
    prompt = [int(t) for t in rng.integers(0, RNG_VOCAB, 300)]
    output = prompt[40 : 40 + n]
    for i in range(20, n, 37):  # a rename: a few tokens differ, the rest is copied
        output[i] = RNG_VOCAB + i
    return Trace("copy", tuple(prompt), tuple(output), tuple(output), tuple([0.9] * n))


def fresh_trace(n: int = 160, draft_hits: float = 0.0) -> Trace:
    rng = np.random.default_rng(2)
    prompt = [int(t) for t in rng.integers(0, RNG_VOCAB, 100)]
    output = [int(t) for t in rng.integers(RNG_VOCAB, 2 * RNG_VOCAB, n)]
    hits = rng.random(n) < draft_hits
    guess = [t if hit else -7 for t, hit in zip(output, hits, strict=True)]
    conf = [0.9 if hit else 0.3 for hit in hits]
    return Trace("fresh", tuple(prompt), tuple(output), tuple(guess), tuple(conf))


def run_auto(m: Machine, trace: Trace, costs: OnlineCosts | None = None) -> tuple[Replayed, AutoPolicy]:
    """auto on one trace; `costs`: an engine's, shared with the requests before (default: fresh)."""
    clock = SimClock()
    draft = TraceDrafter(trace, m) if m.draft is not None else None
    costs = costs or OnlineCosts(m.verify, m.draft)
    policy = AutoPolicy(costs, NgramDrafter(2, 8), draft, clock=clock)
    return replay(trace, policy, m, clock, charge_policy=False), policy


def run_fixed(m: Machine, trace: Trace, method: str, k: int) -> Replayed:
    drafter = {"none": None, "ngram": NgramDrafter(), "draft": None}[method]
    if method == "draft":
        drafter = TraceDrafter(trace, m)  # type: ignore[assignment]
    return replay(trace, FixedPolicy(drafter, k), m, charge_policy=False)


def best_fixed(m: Machine, trace: Trace) -> float:
    methods = ["ngram", "draft"] if m.draft is not None else ["ngram"]
    speeds = [run_fixed(m, trace, "none", 0).tokens_per_second]
    speeds += [run_fixed(m, trace, method, k).tokens_per_second for method in methods for k in range(1, 9)]
    return max(speeds)
