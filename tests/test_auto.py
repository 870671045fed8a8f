"""The auto policy: on replayed synthetic runs (no model), then on the tiny models through llama.cpp.

Replays use the real AutoPolicy and n-gram drafter over recorded-looking traces with
a simulated clock, so the decisions are exact and free of this machine's timing.
The tiny-model tests show the same behaviour through the real engine loop.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from replaytraces import (
    CPU,
    GPU,
    MS,
    RNG_VOCAB,
    best_fixed,
    copy_trace,
    fresh_trace,
    machine,
    run_auto,
    run_fixed,
)
from scipy import stats

from localspec.auto import policy as policy_module
from localspec.auto.costmodel import (
    DRAFT_PRIOR,
    K_MAX,
    LONG_WIDTHS,
    NGRAM_CONTINUE_PRIOR,
    VERIFY_MAX,
    Curve,
    Plan,
    PositionalAcceptance,
    ngram_key,
)
from localspec.auto.oracle import ceiling
from localspec.auto.policy import AutoPolicy, OnlineCosts, StepRecord
from localspec.auto.replay import Machine, Replayed, SimClock, Trace, TraceDrafter, replay
from localspec.engine import speculative
from localspec.engine.config import (
    EXACT_POSITIONS,
    EXACT_VERIFY_BATCH,
    EXACT_VERIFY_BATCH_GPU,
    EngineConfig,
    LoadOptions,
)
from localspec.engine.drafters.base import Draft
from localspec.engine.drafters.model import ModelDrafter
from localspec.engine.drafters.ngram import (
    AUTO_MIN_MATCH,
    NGRAM_MAX_MATCH,
    NgramDrafter,
    NgramMatch,
    NgramMemory,
)
from localspec.engine.llama import LlamaModel
from localspec.engine.sampling import Draws
from localspec.engine.speculative import FixedPolicy, Generation, Policy
from localspec.engine.worker import Engine
from localspec.paths import Paths
from localspec.pickdraft.cost import REPACKED_CPU_POINTS
from localspec.types import (
    ChatMessage,
    GenerationRequest,
    GenerationResult,
    Method,
    SamplingParams,
    SpecParams,
)

TINY = LoadOptions(n_ctx=1024, n_threads=1, batch_invariant=True)  # --exact: bit-identity is asserted


class FrozenCosts(OnlineCosts):
    """Costs as calibrated, never corrected by this busy machine: decisions follow the curves alone."""

    def learn(self, step: StepRecord) -> None:
        pass


# --- decisions on replayed runs ------------------------------------------------------------------


def test_on_the_cpu_curve_auto_copies_with_ngrams_and_beats_plain_decoding() -> None:
    m, trace = machine(CPU, draft_ratio=0.65), copy_trace()
    result, policy = run_auto(m, trace)
    plain = run_fixed(m, trace, "none", 0)
    assert result.method_steps.get("draft", 0) == 0  # a draft at 0.65 of a token never pays here
    assert result.method_steps["ngram"] > result.method_steps.get("none", 0)
    assert 2.0 <= policy.summary()["mean_k"] <= 6.0  # type: ignore[operator]
    assert result.tokens_per_second > 1.3 * plain.tokens_per_second
    assert result.tokens_per_second >= 0.9 * best_fixed(m, trace)


def test_copied_runs_are_learned_in_hindsight_without_drafting_them() -> None:
    # A verify as dear as decoding each token: auto never drafts, yet the text shows how far each
    # n-gram proposal would have been right, and the deep positions learn it (copy_trace copies
    # runs of ~37 tokens). Judged only as far as steps went, they would keep their prior.
    steep = Curve(tuple(34 * MS * n for n in range(1, K_MAX + 2)))
    result, policy = run_auto(machine(steep), copy_trace())
    assert result.method_steps.get("ngram", 0) == 0
    deep = [est for key, est in policy.acceptance.items() if key.startswith("ngram/") and est.seen[5] > 0]
    assert deep, policy.acceptance
    assert max(est.means()[5] for est in deep) > NGRAM_CONTINUE_PRIOR + 0.05


# The repacked CPU curve measured on the 2-core AVX-512 machine (docs/benchmarks.md): a 2-token
# verify costs 1.98 one-token decodes, 16 tokens 5.92: only long drafts pay.
REPACKED = Curve.from_points({1: 25 * MS, 2: 50 * MS, 4: 82 * MS, 8: 128 * MS, 16: 150 * MS}, K_MAX + 1)


def test_a_long_copy_is_drafted_from_its_first_two_dozen_tokens_not_learnt_first() -> None:
    # A whole-file edit: the reply copies 160 tokens of the prompt. The match grows by a token a
    # step; once it is two dozen tokens long its copy is sure enough to draft 15 at once (llama.cpp's
    # ngram modes draft from the first match; learning it from scratch took auto 20-40 steps).
    # Shorter matches' priors expect a 15-token draft to gain 2-14% on this curve: under the margin
    # a step that costs five plain steps must clear (costmodel.RISK).
    m, trace = machine(REPACKED), copy_trace()
    trace = dataclasses.replace(trace, output=trace.prompt[40:200])
    clock = SimClock()
    policy = AutoPolicy(FrozenCosts(m.verify), NgramDrafter(), None, clock=clock)
    chosen: list[str] = []
    choose = policy.choose

    def recording(ctx: speculative.StepContext) -> tuple[object, int]:
        drafter, k = choose(ctx)
        chosen.append(drafter.name if drafter is not None else "none")
        return drafter, k

    policy.choose = recording  # type: ignore[method-assign,assignment]
    result = replay(trace, policy, m, clock, charge_policy=False)
    assert "ngram" in chosen[:25], chosen[:30]
    assert result.tokens_per_second >= 2.0 * run_fixed(m, trace, "none", 0).tokens_per_second


# The same machine's curve with its wide verifies (calibrate, 1.5B Q4_K_M, 2 AVX-512 cores): widths of
# 16m are cheap, the ones just past them dear.
BLOCKS = {1: 1.0, 2: 1.7, 4: 2.7, 8: 4.6, 12: 5.5, 15: 6.8, 16: 5.2, 17: 6.6, 24: 7.9, 31: 9.9, 32: 9.0}
BLOCKS |= {33: 9.6, 40: 11.2, 47: 13.1, 48: 12.8, 49: 13.4, 63: 16.9, 64: 16.5}
WIDE = Curve.from_points({n: 25 * MS * v for n, v in BLOCKS.items()}, 64)


def recorded_ks(policy: AutoPolicy) -> list[int]:
    """Wrap the policy's choose to record the k of each drafting step."""
    ks: list[int] = []
    choose = policy.choose

    def recording(ctx: speculative.StepContext) -> tuple[object, int]:
        drafter, k = choose(ctx)
        if drafter is not None:
            ks.append(k)
        return drafter, k

    policy.choose = recording  # type: ignore[method-assign,assignment]
    return ks


def test_a_long_copy_is_drafted_in_the_cheap_wide_verifies() -> None:
    # A whole file copied: past its first dozen tokens the match is sure, and a verify of 48 or 64
    # positions yields ~4 tokens per decode where 16 yields 3. Widths past 16 are only the measured
    # cheap ones (31 costs more than 32 here; an interpolated width is a guess).
    m, trace = machine(WIDE), copy_trace()
    trace = dataclasses.replace(trace, output=trace.prompt[20:290])
    clock = SimClock()
    policy = AutoPolicy(FrozenCosts(m.verify), NgramDrafter(), None, clock=clock)
    ks = recorded_ks(policy)
    wide = replay(trace, policy, m, clock, charge_policy=False)
    assert max(ks) + 1 in LONG_WIDTHS and max(ks) >= 47, ks
    assert all(k <= K_MAX or k + 1 in LONG_WIDTHS for k in ks), ks
    clock = SimClock()
    capped = AutoPolicy(FrozenCosts(m.verify), NgramDrafter(), None, k_max=K_MAX, clock=clock)
    narrow = replay(trace, capped, m, clock, charge_policy=False)
    assert wide.tokens == narrow.tokens == len(trace.output)
    assert wide.tokens_per_second > 1.1 * narrow.tokens_per_second, ks


