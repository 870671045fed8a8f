"""The auto controller's arithmetic: what a step costs, what a draft is expected to yield, which pays most.

A step drafts k tokens (k = 0: plain decoding) and verifies k + 1 positions in one
batch, so it yields 1 + E[accepted] tokens for overhead + draft(k) + V(k + 1)
seconds (plus, where a verified position is a near-tie, one more one-token decode,
and the step ends there). The plan is the drafter and k with the most expected
tokens per second, k = 0 included. Whether speculation pays depends on the machine:
on a GPU V is nearly flat and a draft of 4-8 tokens pays; on a 2-core CPU V(4) is
~2.5 V(1) and only long n-gram matches pay. Everything here is pure (curves, counts,
numbers) so it is tested on synthetic curves; `localspec.auto` drives it from the loop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The most tokens a draft model drafts in one step; calibration measures V at every width up to K_MAX + 1.
K_MAX = 15
# Wider verifies, for an n-gram's long copy: only these widths, each measured. llama.cpp's CPU matrix
# kernels work in blocks, so a width of 16m is cheap and one just past it dear (1.5B Q4_K_M on 2 AVX-512
# cores, in one-token decodes: V(31) = 9.9, V(32) = 8.7, V(47) = 13.1, V(48) = 12.1, V(64) = 15.6).
# llama.cpp's ngram-simple drafts 48 tokens at once; a copy that runs on pays ~25% more drafted 63 at a
# time than 15 (64 / 15.6 against 16 / 5.0 tokens per decode).
LONG_WIDTHS = (24, 32, 48, 64)
# The most tokens any drafter drafts in one step (an n-gram copying a long run), and the widest verify.
NGRAM_K_MAX = LONG_WIDTHS[-1] - 1
VERIFY_MAX = LONG_WIDTHS[-1]
# Conditional acceptance assumed before any step is seen. Draft models of the same family accept
# ~60-80% of greedy tokens; n-gram acceptance rises with the match length and with a run of copying.
DRAFT_PRIOR = 0.7
# A match of 12 or 24+ tokens is the tail of a copy (an edited file, a quoted block): on the 31-prompt
# bench set its first token was right 0.85-0.97 (12-23) and 0.96-1.00 (24+) of the time, and its
# runs went on for 8-13 of 15 tokens (docs/benchmarks.md). Such a match is worth a long draft at once,
# as llama.cpp's ngram modes draft it, instead of being learnt over dozens of plain steps.
NGRAM_PRIOR_BY_LENGTH = {2: 0.3, 3: 0.4, 4: 0.55, 6: 0.75, 12: 0.85, 24: 0.93}
# After a step that copied, the first token is right more often: on the 31 bench traces (128 tokens,
# fast loading) 6-11 token matches after a copy were right 0.85 of the time in answers and prose, 0.93 in
# code edits; 24+ token ones 0.98-0.99. Each request scales these by how its own matches do (auto.policy).
NGRAM_STREAK_BONUS = 0.1
NGRAM_PRIOR_MAX = 0.97
# Once a copied run has begun, the next token of it is likely copied too; the more so, the longer
# the match that started it.
NGRAM_CONTINUE_PRIOR = 0.85
NGRAM_CONTINUE_BY_LENGTH = {6: 0.9, 12: 0.92, 24: 0.96}
STREAK_MAX = 1
# How much better than plain decoding a plan must look before a step speculates: MARGIN, plus
# RISK for each plain step's time the step costs over a plain one (what a miss at its first token
# throws away). A plan that looks 10% better is a bet on optimistic estimates (the best of several
# looks better than it is), and on this CPU a missed 15-token draft costs five plain tokens; on a
# flat GPU curve the stake, and so the extra margin, is nearly nothing. Replayed on the 31 bench
# traces (128 and 512 tokens, two days' curves, context costs), RISK 0.03 against none: geometric
# mean of auto / none 1.215x -> 1.227x and 1.337x -> 1.354x, bisect's rename 1.35x -> 1.56x and
# 1.59x -> 1.85x. A flat margin of 0.1-0.15 did as well there, but then a draft model dropped after
# an unlucky start was not tried again on a GPU curve (test_auto).
MARGIN = 0.03
RISK = 0.03


@dataclass(frozen=True)
class Curve:
    """Seconds to decode n tokens in one batch (logits at every one), n = 1..len(seconds).

    Past the last point it grows by the average cost of a token over the whole curve (the last
    segment alone may be a block effect, even a drop).
    """

    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.seconds or min(self.seconds) <= 0.0:
            raise ValueError("a curve needs at least one positive point")

    def __call__(self, n: int) -> float:
        s = self.seconds
        if n <= 0:
            return 0.0
        if n <= len(s):
            return s[n - 1]
        return s[-1] + (n - len(s)) * _slope({i + 1: v for i, v in enumerate(s)})

    @classmethod
    def from_points(cls, points: Mapping[int, float], n_max: int) -> Curve:
        """Interpolate measured sizes linearly to 1..n_max.

        Not forced to grow: a batch of 4 can verify faster than one of 3 (kernels work in blocks).
        """
        if 1 not in points:
            raise ValueError("measure n = 1 at least")
        return cls(tuple(_interpolate(points, n) for n in range(1, n_max + 1)))

    @classmethod
    def linear(cls, per_token: float, n_max: int = VERIFY_MAX) -> Curve:
        """No gain from batching: what to assume when nothing was measured (speculation never pays)."""
        return cls(tuple(per_token * n for n in range(1, n_max + 1)))

    def scaled(self, factor: float) -> Curve:
        return Curve(tuple(v * factor for v in self.seconds))

    def relative(self) -> tuple[float, ...]:
        """The curve in units of one token's decode: V(n) / V(1)."""
        return tuple(v / self.seconds[0] for v in self.seconds)


