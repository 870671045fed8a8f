"""The ceiling: how fast any step-by-step choice of method and k could decode a trace, in hindsight.

A policy sees only the past; this sees the whole trace, so it knows at every position
how many tokens each drafter would get right, and picks the sequence of steps with the
least total time under a `Machine`'s costs (the same costs `replay` charges). It
answers "what is the most speculation can give here?" for a prompt and a machine: if
the ceiling is 1.05x, no policy reaches 1.3x there, and the goal or the drafters must
change, not the controller.

The drafters are the ones auto has: prompt lookup (`NgramDrafter`, whose proposal
at a position depends on the context alone; at each position the better of the
fixed method's, matching from 5 tokens, and auto's, from 2: their copy cursors can
follow different copies) and a draft model (the trace's guesses,
charged as `TraceDrafter` charges them, catch-up included). Drafting a wrong token
never helps with greedy verification (the step yields the same tokens and costs
more), so the ceiling drafts only tokens that will be accepted.

Dynamic programming over (position, how far the draft model has read): the draft's
catch-up cost depends on the steps it sat out, so position alone is not a state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localspec.auto.costmodel import K_MAX
from localspec.auto.replay import Machine, Replayed, Trace, verify_outcome
from localspec.engine.drafters.ngram import NgramDrafter
from localspec.engine.sampling import greedy_accept


@dataclass(frozen=True)
class _Step:
    """One step of the best path: where it came from and what it did."""

    previous: tuple[int, int] | None
    method: str
    drafted: int
    accepted: int
    redecided: bool


@dataclass(frozen=True)
class Ceiling:
    """The fastest decode found, as a replay would report it, and the choices that give it."""

    result: Replayed
    choices: tuple[tuple[str, int], ...]  # (method, k) per step; ("none", 0) decodes plainly


def ceiling(
    trace: Trace,
    machine: Machine,
    *,
    k_max: int = K_MAX,
    ngrams: Callable[[], Sequence[NgramDrafter]] = lambda: (NgramDrafter(), NgramDrafter.for_auto()),
) -> Ceiling:
    """The fastest decode of `trace` any sequence of (method, k) choices gives under `machine`."""
    out = trace.output
    size = len(out)
    if size < 1:
        raise ValueError("a trace needs at least its first token")
    cap = machine.draft_limit(k_max)
    runs = {"ngram": [max(r) for r in zip(*(_ngram_runs(trace, d, cap) for d in ngrams()), strict=True)]}
    if machine.draft is not None and trace.draft_guess:
        runs["draft"] = [greedy_accept(trace.draft_guess[i : i + cap], out[i : i + cap]) for i in range(size)]
    # best[i][seen]: least seconds to know out[:i] with the draft model having read out[:seen]
    # (seen < 0: it has not read the whole prompt yet; -len(prompt) is "nothing").
    best: list[dict[int, float]] = [{} for _ in range(size + 1)]
    best[1][-len(trace.prompt)] = 0.0
    how: dict[tuple[int, int], _Step] = {}
    for i in range(1, size):
        for seen, here in best[i].items():
            for (j, after), seconds, step in _moves(trace, machine, runs, i, seen, size - i - 1):
                if here + seconds < best[j].get(after, float("inf")):
                    best[j][after] = here + seconds
                    how[(j, after)] = _Step((i, seen), *step)
    seen_end = min(best[size], key=best[size].__getitem__)
    return _account(best[size][seen_end], (size, seen_end), how)


def _moves(
    trace: Trace,
    machine: Machine,
    runs: dict[str, list[int]],
    i: int,
    seen: int,
    room: int,
) -> list[tuple[tuple[int, int], float, tuple[str, int, int, bool]]]:
    """Every useful step from position i: plain decoding, or k tokens a drafter gets right."""
    context = len(trace.prompt) + i
    plain = machine.step_overhead + machine.verify_at(1, context) + machine.position_overhead
    moves = [((i + 1, seen), plain, ("none", 0, 0, False))]
    for method, run in runs.items():
        for k in range(1, min(run[i], room) + 1):
            drafted = trace.output[i : i + k]
            new, accepted, redecided = verify_outcome(trace, i, drafted)
            seconds = machine.step_overhead + machine.verify_at(k + 1, context)
            seconds += machine.position_overhead * (k + 1)
            seconds += machine.verify_at(1, context) if redecided else 0.0
            after = seen
            if method == "draft":
                assert machine.draft is not None
                # As TraceDrafter: the first token feeds everything unread, each later one its
                # predecessor; the last drafted token is not read until the next step.
                seconds += machine.draft(i - seen) + (k - 1) * machine.draft(1)
                seconds += k * machine.draft_token_overhead
                after = i + k - 1
            moves.append(((i + new, min(after, i + new - 1)), seconds, (method, k, accepted, redecided)))
    return moves


def _ngram_runs(trace: Trace, drafter: NgramDrafter, cap: int) -> list[int]:
    """At each position, how many of the n-gram drafter's proposed tokens are right."""
    context = list(trace.prompt)
    drafter.start(context)
    runs = []
    for i, token in enumerate(trace.output):
        proposal = drafter.peek(context, cap).tokens
        runs.append(greedy_accept(proposal, trace.output[i : i + cap]))
        context.append(token)
    return runs


def _account(seconds: float, end: tuple[int, int], how: dict[tuple[int, int], _Step]) -> Ceiling:
    result = Replayed(tokens=end[0], seconds=seconds)
    choices: list[tuple[str, int]] = []
    state: tuple[int, int] | None = end
    while state is not None and state in how:
        step = how[state]
        result.steps += 1
        result.drafted += step.drafted
        result.accepted += step.accepted
        result.redecided += int(step.redecided)
        result.method_steps[step.method] = result.method_steps.get(step.method, 0) + 1
        choices.append((step.method, step.drafted))
        state = step.previous
    return Ceiling(result, tuple(reversed(choices)))