def test_a_replayed_draft_may_run_past_a_replys_end_and_pays_for_it() -> None:
    # The reply stops (its end-of-text) 12 tokens into a copy of the prompt: the engine cannot
    # know, drafts the copy on, and its verify rejects what lies past the end. Replayed with the
    # request's max_tokens, the same tokens come out and the step pays its whole width.
    m, trace = machine(WIDE), copy_trace()
    short = dataclasses.replace(trace, output=trace.prompt[20:32])
    stops, runs_on = (
        replay(short, FixedPolicy(NgramDrafter(), 15), m, charge_policy=False, max_tokens=limit)
        for limit in (None, 128)
    )
    assert stops.tokens == runs_on.tokens == len(short.output)
    assert stops.drafted <= len(short.output) - 1 < runs_on.drafted
    assert runs_on.seconds > stops.seconds


def test_a_replayed_step_after_a_long_context_costs_what_attention_over_it_adds() -> None:
    # Every position of a verify attends over the whole context: with a per-context cost, the same
    # trace behind a longer prompt replays slower, and wide verifies grow more than plain steps.
    per_context = Curve(tuple(1e-6 * n for n in range(1, 65)))
    flat, grows = machine(WIDE), dataclasses.replace(machine(WIDE), per_context=per_context, measured_at=16)
    assert grows.verify_at(16, 16) == flat.verify(16)
    assert grows.verify_at(16, 1016) == pytest.approx(flat.verify(16) + 1000 * 16e-6)
    trace = copy_trace()
    longer = dataclasses.replace(trace, prompt=(*range(10_000, 11_000), *trace.prompt))
    seconds = [
        replay(t, FixedPolicy(NgramDrafter(), 15), m, charge_policy=False).seconds
        for m in (flat, grows)
        for t in (trace, longer)
    ]
    assert seconds[0] == pytest.approx(seconds[1])  # no context model: the prompt's length is free
    assert seconds[1] < seconds[2] < seconds[3]
    assert ceiling(longer, grows).result.seconds > ceiling(longer, flat).result.seconds


def test_a_draft_model_still_drafts_at_most_k_max_tokens() -> None:
    m, trace = machine(GPU, draft_ratio=0.05), fresh_trace(draft_hits=1.0)
    clock = SimClock()
    policy = AutoPolicy(OnlineCosts(m.verify, m.draft), None, TraceDrafter(trace, m), clock=clock)
    ks = recorded_ks(policy)
    replay(trace, policy, m, clock, charge_policy=False)
    assert ks and max(ks) == K_MAX


def test_without_near_tie_redecides_no_tie_is_expected() -> None:
    costs = FrozenCosts(WIDE)
    assert AutoPolicy(costs, NgramDrafter(), None, near_tie_prior=0.0).near_tie == 0.0
    assert AutoPolicy(costs, NgramDrafter(), None).near_tie > 0.0


def test_positional_acceptance_can_skip_positions_counted_already() -> None:
    est = PositionalAcceptance(0.5, then=0.85)
    est.observe(1, 1)  # a plain step: its proposal's first token was right
    est.observe(5, 6, first=1)  # the rest of it, judged later: 4 more right, then a miss
    assert est.seen[:7] == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    assert est.hits[:7] == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]


def test_on_fresh_text_auto_decodes_plainly_and_loses_nothing() -> None:
    m, trace = machine(CPU, draft_ratio=0.65), fresh_trace()
    result, _ = run_auto(m, trace)
    plain = run_fixed(m, trace, "none", 0)
    assert result.method_steps == {"none": len(trace.output) - 1}
    assert result.tokens_per_second >= 0.99 * plain.tokens_per_second


def test_on_a_flat_gpu_curve_a_good_draft_runs_four_to_eight_tokens() -> None:
    m, trace = machine(GPU, draft_ratio=0.15), fresh_trace(draft_hits=0.9)
    result, _ = run_auto(m, trace)
    assert result.method_steps["draft"] >= 0.9 * result.steps
    assert 4 <= result.drafted / result.method_steps["draft"] <= 8
    assert result.tokens_per_second >= 0.9 * best_fixed(m, trace)
    assert result.tokens_per_second > 2.0 * run_fixed(m, trace, "none", 0).tokens_per_second


def test_a_useless_draft_is_dropped_after_a_few_steps() -> None:
    m, trace = machine(GPU, draft_ratio=0.15), fresh_trace(draft_hits=0.0)
    result, policy = run_auto(m, trace)
    assert result.method_steps.get("draft", 0) <= 5
    assert policy.acceptance["draft"].estimates()[0] < 0.3
    assert result.tokens_per_second >= 0.95 * run_fixed(m, trace, "none", 0).tokens_per_second


def test_a_draft_dropped_after_an_unlucky_start_is_tried_again() -> None:
    # The draft misses its first few tokens, then is right nearly everywhere: auto must not
    # take the bad start for the whole text.
    m, good = machine(GPU, draft_ratio=0.15), fresh_trace(draft_hits=0.95)
    guess = tuple(-7 if i < 6 else t for i, t in enumerate(good.draft_guess))
    trace = dataclasses.replace(good, draft_guess=guess)
    result, _ = run_auto(m, trace)
    assert result.method_steps["draft"] > result.method_steps.get("none", 0)
    assert result.tokens_per_second >= 0.9 * best_fixed(m, trace)


def test_a_draft_never_right_in_one_request_is_not_tried_in_the_next() -> None:
    m, trace = machine(GPU, draft_ratio=0.15), fresh_trace(draft_hits=0.0)
    costs = OnlineCosts(m.verify, m.draft)
    first, _ = run_auto(m, trace, costs)
    second, policy = run_auto(m, trace, costs)
    assert first.method_steps.get("draft", 0) >= 2
    assert second.method_steps.get("draft", 0) == 0
    assert policy.acceptance["draft"].prior < 0.5 * DRAFT_PRIOR
    plain = run_fixed(m, trace, "none", 0).tokens_per_second
    assert first.tokens_per_second < 0.995 * plain <= second.tokens_per_second * 1.001


def test_a_draft_right_as_often_as_expected_starts_each_request_from_the_prior() -> None:
    # The record only lowers a request's prior: a few lucky requests must not make later ones
    # draft where a fresh engine would not.
    m, trace = machine(GPU, draft_ratio=0.15), fresh_trace(draft_hits=0.95)
    costs = OnlineCosts(m.verify, m.draft)
    first, _ = run_auto(m, trace, costs)
    second, policy = run_auto(m, trace, costs)
    assert costs.draft_record.seen > 10 and costs.draft_record.hits > 0.8 * costs.draft_record.seen
    assert policy.acceptance["draft"].prior == DRAFT_PRIOR
    assert second.method_steps == first.method_steps


def test_a_draft_written_off_is_weighed_again_some_requests_later() -> None:
    m = machine(GPU, draft_ratio=0.15)
    costs = OnlineCosts(m.verify, m.draft)
    run_auto(m, fresh_trace(draft_hits=0.0), costs)
    priors: list[float] = []
    drafted = 0
    good = fresh_trace(draft_hits=0.95)
    while not drafted and len(priors) < 30:
        result, policy = run_auto(m, good, costs)
        priors.append(policy.acceptance["draft"].prior)
        drafted = result.method_steps.get("draft", 0)
    # Each request without a try fades the record back toward the prior, until one tries again;
    # then the draft runs as it would have on a fresh engine.
    assert 2 <= len(priors) <= 15
    assert priors == sorted(priors)
    assert drafted > 0.5 * result.steps


class ScriptedLookup:
    """An n-gram drafter whose every peek is the same 63-token copy on a 6-token match; `ended`:
    copies the reply has left for good (NgramDrafter.copies_ended)."""

    name = "ngram"

    def __init__(self, ended: int) -> None:
        self.copies_ended = ended

    def prepare(self, prompt: Sequence[int]) -> None:
        pass

    def start(self, prompt: Sequence[int]) -> None:
        pass

    def peek(self, tokens: Sequence[int], k: int) -> NgramMatch:
        return NgramMatch(list(range(1000, 1000 + min(k, 63))), 6, start=0)

    def in_prose(self, tokens: Sequence[int]) -> bool:
        return False