def _interpolate(points: Mapping[int, float], n: int) -> float:
    if n in points:
        return points[n]
    last = max(points)
    if n > last:
        return points[last] + (n - last) * _slope(points)
    lo = max(s for s in points if s < n)
    hi = min(s for s in points if s > n)
    return points[lo] + (points[hi] - points[lo]) * (n - lo) / (hi - lo)


def _slope(points: Mapping[int, float]) -> float:
    """Seconds per extra token over the whole measured range (one token's cost if only 1 was measured)."""
    last = max(points)
    if last == 1:
        return points[1]
    return max((points[last] - points[1]) / (last - 1), 0.0)


# --- one step's cost and yield -----------------------------------------------------------------


@dataclass(frozen=True)
class StepCost:
    """Seconds for one step: overhead, the first drafted token, each further one, and the verify."""

    verify: Curve
    overhead: float = 0.0
    first_draft: float = 0.0
    per_draft: float = 0.0
    verify_scale: float = 1.0

    def verify_s(self, n: int) -> float:
        return self.verify_scale * self.verify(n)

    def seconds(self, k: int) -> float:
        if k <= 0:
            return self.overhead + self.verify_s(1)
        return self.overhead + self.first_draft + (k - 1) * self.per_draft + self.verify_s(k + 1)


def expected_tokens(accept: Sequence[float], k: int) -> float:
    """Tokens a step yields on average: the target's own one plus each drafted token reached.

    accept[i] is the chance that token i is accepted given tokens 0..i-1 were.
    """
    total, reach = 1.0, 1.0
    for i in range(k):
        reach *= accept[i] if i < len(accept) else (accept[-1] if accept else 0.0)
        total += reach
    return total


@dataclass(frozen=True)
class Option:
    """A drafter the step could use, what it is expected to yield and what it costs."""

    name: str
    accept: Sequence[float]
    cost: StepCost
    k_max: int
    # The chance that a verified position is a near-tie: decided again alone (one more decode),
    # and the step ends there (localspec.speculative.NEAR_TIE).
    near_tie: float = 0.0
    # How this drafter's steps have really done against what their plans expected (tokens per
    # second, measured over plan): what the model above leaves out, it learns here.
    efficiency: float = 1.0


