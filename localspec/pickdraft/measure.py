"""`pick-draft --measure`: replace the priors with this machine's numbers, then rank again.

For the target and every usable draft it measures the decode curve (`calibrate`,
cached per model and machine, the same cache the auto policy reads), then runs a
short greedy acceptance probe: a few built-in prompts, each drafting PROBE_K tokens
per step, through the real speculative loop. Acceptance by draft position and (for
n-gram lookup) how often a match is found come from those steps' counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from localspec.auto.calibrate import calibrate
from localspec.auto.costmodel import Curve
from localspec.engine.config import LoadOptions
from localspec.engine.drafters.base import Drafter
from localspec.engine.drafters.model import ModelDrafter
from localspec.engine.drafters.ngram import NgramDrafter
from localspec.engine.llama import LlamaModel
from localspec.engine.prompting import prompt_tokens
from localspec.engine.speculative import FixedPolicy, Generation
from localspec.engine.templating import TemplateRenderer
from localspec.paths import Paths
from localspec.pickdraft.cost import Estimate, estimate, k_max, ngram_estimate, ngram_k_max
from localspec.pickdraft.rank import Candidate, PickResult, choose, describe, rank_key
from localspec.types import ChatMessage, GenerationRequest, SamplingParams

ProgressFn = Callable[[str, float], None]

# Short and varied: code to write, prose to explain, code to copy with a change (where n-grams shine).
PROBE_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Explain in three sentences what a hash map is and when to use one.",
    "Rename the variable `x` to `total` in this code and return the code:\n"
    "def add_all(items):\n    x = 0\n    for item in items:\n        x += item\n    return x\n",
)
PROBE_TOKENS = 32
PROBE_K = 4
PROBE_CTX = 1024


@dataclass
class ProbeCounts:
    """What the probe's steps did, summed over prompts."""

    steps: int = 0
    drafting_steps: int = 0
    drafted: list[int] | None = None
    accepted: list[int] | None = None

    def acceptance(self) -> list[float]:
        """Acceptance at each position given the earlier ones were accepted."""
        drafted, accepted = self.drafted or [], self.accepted or []
        out: list[float] = []
        reached = drafted[0] if drafted else 0
        for i, acc in enumerate(accepted):
            # Position i is judged on drafts that reached it with every earlier token accepted.
            base = min(reached, drafted[i])
            out.append(acc / base if base else (out[-1] if out else 0.0))
            reached = acc
        return out or [0.0]

    @property
    def match_rate(self) -> float:
        return self.drafting_steps / self.steps if self.steps else 0.0


def measure(
    result: PickResult,
    *,
    progress: ProgressFn | None = None,
    prompts: Sequence[str] = PROBE_PROMPTS,
    max_tokens: int = PROBE_TOKENS,
    cache_dir: Path | None = None,
) -> PickResult:
    """The same candidates re-estimated from measurements on this machine, ranked and chosen again."""
    cache = cache_dir or Paths.from_env().cache_dir
    todo = [c for c in result.candidates if c.usable and c.method != "none"]
    total = 1 + len(todo)
    report = progress or (lambda _label, _fraction: None)
    base = next(c for c in result.candidates if c.method == "none")
    assert base.plan is not None
    options = LoadOptions(
        n_ctx=min(PROBE_CTX, base.plan.n_ctx),
        gpu_layers=base.plan.target.llama_gpu_layers,
        kv_type=base.plan.kv_type,
        batch_invariant=not result.repack,
    )
    target = LlamaModel(result.target.path, options)
    try:
        curve = calibrate(target, cache, progress=lambda f: report("calibrating the target", f / total)).curve
        measured: dict[int, Estimate] = {}
        for i, cand in enumerate(todo, start=1):
            step = _Step(report, cand.label, i, total)
            measured[id(cand)] = _measure_one(cand, target, curve, options, cache, prompts, max_tokens, step)
        report("done", 1.0)
    finally:
        target.close()
    updated = [_updated(c, measured.get(id(c))) for c in result.candidates]
    ranked = sorted(updated, key=rank_key)
    return replace(result, candidates=ranked, choice=choose(ranked))


class _Step:
    """Progress within one candidate's share of the bar."""

    def __init__(self, report: ProgressFn, label: str, index: int, total: int) -> None:
        self.report, self.label, self.index, self.total = report, label, index, total

    def __call__(self, what: str, fraction: float) -> None:
        self.report(f"{what} {self.label}", (self.index + fraction) / self.total)


def _measure_one(
    cand: Candidate,
    target: LlamaModel,
    curve: Curve,
    options: LoadOptions,
    cache: Path,
    prompts: Sequence[str],
    max_tokens: int,
    step: _Step,
) -> Estimate:
    verify = Curve(curve.relative())
    # As far as the engine will verify in this loading (6 with --exact; otherwise auto's K_MAX for
    # a draft model, NGRAM_K_MAX for an n-gram copy).
    most = k_max(repack=not options.batch_invariant)
    if cand.method == "ngram":
        counts = probe(target, NgramDrafter(), prompts, max_tokens, lambda f: step("probing", f))
        copy_most = ngram_k_max(repack=not options.batch_invariant)
        return ngram_estimate(verify, counts.match_rate, counts.acceptance(), measured=True, k_max=copy_most)
    path = cand.path if cand.method == "draft" else _layerskip_file(target.path)
    assert path is not None and cand.plan is not None and cand.plan.draft is not None
    draft = LlamaModel(path, replace(options, gpu_layers=cand.plan.draft.llama_gpu_layers))
    try:
        d_curve = calibrate(draft, cache, progress=lambda f: step("calibrating", f / 2)).curve
        counts = probe(
            target,
            ModelDrafter(draft, cand.method),
            prompts,
            max_tokens,
            lambda f: step("probing", 0.5 + f / 2),
        )
    finally:
        draft.close()
    return estimate(verify, d_curve(1) / curve(1), counts.acceptance(), measured=True, k_max=most)


def _layerskip_file(target: Path) -> Path:
    from localspec.models.layerskip import derive_layerskip_draft

    return derive_layerskip_draft(target, cache_dir=Paths.from_env().derived_models_dir)


def probe(
    target: LlamaModel,
    drafter: Drafter,
    prompts: Sequence[str],
    max_tokens: int,
    progress: Callable[[float], None] | None = None,
    k: int = PROBE_K,
) -> ProbeCounts:
    """Greedy generations drafting k tokens per step; their acceptance counts, summed."""
    counts = ProbeCounts(drafted=[0] * k, accepted=[0] * k)
    assert counts.drafted is not None and counts.accepted is not None
    with TemplateRenderer() as renderer:
        tokens = [
            prompt_tokens(target, GenerationRequest(messages=(ChatMessage("user", text),)), renderer)
            for text in prompts
        ]
    for i, prompt in enumerate(tokens):
        gen = Generation(
            target,
            prompt,
            max_tokens=max_tokens,
            params=SamplingParams(),
            stop=(),
            policy=FixedPolicy(drafter, k),
            method=drafter.name,
            k=k,
        )
        for _ in gen.run():
            pass
        st = gen.stats
        counts.steps += st.steps
        counts.drafting_steps += st.method_steps.get(drafter.name, 0)
        for pos, (d, a) in enumerate(zip(st.drafted_by_position, st.accepted_by_position, strict=True)):
            if pos < k:
                counts.drafted[pos] += d
                counts.accepted[pos] += a
        if progress is not None:
            progress((i + 1) / len(prompts))
    return counts


def _updated(cand: Candidate, est: Estimate | None) -> Candidate:
    if est is None:
        return cand
    return replace(cand, estimate=est, reason=describe(est, cand.method))