def bet_after_short_runs(ended: int) -> tuple[int, list[float], list[float]]:
    """auto's bet on the scripted copy, where this request's runs broke after 5 tokens four times and
    the copy's key was right 3 of 3 once: the tokens drafted, the key's estimates, those planned with."""
    # A GPU-like verify curve out to the widest verify: a long copy costs little more than a token.
    flat = Curve(tuple((5.0 + 0.1 * (n - 1)) * 1e-3 for n in range(1, VERIFY_MAX + 1)))
    lookup = ScriptedLookup(ended)
    policy = AutoPolicy(OnlineCosts(flat), lookup, None, near_tie_prior=0.0, clock=SimClock())  # type: ignore[arg-type]
    for _ in range(4):
        policy._learn_continuing(5, 6)
    key = ngram_key(6, 1)
    for _ in range(3):
        policy._estimator(key).observe(3, 3)
    prompt = list(range(100))
    _, k = policy.choose(speculative.StepContext([*prompt, 7], 1 << 20, 0, len(prompt)))
    estimates = policy._estimates(key)
    return k, estimates, policy._within_evidence(key, estimates)


def test_a_reply_stitched_from_pieces_bets_past_a_keys_evidence_at_its_own_runs_rate() -> None:
    whole_k, estimates, capped = bet_after_short_runs(ended=0)
    stitched_k, _, _ = bet_after_short_runs(ended=1)
    # Past its evidence (3 positions) the key's estimates are its last position's; this request's
    # runs went on at about 0.84 a position, and where the reply has left a copy for good no
    # position past the evidence is planned higher than that.
    assert capped[:3] == estimates[:3]
    assert min(estimates[3:8]) > 0.95 and max(capped[3:]) < 0.85
    # A reply that is one copy with edits in it bets as before; a stitched one less.
    assert stitched_k < whole_k


def test_drafting_that_keeps_falling_short_of_its_plan_is_cut_back() -> None:
    # Each drafted token costs 0.8 of a target token more than the costs auto plans with, and
    # nothing corrects those (FrozenCosts): only measured steps against their plans can show it.
    m = dataclasses.replace(machine(GPU, draft_ratio=0.15), draft_token_overhead=0.8 * GPU(1))
    trace = fresh_trace(draft_hits=0.5)
    clock = SimClock()
    policy = AutoPolicy(
        FrozenCosts(GPU, GPU.scaled(0.15)), NgramDrafter(2, 8), TraceDrafter(trace, m), clock=clock
    )
    result = replay(trace, policy, m, clock, charge_policy=False)
    plain = run_fixed(m, trace, "none", 0)
    assert run_fixed(m, trace, "draft", 2).tokens_per_second < plain.tokens_per_second
    assert policy.efficiency["draft"].value < 0.8
    # Without the correction it drafts on ~3 of 4 steps; with it, it keeps trying, but less.
    assert result.method_steps["draft"] < 0.5 * result.steps


def test_tokens_after_a_near_tie_are_no_evidence_against_the_draft() -> None:
    m, trace = machine(GPU, draft_ratio=0.15), fresh_trace(draft_hits=1.0)
    policy = AutoPolicy(OnlineCosts(m.verify, m.draft), None, TraceDrafter(trace, m), clock=SimClock())
    tokens = [*trace.prompt, trace.output[0]]
    drafter, k = policy.choose(speculative.StepContext(tokens, 1 << 20, 0))
    assert drafter is not None and drafter.name == "draft"
    drafter.propose(tokens, 4, SamplingParams(), Draws(0))
    # Four drafted; a near-tie at position 1, where the draft was right, ended the step.
    policy.observe(speculative.StepOutcome("draft", k, 4, 2, 0, 0.0, 0.0, 1, 0.0, judged=2, examined=2))
    estimator = policy.acceptance["draft"]
    assert estimator.hits[:2] == estimator.seen[:2] == [1.0, 1.0]
    assert estimator.seen[2] == 0.0


def test_a_draft_costing_more_than_it_saves_is_never_run() -> None:
    m, trace = machine(GPU, draft_ratio=1.2), fresh_trace(draft_hits=0.7)
    result, _ = run_auto(m, trace)
    assert result.method_steps.get("draft", 0) == 0


class CountingDrafter(TraceDrafter):
    """A trace's draft model that counts how often the policy weighed it (its catch-up is asked)."""

    weighed = 0

    def lag(self, tokens: Sequence[int]) -> int:
        self.weighed += 1
        return super().lag(tokens)


def weighings(draft_ratio: float, draft_hits: float) -> tuple[Replayed, int]:
    """auto with only a draft model on a GPU-like machine: the replay, and how often it weighed the draft."""
    m, trace = machine(GPU, draft_ratio=draft_ratio), fresh_trace(draft_hits=draft_hits)
    clock = SimClock()
    draft = CountingDrafter(trace, m)
    policy = AutoPolicy(OnlineCosts(m.verify, m.draft), None, draft, clock=clock)
    return replay(trace, policy, m, clock, charge_policy=False), draft.weighed


def test_a_draft_model_that_cannot_pay_is_weighed_once_every_few_steps() -> None:
    result, weighed = weighings(draft_ratio=1.2, draft_hits=0.7)
    assert result.method_steps.get("draft", 0) == 0
    # Weighed, found wanting, left to rest DRAFT_REST_STEPS steps: once in every DRAFT_REST_STEPS + 1.
    assert weighed == pytest.approx(result.steps / (policy_module.DRAFT_REST_STEPS + 1), abs=1)


def test_a_draft_model_that_pays_is_weighed_on_every_step() -> None:
    result, weighed = weighings(draft_ratio=0.05, draft_hits=1.0)
    assert result.method_steps.get("draft", 0) == result.steps
    assert weighed >= result.steps


def test_confidence_stops_a_draft_where_it_goes_wrong() -> None:
    # The draft is right and sure for 3 tokens, then unsure and wrong: auto learns to stop there.
    rng = np.random.default_rng(3)
    out = [int(t) for t in rng.integers(0, RNG_VOCAB, 200)]
    guess = [t if i % 4 != 3 else -1 for i, t in enumerate(out)]
    conf = [0.97 if i % 4 != 3 else 0.1 for i in range(200)]
    trace = Trace("pattern", (1, 2, 3), tuple(out), tuple(guess), tuple(conf))
    m = machine(GPU, draft_ratio=0.15)
    result, _ = run_auto(m, trace)
    assert result.accepted / result.drafted > 0.9


def test_plain_steps_still_teach_the_ngram_estimates() -> None:
    # Every pair of output tokens appears in the prompt, followed by the wrong token: the n-gram
    # always has a proposal and it is always wrong. Auto learns that without drafting with it,
    # by comparing each step's proposal with what was generated.
    rng = np.random.default_rng(4)
    out = [int(t) for t in rng.integers(0, RNG_VOCAB, 160)]
    prompt = [t for i in range(1, 160) for t in (out[i - 1], out[i], RNG_VOCAB + i)]
    trace = Trace("misleading", tuple(prompt), tuple(out))
    result, policy = run_auto(machine(CPU), trace)
    assert result.method_steps.get("ngram", 0) <= 3
    assert policy.acceptance["ngram/2/0"].estimates()[0] < 0.1


def test_short_matches_start_from_how_this_requests_matches_have_done() -> None:
    # Where every match has been wrong, a match length not seen yet starts below its fixed prior;
    # where matches keep copying, above it. (A 6-token match after a copy was right 0.85 of the time
    # in the bench set's answers, 0.93 in its edits.)
    rng = np.random.default_rng(4)
    out = [int(t) for t in rng.integers(0, RNG_VOCAB, 160)]
    prompt = [t for i in range(1, 160) for t in (out[i - 1], out[i], RNG_VOCAB + i)]
    _, misled = run_auto(machine(CPU), Trace("misleading", tuple(prompt), tuple(out)))
    _, copying = run_auto(machine(CPU), copy_trace())
    assert misled.lift < 0.5 < 1.0 < copying.lift
    fresh = AutoPolicy(OnlineCosts(CPU), NgramDrafter(), None)
    unseen = "ngram/6/1"
    assert unseen not in misled.acceptance and unseen not in fresh.acceptance
    assert misled._estimates(unseen)[0] < 0.6 * fresh._estimates(unseen)[0]
    # Long matches are copies in any text: their priors stay as they are.
    assert misled._estimates("ngram/24/1")[0] == pytest.approx(fresh._estimates("ngram/24/1")[0])