@dataclass(frozen=True)
class Plan:
    """The choice for one step: drafter (None: plain decoding) and k, with its expectation."""

    name: str | None
    k: int
    tokens: float
    seconds: float

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def allowed(k: int) -> bool:
    """Whether a step may draft k tokens: every k up to K_MAX, past it only into a measured LONG_WIDTH."""
    return k <= K_MAX or k + 1 in LONG_WIDTHS


def best_k(option: Option) -> Plan:
    """The allowed k in 1..k_max with the most expected tokens per second for this drafter."""
    # StepCost.seconds and expected_tokens, unrolled into one pass: this runs before every step.
    cost, accept, tie = option.cost, option.accept, option.near_tie
    points, scale = cost.verify.seconds, cost.verify_scale
    fixed = cost.overhead + cost.first_draft - cost.per_draft
    redecide = tie * cost.verify_s(1)  # expected, for each verified position reached
    best = Plan(option.name, 0, 0.0, 1.0)
    tokens, reach, extra = 1.0, 1.0, redecide
    for k in range(1, option.k_max + 1):
        reach *= (1.0 - tie) * (accept[k - 1] if k - 1 < len(accept) else (accept[-1] if accept else 0.0))
        tokens += reach
        extra += reach * redecide
        verify = points[k] if k < len(points) else cost.verify(k + 1)
        seconds = fixed + k * cost.per_draft + scale * verify + extra
        if tokens * best.seconds > best.tokens * seconds and allowed(k):
            best = Plan(option.name, k, tokens, seconds)
        elif reach < 1e-3:
            break  # what is left to gain cannot pay for even the next position
    return best


def plan(plain: StepCost, options: Sequence[Option], margin: float = MARGIN, risk: float = RISK) -> Plan:
    """The decision: plain decoding unless some drafter and k beat it in expected tokens per second.

    Speculating must win by `margin`, and by `risk` times what the step costs over a plain one
    (all of it lost when the first drafted token misses): a bet that only breaks even on
    estimates loses as often as it wins on the real text, and the dearer its verify, the more
    one loss costs.
    """
    return weighed(plain, options, margin, risk)[0]


def weighed(
    plain: StepCost, options: Sequence[Option], margin: float = MARGIN, risk: float = RISK
) -> tuple[Plan, list[float]]:
    """plan(), and each option's best expected rate over plain decoding's (0: it cannot draft)."""
    plain_plan = Plan(None, 0, 1.0, plain.seconds(0))
    best, best_rate = plain_plan, plain_plan.rate
    ratios: list[float] = []
    for option in options:
        candidate = best_k(option)
        rate = candidate.rate * option.efficiency
        ratios.append(rate / plain_plan.rate if candidate.k > 0 and plain_plan.rate > 0 else 0.0)
        if candidate.k > 0 and rate > best_rate:
            best, best_rate = candidate, rate
    stake = best.seconds / plain_plan.seconds - 1.0
    chosen = best if best_rate > plain_plan.rate * (1.0 + margin + risk * stake) else plain_plan
    return chosen, ratios


def break_even(cost: StepCost, k: int) -> float:
    """The acceptance (the same at every position) at which drafting k tokens matches plain decoding.

    1.0 or more: drafting k tokens cannot pay on this machine, whatever the drafter.
    """
    target = cost.seconds(k) / cost.seconds(0)
    if expected_tokens([1.0], k) < target:
        return float("inf")
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if expected_tokens([mid], k) >= target else (mid, hi)
    return hi


