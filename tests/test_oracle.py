"""The ceiling: no policy may beat it, and it charges exactly what a replay of its own choices costs."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from replaytraces import CPU, GPU, best_fixed, copy_trace, fresh_trace, machine, run_auto

from localspec.auto.costmodel import K_MAX
from localspec.auto.oracle import ceiling
from localspec.auto.replay import Machine, Trace, TraceDrafter, replay
from localspec.engine.drafters.base import Drafter
from localspec.engine.drafters.ngram import NgramDrafter
from localspec.engine.speculative import NEAR_TIE, FixedPolicy, StepContext, StepOutcome


class Scripted:
    """Makes the ceiling's choices, one per step, with the drafters auto has."""

    def __init__(self, choices: tuple[tuple[str, int], ...], trace: Trace, m: Machine) -> None:
        self._choices = list(choices)
        self._drafters: dict[str, Drafter] = {"ngram": NgramDrafter(2, 8)}
        if m.draft is not None:
            self._drafters["draft"] = TraceDrafter(trace, m)

    def prepare(self, prompt: Sequence[int]) -> None:
        pass

    def choose(self, ctx: StepContext) -> tuple[Drafter | None, int]:
        method, k = self._choices.pop(0)
        return (None, 0) if method == "none" else (self._drafters[method], k)

    def observe(self, outcome: StepOutcome) -> None:
        pass

    def pause(self, tokens: Sequence[int]) -> None:
        pass


def with_near_ties(trace: Trace, every: int = 11) -> Trace:
    gaps = tuple(NEAR_TIE / 2 if i % every == 5 else 5.0 for i in range(len(trace.output)))
    return dataclasses.replace(trace, target_gap=gaps)


CASES = {
    "copy on the cpu": (copy_trace(90), machine(CPU)),
    "copy, capped verifies": (copy_trace(90), dataclasses.replace(machine(CPU), max_verify_batch=7)),
    "copy with a draft on a gpu": (copy_trace(90), machine(GPU, draft_ratio=0.3, overhead=0.5e-3)),
    "near-ties with a draft": (with_near_ties(copy_trace(90)), machine(GPU, draft_ratio=0.3)),
    "a half-right draft on a gpu": (fresh_trace(90, draft_hits=0.7), machine(GPU, draft_ratio=0.2)),
}


@pytest.mark.parametrize("case", CASES)
def test_replaying_the_ceilings_choices_takes_the_time_it_says(case: str) -> None:
    trace, m = CASES[case]
    best = ceiling(trace, m)
    again = replay(trace, Scripted(best.choices, trace, m), m, charge_policy=False)
    assert again.tokens == best.result.tokens == len(trace.output)
    assert again.seconds == pytest.approx(best.result.seconds, rel=1e-9)
    assert again.steps == best.result.steps and again.accepted == best.result.accepted
    assert again.method_steps == best.result.method_steps


@pytest.mark.parametrize("case", CASES)
def test_no_policy_beats_the_ceiling(case: str) -> None:
    trace, m = CASES[case]
    top = ceiling(trace, m).result.tokens_per_second
    assert best_fixed(m, trace) <= top * (1 + 1e-9)
    assert run_auto(m, trace)[0].tokens_per_second <= top * (1 + 1e-9)


def test_where_no_drafter_is_ever_right_the_ceiling_is_plain_decoding() -> None:
    trace, m = fresh_trace(60, draft_hits=0.0), machine(GPU, draft_ratio=0.3)
    best = ceiling(trace, m)
    plain = replay(trace, FixedPolicy(None, 0), m, charge_policy=False)
    assert best.choices == (("none", 0),) * (len(trace.output) - 1)
    assert best.result.seconds == pytest.approx(plain.seconds)


def test_a_perfect_draft_on_a_flat_curve_drafts_the_longest_steps() -> None:
    trace, m = fresh_trace(96, draft_hits=1.0), machine(GPU, draft_ratio=0.05)
    best = ceiling(trace, m)
    assert {method for method, _ in best.choices} == {"draft"}
    assert best.result.steps == -(-(len(trace.output) - 1) // (K_MAX + 1))  # ceil: k = K_MAX each step


def test_a_draft_dearer_than_the_target_is_never_worth_running() -> None:
    trace, m = fresh_trace(60, draft_hits=0.9), machine(CPU, draft_ratio=1.5)
    assert "draft" not in ceiling(trace, m).result.method_steps


def test_an_empty_trace_is_refused() -> None:
    with pytest.raises(ValueError, match="first token"):
        ceiling(Trace("empty", (1, 2), ()), machine(CPU))