# Tokens whose text opens or closes a fenced code block, and ends a line; every other token a word.
FENCE, NL = 9001, 9002


def fenced_text(token: int) -> str:
    return {FENCE: "```", NL: "\n"}.get(token, f" w{token}")


def repacked_cpu() -> Machine:
    """The repacked curve of 2 AVX-512 cores, at 28 ms a plain step."""
    return machine(Curve.from_points({n: 28 * MS * v for n, v in REPACKED_CPU_POINTS.items()}, VERIFY_MAX))


def test_in_prose_a_short_match_bets_only_what_the_request_can_afford_to_lose() -> None:
    # A short answer quotes 8 tokens of its document, then goes its own way: a bet on the quote's
    # short match loses its whole verify (on this curve 15 drafted tokens cost 4 plain ones, 15% of
    # a 30-token answer). In prose it waits until the request's drafts have won what it risks; in a
    # fenced code block, where short matches mostly continue a copy, it bets as before.
    fence, nl, text = FENCE, NL, fenced_text
    rng = np.random.default_rng(5)
    doc = [int(t) for t in rng.integers(0, RNG_VOCAB, 200)]
    quote = doc[100:108]
    fresh = [int(t) for t in rng.integers(RNG_VOCAB, 2 * RNG_VOCAB, 60)]
    m = repacked_cpu()

    class Recording(AutoPolicy):
        """auto, keeping the steps that drafted on a short match (key, k)."""

        def choose(self, ctx: speculative.StepContext) -> tuple[Any, int]:
            drafter, k = super().choose(ctx)
            key = self._last.ngram_key if self._last else None
            if k and key is not None and int(key.split("/")[1]) < 12:
                self.bets.append((key, k))
            return drafter, k

        bets: list[tuple[str, int]]

    def bets(reply: list[int]) -> tuple[list[tuple[str, int]], float]:
        """The steps that drafted on a short match, and auto's speed over plain decoding."""
        trace, clock = Trace("answer", (*doc, nl), tuple(reply)), SimClock()
        policy = Recording(
            OnlineCosts(m.verify), NgramDrafter.for_auto(text=text), None, near_tie_prior=0.0, clock=clock
        )
        policy.bets = []
        auto = replay(trace, policy, m, clock, charge_policy=False).tokens_per_second
        plain = replay(trace, FixedPolicy(None, 0), m, charge_policy=False).tokens_per_second
        return policy.bets, auto / plain

    answer = [*fresh[:5], *quote, *fresh[5:22]]
    in_prose, speed = bets(answer)
    assert in_prose == [] and speed >= 0.99
    in_code, speed = bets([fence, nl, *answer])
    assert in_code and speed < 0.95  # the bet the budget spares prose
    # Once a long quote's drafts have won, a short match in prose is bet on again, staking at most
    # one plain step whatever was won; in code a long one is bet.
    after_a_win, speed = bets([*fresh[:5], *doc[20:60], *fresh[5:10], *quote, *fresh[10:20]])
    assert after_a_win and speed > 1.1
    assert max(m.verify(k + 1) for _, k in after_a_win) <= 2 * m.verify(1)
    assert max(m.verify(k + 1) for _, k in in_code) > 2 * m.verify(1)


def test_in_prose_a_quote_that_ends_the_answer_costs_it_little() -> None:
    # A short answer quotes 13 tokens of its document and ends there (qa_ref_exceptions): at its
    # last token the match is 12 long, and the document goes on. A 15-token bet on it is lost
    # whole (0.86x of plain decoding over 17 real tokens); in prose it bets only what the answer
    # can afford. In fenced code, where a 12-token match is a copy, it still bets long (and wins
    # there, on the quote's shorter matches before).
    fence, nl, text = FENCE, NL, fenced_text
    rng = np.random.default_rng(7)
    doc = [int(t) for t in rng.integers(0, RNG_VOCAB, 200)]
    fresh = [int(t) for t in rng.integers(RNG_VOCAB, 2 * RNG_VOCAB, 10)]
    m = repacked_cpu()

    def run(reply: list[int]) -> tuple[int, float]:
        """The most tokens a step drafted, and auto's speed over plain decoding."""
        trace, clock = Trace("answer", (*doc, nl), tuple(reply)), SimClock()
        policy = AutoPolicy(
            OnlineCosts(m.verify), NgramDrafter.for_auto(text=text), None, near_tie_prior=0.0, clock=clock
        )
        ks = recorded_ks(policy)
        auto = replay(trace, policy, m, clock, charge_policy=False).tokens_per_second
        plain = replay(trace, FixedPolicy(None, 0), m, charge_policy=False).tokens_per_second
        return max(ks, default=0), auto / plain

    longest, speed = run([*fresh[:3], *doc[100:113]])
    assert longest <= 3 and speed >= 0.97
    longest, _ = run([fence, nl, *fresh[:3], *doc[100:113]])
    assert longest >= 8


def test_a_short_match_found_elsewhere_while_an_edit_is_written_stakes_one_plain_step() -> None:
    # A rename in a copied file: the reply leaves its copy to write the new name, which the prompt's
    # instruction spells out. The name's last tokens match there, and what follows them in the
    # instruction is prose, not the file: once right for a token, a 47-token draft on it was lost
    # whole (edit_rename_click_textwrap, 8 plain steps). Such a bet stakes at most one plain step,
    # as a short match in prose does; the copy's own matches are bet on as before.
    fence, nl, text = FENCE, NL, fenced_text
    rng = np.random.default_rng(11)
    src = [int(t) for t in rng.integers(0, RNG_VOCAB, 160)]
    added = [int(t) for t in rng.integers(RNG_VOCAB, 2 * RNG_VOCAB, 4)]
    new_name = [int(t) for t in rng.integers(2 * RNG_VOCAB, 3 * RNG_VOCAB, 2)]
    instruction = [int(t) for t in rng.integers(3 * RNG_VOCAB, 4 * RNG_VOCAB, 30)]
    prompt = (fence, nl, *src, nl, fence, nl, *instruction[:10], *new_name, *instruction[10:], nl)
    # A token added every 25 (a type hint, say): the copy goes on where it was, its short matches
    # right for long runs. Then the rename, at token 120.
    reply: list[int] = [fence, nl]
    for i, at in enumerate(range(0, 100, 25)):
        reply += [*src[at : at + 25], added[i]]
    reply += [*src[100:120], *new_name, *src[121:]]
    m = repacked_cpu()

    class Watched(NgramDrafter):
        """The lookup auto plans with, keeping the last match it proposed."""

        last = NgramMatch([], 0)

        def peek(self, tokens: Sequence[int], k: int) -> NgramMatch:
            self.last = super().peek(tokens, k)
            return self.last

    drafter = Watched(AUTO_MIN_MATCH, NGRAM_MAX_MATCH, text=text)
    clock = SimClock()
    policy = AutoPolicy(OnlineCosts(m.verify), drafter, None, near_tie_prior=0.0, clock=clock)
    bets: list[tuple[bool, int]] = []
    choose = policy.choose

    def recording(ctx: speculative.StepContext) -> tuple[object, int]:
        chosen, k = choose(ctx)
        if chosen is not None:
            bets.append((drafter.last.astray, k))
        return chosen, k

    policy.choose = recording  # type: ignore[method-assign,assignment]
    replay(Trace("rename", prompt, tuple(reply)), policy, m, clock, charge_policy=False)
    astray = [k for was, k in bets if was]
    assert astray and max(m.verify(k + 1) for k in astray) <= 2 * m.verify(1), bets
    assert max(k for was, k in bets if not was) >= 15  # the copy itself, drafted long