class EarlyStop:
    """While a model drafts, decides token by token whether to keep it and go on drafting.

    The draft's confidence in token i gives its acceptance; the positions after it are expected
    to accept as `ahead` says. Token i is kept when some continuation through it (i alone, or i
    and the next few) raises the step's expected tokens per second above stopping before it.
    Looking ahead matters on a flat curve: one more token barely pays alone, a run of them does.
    """

    def __init__(self, cost: StepCost, ahead: Sequence[float], k_max: int = K_MAX) -> None:
        self.cost = cost
        self.ahead = ahead
        self.k_max = k_max
        self.tokens = 1.0
        # The first draft decode is paid before token 0 can be judged.
        self.seconds = cost.seconds(0) + cost.first_draft
        self.reach = 1.0

    def _added(self, i: int) -> float:
        """What keeping token i adds: its verify position and the decode that drafts the next one."""
        return self.cost.verify_s(i + 2) - self.cost.verify_s(i + 1) + self.cost.per_draft

    def keep(self, i: int, accept: float) -> bool:
        reach = self.reach * accept
        tokens, seconds = self.tokens + reach, self.seconds + self._added(i)
        kept = tokens * self.seconds >= self.tokens * seconds
        future_reach, t, s = reach, tokens, seconds
        for j in range(i + 1, self.k_max):
            if kept:
                break
            p = self.ahead[j] if j < len(self.ahead) else (self.ahead[-1] if self.ahead else 0.0)
            future_reach *= p
            t, s = t + future_reach, s + self._added(j)
            kept = t * self.seconds >= self.tokens * s
        if kept:
            self.tokens, self.seconds, self.reach = tokens, seconds, reach
        return kept


# --- acceptance estimates ------------------------------------------------------------------------


class PositionalAcceptance:
    """Acceptance at each draft position, given the earlier ones were accepted, weighted toward recent steps.

    Counts decay each time a position is observed, so the estimate follows the text (copying a
    block, then writing fresh code). Each position is shrunk toward the one before it, position 0
    toward the prior: deep positions, seldom reached, start from what shallow ones show.

    Position 0 is estimated cautiously, `caution` standard errors below its mean: choosing the
    best-looking option favours whichever estimate noise has pushed up, and a draft chosen on a
    lucky estimate costs a verify for nothing; little evidence must not look like good evidence.
    """

    def __init__(
        self,
        prior: float,
        *,
        then: float | None = None,
        strength: float = 1.0,
        decay: float = 0.9,
        caution: float = 1.0,
        size: int = VERIFY_MAX,
    ):
        self.prior = prior
        # What position 1 shrinks toward (default: position 0): a run, once begun, may differ.
        self.then = then
        self.strength = strength
        self.decay = decay
        self.caution = caution
        self.hits = [0.0] * size
        self.seen = [0.0] * size
        # Positions from here on were never observed: each one's mean is the one before it. The
        # policy asks for estimates before every step, and a draft model reaches K_MAX + 1 of
        # the VERIFY_MAX positions, so only these are worked out.
        self._depth = 0
        self._cached: list[float] | None = None

    def observe(self, accepted: int, judged: int, first: int = 0) -> None:
        """One step: tokens 0..accepted-1 were accepted; token `accepted` was rejected if it was judged.

        `first`: positions before it were counted already (a proposal judged in hindsight).
        """
        for i in range(first, min(judged, len(self.seen))):
            hit = i < accepted
            self.hits[i] = self.hits[i] * self.decay + hit
            self.seen[i] = self.seen[i] * self.decay + 1.0
            self._depth = max(self._depth, i + 1)
            if not hit:
                break
        self._cached = None

    @property
    def depth(self) -> int:
        """Positions observed so far (0: none): past them, every estimate is the one before it."""
        return self._depth

    def forget(self, factor: float) -> None:
        """Drift back toward the prior while unused, so a drafter judged on a bad stretch is tried again."""
        depth = self._depth
        self.hits[:depth] = [h * factor for h in self.hits[:depth]]
        self.seen[:depth] = [s * factor for s in self.seen[:depth]]
        self._cached = None

    def set_prior(self, prior: float) -> None:
        """A new prior for position 0 (the request's lift moved it): estimates are worked out again."""
        if prior != self.prior:
            self.prior = prior
            self._cached = None

    def means(self) -> list[float]:
        out: list[float] = []
        anchor = self.prior
        strength = self.strength
        # Past the deepest observed position nothing moves an estimate off the one before it,
        # but position 1 starts from `then`.
        worked = max(self._depth, 2)
        for i, (h, s) in enumerate(zip(self.hits[:worked], self.seen[:worked], strict=True)):
            if i == 1 and self.then is not None:
                anchor = self.then
            anchor = (h + strength * anchor) / (s + strength)
            out.append(anchor)
        out.extend([anchor] * (len(self.hits) - len(out)))
        return out

    def estimates(self) -> list[float]:
        """For planning: the mean at each position, cautious at position 0.

        Position 0 decides whether a step drafts at all, so its noise is what a choice among
        options picks up; deeper positions only stretch a draft that is already worth its verify.
        """
        if self._cached is None:
            means = self.means()
            p, n = means[0], self.seen[0] + self.strength + 1.0
            means[0] = max(0.0, p - self.caution * math.sqrt(p * (1.0 - p) / n))
            self._cached = means
        return self._cached


