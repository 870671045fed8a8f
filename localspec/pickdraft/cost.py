"""pick-draft's cost model: what a drafted token and a verify cost in target tokens, before measuring.

The step arithmetic (expected tokens, the best k) is the auto controller's
(`auto.costmodel`); this module only supplies its inputs for a machine pick-draft has
not measured, from the memory plan:

- a token costs what the model reads per token (every block and the output head)
  over the bandwidth of where it sits, plus a fixed cost per decode on each side
  (CPU_STEP_OVERHEAD_BYTES, GPU_STEP_OVERHEAD_BYTES) and, on a GPU, per drafted token
  (GPU_DRAFT_TOKEN_S), which is why a 0.5B draft costs 0.6-0.75 of a 1.5B target's token on a
  2-core CPU and more than a whole one on an H200 (measured) though it reads 0.4 of its bytes:
  on a fast GPU small models are latency-bound, and a draft pays only under a target that reads
  many times its bytes;
- verifying n tokens costs V(n) = 1 + 0.4 (n - 1) target tokens on a CPU with batch-invariant
  loading (`--exact`; calibration on the 2-core CI machine: V(4) = 2.25, V(7) = 3.48); with
  repacked weights (the default) it follows REPACKED_CPU_POINTS, our own calibration of the Qwen
  1.5B target on a 2-core AVX-512 CPU (V(2) = 1.64, V(4) = 2.62, V(8) = 4.63, V(16) = 5.22,
  V(64) = 12.64: dear for short drafts, cheap for long ones, which only copies fill); on a GPU it
  follows the H200's calibrations, a 1.5B's (GPU_SMALL_POINTS: V(2) = 1.32, V(9) = 2.09) and the
  mean of 7B-32B targets' (GPU_LARGE_POINTS: V(2) = 1.10, V(8) = 1.99, V(9) = 1.81), by size;
- drafts go as far as the engine verifies: 6 tokens with --exact (EXACT_VERIFY_BATCH); otherwise
  auto's K_MAX for a draft model and, for an n-gram copy, NGRAM_K_MAX into the verify widths
  auto drafts to (`costmodel.allowed`);
- acceptance: the controller's DRAFT_PRIOR for a draft model; n-gram lookup drafts on
  NGRAM_MATCH_RATE of steps with the controller's prior for a 4-token match.

Measured curves (`calibrate`'s cache, or `pick-draft --measure`) replace the priors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from localspec.auto.costmodel import (
    DRAFT_PRIOR,
    NGRAM_K_MAX,
    NGRAM_PRIOR_BY_LENGTH,
    Curve,
    Option,
    StepCost,
    allowed,
    best_k,
    expected_tokens,
)
from localspec.auto.costmodel import (
    K_MAX as FAST_K_MAX,
)
from localspec.engine.config import EXACT_VERIFY_BATCH
from localspec.pickdraft.devices import MIB
from localspec.pickdraft.memplan import MemoryPlan, ModelShape

# With --exact, drafts stop at 6 tokens: verify batches of more than 7 positions do not round like
# one-token decoding (engine.config.EXACT_VERIFY_BATCH), so the engine never runs them.
EXACT_K_MAX = EXACT_VERIFY_BATCH - 1
CPU_VERIFY_SLOPE = 0.4
# V(n) / V(1) with repacked weights, at the widths the kernels like (they work in blocks of 4 rows,
# and batches of 40+ are read with the plain prefill copy), interpolated between: `localspec
# calibrate` on the 2-core AVX-512 machine, 2026-11-24 (docs/benchmarks.md).
REPACKED_CPU_POINTS = {1: 1.0, 2: 1.64, 4: 2.62, 8: 4.63, 16: 5.22, 24: 7.87, 32: 9.87, 48: 10.47, 64: 12.64}
# V(n) / V(1) with every layer on a GPU: the engine's calibrations on an H200 (docs/benchmarks.md,
# "GPU, measured" and "GPU, measured again"; docs/gpu/h200-calibration-*.json). A 1.5B's
# (Qwen2.5-Coder-1.5B's layout) pays 1.32 for a second position; targets of 7B, 14B and 32B (shaped
# as Qwen2.5's, their mean here) 1.07-1.14, and climb to 1.86-2.14 at 8 before dropping at 9, where
# llama.cpp's CUDA backend leaves its matrix-vector kernel for the tiled one.
GPU_SMALL_POINTS = {
    1: 1.0, 2: 1.32, 4: 1.33, 8: 1.65, 9: 2.09, 16: 2.16, 24: 2.33, 32: 2.51, 48: 2.88, 64: 3.29,
}  # fmt: skip
GPU_LARGE_POINTS = {
    1: 1.0, 2: 1.1, 3: 1.23, 4: 1.39, 5: 1.51, 6: 1.67, 7: 1.83, 8: 1.99, 9: 1.81, 12: 1.82, 16: 1.86,
    24: 2.08, 32: 2.28, 48: 2.66, 64: 3.0,
}  # fmt: skip
# Bytes a token reads of the two calibrated sizes (the 1.5B's, the 7B-shaped one's): between them the
# two curves are mixed in proportion to the logarithm of a model's bytes.
GPU_SMALL_BYTES = 980e6
GPU_LARGE_BYTES = 4.37e9
# Effective bytes per second of decoding, CPU: fitted on the 2-core CI machine; GPU: fitted with
# GPU_STEP_OVERHEAD_BYTES to the H200's one-token decodes of five sizes (bytes a token read, ms:
# 0.5B 0.39 GB 2.02, 1.5B 0.98 GB 2.47, 7B 4.37 GB 4.90, 14B 8.52 GB 8.79, 32B 19.45 GB 14.74;
# predicted 2.30, 2.70, 4.99, 7.78, 15.14, within 14%): launches and synchronisation cost as much as
# streaming 3 GB more. The 0.5B draft's cost per target token comes out 0.85, 0.46, 0.30 and 0.15
# of the 1.5B, 7B, 14B and 32B's, where its one-token decode measured 0.82 of the 1.5B's and, in the
# calibrations run beside the others, 0.72, 0.39 and 0.17 (it read 2.0-3.5 ms from run to run).
CPU_BANDWIDTH = 20e9
GPU_BANDWIDTH = 1.484e12
GPU_STEP_OVERHEAD_BYTES = 3.03e9
# What a drafted token costs on a GPU beyond the draft's one-token decode as fitted above: drafting
# alternates with the target's verifies (and reads the draft's confidence). In localspec's own runs
# on the H200 (`draft` against `none`, nothing accepted, docs/gpu/h200-localspec_bench.json and
# h200-s28-bench-*.json), a drafting step of the 0.5B took 2.2, 2.95 and 3.9 ms beside the 1.5B, 7B
# and 32B: 1.18, 0.77 and 0.30 of their plain steps. With this the prior gives 1.26, 0.68 and 0.22;
# without it 0.85, 0.46 and 0.15, and a 0.5B draft would look like it pays under a 7B.
GPU_DRAFT_TOKEN_S = 1.1e-3
# A decode on a CPU costs, besides streaming the weights, about as long as streaming this much
# more (threads handing off each op, the graph, the step's Python): fitted so the 0.5B Qwen draft
# costs ~0.64 of the 1.5B target's token, as measured on the 2-core CI machine.
CPU_STEP_OVERHEAD_BYTES = 640 * MIB
NGRAM_MATCH_RATE = 0.2
NGRAM_ACCEPTANCE = (NGRAM_PRIOR_BY_LENGTH[4],)
# Measured by layerskip.default_keep's split as greedy agreement: 54% on Qwen2.5-Coder-1.5B, 12% on SmolLM2.
LAYERSKIP_ACCEPTANCE = 0.35


@dataclass(frozen=True)
class Estimate:
    """Expected speedup over plain decoding at the best k, and the numbers behind it."""

    speedup: float
    k: int
    draft_cost: float
    verify_cost: float
    acceptance: float
    measured: bool = False


class Costs:
    """Decode costs in target-token units for one plan: measured curves where given, priors otherwise."""

    def __init__(
        self, target: ModelShape, target_path: Path, curves: Mapping[Path, Curve], *, repack: bool = False
    ) -> None:
        self.target = target
        self.measured_target = curves.get(target_path)
        self.curves = curves
        self.k_max = k_max(repack)
        self.ngram_k_max = ngram_k_max(repack)
        self.cpu_shape: Callable[[int], float] = REPACKED_CPU_CURVE if repack else _exact_shape

    def verify(self, plan: MemoryPlan) -> Curve:
        """V(n) / V(1): what verifying n tokens costs in target tokens."""
        if self.measured_target is not None:
            return Curve(self.measured_target.relative())
        seconds = self._prior(self.target, plan.target.gpu_layers, plan.target.all_on_gpu)
        return Curve(tuple(s / seconds[0] for s in seconds))

    def _prior(self, shape: ModelShape, gpu_layers: int, all_on_gpu: bool) -> tuple[float, ...]:
        return _prior_seconds(shape, gpu_layers, all_on_gpu, self.cpu_shape, self.ngram_k_max)

    def draft_model(
        self, draft: ModelShape, plan: MemoryPlan, acceptance: float, path: Path | None
    ) -> Estimate:
        assert plan.draft is not None
        measured = self.curves.get(path) if path else None
        if measured is not None and self.measured_target is not None:
            cost = measured(1) / self.measured_target(1)
        else:
            measured = None
            target = self._prior(self.target, plan.target.gpu_layers, plan.target.all_on_gpu)
            own = self._prior(draft, plan.draft.gpu_layers, plan.draft.all_on_gpu)[0]
            cost = (own + _drafting_extra(plan.draft.gpu_layers)) / target[0]
        return estimate(
            self.verify(plan), cost, [acceptance], measured=measured is not None, k_max=self.k_max
        )

    def scaled_draft(self, size_ratio: float, plan: MemoryPlan) -> Estimate:
        """A draft not on disk: its bytes per token taken in proportion to its file size."""
        t = self.target
        scaled = replace(t, layer_bytes=tuple(int(b * size_ratio) for b in t.layer_bytes),
                         head_bytes=int(t.head_bytes * size_ratio))  # fmt: skip
        place = (plan.target.gpu_layers, plan.target.all_on_gpu)
        own = self._prior(scaled, *place)[0] + _drafting_extra(plan.target.gpu_layers)
        cost = own / self._prior(t, *place)[0]
        return estimate(self.verify(plan), cost, [DRAFT_PRIOR], measured=False, k_max=self.k_max)

    def ngram(self, plan: MemoryPlan) -> Estimate:
        verify = self.verify(plan)
        return ngram_estimate(
            verify, NGRAM_MATCH_RATE, NGRAM_ACCEPTANCE, measured=False, k_max=self.ngram_k_max
        )


def ngram_estimate(
    verify: Curve, match_rate: float, accept: Sequence[float], *, measured: bool, k_max: int = EXACT_K_MAX
) -> Estimate:
    """N-gram lookup at its best k: a step without a match costs one target token and yields one.

    Past K_MAX only the widths auto drafts to count (`costmodel.allowed`), and none past the curve.
    """
    best: Estimate | None = None
    for k in range(1, min(k_max, len(verify.seconds) - 1) + 1):
        if not allowed(k):
            continue
        tokens = match_rate * expected_tokens(accept, k) + (1 - match_rate)
        seconds = match_rate * verify(k + 1) + (1 - match_rate) * verify(1)
        if best is None or tokens / seconds > best.speedup:
            best = Estimate(tokens / seconds, k, 0.0, verify(k + 1), accept[0] if accept else 0.0, measured)
    assert best is not None
    return best


def estimate(
    verify: Curve, cost: float, accept: Sequence[float], *, measured: bool, k_max: int = EXACT_K_MAX
) -> Estimate:
    """A draft model at its best k: `cost` per drafted token, `accept[i]` at position i, verify curve V."""
    plan = best_k(Option("draft", accept, StepCost(verify, 0.0, cost, cost), k_max))
    speedup = plan.rate * verify(1) if plan.k else 0.0
    return Estimate(speedup, plan.k, cost, verify(plan.k + 1), accept[0], measured)


def _drafting_extra(gpu_layers: int) -> float:
    """Seconds a drafted token costs beyond its decode: GPU_DRAFT_TOKEN_S for a draft on a GPU."""
    return GPU_DRAFT_TOKEN_S if gpu_layers > 0 else 0.0


def _exact_shape(n: int) -> float:
    return 1 + CPU_VERIFY_SLOPE * (n - 1)


REPACKED_CPU_CURVE = Curve.from_points(REPACKED_CPU_POINTS, max(REPACKED_CPU_POINTS))
GPU_SMALL_CURVE = Curve.from_points(GPU_SMALL_POINTS, max(GPU_SMALL_POINTS))
GPU_LARGE_CURVE = Curve.from_points(GPU_LARGE_POINTS, max(GPU_LARGE_POINTS))


def gpu_shape(bytes_per_token: float) -> Callable[[int], float]:
    """V(n) / V(1) on a GPU for a model reading this many bytes a token: the small calibration's up
    to a 1.5B's size, the large one's from a 7B's, mixed by the logarithm of the bytes between."""
    span = math.log(GPU_LARGE_BYTES / GPU_SMALL_BYTES)
    w = min(max(math.log(max(bytes_per_token, 1.0) / GPU_SMALL_BYTES) / span, 0.0), 1.0)
    return lambda n: (1.0 - w) * GPU_SMALL_CURVE(n) + w * GPU_LARGE_CURVE(n)


