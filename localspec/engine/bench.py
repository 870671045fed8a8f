"""Run every method on every prompt and compare each with `none`: speed, acceptance, identity.

A benchmark, not a test: numbers depend on the machine. Runs are sequential on
one engine, `none` first for each prompt, so every method sees the same warm
caches; `repeat` > 1 keeps the fastest run of each. Repeats take turns (none,
auto, none, auto, ...) rather than running back to back: a shared CPU drifts by
several percent over a minute, and back-to-back repeats charge that drift to
whichever method ran later.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from localspec.engine.worker import Engine
from localspec.errors import UserInputError
from localspec.types import ChatMessage, GenerationRequest, GenerationResult, Method, SpecParams


@dataclass(frozen=True)
class BenchRow:
    tokens_per_second: float
    # (fastest - slowest) / fastest over the repeats: how much this machine's noise moves one run.
    spread: float
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


def load_prompts(path: Path) -> dict[str, str]:
    """A JSON object mapping prompt names to user messages."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserInputError(f"cannot read prompts file {path}: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise UserInputError(f"{path} must be a JSON object mapping names to prompt strings")
    return data


def run_bench(
    engine: Engine,
    prompts: Mapping[str, str],
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
    for name, text in prompts.items():
        runs: dict[str, list[GenerationResult]] = {m: [] for m in ordered}
        for _ in range(max(1, repeat)):
            for method in ordered:
                if on_run is not None:
                    on_run(name, method)
                runs[method].append(engine.generate(_request(text, max_tokens, method, k)))
        base = _fastest(runs["none"])
        report[name] = {m: _row(runs[m], base) for m in ordered if m in methods or m == "none"}
    return report


def _fastest(runs: Sequence[GenerationResult]) -> GenerationResult:
    return max(runs, key=lambda r: r.stats.tokens_per_second)


def _request(text: str, max_tokens: int, method: Method, k: int | None) -> GenerationRequest:
    # Every run evaluates its prompt from scratch, so methods are compared on equal terms.
    return GenerationRequest(
        messages=(ChatMessage("user", text),),
        max_tokens=max_tokens,
        speculative=SpecParams(method, k),
        cache_prompt=False,
    )


def _row(runs: Sequence[GenerationResult], base: GenerationResult) -> BenchRow:
    result = _fastest(runs)
    st = result.stats
    speed = st.tokens_per_second
    slowest = min(r.stats.tokens_per_second for r in runs)
    return BenchRow(
        tokens_per_second=round(speed, 2),
        spread=round(1 - slowest / speed, 3) if speed else 0.0,
        speedup_vs_none=round(speed / base.stats.tokens_per_second, 3)
        if base.stats.tokens_per_second
        else 0.0,
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
    )


def report_json(report: Mapping[str, Mapping[str, BenchRow]]) -> dict[str, dict[str, dict[str, object]]]:
    return {name: {m: asdict(row) for m, row in rows.items()} for name, rows in report.items()}
