"""Replay recorded runs under a cost model: how fast any policy would decode them, with no model loaded.

Greedy decoding is lossless here, so the target's output does not depend on the
policy: one recorded run per prompt fixes every step's outcome, a drafted token
being accepted exactly when it equals the target's token at that place. A trace
holds the target's tokens and, for each position, the draft model's guess and
confidence given the true prefix (all a draft can propose while it stays on the
accepted path). Time comes from a `Machine`: the calibrated curves plus Python's
own costs per step, per verified position and per drafted token.

The policy under test runs unchanged (the real AutoPolicy, FixedPolicy, n-gram
drafter); only llama.cpp and the clock are simulated.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from localspec.auto.costmodel import Curve
from localspec.engine.drafters.base import Draft, Drafter, KeepFn, common_prefix
from localspec.engine.sampling import Draws
from localspec.engine.speculative import NEAR_TIE, Policy, StepContext, StepOutcome
from localspec.types import SamplingParams

_GREEDY = SamplingParams()
_OFF_PATH = -1  # a drafted token after a wrong one: never accepted, whatever it would have been


@dataclass(frozen=True)
class Trace:
    """One prompt's greedy run: the target's tokens, and the draft's guess at each of their positions."""

    name: str
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    draft_guess: tuple[int, ...] = ()
    draft_confidence: tuple[float, ...] = ()
    target_gap: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trace:
        return cls(
            name=str(data["name"]),
            prompt=tuple(int(t) for t in data["prompt"]),
            output=tuple(int(t) for t in data["output"]),
            draft_guess=tuple(int(t) for t in data.get("draft_guess", ())),
            draft_confidence=tuple(float(c) for c in data.get("draft_confidence", ())),
            target_gap=tuple(float(g) for g in data.get("target_gap", ())),
        )


@dataclass(frozen=True)
class Machine:
    """The cost model, in seconds: llama.cpp's curves and Python's share."""

    verify: Curve
    draft: Curve | None = None
    step_overhead: float = 0.0
    position_overhead: float = 0.0
    draft_token_overhead: float = 0.0
    # The largest verify batch the engine runs (LlamaModel.max_verify_batch): a step drafts at most
    # one fewer. None: no limit (a machine on paper).
    max_verify_batch: int | None = None
    # What each token of context adds to a batch of n (every position attends over the whole
    # context), `verify` being measured after `measured_at` tokens. None: every step costs as after
    # a short prefix.
    per_context: Curve | None = None
    measured_at: int = 0

    def verify_at(self, n: int, context: int) -> float:
        """Seconds to verify a batch of n after `context` tokens."""
        if self.per_context is None or context <= self.measured_at:
            return self.verify(n)
        return self.verify(n) + (context - self.measured_at) * self.per_context(n)

    def draft_limit(self, k: int) -> int:
        """`k`, or fewer: the most a step may draft here, as the engine caps it."""
        return k if self.max_verify_batch is None else min(k, self.max_verify_batch - 1)


@dataclass
class Replayed:
    """What a policy did on a trace and how long the decode phase (after the first token) took."""

    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    redecided: int = 0
    method_steps: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        """Decode-phase speed, as 1 / mean inter-token latency in the engine's stats."""
        return (self.tokens - 1) / self.seconds if self.seconds > 0 else 0.0