def k_max(repack: bool) -> int:
    """The most tokens a draft model drafts per step: auto's K_MAX, or 6 with --exact (not repacked)."""
    return FAST_K_MAX if repack else EXACT_K_MAX


def ngram_k_max(repack: bool) -> int:
    """The most tokens an n-gram copy drafts per step: NGRAM_K_MAX, or 6 with --exact."""
    return NGRAM_K_MAX if repack else EXACT_K_MAX


def _prior_seconds(
    shape: ModelShape,
    gpu_layers: int,
    all_on_gpu: bool,
    cpu_shape: Callable[[int], float] = _exact_shape,
    k_max: int = EXACT_K_MAX,
) -> tuple[float, ...]:
    """Prior seconds to decode n = 1..k_max + 1 tokens in one batch with this placement."""
    n = shape.n_layers
    head = shape.head_bytes + shape.other_bytes
    gpu_read = sum(shape.layer_bytes[n - gpu_layers :]) + (head if all_on_gpu else 0)
    cpu_read = shape.bytes_per_token - gpu_read
    cpu = (cpu_read + CPU_STEP_OVERHEAD_BYTES) / CPU_BANDWIDTH if cpu_read > 0 else 0.0
    gpu = (gpu_read + GPU_STEP_OVERHEAD_BYTES) / GPU_BANDWIDTH if gpu_read > 0 else 0.0
    gpu_curve = gpu_shape(shape.bytes_per_token)
    return tuple(cpu * cpu_shape(m) + gpu * gpu_curve(m) for m in range(1, k_max + 2))
