"""Run every method on every prompt and compare each with `none`: speed, acceptance, identity.

A benchmark, not a test: numbers depend on the machine. Runs are sequential on
one engine, `none` first for each prompt, so every method sees the same warm
caches; `repeat` > 1 keeps the fastest run of each. Repeats take turns (none,
auto, none, auto, ...) rather than running back to back: a shared CPU drifts by
several percent over a minute, and back-to-back repeats charge that drift to
whichever method ran later.

Three speeds per run, as llama-server reports them, so the two can be compared:
decode tok/s counts the tokens after the first over the time after the first
(llama-server's `predicted_per_second`), end-to-end tok/s all tokens over the
whole request, and time to first token the prompt's evaluation (its `prompt_ms`).
Speedups are on decode tok/s: the prompt costs every method the same.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from localspec.engine.benchset import BenchPrompt, load_bench_set
from localspec.engine.worker import Engine
from localspec.types import GenerationRequest, GenerationResult, GenerationStats, Method, SpecParams

# The group of every prompt in the per-kind medians.
ALL_KINDS = "all"


@dataclass(frozen=True)
class BenchRow:
    decode_tps: float
    e2e_tps: float
    ttft_s: float
    # (fastest - slowest) / fastest decode tok/s over the repeats: how much noise moves one run.
    spread: float
    # Decode tok/s over `none`'s on the same prompt.
    speedup_vs_none: float
    acceptance_rate: float
    identical_to_none: bool
    tokens: int
    drafted: int
    accepted: int
    mean_accepted_length: float
    k: int
    mean_k: float
    redecided: int
    exact: bool
    python_share: float
    method_steps: dict[str, int]
    fallback_reason: str | None
    text: str


def load_prompts(path: Path) -> dict[str, str]:
    """Prompt name -> its (last) user message, from a file in either bench-set format."""
    return {p.name: p.messages[-1].content for p in load_bench_set(path)}


def decode_tps(stats: GenerationStats) -> float:
    """Tokens after the first over the time after the first (0 with fewer than two tokens)."""
    after_first = stats.elapsed_s - stats.ttft_s
    return (stats.tokens - 1) / after_first if stats.tokens > 1 and after_first > 0 else 0.0


def run_bench(
    engine: Engine,
    prompts: Sequence[BenchPrompt] | Mapping[str, str],
    methods: Sequence[Method],
    *,
    max_tokens: int,
    k: int | None = None,
    repeat: int = 1,
    on_run: Callable[[str, str], None] | None = None,
) -> dict[str, dict[str, BenchRow]]:
    """{prompt name: {method: row}}; `none` is always run first as the reference.

    `k` None runs each method with its default k (see SpecParams).
    """
    report: dict[str, dict[str, BenchRow]] = {}
    ordered: list[Method] = ["none", *[m for m in methods if m != "none"]]
    for prompt in as_prompts(prompts):
        runs: dict[str, list[GenerationResult]] = {m: [] for m in ordered}
        for _ in range(max(1, repeat)):
            for method in ordered:
                if on_run is not None:
                    on_run(prompt.name, method)
                runs[method].append(engine.generate(_request(prompt, max_tokens, method, k)))
        base = _fastest(runs["none"])
        report[prompt.name] = {m: _row(runs[m], base) for m in ordered if m in methods or m == "none"}
    return report


def as_prompts(prompts: Sequence[BenchPrompt] | Mapping[str, str]) -> list[BenchPrompt]:
    if isinstance(prompts, Mapping):
        return [BenchPrompt.user(name, text) for name, text in prompts.items()]
    return list(prompts)


def _fastest(runs: Sequence[GenerationResult]) -> GenerationResult:
    return max(runs, key=lambda r: decode_tps(r.stats))


def _request(prompt: BenchPrompt, max_tokens: int, method: Method, k: int | None) -> GenerationRequest:
    # Every run evaluates its prompt from scratch, so methods are compared on equal terms.
    return GenerationRequest(
        messages=prompt.messages,
        max_tokens=max_tokens,
        speculative=SpecParams(method, k),
        cache_prompt=False,
    )


def _row(runs: Sequence[GenerationResult], base: GenerationResult) -> BenchRow:
    result = _fastest(runs)
    st = result.stats
    speed = decode_tps(st)
    slowest = min(decode_tps(r.stats) for r in runs)
    base_speed = decode_tps(base.stats)
    return BenchRow(
        decode_tps=round(speed, 2),
        e2e_tps=round(st.tokens_per_second, 2),
        ttft_s=round(st.ttft_s, 4),
        spread=round(1 - slowest / speed, 3) if speed else 0.0,
        speedup_vs_none=round(speed / base_speed, 3) if base_speed else 0.0,
        acceptance_rate=round(st.acceptance_rate, 3),
        identical_to_none=result.token_ids == base.token_ids,
        tokens=st.tokens,
        drafted=st.drafted,
        accepted=st.accepted,
        mean_accepted_length=round(st.mean_accepted_length, 2),
        k=st.k,
        mean_k=round(st.mean_k, 2),
        redecided=st.redecided,
        exact=st.exact,
        python_share=round(st.python_s / st.elapsed_s, 4) if st.elapsed_s else 0.0,
        method_steps=dict(st.method_steps),
        fallback_reason=st.fallback_reason,
        text=result.text,
    )


def kind_medians(
    prompts: Sequence[BenchPrompt], report: Mapping[str, Mapping[str, BenchRow]]
) -> dict[str, dict[str, dict[str, float]]]:
    """{kind: {method: medians of decode/e2e tok/s, TTFT and decode speedup}}, plus every prompt as `all`."""
    groups: dict[str, list[str]] = {}
    for p in prompts:
        if p.name in report:
            groups.setdefault(p.kind, []).append(p.name)
    groups[ALL_KINDS] = [name for names in groups.values() for name in names]
    medians: dict[str, dict[str, dict[str, float]]] = {}
    for kind, names in groups.items():
        methods = dict.fromkeys(m for name in names for m in report[name])
        medians[kind] = {m: _medians([report[n][m] for n in names if m in report[n]]) for m in methods}
    return medians


def _medians(rows: Sequence[BenchRow]) -> dict[str, float]:
    def median(field: str) -> float:
        return round(statistics.median(getattr(r, field) for r in rows), 4)

    fields = ("decode_tps", "e2e_tps", "ttft_s", "speedup_vs_none")
    return {"prompts": len(rows), **{f: median(f) for f in fields}}


def report_json(
    prompts: Sequence[BenchPrompt] | Mapping[str, str],
    report: Mapping[str, Mapping[str, BenchRow]],
    settings: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """The whole report: settings, each prompt's kind, source and rows, and the medians per kind."""
    listed = as_prompts(prompts)
    return {
        "settings": dict(settings or {}),
        "prompts": {
            p.name: {
                "kind": p.kind,
                "source": p.source,
                "methods": {m: asdict(r) for m, r in report[p.name].items()},
            }
            for p in listed
            if p.name in report
        },
        "kinds": kind_medians(listed, report),
    }
