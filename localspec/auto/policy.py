"""The `auto` policy: before each step, pick the drafter and k that the controller expects to pay most.

It sees three things the pure controller does not gather itself:
- what steps really cost: the calibrated curves are corrected online by each step's
  llama.cpp time and its wall time (other load on the machine, a longer context, and
  Python's own overhead per step all move the balance);
- the n-gram match before choosing (a peek costs a few dict lookups), and, after each
  step, whether that match's tokens were the ones generated, whatever method ran: the
  n-gram's acceptance is learnt on every step, not only on those that drafted with it;
- the draft model's confidence, token by token, to stop drafting where one more token
  would lower the step's expected rate.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from localspec.auto.costmodel import (
    DRAFT_PRIOR,
    K_MAX,
    NGRAM_K_MAX,
    NGRAM_PRIOR_MAX,
    VERIFY_MAX,
    ConfidenceMap,
    Curve,
    EarlyStop,
    Efficiency,
    Option,
    Plan,
    PositionalAcceptance,
    StepCost,
    ngram_continue_prior,
    ngram_key,
    ngram_prior,
    weighed,
)

if TYPE_CHECKING:
    from localspec.engine.drafters.base import Draft, KeepFn
    from localspec.engine.drafters.ngram import NgramDrafter
    from localspec.engine.sampling import Draws
    from localspec.engine.speculative import StepContext, StepOutcome
    from localspec.types import SamplingParams

# Weight of the newest step in the online cost corrections.
COST_ALPHA = 0.2
SCALE_RANGE = (0.05, 20.0)
# Per unused step, a model drafter's acceptance evidence fades by this factor (back toward the prior).
IDLE_FORGET = 0.98
# Per unused step, a drafter's measured-over-planned evidence fades by this factor: faster than its
# acceptance, since a shortfall is often a passing stretch (a run of near-ties) and the drafter must
# get the chance to show it has passed.
EFFICIENCY_IDLE_FORGET = 0.8
# A batched verify's measured-over-calibrated ratio is learnt only from steps that draft, apart for
# each class of verify width (the widest of each class, in tokens). One ratio for every width let the
# narrow verifies price the wide ones: on a busy VM (2 AVX2 cores) 3-token verifies ran 1.44x the
# curve, the ratio rose to 1.30, a 63-token copy then looked too dear a stake, and with no wide step
# to measure it again a file copied verbatim was decoded plainly for 100 tokens (edit_fill_body_sched,
# docs/benchmarks.md session 30). And there a calibration's single timings of widths 5-64 came out
# 20-50% off (V(8) = 9.1 V(1) one load, 5.6-6.5 in each of three later three-pass measurements), in
# either direction: each class's error is its own, learnt as its widths run.
WIDTH_CLASSES = (4, 8, 16, 32, VERIFY_MAX)
# A class can still be measured dear by one unlucky step (a VM stall) and then never run again: each
# step that declines a long match (LIFTED_BELOW tokens or more, right 0.98 of the time) fades every
# class's ratio back toward the calibration by this factor, until a step measures it again. Only
# then: faded on every plain step, it sent prose, where narrow verifies stayed that dear, back to
# bets they lose (replayed: 3 prompts of 31 under 0.97x of none).
BATCH_DOUBT = 0.95
# A draft's catch-up is charged as at most this many tokens: feeding it a prompt, or the tokens of
# steps it sat out, is paid once and then serves every later step, as a prefill does.
CATCH_UP_CHARGED = 2
# A draft model whose best plan is expected to yield under DRAFT_REST_BELOW of plain decoding's rate
# is not weighed again for DRAFT_REST_STEPS steps: its estimates move a few percent a step, and
# weighing it (its catch-up, its estimates, a plan over 15 widths) was most of auto's Python per step:
# about 3% of a 7B target's step on an H200, where auto ran 0.96x of `none` without drafting once.
DRAFT_REST_BELOW = 0.95
DRAFT_REST_STEPS = 4
# Near-ties re-decided per verified position, before any is seen (prose: 10-26%; code: less).
NEAR_TIE_PRIOR = 0.05
TIE_PRIOR_WEIGHT = 20.0
TIE_DECAY = 0.98
# The n-gram's first-token priors are fixed per match length, but the texts differ: in an edit most
# matches continue a copy, in an answer about a document most short ones are chance. Each request
# scales the priors of short matches (under LIFTED_BELOW tokens; longer ones are right 0.98 of the
# time in any text) by how its matches have done against theirs (hits over the priors' sum, decayed,
# LIFT_STRENGTH matches "as expected" before any is seen). The estimates themselves are the request's
# own: how far a copied run goes differs by text (after a 12-token match, runs of 16 tokens in answers
# and prose, 32 in code edits), and carried from an edit to a summary they drafted 63 tokens where
# 15 were right (measured: 0.82x of plain decoding on summarize_ref_with).
LIFT_DECAY = 0.95
LIFT_STRENGTH = 4.0
LIFTED_BELOW = 12
# In prose, a match's bet risks only what the request can afford: if its first drafted token
# misses, the whole verify is lost (on 2 AVX-512 cores a 15-token draft costs 4-5 plain tokens'
# time, 15-25% of a 30-token answer). What a step costs over a plain one must fit in what this
# request's drafts have won so far plus PROSE_RISK of its plain decoding so far. Not in fenced code,
# where short matches mostly continue a copy (runs 2-3x as long as in prose). Replayed (31 prompts,
# 8 machines, context costs): the prompts under 0.97x of none 5 -> 1 at 128 tokens, 1 -> 0 at 512,
# 5 -> 1 on a third recording; the geometric mean up 1% on each; the edits unchanged. Risked in code
# too (session 12's loss budget), it cost the edits (typehints at 128 tokens 2.62x -> 1.91x).
# 12+ token matches were first left out (a licence quoted from its first words then lost 1.34x ->
# 1.00x); since short matches bet from the start of a quote, they are bounded too: an answer that
# quotes its document for 12 tokens and ends there lost a 15-token bet on its last token, 0.86x of
# none over 17 tokens (qa_ref_exceptions, measured twice). Replayed the same way: geometric mean
# 1.452x -> 1.459x, summarize_ref_with 1.23x -> 1.40x, qa_click_licence 1.61x -> 1.64x, none lower.
PROSE_RISK = 0.03
# And a short match's bet in prose stakes at most one plain step, however much the request has
# won: its run seldom goes past a few tokens (bench set, answers and prose: 8-15 token bets on 3-token
# matches after a copy were right for 2.9 tokens a bet, on 2-token ones 0.5), and its estimates that
# far out rest on a few runs. On 2 AVX-512 cores that is 3 tokens (V(4) = 1.55 V(1), V(5) = 2.03); on a GPU,
# where a wide verify costs little more than a narrow one, it bounds nothing. Replayed (31 prompts,
# 8 machines, context costs): geometric mean 1.459x -> 1.467x, summarize_ref_with 1.40x -> 1.48x,
# chat_explain_sky 1.02x -> 1.04x; every prompt's slowest machine as fast or faster; only the
# licence quote's mean lower (1.64x -> 1.59x).
SHORT_STAKE = 1.0
# A key's estimates past its own deepest evidence are those of its deepest position: one 3-token
# bet right makes a 47-token one look right at 0.99 a position. In a reply that copies one text with
# edits in it, that holds: past an edit the copy mostly runs on to the next. In a reply stitched
# from pieces it does not (edit_bugfix_intranges: on 2 AVX2 cores, 47-token bets right for 10 and 3,
# 0.87-0.93x of `none` in three of five rounds). So once the reply has left a copy for good (the copy
# cursor, away from one, anchored elsewhere: NgramDrafter.copies_ended), positions past a key's
# evidence are estimated no higher than the rate at which this request's runs, every key's, went on
# past their first token (decayed by CONTINUE_DECAY a position judged, CONTINUE_PRIOR counting for
# CONTINUE_WEIGHT positions). Replayed (31 prompts, 14 machine/calibration pairs, 6 jittered curves
# each): intranges 1.15x faster on geometric mean, on no pair slower, its worst 0.90x -> 0.95x of
# none; prompts under 0.97x of none 4 -> 2; the renames, type hints, docstrings unchanged (their
# replies come back to the copy after each edit); reprlib 0.9% slower (5% on one pair). Capped in
# every reply instead, as a continuation rate is geometric and a copy's runs are long-tailed, the
# renames' continuation past their first edit, right for 63 tokens, was cut to 23 (up to 16% slower).
CONTINUE_PRIOR = 0.98
CONTINUE_WEIGHT = 5.0
CONTINUE_DECAY = 0.9
# How many steps' worth of evidence the draft model's prior acceptance counts for.
DRAFT_PRIOR_WEIGHT = 2.0
# A draft model's first drafted token, right or wrong, is remembered across an engine's requests
# (OnlineCosts.draft_record), and a request's prior for it is the record's when that is lower than
# DRAFT_PRIOR. A draft that is never right (the random-weight models shaped as a 32B target and the
# 0.5B on an H200) was otherwise tried 2-5 times in every request, each try a draft and a verify lost,
# and auto read 0.926-0.985x of `none` there (docs/benchmarks.md session 33); where the draft is
# right about as often as the prior says, nothing changes. Never above DRAFT_PRIOR: on real traces
# a record raised by a few right tokens sent later requests (a bug fix beside a 14B-shaped curve,
# 1.64x -> 1.40x) to drafts that lost. DRAFT_PRIOR counts for DRAFT_RECORD_WEIGHT first tokens;
# each observed one decays the record by DRAFT_RECORD_DECAY, each new request by DRAFT_RECORD_FADE,
# so a draft written off is weighed again some requests later (beside the 32B-shaped curve, eight).
DRAFT_RECORD_WEIGHT = 4.0
DRAFT_RECORD_DECAY = 0.95
DRAFT_RECORD_FADE = 0.9


class DecayedRate:
    """Hits over trials, each trial decaying the earlier ones by `decay`, starting from `prior`,
    which counts for `weight` trials: the draft model's record across requests, and a request's
    rate of n-gram runs going on."""

    def __init__(self, prior: float, weight: float, decay: float) -> None:
        self.prior, self.weight, self.decay = prior, weight, decay
        self.hits = self.seen = 0.0

    def observe(self, hit: bool) -> None:
        self.hits = self.hits * self.decay + hit
        self.seen = self.seen * self.decay + 1.0

    def fade(self, factor: float) -> None:
        """Every trial so far counts `factor` less."""
        self.hits *= factor
        self.seen *= factor

    @property
    def rate(self) -> float:
        return (self.hits + self.weight * self.prior) / (self.seen + self.weight)


class ModelDraft(Protocol):
    """What auto needs of a model drafter (ModelDrafter; a replayed trace in the simulator)."""

    name: str

    def start(self, prompt: Sequence[int], fresh: bool = True) -> None: ...

    def propose_while(
        self, tokens: Sequence[int], k: int, params: SamplingParams, draws: Draws, keep: KeepFn
    ) -> Draft: ...

    def lag(self, tokens: Sequence[int]) -> int: ...


def _ew(current: float, sample: float, alpha: float = COST_ALPHA) -> float:
    return current + alpha * (sample - current)


def _clamp(value: float) -> float:
    return min(max(value, SCALE_RANGE[0]), SCALE_RANGE[1])


class _Line:
    """y = a + b x, fitted by exponentially weighted least squares (recent steps weigh more)."""

    def __init__(self, decay: float = 1.0 - COST_ALPHA) -> None:
        self.decay = decay
        self.s0 = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self.s0, self.sx, self.sy = self.s0 * d + 1.0, self.sx * d + x, self.sy * d + y
        self.sxx, self.sxy = self.sxx * d + x * x, self.sxy * d + x * y

    def intercept(self) -> float | None:
        """a, or None while the points do not pin it (no x = 0 yet and too little spread in x)."""
        if self.s0 == 0.0:
            return None
        spread = self.s0 * self.sxx - self.sx * self.sx
        if spread <= 1e-6 * self.s0 * self.s0:
            return self.sy / self.s0 if self.sx == 0.0 else None
        slope = (self.s0 * self.sxy - self.sx * self.sy) / spread
        return (self.sy - slope * self.sx) / self.s0


class OnlineCosts:
    """Calibrated curves (seconds) for the target and the draft model, corrected by what steps take.

    Shared by an engine's requests: the machine's state outlives any one request.
    """

    def __init__(self, verify: Curve, draft: Curve | None = None) -> None:
        self.verify = verify
        self.draft = draft
        self.target_scale = 1.0
        # A batched verify's time over what target_scale predicts for it, per WIDTH_CLASSES class:
        # the curve is measured after a 16-token prefix, and attention over a long context costs
        # each position of a batch (1.5B on 2 AVX-512 cores at 1,200 tokens: V(1) 1.18x the
        # calibrated, V(16) 1.40x, V(48) 1.51x).
        # A class no step has measured yet is taken as calibrated: given the ratio of the classes
        # that ran, a copy's first wide verify is priced by the narrow ones. Replayed (31 traces,
        # 14 pairs of machine and calibration, AVX2 ones among them), one ratio for every width
        # against these: geometric mean 1.192x -> 1.202x of none; the 7 code edits' where the
        # calibration is off 1.30x -> 1.41x, 1.56x -> 1.70x, 1.71x -> 1.80x (AVX2 curves),
        # 2.00x -> 2.17x and 2.23x -> 2.52x (machines B and C calibrated as each other); within
        # 0.02x where it is right. A class starting from the others' ratio kept half of that (1.200x).
        self.batch_ratios = [1.0] * len(WIDTH_CLASSES)
        # The curve with them applied, and the ratios it was built from (built again when they move).
        self._batched: tuple[tuple[float, ...], Curve] | None = None
        self.draft_scale = 1.0
        self.overhead = 0.0
        self.per_token: dict[str, float] = {}
        # Python's time per step against tokens drafted: its intercept is the per-step overhead,
        # known even before any plain step (a draft that always runs would otherwise hide it).
        self._residuals = _Line()
        # Not a cost, but as these an engine's requests share it: how often the draft model's first
        # drafted token was right (see DRAFT_RECORD_WEIGHT).
        self.draft_record = DecayedRate(DRAFT_PRIOR, DRAFT_RECORD_WEIGHT, DRAFT_RECORD_DECAY)

    def batch_ratio(self, n: int) -> float:
        """A verify of n tokens' time over the calibrated curve's, beyond what target_scale says."""
        return self.batch_ratios[_width_class(n)] if n > 1 else 1.0

    def batch_scale(self, n: int) -> float:
        """What a batched verify of n tokens takes over the calibrated curve."""
        return self.target_scale * self.batch_ratio(n)

    def _batched_curve(self) -> Curve:
        """The calibrated curve with each width's class ratio: what verifies take, target_scale aside."""
        ratios = tuple(self.batch_ratios)
        if self._batched is None or self._batched[0] != ratios:
            points = self.verify.seconds
            self._batched = ratios, Curve(tuple(v * self.batch_ratio(n) for n, v in enumerate(points, 1)))
        return self._batched[1]

    def step_cost(self, name: str | None, lag: int = 1, *, model: bool = False) -> StepCost:
        """The cost of a step with drafter `name` (None: plain); `model` drafters decode, n-grams look up."""
        if name is None:
            return StepCost(self.verify, self.overhead, verify_scale=self.target_scale)
        verify, scale = self._batched_curve(), self.target_scale
        extra = self.per_token.get(name, 0.0)
        if not model or self.draft is None:
            return StepCost(verify, self.overhead, extra, extra, scale)
        first = self.draft_scale * self.draft(min(lag, CATCH_UP_CHARGED))
        per = self.draft_scale * self.draft(1)
        return StepCost(verify, self.overhead, first + extra, per + extra, scale)

    def doubt_batch_ratios(self) -> None:
        """Fade the batched verifies' corrections one step back toward the calibration (BATCH_DOUBT)."""
        self.batch_ratios = [1.0 + (r - 1.0) * BATCH_DOUBT for r in self.batch_ratios]

    def learn(self, step: StepRecord) -> None:
        """Fold one finished step's times into the corrections."""
        # A near-tie's one-token decode is not the batch's cost: the verify curve is the batch alone.
        batch_s = step.target_s - step.redecide_s
        if batch_s > 0 and step.drafted:
            n = step.drafted + 1
            ratio, c = batch_s / self.verify(n) / self.target_scale, _width_class(n)
            self.batch_ratios[c] = _clamp(_ew(self.batch_ratios[c], ratio))
        elif batch_s > 0:
            self.target_scale = _clamp(_ew(self.target_scale, batch_s / self.verify(1)))
        residual = step.wall_s - step.target_s - step.draft_s
        if step.decodes and self.draft is not None and step.lag <= K_MAX + 1:
            predicted = self.draft(step.lag) + (step.decodes - 1) * self.draft(1)
            self.draft_scale = _clamp(_ew(self.draft_scale, step.draft_s / predicted))
        if step.decodes == 0 or step.drafted:
            self._residuals.add(step.drafted, residual)
            overhead = self._residuals.intercept()
            if overhead is not None:
                self.overhead = max(overhead, 0.0)
        if step.drafted and step.name is not None:
            extra = max(residual - self.overhead, 0.0) / step.drafted
            self.per_token[step.name] = _ew(self.per_token.get(step.name, 0.0), extra)