class ConfidenceMap:
    """How often a model's drafted token is accepted at a given confidence (its own probability).

    Buckets start at whatever the caller falls back to (the positional estimate), so an
    uncalibrated draft (tiny test models are) is not stopped on its confidence until data says so.
    """

    EDGES = (0.3, 0.6, 0.8, 0.95)

    def __init__(self, *, strength: float = 2.0, decay: float = 0.95) -> None:
        self.strength = strength
        self.decay = decay
        self.hits = [0.0] * (len(self.EDGES) + 1)
        self.seen = [0.0] * (len(self.EDGES) + 1)

    def bucket(self, confidence: float) -> int:
        return sum(confidence >= edge for edge in self.EDGES)

    def observe(self, confidences: Sequence[float], accepted: int) -> None:
        for i, confidence in enumerate(confidences[: accepted + 1]):
            b = self.bucket(confidence)
            self.hits[b] = self.hits[b] * self.decay + (i < accepted)
            self.seen[b] = self.seen[b] * self.decay + 1.0

    def acceptance(self, confidence: float, fallback: float) -> float:
        b = self.bucket(confidence)
        return (self.hits[b] + self.strength * fallback) / (self.seen[b] + self.strength)


class Efficiency:
    """Measured tokens per second of a drafter's steps over what their plans expected.

    The plan is a model: it leaves out costs it cannot see (a near-tie run longer than its
    estimate, a draft that ran past the planned k, a decode slower at this context length),
    and an estimate chosen as the best of several is biased up. Steps that fell short pull
    this below 1, and the drafter then has to look that much better to be chosen: a bet that
    keeps losing on this text stops being made. Kept as ratios of decayed sums, with
    `strength` steps of "as planned" before any is seen, and limited to `bounds`.
    """

    def __init__(
        self, *, strength: float = 3.0, decay: float = 0.9, bounds: tuple[float, float] = (0.5, 1.1)
    ) -> None:
        self.strength = strength
        self.decay = decay
        self.bounds = bounds
        self.tokens = self.seconds = 0.0  # measured over planned, summed per step

    def observe(self, planned: Plan, tokens: int, seconds: float) -> None:
        if planned.tokens <= 0 or planned.seconds <= 0 or seconds <= 0:
            return
        self.tokens = self.tokens * self.decay + tokens / planned.tokens
        self.seconds = self.seconds * self.decay + seconds / planned.seconds

    def forget(self, factor: float) -> None:
        self.tokens *= factor
        self.seconds *= factor

    @property
    def value(self) -> float:
        ratio = (self.tokens + self.strength) / (self.seconds + self.strength)
        return min(max(ratio, self.bounds[0]), self.bounds[1])


def ngram_key(match_len: int, streak: int) -> str:
    """Estimates are kept apart by match length (2, 3, 4-5, 6-11, 12-23, 24+) and by whether the
    last step copied."""
    length = max(n for n in NGRAM_PRIOR_BY_LENGTH if n <= max(match_len, 2))
    return f"ngram/{length}/{min(streak, STREAK_MAX)}"


def ngram_prior(key: str) -> float:
    """Position 0's prior: by match length, higher after a step that copied (never above NGRAM_PRIOR_MAX)."""
    _, length, streak = key.split("/")
    base = NGRAM_PRIOR_BY_LENGTH[int(length)]
    return max(base, min(NGRAM_PRIOR_MAX, base + NGRAM_STREAK_BONUS * int(streak)))


def ngram_continue_prior(key: str) -> float:
    """What the positions after the first shrink toward: a long match's copy runs on longer."""
    return NGRAM_CONTINUE_BY_LENGTH.get(int(key.split("/")[1]), NGRAM_CONTINUE_PRIOR)