def test_auto_reads_earlier_requests_only_once_the_reply_has_begun() -> None:
    # Every chat prompt ends in the same template tokens: at the reply's first step an earlier
    # request's prompt matches this one's tail, and what followed it there is another reply.
    memory = NgramMemory(capacity=1000)
    template = [100, 101, 102, 103, 104, 105, 106, 107]
    memory.remember([7, *template, 50, 51, 52, 53, 54, 55, 56, 57])
    prompt = [8, 9, *template]
    policy = AutoPolicy(OnlineCosts(GPU), NgramDrafter.for_auto(memory), None)
    policy.choose(speculative.StepContext([*prompt, 50], 1 << 20, 0, len(prompt)))
    assert policy._last is not None and policy._last.peek == ()
    policy.choose(speculative.StepContext([*prompt, 50, 51], 1 << 20, 1, len(prompt)))
    assert policy._last is not None and list(policy._last.peek[:3]) == [52, 53, 54]


def test_online_costs_follow_what_steps_really_take() -> None:
    costs = OnlineCosts(CPU, CPU.scaled(0.5))
    plan = Plan(None, 0, 1.0, CPU(1))
    for _ in range(40):
        step = StepRecord(None, plan, 0.0, 10, target_s=2 * CPU(1), wall_s=2 * CPU(1) + 3 * MS)
        costs.learn(step)
    assert costs.target_scale == pytest.approx(2.0, rel=0.01)
    assert costs.overhead == pytest.approx(3 * MS, rel=0.01)
    for _ in range(40):
        step = StepRecord("draft", plan, 0.0, 10, lag=1, decodes=4, drafted=4, draft_s=4 * CPU(1))
        step.target_s, step.wall_s = 2 * CPU(5), 2 * CPU(5) + 4 * CPU(1) + 3 * MS + 4 * MS
        costs.learn(step)
    assert costs.draft_scale == pytest.approx(2.0, rel=0.01)
    assert costs.per_token["draft"] == pytest.approx(1 * MS, rel=0.01)
    assert costs.step_cost("draft", 1, model=True).per_draft == pytest.approx(CPU(1) + 1 * MS, rel=0.01)


def test_online_costs_settle_on_the_machine_they_run_on() -> None:
    # The replay charges exactly the machine's costs: what auto learns must be that machine, even
    # though the draft's first use feeds the whole prompt (a catch-up it must not take as typical).
    m = Machine(GPU, GPU.scaled(0.15), step_overhead=0.5 * MS, position_overhead=0.05 * MS)
    _, policy = run_auto(m, fresh_trace(draft_hits=0.9))
    costs = policy.costs
    assert costs.target_scale == pytest.approx(1.0, rel=0.02)
    assert costs.draft_scale == pytest.approx(1.0, rel=0.02)
    assert costs.per_token["draft"] == pytest.approx(0.05 * MS, abs=0.02 * MS)


def test_near_ties_end_steps_and_auto_drafts_less_where_they_are_common() -> None:
    # Every 3rd position is a near-tie: a verify that reaches one ends there, paying one more
    # one-token decode. The draft is always right, yet drafting far no longer pays as much.
    m, base = machine(GPU, draft_ratio=0.15), fresh_trace(draft_hits=1.0)
    gaps = tuple(0.1 if i % 3 == 2 else 5.0 for i in range(len(base.output)))
    tied = Trace("tied", base.prompt, base.output, base.draft_guess, base.draft_confidence, gaps)
    fixed = run_fixed(m, tied, "draft", 8)
    assert fixed.redecided > 0 and fixed.tokens / fixed.steps <= 3.0
    smooth, _ = run_auto(m, base)
    rough, policy = run_auto(m, tied)
    assert policy.near_tie > 0.2
    assert rough.drafted / rough.steps < smooth.drafted / smooth.steps
    # Each step says what its near-tie decode took: the machine is not taken for a slower one.
    assert rough.redecided > 0 and policy.costs.target_scale == pytest.approx(1.0, rel=0.02)


def test_a_redecide_s_time_is_taken_out_of_the_verify_time() -> None:
    # A machine 1.5x slower than calibrated, whose near-tie decodes take 0.7 of a calibrated token:
    # only the batch is compared with the curve. Counting the extra decode (1.78) or estimating
    # it from the curve (1.27) would both learn the wrong scale.
    costs = OnlineCosts(CPU)
    plan = Plan("ngram", 3, 3.0, CPU(4))
    for _ in range(60):
        redecide_s = 0.7 * CPU(1)
        step = StepRecord("ngram", plan, 0.0, 10, drafted=3, accepted=1, redecided=1, redecide_s=redecide_s)
        step.target_s = 1.5 * CPU(4) + redecide_s
        costs.learn(step)
    assert costs.batch_scale(4) == pytest.approx(1.5, rel=0.001)


# 2 AVX2 cores (AMD EPYC, Zen 3), Qwen2.5-Coder-1.5B Q4_K_M as calibrated there (V(n) / V(1) x 70 ms).
AVX2_POINTS = {1: 1.0, 2: 1.58, 4: 2.15, 8: 7.61, 12: 9.58, 16: 10.39}
AVX2_POINTS |= {24: 16.78, 32: 17.47, 48: 22.34, 64: 25.44}
AVX2 = Curve.from_points({n: 70 * MS * v for n, v in AVX2_POINTS.items()}, VERIFY_MAX)


def skewed_avx2(narrow: float, wide: float = 1.0) -> Machine:
    """That machine busy, or its calibration off: verifies of 2-8 tokens take `narrow` times what
    the calibration says, of 17-64 `wide` times (single timings there came out 20-50% off, either way)."""
    scale = {n: narrow if 2 <= n <= 8 else wide if n > 16 else 1.0 for n in range(1, VERIFY_MAX + 1)}
    return Machine(Curve(tuple(v * scale[n] for n, v in enumerate(AVX2.seconds, 1))))


def verbatim_trace() -> Trace:
    rng = np.random.default_rng(3)
    prompt = tuple(int(t) for t in rng.integers(0, RNG_VOCAB, 900))
    return Trace("verbatim", prompt, prompt[100:400])


def copy_on_avx2(m: Machine) -> tuple[float, AutoPolicy]:
    """auto / plain decoding on a verbatim copy, on machine `m` with auto calibrated as AVX2 says."""
    trace = verbatim_trace()
    plain = replay(trace, FixedPolicy(None, 0), m, charge_policy=False).tokens_per_second
    clock = SimClock()
    policy = AutoPolicy(OnlineCosts(AVX2), NgramDrafter.for_auto(), None, near_tie_prior=0.0, clock=clock)
    auto = replay(trace, policy, m, clock, charge_policy=False, max_tokens=len(trace.output))
    return auto.tokens_per_second / plain, policy


def test_narrow_verifies_learnt_dear_do_not_price_the_wide_ones() -> None:
    # A busy VM: 3-token verifies take 1.45x the calibration, a 63-token one as calibrated. Each
    # class of widths learns its own ratio; one ratio for all made the copy look 1.45x as dear.
    costs = OnlineCosts(AVX2)
    narrow, wide = Plan("ngram", 3, 4.0, AVX2(4)), Plan("ngram", 63, 64.0, AVX2(64))
    for _ in range(30):
        costs.learn(StepRecord("ngram", narrow, 0.0, 900, drafted=3, accepted=3, target_s=1.45 * AVX2(4)))
    assert costs.batch_scale(4) == pytest.approx(1.45, rel=0.01)
    assert costs.batch_scale(64) == pytest.approx(1.0)
    assert costs.step_cost("ngram").verify_s(64) == pytest.approx(AVX2(64))
    costs.learn(StepRecord("ngram", wide, 0.0, 900, drafted=63, accepted=63, target_s=1.2 * AVX2(64)))
    assert 1.0 < costs.batch_scale(48) < 1.2 and costs.batch_scale(4) == pytest.approx(1.45, rel=0.01)