@dataclass
class StepRecord:
    """One step as the policy saw it: its plan, then what happened."""

    name: str | None
    plan: Plan
    started: float
    n_tokens: int
    peek: Sequence[int] = ()
    ngram_key: str | None = None
    lag: int = 1
    confidences: list[float] = field(default_factory=list)
    decodes: int = 0
    refused: bool = False
    drafted: int = 0
    accepted: int = 0
    examined: int = 1
    redecided: int = 0
    draft_s: float = 0.0
    target_s: float = 0.0
    redecide_s: float = 0.0
    wall_s: float = 0.0
    observed: bool = False


class AutoPolicy:
    """The Policy behind `--method auto`: plain decoding, unless a drafter is expected to beat it.

    `k_max` caps the tokens drafted per step (a request's k): at most NGRAM_K_MAX for an n-gram's
    copy, K_MAX for the draft model. `near_tie_prior`: the share of verified positions re-decided
    alone before any is seen (only --exact re-decides; 0 where nothing is).
    """

    def __init__(
        self,
        costs: OnlineCosts,
        ngram: NgramDrafter | None,
        draft: ModelDraft | None,
        *,
        k_max: int = NGRAM_K_MAX,
        near_tie_prior: float = NEAR_TIE_PRIOR,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.costs = costs
        costs.draft_record.fade(DRAFT_RECORD_FADE)  # a new request
        self.k_max = max(1, min(k_max, NGRAM_K_MAX))
        self.draft_k_max = min(self.k_max, K_MAX)
        self.acceptance: dict[str, PositionalAcceptance] = {}
        self._lift_hits = self._lift_expected = 0.0
        self.confidence = ConfidenceMap()
        self.efficiency: dict[str, Efficiency] = {}
        self.streak = 0
        # Near-ties per verified position (decayed counts, seeded with a few percent).
        self.ties, self.tie_positions = near_tie_prior * TIE_PRIOR_WEIGHT, TIE_PRIOR_WEIGHT
        self.steps: Counter[str] = Counter()
        self.k_total = 0
        self._ngram = ngram
        self._draft = _StoppingDrafter(draft, self) if draft is not None else None
        # Steps left before the draft model is weighed again (see DRAFT_REST_STEPS).
        self._draft_rest = 0
        self._clock = clock
        self._last: StepRecord | None = None
        # An n-gram proposal right as far as its step judged it, waiting for the tokens that
        # follow to judge the rest: (where it starts, its tokens, its estimator's key, judged).
        self._pending: tuple[int, Sequence[int], str, int] | None = None
        # Seconds this request's drafting steps have saved over plain decoding (negative: lost),
        # and how many tokens it had when it began.
        self.won = 0.0
        self._began: int | None = None
        # How often this request's n-gram drafts went on past their first token (see CONTINUE_PRIOR).
        self._continuing = DecayedRate(CONTINUE_PRIOR, CONTINUE_WEIGHT, CONTINUE_DECAY)

    # --- the Policy protocol --------------------------------------------------------------------

    def prepare(self, prompt: Sequence[int]) -> None:
        if self._ngram is not None:
            self._ngram.prepare(prompt)

    def choose(self, ctx: StepContext) -> tuple[_StoppingDrafter | NgramDrafter | None, int]:
        now = self._clock()
        self._settle(ctx.tokens, now)
        if self._began is None:
            self._began = len(ctx.tokens)
            if self._ngram is not None and ctx.prompt_len:
                # Peeked at from the first step, it must know where the reply begins from then on
                # (the engine starts a drafter only at its first draft).
                self._ngram.start(ctx.tokens[: ctx.prompt_len])
        options: list[Option] = []
        tie = self.near_tie
        peek: Sequence[int] = ()
        key = None
        if self._ngram is not None:
            match = self._ngram.peek(ctx.tokens, self.k_max)
            if match.tokens:
                peek, key = match.tokens, ngram_key(match.match_len, self.streak)
                cost = self.costs.step_cost(self._ngram.name)
                k_max = len(peek)
                # In code too, a short (so lifted) match away from the copy while an edit is written:
                # the edit's new name matched in the instruction (a 47-token bet on it right for 1,
                # edit_rename_click_textwrap). Replayed (31 prompts, 8 machines, context costs):
                # geometric mean 1.467x -> 1.485x, the renames and type hints 5-16% faster,
                # none slower; on the agent set (files shown numbered) two 15-21% faster, one 2% slower.
                if match.astray or self._ngram.in_prose(ctx.tokens):
                    k_max = self._affordable(cost, k_max, len(ctx.tokens), short=_lifted(key))
                if k_max:
                    accept = self._estimates(key)
                    if self._ngram.copies_ended:
                        accept = self._within_evidence(key, accept)
                    eff = self._efficiency(self._ngram.name).value
                    options.append(Option(self._ngram.name, accept, cost, k_max, tie, eff))
        lag = 1
        draft_cost = None
        draft_name = None  # set where the draft model is weighed this step
        if self._draft is not None and self._draft_rest > 0:
            self._draft_rest -= 1
        elif self._draft is not None:
            draft_name = self._draft.name
            lag = self._draft.inner.lag(ctx.tokens)
            draft_cost = self.costs.step_cost(self._draft.name, lag, model=True)
            accept = self._estimates(self._draft.name)
            eff = self._efficiency(self._draft.name).value
            options.append(Option(self._draft.name, accept, draft_cost, self.draft_k_max, tie, eff))
        choice, ratios = weighed(self.costs.step_cost(None), options)
        if choice.name is None and key is not None and not _lifted(key):
            self.costs.doubt_batch_ratios()
        if draft_name is not None and choice.name != draft_name and ratios[-1] < DRAFT_REST_BELOW:
            self._draft_rest = DRAFT_REST_STEPS
        self._last = StepRecord(choice.name, choice, now, len(ctx.tokens), peek, key, lag)
        self.steps[choice.name or "none"] += 1
        self.k_total += choice.k
        if choice.name is None:
            return None, 0
        if self._ngram is not None and choice.name == self._ngram.name:
            return self._ngram, choice.k
        assert self._draft is not None and draft_cost is not None
        # A near-tie ends the step like a rejection: to the stop rule, it lowers every acceptance.
        accept = self._estimates(self._draft.name)
        ahead = [(1.0 - tie) * p for p in accept]
        self._draft.begin(EarlyStop(draft_cost, ahead, self.draft_k_max), accept, 1.0 - tie, self._last)
        # The plan only says drafting pays; how far it goes is the draft's confidence's call.
        return self._draft, self.draft_k_max

    def observe(self, outcome: StepOutcome) -> None:
        step = self._last
        if step is None:
            return
        step.observed = True
        step.drafted, step.accepted, step.examined = outcome.drafted, outcome.accepted, outcome.examined
        step.draft_s, step.target_s = outcome.draft_s, outcome.target_s
        step.redecided, step.redecide_s = outcome.redecided, outcome.redecide_s
        if self._draft is not None and step.name == self._draft.name and step.decodes:
            # A first token the confidence rule refused counts as rejected, or a draft that always
            # stops at once would be planned, and paid for, every step. Later refusals are choices,
            # not evidence: counted, they would make the next plans stop sooner and sooner. Tokens
            # after a near-tie were never judged: they are no evidence either way.
            judged = max(outcome.judged, int(step.refused))
            self._estimator(self._draft.name).observe(outcome.accepted, judged)
            if judged:
                self.costs.draft_record.observe(outcome.accepted > 0)
            self.confidence.observe(step.confidences[: outcome.judged], outcome.accepted)

    def pause(self, tokens: Sequence[int]) -> None:
        """Learn from the last step now: the grammar's forced step next is not its to answer for."""
        self._settle(tokens, self._clock())
        self._last = None

    # --- learning ---------------------------------------------------------------------------------

    def _settle(self, tokens: Sequence[int], now: float) -> None:
        """Learn from the step that just ended: its wall time, and what the n-gram would have drafted."""
        step = self._last
        if step is None:
            return
        if step.observed:
            step.wall_s = now - step.started
            self.costs.learn(step)
            if step.drafted:
                made = len(tokens) - step.n_tokens
                self.won += made * self.costs.step_cost(None).seconds(0) - step.wall_s
                # Positions looked at: up to the first rejection (or the near-tie that ended the step).
                self.ties = self.ties * TIE_DECAY + step.redecided
                self.tie_positions = self.tie_positions * TIE_DECAY + step.examined
            # A first use feeds the draft the whole prompt, a cost every later step shares: not
            # this step's to answer for.
            if step.name is not None and step.lag <= CATCH_UP_CHARGED:
                self._efficiency(step.name).observe(step.plan, len(tokens) - step.n_tokens, step.wall_s)
        new = tokens[step.n_tokens :]
        if step.ngram_key is not None and new:
            judged = min(len(step.peek), len(new))
            accepted = next((i for i in range(judged) if step.peek[i] != new[i]), judged)
            self._estimator(step.ngram_key).observe(accepted, judged)
            self._learn_continuing(accepted, judged)
            if _lifted(step.ngram_key):
                self._learn_lift(step.ngram_key, accepted > 0)
            self.streak = self.streak + 1 if accepted else 0
            if self._pending is None and accepted == judged < len(step.peek):
                self._pending = (step.n_tokens, step.peek, step.ngram_key, judged)
        elif new:
            self.streak = 0
        self._judge_pending(tokens)
        for name, efficiency in self.efficiency.items():
            if name != step.name:
                efficiency.forget(EFFICIENCY_IDLE_FORGET)
        if self._draft is not None and step.name != self._draft.name:
            self._estimator(self._draft.name).forget(IDLE_FORGET)

    def _judge_pending(self, tokens: Sequence[int]) -> None:
        """Judge the rest of an n-gram proposal in hindsight, by the tokens that followed it.

        A step judges a proposal only as far as it went: one token when it decoded plainly, k
        when it drafted k. Judged only that way, how long copied runs last would be learned only
        by drafting long, which the estimates never advise until they have learned it (on a
        steep verify curve, never). The text that follows tells it anyway, at no cost. The
        positions the step judged itself are not counted again, each position is counted once as
        its token arrives, and one proposal is followed at a time: the next steps' proposals mostly
        continue the same run.
        """
        if self._pending is None:
            return
        start, peek, key, done = self._pending
        seen = tokens[start:]
        judged = min(len(peek), len(seen))
        accepted = next((i for i in range(done, judged) if peek[i] != seen[i]), judged)
        if accepted < judged:  # a wrong token: the run ended there
            self._estimator(key).observe(accepted, accepted + 1, first=done)
            self._learn_continuing(accepted, accepted + 1, done)
            self._pending = None
            return
        # Right so far: counted as it comes, so a long run starts paying before it ends.
        self._estimator(key).observe(judged, judged, first=done)
        self._learn_continuing(judged, judged, done)
        self._pending = None if judged == len(peek) else (start, peek, key, judged)

    def _learn_continuing(self, accepted: int, judged: int, first: int = 0) -> None:
        """Count a judged n-gram draft's positions past its first (from `first`) into the request's
        rate of runs going on, up to its first wrong token."""
        for i in range(max(first, 1), judged):
            self._continuing.observe(i < accepted)
            if i >= accepted:
                return

    def _within_evidence(self, key: str, accept: list[float]) -> list[float]:
        """`accept` with the positions past the key's own evidence no higher than this request's rate
        of runs going on (see CONTINUE_PRIOR)."""
        rate = self._continuing.rate
        depth = max(self._estimator(key).depth, 1)
        return accept[:depth] + [min(p, rate) for p in accept[depth:]]

    def _affordable(self, cost: StepCost, k: int, n_tokens: int, *, short: bool) -> int:
        """The most tokens (up to k) a bet may draft that this request can afford to lose whole:
        its cost over a plain step within what its drafts have won plus PROSE_RISK of its plain
        decoding so far, and a short match's within SHORT_STAKE plain steps (0: none)."""
        assert self._began is not None
        plain = self.costs.step_cost(None).seconds(0)
        allowance = self.won + PROSE_RISK * plain * (n_tokens - self._began)
        if short:
            allowance = min(allowance, SHORT_STAKE * plain)
        while k > 0 and cost.seconds(k) - plain > allowance:
            k -= 1
        return k

    @property
    def near_tie(self) -> float:
        return self.ties / self.tie_positions

    def _estimator(self, key: str) -> PositionalAcceptance:
        estimator = self.acceptance.get(key)
        if estimator is None:
            if key.startswith("ngram/"):
                estimator = PositionalAcceptance(ngram_prior(key), then=ngram_continue_prior(key))
            else:
                # No caution for a model draft: it learns only while it runs, and a cautious
                # estimate would stop it after one bad step. Its cost keeps it off where it loses.
                prior = min(DRAFT_PRIOR, self.costs.draft_record.rate)  # only ever lowered
                estimator = PositionalAcceptance(prior, strength=DRAFT_PRIOR_WEIGHT, caution=0.0)
            self.acceptance[key] = estimator
        return estimator

    def _efficiency(self, name: str) -> Efficiency:
        return self.efficiency.setdefault(name, Efficiency())

    def _estimates(self, key: str) -> list[float]:
        estimator = self._estimator(key)
        if _lifted(key):
            # A short match's worth depends on the text: its prior follows how this request's
            # matches have done against theirs (a key with no evidence yet starts from there).
            estimator.set_prior(min(NGRAM_PRIOR_MAX, ngram_prior(key) * self.lift))
        return estimator.estimates()

    def _learn_lift(self, key: str, hit: bool) -> None:
        self._lift_hits = self._lift_hits * LIFT_DECAY + hit
        self._lift_expected = self._lift_expected * LIFT_DECAY + ngram_prior(key)

    @property
    def lift(self) -> float:
        """How this request's n-gram matches do against their priors: first tokens right over expected."""
        return (self._lift_hits + LIFT_STRENGTH) / (self._lift_expected + LIFT_STRENGTH)

    def summary(self) -> dict[str, object]:
        """Share of steps per choice and the mean k planned (over all steps; over drafting ones)."""
        total = sum(self.steps.values())
        drafting = total - self.steps.get("none", 0)
        return {
            "steps": dict(self.steps),
            "share": {name: n / total for name, n in self.steps.items()} if total else {},
            "mean_k": self.k_total / total if total else 0.0,
            "mean_k_drafting": self.k_total / drafting if drafting else 0.0,
        }


def _width_class(n: int) -> int:
    """The WIDTH_CLASSES class of a verify of n tokens (n > 1; wider than the last: the last)."""
    return next((i for i, top in enumerate(WIDTH_CLASSES) if n <= top), len(WIDTH_CLASSES) - 1)


def _lifted(key: str) -> bool:
    """Whether the key is a short n-gram match's, whose prior follows the request's lift."""
    return key.startswith("ngram/") and int(key.split("/")[1]) < LIFTED_BELOW


class _StoppingDrafter:
    """A model drafter whose drafting stops where the controller says one more token stops paying."""

    def __init__(self, inner: ModelDraft, policy: AutoPolicy) -> None:
        self.inner = inner
        self.name = inner.name
        self._policy = policy
        self._stop: EarlyStop | None = None
        self._accept: Sequence[float] = ()
        self._no_tie = 1.0
        self._step: StepRecord | None = None

    def begin(self, stop: EarlyStop, accept: Sequence[float], no_tie: float, step: StepRecord) -> None:
        self._stop, self._accept, self._no_tie, self._step = stop, accept, no_tie, step

    def start(self, prompt: Sequence[int], fresh: bool = True) -> None:
        self.inner.start(prompt, fresh)

    def propose(self, tokens: Sequence[int], k: int, params: SamplingParams, draws: Draws) -> Draft:
        if self._step is not None:
            # Measured now, after start(): a first use feeds the whole prompt, not the lag planned with.
            self._step.lag = self.inner.lag(tokens)
        return self.inner.propose_while(tokens, k, params, draws, self._keep)

    def _keep(self, i: int, confidence: float) -> bool:
        assert self._stop is not None and self._step is not None
        self._step.decodes += 1
        fallback = self._accept[min(i, len(self._accept) - 1)]
        accept = self._no_tie * self._policy.confidence.acceptance(confidence, fallback)
        if not self._stop.keep(i, accept):
            self._step.refused = True
            return False
        self._step.confidences.append(confidence)
        return True