class SimClock:
    """A clock that moves only when the replay says time was spent."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class TraceDrafter:
    """A model drafter that proposes the trace's guesses and charges the machine's draft curve.

    It keeps a record of what it has decoded the way ModelDrafter keeps its KV cache, so a
    catch-up after steps it sat out costs a batch of that many tokens, as it does for real.
    """

    def __init__(self, trace: Trace, machine: Machine, name: str = "draft") -> None:
        if machine.draft is None or not trace.draft_guess:
            raise ValueError("replaying a draft model needs its curve and the trace's draft guesses")
        self.name = name
        self._trace = trace
        self._curve = machine.draft
        self._per_token = machine.draft_token_overhead
        self._seen: list[int] = []

    def start(self, prompt: Sequence[int], fresh: bool = True) -> None:
        if fresh:
            self._seen = []

    def lag(self, tokens: Sequence[int]) -> int:
        return max(1, len(tokens) - common_prefix(self._seen, tokens))

    def propose(self, tokens: Sequence[int], k: int, params: SamplingParams, draws: Draws) -> Draft:
        return self._propose(tokens, k, None)

    def propose_while(
        self, tokens: Sequence[int], k: int, params: SamplingParams, draws: Draws, keep: KeepFn
    ) -> Draft:
        return self._propose(tokens, k, keep)

    def _propose(self, tokens: Sequence[int], k: int, keep: KeepFn | None) -> Draft:
        trace, draft = self._trace, Draft()
        at = len(tokens) - len(trace.prompt)
        common = min(common_prefix(self._seen, tokens), len(tokens) - 1)
        del self._seen[common:]
        feed = list(tokens[common:])
        on_path = True
        for j in range(k):
            if at + j >= len(trace.draft_guess):
                break
            draft.seconds += self._curve(len(feed)) + self._per_token
            self._seen.extend(feed)
            guess = trace.draft_guess[at + j] if on_path else _OFF_PATH
            if keep is not None and not keep(j, trace.draft_confidence[at + j]):
                break
            on_path = on_path and guess == trace.output[at + j]
            draft.tokens.append(guess)
            feed = [guess]
        return draft


def replay(
    trace: Trace,
    policy: Policy,
    machine: Machine,
    clock: SimClock | None = None,
    *,
    charge_policy: bool = True,
    max_tokens: int | None = None,
) -> Replayed:
    """Run `policy` over the trace as Generation would (greedy), charging the machine's costs.

    With `charge_policy`, the real time the policy itself takes to choose and learn is charged
    too: it is paid on every step on the real machine. `max_tokens`: the request's limit, when
    the trace ended before it (the target's end of text): a draft may then run past the end, as
    the engine cannot know where the reply stops, and its tokens there are rejected. None: the
    trace's length (drafts stop at its end).
    """
    clock = clock or SimClock()
    out, result = trace.output, Replayed(tokens=1)
    limit = len(out) if max_tokens is None else max(max_tokens, len(out))
    tokens = [*trace.prompt, out[0]]
    started: set[int] = set()
    policy.prepare(trace.prompt)  # while the prompt is read, before the decode phase timed here
    begin = clock.now
    while result.tokens < len(out):
        thinking = time.perf_counter()
        drafter, k = policy.choose(StepContext(tokens, 1 << 30, result.steps, len(trace.prompt)))
        if charge_policy:
            clock.advance(time.perf_counter() - thinking)
        # As Generation stops at max_tokens and at its largest exact verify batch.
        k = machine.draft_limit(min(k, limit - result.tokens - 1))
        draft = _draft(drafter, k, tokens, trace.prompt, started)
        clock.advance(machine.step_overhead + draft.seconds)
        n = len(draft.tokens)
        new, accepted, redecided = verify_outcome(trace, result.tokens, draft.tokens)
        new = min(new, len(out) - result.tokens)  # past the end the target chose its end of text
        # As Generation: a near-tie at position new - 1 ends the judging there.
        judged = min(new, n) if redecided else n
        redecide_s = machine.verify_at(1, len(tokens)) if redecided else 0.0
        target_s = machine.verify_at(n + 1, len(tokens)) + redecide_s
        clock.advance(target_s + machine.position_overhead * (n + 1))
        name = drafter.name if drafter is not None and n else "none"
        thinking = time.perf_counter()
        policy.observe(
            StepOutcome(
                drafter.name if drafter else None,
                k,
                n,
                accepted,
                0,
                draft.seconds,
                target_s,
                int(redecided),
                redecide_s,
                judged,
                new,
            )
        )
        if charge_policy:
            clock.advance(time.perf_counter() - thinking)
        tokens.extend(out[result.tokens : result.tokens + new])
        result.tokens += new
        result.redecided += redecided
        result.steps += 1
        result.drafted += n
        result.accepted += accepted
        result.method_steps[name] = result.method_steps.get(name, 0) + 1
    result.seconds = clock.now - begin
    return result


def verify_outcome(trace: Trace, at: int, draft: Sequence[int]) -> tuple[int, int, bool]:
    """(tokens the step yields, drafted tokens accepted, whether a near-tie was re-decided).

    As Generation's greedy verify: positions are judged in order; the first one whose top-two
    gap is a near-tie ends the step with a one-token decode, as the target alone decides it.
    """
    out, gaps, n = trace.output, trace.target_gap, len(draft)
    for i in range(n + 1):
        ended = at + i >= len(out)  # the reply's end: the target chose its end-of-text token there
        if n and not ended and at + i < len(gaps) and gaps[at + i] < NEAR_TIE:
            return i + 1, i + int(i < n and draft[i] == out[at + i]), True
        if i < n and (ended or draft[i] != out[at + i]):
            return i + 1, i, False
    return n + 1, n, False


def _draft(
    drafter: Drafter | None, k: int, tokens: Sequence[int], prompt: Sequence[int], started: set[int]
) -> Draft:
    if drafter is None or k <= 0:
        return Draft()
    if id(drafter) not in started:
        drafter.start(prompt)
        started.add(id(drafter))
    return drafter.propose(tokens, k, _GREEDY, Draws(0))