def test_a_copy_is_drafted_wide_where_only_the_narrow_verifies_run_dearer_than_calibrated() -> None:
    # Learnt as one ratio, the dear short bets a copy starts with priced its wide verifies out for
    # a while (18 plain steps, 2.42x of plain decoding); learnt per class, 6 plain steps, 2.57x.
    speedup, policy = copy_on_avx2(skewed_avx2(1.35, 0.85))
    assert speedup > 2.5
    assert policy.steps["none"] <= 10


def test_a_verify_ratio_that_prices_long_copies_out_is_doubted_while_they_are_declined() -> None:
    # Narrow verifies 1.45x the calibration (edit_fill_body_sched on a busy VM): with one ratio for
    # all widths, auto's first short bets taught 1.3, which priced the 63-token copy out for the rest
    # of the reply (1.01x of plain decoding, 279 plain steps). Declining a long match doubts the
    # ratios until a step drafts and measures a wide verify again.
    speedup, policy = copy_on_avx2(skewed_avx2(1.45))
    assert speedup > 1.8
    assert policy.steps["none"] < 40


def test_a_verify_ratio_is_not_doubted_where_no_long_match_is_declined() -> None:
    # Fresh text, no match: nothing measures the ratio, and nothing doubts it either (doubted on
    # every plain step, it sent prose back to short bets that verifies still too dear lost).
    m = skewed_avx2(1.45)
    costs = OnlineCosts(AVX2)
    costs.batch_ratios = [1.3] * len(costs.batch_ratios)
    clock = SimClock()
    policy = AutoPolicy(costs, NgramDrafter.for_auto(), None, near_tie_prior=0.0, clock=clock)
    replay(fresh_trace(), policy, m, clock, charge_policy=False)
    assert costs.batch_ratio(64) == pytest.approx(1.3)
    costs.doubt_batch_ratios()
    assert 1.0 < costs.batch_ratio(64) < 1.3


def test_batched_verifies_learn_their_own_scale_beside_plain_decodes() -> None:
    # At a long context a verify's every position attends over it: plain decodes take 1.2x the
    # calibrated curve, a 16-token verify 1.4x. Plain steps set the plain scale, drafting ones how
    # much more a batch takes; a plan for drafting counts both.
    costs = OnlineCosts(CPU)
    plain, wide = Plan(None, 0, 1.0, CPU(1)), Plan("ngram", 15, 8.0, CPU(16))
    for _ in range(60):
        costs.learn(StepRecord(None, plain, 0.0, 1200, target_s=1.2 * CPU(1), wall_s=1.2 * CPU(1)))
        step = StepRecord("ngram", wide, 0.0, 1200, drafted=15, accepted=15, target_s=1.4 * CPU(16))
        step.wall_s = step.target_s
        costs.learn(step)
    assert costs.target_scale == pytest.approx(1.2, rel=0.01)
    assert costs.batch_scale(16) == pytest.approx(1.4, rel=0.01)
    assert costs.step_cost(None).seconds(0) == pytest.approx(1.2 * CPU(1), rel=0.01)
    assert costs.step_cost("ngram").verify_s(16) == pytest.approx(1.4 * CPU(16), rel=0.01)


# --- the tiny models, through llama.cpp -----------------------------------------------------------


def generate(target: LlamaModel, policy: Policy, prompt: str, **kw: object) -> Generation:
    gen = Generation(
        target,
        target.tokenize(prompt),
        max_tokens=kw.pop("max_tokens", 96),  # type: ignore[arg-type]
        params=kw.pop("params", SamplingParams()),  # type: ignore[arg-type]
        stop=(),
        policy=policy,
        method="auto",
        k=4,
    )
    list(gen.run())
    return gen


PROMPTS = ["let us write some code", "the cat sat on", "def add(a, b):\n    return", "one two three one two"]


def gpu_like_costs() -> FrozenCosts:
    return FrozenCosts(GPU, GPU.scaled(0.15))


@pytest.mark.parametrize("draft_file", ["tiny_perfect_draft", "tiny_useless_draft"])
def test_auto_speculates_with_a_perfect_draft_and_not_with_a_useless_one(
    request: pytest.FixtureRequest, tiny: LlamaModel, draft_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tiny target's logits are flat: at NEAR_TIE, ~30% of the positions a verify judges are
    # near-ties (real models: 10-26% on prose), and auto, told of each re-decide, rightly finds that
    # even a perfect draft barely pays. A narrower band gives real-model-like ties (~14% here).
    monkeypatch.setattr(speculative, "NEAR_TIE", 0.3)
    draft = LlamaModel(request.getfixturevalue(draft_file), TINY)
    steps = {"draft": 0, "none": 0, "ngram": 0}
    for prompt in PROMPTS:
        base = generate(tiny, FixedPolicy(None, 0), prompt)
        policy = AutoPolicy(gpu_like_costs(), NgramDrafter(2, 8), ModelDrafter(draft))
        gen = generate(tiny, policy, prompt)
        assert gen.result is not None and base.result is not None
        assert gen.result.token_ids == base.result.token_ids
        for name, n in gen.stats.method_steps.items():
            steps[name] += n
    total = sum(steps.values())
    if draft_file == "tiny_perfect_draft":
        assert steps["draft"] > 0.8 * total
    else:
        assert steps["draft"] < 0.1 * total
    draft.close()


class _Recording(FixedPolicy):
    def __init__(self, drafter: ModelDrafter, k: int) -> None:
        super().__init__(drafter, k)
        self.outcomes: list[speculative.StepOutcome] = []

    def observe(self, outcome: speculative.StepOutcome) -> None:
        self.outcomes.append(outcome)


def test_step_outcomes_say_what_was_judged_and_looked_at(
    tiny: LlamaModel, tiny_perfect_draft: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    draft = LlamaModel(tiny_perfect_draft, TINY)
    monkeypatch.setattr(speculative, "NEAR_TIE", 0.0)  # no near-ties: steps end at rejections
    policy = _Recording(ModelDrafter(draft), 4)
    generate(tiny, policy, "the cat sat on", max_tokens=40)
    drafting = [o for o in policy.outcomes if o.drafted]
    assert drafting and all(o.redecided == 0 for o in drafting)
    assert all(o.judged == o.drafted and o.examined == o.accepted + 1 for o in drafting)
    # Every verified position a near-tie: each step ends at its first, judging one drafted token.
    monkeypatch.setattr(speculative, "NEAR_TIE", 1e9)
    policy = _Recording(ModelDrafter(draft), 4)
    generate(tiny, policy, "the cat sat on", max_tokens=40)
    drafting = [o for o in policy.outcomes if o.drafted]
    assert drafting and all(o.redecided == 1 and o.judged == 1 and o.examined == 1 for o in drafting)
    assert all(o.drafted == o.k for o in drafting)  # the rest of each draft was never judged
    draft.close()


def test_fast_loading_verifies_in_any_batch_and_skips_near_tie_redecides(
    tiny_target: Path, tiny_perfect_draft: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(speculative, "NEAR_TIE", 1e9)  # every verified position a near-tie
    fast_options = dataclasses.replace(TINY, batch_invariant=False)
    target, draft = LlamaModel(tiny_target, fast_options), LlamaModel(tiny_perfect_draft, fast_options)
    assert not target.exact and target.max_verify_batch == fast_options.n_batch
    gen = generate(target, FixedPolicy(ModelDrafter(draft), 12), "the cat sat on", max_tokens=40)
    assert not gen.stats.exact and gen.stats.redecided == 0
    assert gen.stats.mean_k > EXACT_VERIFY_BATCH - 1  # no exact-batch cap either
    target.close()
    draft.close()
    exact_target = LlamaModel(tiny_target, TINY)
    assert exact_target.exact and exact_target.max_verify_batch == EXACT_VERIFY_BATCH
    exact_draft = LlamaModel(tiny_perfect_draft, TINY)
    gen = generate(exact_target, FixedPolicy(ModelDrafter(exact_draft), 12), "the cat sat on", max_tokens=40)
    assert gen.stats.exact and gen.stats.redecided > 0
    exact_target.close()
    exact_draft.close()


def test_exact_loading_on_the_cpu_verifies_in_batches_only_before_the_exact_positions(
    tiny_target: Path,
) -> None:
    # From position EXACT_POSITIONS on, llama.cpp splits a one-token decode's attention across its
    # threads and no batch rounds as it does (config.EXACT_POSITIONS): a verify there is one token.
    target = LlamaModel(tiny_target, TINY)
    text = target.tokenize("the cat sat on the mat and then it ran away " * 40, add_special=False)
    for n_past, limit in ((100, EXACT_VERIFY_BATCH), (EXACT_POSITIONS - 3, 3), (EXACT_POSITIONS + 40, 1)):
        target.reset()
        target.decode(text[:n_past])
        assert target.verify_limit() == limit, n_past
    fast = LlamaModel(tiny_target, dataclasses.replace(TINY, batch_invariant=False))
    fast.decode(text[: EXACT_POSITIONS + 40])
    assert fast.verify_limit() == fast.max_verify_batch
    # Through the engine's loop: a fixed 4-token n-gram draft after a long prompt decodes plainly.
    gen = generate(
        target, FixedPolicy(NgramDrafter(), 4), " ".join(["the cat sat on the mat"] * 50), max_tokens=24
    )
    assert gen.stats.drafted == 0 and gen.stats.steps == 23
    for model in (target, fast):
        model.close()


def test_exact_loading_on_a_gpu_drafts_nothing(
    tiny_target: Path, tiny_perfect_draft: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On CUDA no verify of 2+ positions rounds as one-token decoding (measured on an H200:
    # config.EXACT_VERIFY_BATCH_GPU), so --exact with layers on a GPU must never draft. No GPU
    # here: only the offload check is faked; llama.cpp itself loads and decodes on the CPU.
    from localspec.engine import llama as backend

    monkeypatch.setattr(backend, "gpu_offload_supported", lambda: True)
    target = LlamaModel(tiny_target, TINY)
    assert target.on_gpu and target.max_verify_batch == EXACT_VERIFY_BATCH_GPU == 1
    draft = LlamaModel(tiny_perfect_draft, TINY)
    gen = generate(target, FixedPolicy(ModelDrafter(draft), 4), "the cat sat on", max_tokens=24)
    assert gen.stats.exact and gen.stats.drafted == 0
    cpu = LlamaModel(tiny_target, dataclasses.replace(TINY, gpu_layers=0))
    assert not cpu.on_gpu and cpu.max_verify_batch == EXACT_VERIFY_BATCH
    for model in (target, draft, cpu):
        model.close()
    # Through the engine, every method says why it ran plain.
    config = EngineConfig(target=tiny_target, draft=tiny_perfect_draft, load=TINY)
    with Engine(config) as engine:
        engine.wait_ready()
        for method in ("draft", "ngram", "auto"):
            request = GenerationRequest(prompt="the cat sat on", max_tokens=8, speculative=SpecParams(method))
            stats = engine.generate(request).stats
            assert stats.method == "none" and stats.drafted == 0 and stats.exact
            assert stats.fallback_reason == f"{method} off: " + (
                "--exact with layers on a GPU verifies one token at a time (no wider verify is bit-identical)"
            )


def test_auto_is_token_identical_under_sampling_with_a_seed(
    tiny: LlamaModel, tiny_related_draft: Path
) -> None:
    draft = LlamaModel(tiny_related_draft, TINY)
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=11)

    def sampled() -> tuple[int, ...]:
        policy = AutoPolicy(gpu_like_costs(), NgramDrafter(2, 8), ModelDrafter(draft))
        gen = generate(tiny, policy, "hello world", params=params)
        assert gen.result is not None and gen.stats.drafted > 0
        return gen.result.token_ids

    assert sampled() == sampled()
    draft.close()


def test_a_seed_draws_one_text_whichever_method_decodes_it(
    tiny: LlamaModel, tiny_related_draft: Path
) -> None:
    # The target draws each position's token with that position's uniform, a draft model its guess
    # with the same one, and a drafted token is kept where it is the target's draw. So where a verify
    # rounds as one-token decoding (the tiny model's do), none, n-gram lookup, a draft model and auto
    # (whose choices follow the clock) write the same text for a seed. (On larger models a batched
    # verify's rounding can still move a draw.)
    prompt = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat"
    draft = LlamaModel(tiny_related_draft, TINY)

    def sampled(policy: Policy, seed: int = 5) -> Generation:
        gen = generate(tiny, policy, prompt, params=SamplingParams(temperature=0.7, top_p=0.95, seed=seed))
        assert gen.result is not None
        return gen

    plain = sampled(FixedPolicy(None, 0))
    ngram = sampled(FixedPolicy(NgramDrafter(2, 8), 8))
    model = sampled(FixedPolicy(ModelDrafter(draft), 4))
    auto = sampled(AutoPolicy(gpu_like_costs(), NgramDrafter(2, 8), ModelDrafter(draft)))
    for gen in (ngram, model, auto):  # drafts were kept, and some not
        assert gen.stats.accepted > 0 and (gen is auto or gen.stats.accepted < gen.stats.drafted)
    texts = {gen.result.token_ids for gen in (plain, ngram, model, auto) if gen.result is not None}
    assert len(texts) == 1
    other = sampled(FixedPolicy(None, 0), seed=6).result
    assert other is not None and plain.result is not None and other.token_ids != plain.result.token_ids
    draft.close()


class _KeepIfSure:
    """A model drafter under a harsh confidence rule: keep a token only where the draft is sure."""

    name = "draft"

    def __init__(self, model: LlamaModel) -> None:
        self.inner = ModelDrafter(model)

    def start(self, prompt: Sequence[int], fresh: bool = True) -> None:
        self.inner.start(prompt, fresh)

    def propose(self, tokens: Sequence[int], k: int, params: SamplingParams, draws: Draws) -> Draft:
        return self.inner.propose_while(tokens, k, params, draws, lambda i, confidence: confidence >= 0.3)


def test_stopping_on_confidence_keeps_sampling_lossless(tiny: LlamaModel, tiny_related_draft: Path) -> None:
    # Were the rule to look at the probability of the token a sample drew, kept tokens would
    # be skewed toward likely ones and the output with them: chi-square against `none` shows it
    # (measured: p ~ 1e-32 with that rule on this prompt; ~0.9 with the distribution's top).
    draft = LlamaModel(tiny_related_draft, TINY)
    prompt = tiny.tokenize("def add(a, b):\n    return")

    def second_tokens(policy: Policy, offset: int) -> Counter[int]:
        seen: Counter[int] = Counter()
        for seed in range(2000):
            params = SamplingParams(temperature=1.0, seed=seed + offset)
            gen = Generation(
                tiny, prompt, max_tokens=3, params=params, stop=(), policy=policy, method="x", k=1
            )
            list(gen.run())
            assert gen.result is not None
            if len(gen.result.token_ids) >= 2:
                seen[gen.result.token_ids[1]] += 1
        return seen

    base = second_tokens(FixedPolicy(None, 0), 0)
    sure = _KeepIfSure(draft)
    spec = second_tokens(FixedPolicy(sure, 1), 10**6)
    keys = sorted(set(base) | set(spec))
    table = np.array([[base[k] for k in keys], [spec[k] for k in keys]], dtype=float)
    common = table.sum(axis=0) >= 20
    pooled = np.column_stack([table[:, common], table[:, ~common].sum(axis=1)])
    pooled = pooled[:, pooled.sum(axis=0) > 0]
    assert float(stats.chi2_contingency(pooled).pvalue) > 1e-3
    draft.close()


# --- the engine's auto method, calibrated for real ------------------------------------------------


def run(engine: Engine, prompt: str, method: Method, k: int | None = None, **kw: object) -> GenerationResult:
    request = GenerationRequest(prompt=prompt, speculative=SpecParams(method, k), **kw)  # type: ignore[arg-type]
    return engine.generate(request)


def test_engine_auto_calibrates_once_and_falls_back_to_plain_with_a_useless_draft(
    tiny_target: Path, tiny_useless_draft: Path
) -> None:
    cache = Paths.from_env().cache_dir
    calibration = cache / "calibration"
    # Each prompt runs as none, then auto: no memory of the none run, which n-gram would copy whole.
    config = EngineConfig(
        target=tiny_target, draft=tiny_useless_draft, load=TINY, cache_dir=cache, ngram_memory_tokens=0
    )
    with Engine(config) as engine:
        engine.wait_ready()
        files = sorted(calibration.glob("*.json"))
        assert len(files) == 2  # target and draft, measured at load
        stamps = [f.stat().st_mtime_ns for f in files]
        steps = {"none": 0}
        for prompt in PROMPTS:
            base = run(engine, prompt, "none", max_tokens=64)
            spec = run(engine, prompt, "auto", max_tokens=64)
            assert spec.token_ids == base.token_ids
            assert spec.stats.method == "auto" and spec.stats.fallback_reason is None
            for name, n in spec.stats.method_steps.items():
                steps[name] = steps.get(name, 0) + n
        assert steps["none"] >= 0.85 * sum(steps.values())
    # The busy-machine guard stays quiet: a tiny model's whole token is far under its minimum.
    with Engine(config) as engine:
        engine.wait_ready()
        assert [f.stat().st_mtime_ns for f in sorted(calibration.glob("*.json"))] == stamps


def test_engine_auto_takes_the_request_k_as_a_cap(tiny_target: Path, tiny_perfect_draft: Path) -> None:
    config = EngineConfig(target=tiny_target, draft=tiny_perfect_draft, method="none", load=TINY)
    with Engine(config) as engine:
        engine.wait_ready()
        # A flat curve instead of this CPU's calibration, so that the perfect draft runs far.
        assert engine._methods is not None
        engine._methods._auto_costs = gpu_like_costs()
        longest = 0
        for prompt in PROMPTS:
            base = run(engine, prompt, "none", max_tokens=64)
            capped = run(engine, prompt, "auto", 2, max_tokens=64)
            free = run(engine, prompt, "auto", max_tokens=64)
            assert capped.token_ids == free.token_ids == base.token_ids
            # Uncapped, auto may draft as far as an exact verify batch allows (EXACT_VERIFY_BATCH).
            assert (capped.stats.k, free.stats.k, base.stats.k) == (2, EXACT_VERIFY_BATCH - 1, 0)
            assert capped.stats.drafted > 0 and len(capped.stats.drafted_by_position) <= 2
            assert 1.0 <= capped.stats.mean_k <= 2.0
            assert 1.0 <= free.stats.mean_k <= EXACT_VERIFY_BATCH - 1
            longest = max(longest, len(free.stats.drafted_by_position))
        assert longest > 2  # uncapped, it drafts further: the cap is what stopped it


def test_engine_auto_reads_a_chat_reply_as_markdown_and_a_raw_completion_not(tiny_target: Path) -> None:
    # Where a reply is in prose, auto's short-match bets are limited; it knows only in a chat
    # reply's Markdown, whose code is fenced: a completion's raw text may be code throughout.
    with Engine(EngineConfig(target=tiny_target, method="none", load=TINY)) as engine:
        engine.wait_ready()
        methods = engine._methods
        assert methods is not None and engine._target is not None
        methods._auto_costs = gpu_like_costs()
        prose = engine._target.tokenize("Here it is:\n", add_special=False)
        code = engine._target.tokenize("Here it is:\n```python\nx = 1\n", add_special=False)

        def in_prose(req: GenerationRequest, tokens: list[int]) -> bool:
            policy = methods.policy(req, ())[0]
            assert isinstance(policy, AutoPolicy) and policy._ngram is not None
            return policy._ngram.in_prose(tokens)

        auto = SpecParams(method="auto")
        chat = GenerationRequest(messages=(ChatMessage(role="user", content="hi"),), speculative=auto)
        assert in_prose(chat, prose) and not in_prose(chat, code)
        # As the daemon submits it: its messages rendered to a prompt first (Engine.prepare). Read
        # as a raw completion, its prose bets went unbounded in every served chat (a 29-token
        # answer bet 3 and 15 tokens, none right: 0.82x of plain decoding).
        served = engine.prepare(chat)
        assert not served.messages and served.prompt
        assert in_prose(served, prose) and not in_prose(served, code)
        assert not in_prose(GenerationRequest(prompt="def f():", speculative=auto), prose)
        assert not in_prose(GenerationRequest(prompt="a = ", suffix="\n", speculative=auto), prose)


def test_engine_n_gram_drafts_know_the_models_end_of_generation_tokens(tiny_target: Path) -> None:
    # A draft stops at the first of them (NgramDrafter._until_end): the target's own, read at load.
    with Engine(EngineConfig(target=tiny_target, method="none", load=TINY)) as engine:
        engine.wait_ready()
        assert engine._target is not None and engine._methods is not None
        ends = frozenset(engine._target.eog_tokens())
        assert ends
        chat = GenerationRequest(messages=(ChatMessage(role="user", content="hi"),))
        for auto in (False, True):
            assert engine._methods._ngram(chat, auto=auto)._ends == ends


def test_engine_with_a_fixed_default_method_calibrates_on_the_first_auto_request(
    tiny_target: Path, tiny_perfect_draft: Path
) -> None:
    cache = Paths.from_env().cache_dir
    calibration = cache / "calibration"
    config = EngineConfig(
        target=tiny_target, draft=tiny_perfect_draft, method="none", load=TINY, cache_dir=cache
    )
    with Engine(config) as engine:
        engine.wait_ready()
        assert not calibration.exists()
        # Earlier requests leave KV caches that calibration then empties: nothing stale may be reused.
        base = run(engine, "hello world", "none", max_tokens=24)
        run(engine, "hello world", "draft", max_tokens=24)
        assert run(engine, "hello world", "auto", max_tokens=24).token_ids == base.token_ids
        assert len(list(calibration.glob("*.json"))) == 2
        assert run(engine, "hello world", "draft", max_tokens=24).token_ids == base.token_ids


def test_replay_drafts_no_further_than_the_engines_largest_verify_batch() -> None:
    trace = copy_trace()
    free = replay(trace, FixedPolicy(NgramDrafter(), 12), machine(GPU))
    capped_machine = dataclasses.replace(machine(GPU), max_verify_batch=EXACT_VERIFY_BATCH)
    capped = replay(trace, FixedPolicy(NgramDrafter(), 12), capped_machine)
    assert free.drafted / free.method_steps["ngram"] > EXACT_VERIFY_BATCH - 1  # copying runs far
    assert capped.drafted <= (EXACT_VERIFY_BATCH - 1) * capped.method_steps["ngram"]
    assert capped.tokens == free.tokens == len(trace.output)


class _Preparing(FixedPolicy):
    """Plain decoding, keeping what the generation asked of it, in order."""

    def __init__(self) -> None:
        super().__init__(None, 0)
        self.calls: list[tuple[str, object]] = []

    def prepare(self, prompt: Sequence[int]) -> None:
        self.calls.append(("prepare", list(prompt)))

    def choose(self, ctx: speculative.StepContext) -> tuple[Any, int]:
        self.calls.append(("choose", len(ctx.tokens)))
        return super().choose(ctx)


def test_the_policy_prepares_on_the_prompt_once_before_its_first_choice(tiny: LlamaModel) -> None:
    policy = _Preparing()
    gen = generate(tiny, policy, "the cat sat on", max_tokens=8)
    assert policy.calls[0] == ("prepare", gen.prompt)
    assert [name for name, _ in policy.calls[1:]] == ["choose"] * 7  # the first token needs no step


class _FailingPrepare(_Preparing):
    def prepare(self, prompt: Sequence[int]) -> None:
        raise RuntimeError("index broke")


def test_a_policy_that_fails_to_prepare_costs_the_request_nothing_but_its_drafts(tiny: LlamaModel) -> None:
    base = generate(tiny, FixedPolicy(None, 0), "the cat sat on", max_tokens=12)
    policy = _FailingPrepare()
    gen = generate(tiny, policy, "the cat sat on", max_tokens=12)
    assert gen.result is not None and base.result is not None
    assert gen.result.token_ids == base.result.token_ids
    assert gen.stats.fallback_reason == "preparing the drafts failed: index broke"
    assert policy.calls == []  # decoded plainly, never asked again
