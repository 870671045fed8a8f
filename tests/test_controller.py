"""The controller's decision as a pure function: synthetic curves and acceptance histories in, a plan out.

Curves are in units of one target token (V(1) = 1). CPU-like is what llama-bench
measured on this 2-core machine for Qwen2.5-Coder-1.5B (V(4) ~ 2.5, V(9) ~ 6.4);
GPU-like is nearly flat, as a batched verify is on a GPU.
"""

from __future__ import annotations

import math
import random

import pytest

from localspec.auto.costmodel import (
    K_MAX,
    NGRAM_PRIOR_MAX,
    ConfidenceMap,
    Curve,
    EarlyStop,
    Efficiency,
    Option,
    Plan,
    PositionalAcceptance,
    StepCost,
    break_even,
    expected_tokens,
    ngram_continue_prior,
    ngram_key,
    ngram_prior,
    plan,
)

CPU = Curve.from_points({1: 1.0, 2: 1.5, 4: 2.5, 9: 6.4, 16: 11.4}, K_MAX + 1)
GPU = Curve(tuple(1.0 + 0.02 * (n - 1) for n in range(1, K_MAX + 2)))


def draft_option(curve: Curve, accept: float, per_token: float, k_max: int = K_MAX) -> Option:
    return Option("draft", [accept] * k_max, StepCost(curve, 0.0, per_token, per_token), k_max)


def ngram_option(curve: Curve, accept: float, available: int = K_MAX) -> Option:
    return Option("ngram", [accept] * available, StepCost(curve), available)


# --- curves ----------------------------------------------------------------------------------------


def test_curve_interpolates_measured_points() -> None:
    assert CPU(1) == 1.0 and CPU(4) == 2.5 and CPU(9) == pytest.approx(6.4)
    assert CPU(3) == pytest.approx(2.0)
    assert CPU(6) == pytest.approx(2.5 + 3.9 * 2 / 5)
    # Measured on this CPU: a batch of 4 verifies faster than one of 3. That is kept, not smoothed.
    blocky = Curve.from_points({1: 1.0, 2: 1.7, 3: 2.1, 4: 1.7}, 6)
    assert blocky(4) < blocky(3)
    assert blocky(6) == pytest.approx(1.7 + 2 * 0.7 / 3)  # past the last point: the average slope


def test_curve_extrapolates_linearly_past_its_end() -> None:
    curve = Curve((1.0, 1.5, 2.0))
    assert curve(5) == pytest.approx(3.0)
    assert Curve((1.0, 2.0, 1.5))(4) == pytest.approx(1.75)  # a last drop is not a trend
    assert curve(0) == 0.0
    assert Curve.linear(0.5, 4).relative() == (1.0, 2.0, 3.0, 4.0)


def test_curve_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        Curve(())
    with pytest.raises(ValueError):
        Curve((1.0, 0.0))
    with pytest.raises(ValueError):
        Curve.from_points({2: 1.0}, 4)


# --- expected yield and cost ----------------------------------------------------------------------


def test_expected_tokens_counts_the_targets_own_token_and_each_reached_draft() -> None:
    assert expected_tokens([0.5] * 4, 0) == 1.0
    assert expected_tokens([1.0] * 4, 4) == 5.0
    assert expected_tokens([0.5, 0.5, 0.5], 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens([0.0, 1.0], 2) == 1.0


def test_step_cost_adds_overhead_draft_and_verify() -> None:
    cost = StepCost(CPU, overhead=0.1, first_draft=0.5, per_draft=0.3)
    assert cost.seconds(0) == pytest.approx(1.1)
    assert cost.seconds(3) == pytest.approx(0.1 + 0.5 + 0.6 + 2.5)


# --- the decision ------------------------------------------------------------------------------------


def test_flat_gpu_curve_and_a_good_draft_speculate_four_to_eight_tokens() -> None:
    choice = plan(StepCost(GPU), [draft_option(GPU, 0.8, 0.1)])
    assert choice.name == "draft"
    assert 4 <= choice.k <= 8
    assert choice.rate > 2.0 / GPU(1)


def test_flat_gpu_curve_and_a_near_perfect_draft_draft_long() -> None:
    choice = plan(StepCost(GPU), [draft_option(GPU, 0.95, 0.05)])
    assert choice.name == "draft" and choice.k >= 8


def test_steep_cpu_curve_rejects_a_draft_costing_most_of_a_target_token() -> None:
    # Measured here: the 0.5B draft costs 0.6-0.75 of a 1.5B target token; even a perfect one loses.
    for accept in (0.7, 0.9, 1.0):
        choice = plan(StepCost(CPU), [draft_option(CPU, accept, 0.65)])
        assert (choice.name, choice.k) == (None, 0), accept


def test_draft_that_costs_more_than_it_saves_loses_even_on_a_gpu() -> None:
    choice = plan(StepCost(GPU), [draft_option(GPU, 0.6, 1.2)])
    assert choice.name is None


def test_steep_cpu_curve_takes_long_ngram_matches_with_a_short_k() -> None:
    choice = plan(StepCost(CPU), [ngram_option(CPU, 0.95)])
    assert choice.name == "ngram"
    assert 2 <= choice.k <= 4
    assert choice.rate == pytest.approx(expected_tokens([0.95], choice.k) / CPU(choice.k + 1))


def test_steep_cpu_curve_skips_weak_ngram_matches() -> None:
    assert plan(StepCost(CPU), [ngram_option(CPU, 0.4)]).name is None


def test_k_never_exceeds_what_the_drafter_can_propose() -> None:
    choice = plan(StepCost(GPU), [ngram_option(GPU, 1.0, available=3)])
    assert (choice.name, choice.k) == ("ngram", 3)


def test_the_better_of_two_drafters_wins() -> None:
    options = [ngram_option(GPU, 0.5), draft_option(GPU, 0.8, 0.1)]
    assert plan(StepCost(GPU), options).name == "draft"
    options = [ngram_option(GPU, 0.98), draft_option(GPU, 0.8, 0.1)]
    assert plan(StepCost(GPU), options).name == "ngram"


def test_plain_decoding_wins_ties_and_empty_option_lists() -> None:
    assert plan(StepCost(CPU), []).name is None
    linear = Curve.linear(1.0)
    # With no gain from batching a perfect free drafter only ties plain decoding: keep plain.
    assert plan(StepCost(linear), [ngram_option(linear, 1.0)]).name is None


def test_per_step_overhead_favours_speculation() -> None:
    # A fixed cost per step (Python, the policy) is shared by more tokens when a step yields more.
    option = ngram_option(CPU, 0.45)
    assert plan(StepCost(CPU), [option]).name is None
    with_overhead = Option("ngram", option.accept, StepCost(CPU, overhead=1.0), option.k_max)
    assert plan(StepCost(CPU, overhead=1.0), [with_overhead]).name == "ngram"


def test_break_even_acceptance() -> None:
    assert break_even(StepCost(GPU, 0.0, 0.1, 0.1), 4) < 0.35
    cpu_ngram = break_even(StepCost(CPU), 3)
    assert 0.6 < cpu_ngram < 0.8
    assert expected_tokens([cpu_ngram], 3) == pytest.approx(CPU(4), rel=1e-6)
    assert math.isinf(break_even(StepCost(CPU, 0.0, 0.65, 0.65), 3))


# --- stopping a model draft on its confidence ----------------------------------------------------


def test_early_stop_keeps_confident_tokens_on_a_flat_curve_and_stops_on_doubt() -> None:
    stop = EarlyStop(StepCost(GPU, 0.0, 0.1, 0.1), [0.9] * K_MAX)
    assert all(stop.keep(i, 0.9) for i in range(6))
    assert not stop.keep(6, 0.05)


def test_early_stop_is_stricter_on_a_steep_curve() -> None:
    ahead = [0.5] * K_MAX
    gpu, cpu = EarlyStop(StepCost(GPU, 0.0, 0.1, 0.1), ahead), EarlyStop(StepCost(CPU, 0.0, 0.1, 0.1), ahead)
    assert gpu.keep(0, 0.5)
    assert not cpu.keep(0, 0.5)
    assert EarlyStop(StepCost(CPU, 0.0, 0.1, 0.1), ahead).keep(0, 0.95)


def test_early_stop_accounts_for_the_chance_of_reaching_a_token() -> None:
    stop = EarlyStop(StepCost(GPU, 0.0, 0.2, 0.2), [0.6] * K_MAX)
    kept = 0
    while kept < K_MAX and stop.keep(kept, 0.6):
        kept += 1
    # Each token is reached with 0.6^i: a few are worth it, not all of them.
    assert 1 <= kept <= 5


def test_early_stop_looks_past_a_token_that_does_not_pay_alone() -> None:
    # Verifying a second position costs a whole token here, later ones nothing: a run pays.
    step = Curve((1.0, 2.0, *([2.0] * K_MAX)))
    cost = StepCost(step, 0.0, 0.1, 0.1)
    assert EarlyStop(cost, [0.9] * K_MAX).keep(0, 0.9)
    assert not EarlyStop(cost, [0.0] * K_MAX).keep(0, 0.9)  # nothing would follow it
    assert not EarlyStop(cost, [0.9] * K_MAX, k_max=1).keep(0, 0.9)  # no room for more


# --- acceptance estimates -------------------------------------------------------------------------


def test_estimates_start_at_the_prior_and_follow_the_history() -> None:
    est = PositionalAcceptance(0.6, caution=0.0)
    assert est.estimates()[:3] == pytest.approx([0.6, 0.6, 0.6])
    for _ in range(30):
        est.observe(accepted=4, judged=4)
    assert min(est.estimates()[:4]) > 0.9
    for _ in range(30):
        est.observe(accepted=0, judged=4)
    assert est.estimates()[0] < 0.2


def test_a_rejection_stops_observation_at_that_position() -> None:
    est = PositionalAcceptance(0.5, strength=1.0, caution=0.0)
    for _ in range(50):
        est.observe(accepted=1, judged=4)
    p = est.estimates()
    assert p[0] > 0.9 and p[1] < 0.1
    assert est.seen[2] == 0.0  # never reached: nothing is known of position 2 but what position 1 shows
    assert p[2] == pytest.approx(p[1])


def test_deep_positions_inherit_shallow_ones() -> None:
    est = PositionalAcceptance(0.3)
    for _ in range(20):
        est.observe(accepted=2, judged=2)  # positions 0 and 1 always accepted, deeper never tried
    p = est.estimates()
    assert p[5] > 0.9


def test_recent_steps_weigh_more_than_old_ones() -> None:
    est = PositionalAcceptance(0.5, decay=0.8)
    for _ in range(100):
        est.observe(accepted=1, judged=1)
    for _ in range(10):
        est.observe(accepted=0, judged=1)
    assert est.estimates()[0] < 0.3


def test_unused_estimates_drift_back_to_the_prior() -> None:
    est = PositionalAcceptance(0.7, caution=0.0)
    for _ in range(20):
        est.observe(accepted=0, judged=3)
    low = est.estimates()[0]
    est.forget(0.01)
    assert low < 0.2 and est.estimates()[0] > 0.6


def _full_means(est: PositionalAcceptance) -> list[float]:
    """Every position worked out in turn, as the estimator did before it stopped at the deepest seen."""
    out, anchor = [], est.prior
    for i, (h, s) in enumerate(zip(est.hits, est.seen, strict=True)):
        if i == 1 and est.then is not None:
            anchor = est.then
        anchor = (h + est.strength * anchor) / (s + est.strength)
        out.append(anchor)
    return out


@pytest.mark.parametrize(("then", "strength"), [(None, 1.0), (0.85, 1.0), (None, 20.0), (0.9, 3.0)])
def test_estimates_worked_out_to_the_deepest_observed_position_equal_the_full_ones(
    then: float | None, strength: float
) -> None:
    rng = random.Random(7)
    est = PositionalAcceptance(0.6, then=then, strength=strength)
    assert est.means() == pytest.approx(_full_means(est), rel=1e-12)
    for _ in range(300):
        if rng.random() < 0.3:
            est.forget(0.98)
        else:
            judged = rng.randint(1, 20)
            est.observe(rng.randint(0, judged), judged, first=rng.choice((0, 0, 0, 1)))
        means = est.means()
        assert len(means) == len(est.hits)
        assert means == pytest.approx(_full_means(est), rel=1e-12)


def test_confidence_map_learns_how_confidence_relates_to_acceptance() -> None:
    conf = ConfidenceMap()
    assert conf.acceptance(0.9, fallback=0.7) == pytest.approx(0.7)
    for _ in range(40):
        conf.observe([0.99, 0.97, 0.2], accepted=2)  # sure tokens accepted, the unsure one not
    assert conf.acceptance(0.98, fallback=0.5) > 0.9
    assert conf.acceptance(0.1, fallback=0.5) < 0.1
    conf.observe([0.5], accepted=1)
    assert conf.seen[conf.bucket(0.5)] == 1.0


def test_ngram_keys_group_match_lengths_and_runs_of_copying() -> None:
    assert ngram_key(2, 0) == "ngram/2/0"
    assert ngram_key(5, 1) == "ngram/4/1"
    assert ngram_key(8, 7) == "ngram/6/1"
    assert ngram_key(12, 0) == "ngram/12/0"
    assert ngram_key(31, 1) == "ngram/24/1"
    assert ngram_prior("ngram/6/1") > ngram_prior("ngram/6/0") > ngram_prior("ngram/2/0")
    assert ngram_prior("ngram/24/0") > ngram_prior("ngram/12/0") > ngram_prior("ngram/6/0")
    assert all(ngram_prior(f"ngram/{n}/1") <= NGRAM_PRIOR_MAX for n in (2, 3, 4, 6, 12, 24))


def test_the_longer_the_match_the_longer_its_copy_is_expected_to_run() -> None:
    runs = [ngram_continue_prior(f"ngram/{n}/0") for n in (2, 6, 12, 24)]
    assert runs == sorted(runs) and runs[0] < runs[-1]


def test_a_run_may_continue_more_surely_than_it_starts() -> None:
    est = PositionalAcceptance(0.3, then=0.85, caution=0.0)
    assert est.estimates()[:3] == pytest.approx([0.3, 0.85, 0.85])


def test_position_zero_is_cautious_until_evidence_builds_up() -> None:
    est = PositionalAcceptance(0.8)
    first = est.estimates()[0]
    assert first < 0.6  # the prior alone is not evidence
    for _ in range(40):
        est.observe(accepted=1, judged=1)
    learnt = est.estimates()[0]
    assert learnt > 0.85 and learnt < est.means()[0]
    assert est.estimates()[1] == est.means()[1]  # deeper positions are not discounted


# --- measured over planned ------------------------------------------------------------------------


def test_efficiency_starts_as_planned_and_follows_steps_that_fall_short() -> None:
    eff = Efficiency()
    assert eff.value == 1.0
    planned = Plan("draft", 3, 3.0, 1.0)
    for _ in range(40):
        eff.observe(planned, tokens=2, seconds=1.5)  # 2/3 of the tokens in 1.5x the time
    # Between the plan (1) and the measurements (0.44), nearer the measurements.
    assert (2 / 3) / 1.5 < eff.value < 0.6
    eff.forget(0.0)
    assert eff.value == 1.0


def test_efficiency_is_bounded_and_ignores_empty_plans() -> None:
    eff = Efficiency(bounds=(0.5, 1.1))
    eff.observe(Plan(None, 0, 0.0, 1.0), tokens=5, seconds=1.0)
    assert eff.value == 1.0
    for _ in range(30):
        eff.observe(Plan("ngram", 4, 2.0, 1.0), tokens=1, seconds=10.0)
    assert eff.value == 0.5
    for _ in range(60):
        eff.observe(Plan("ngram", 4, 2.0, 1.0), tokens=5, seconds=0.5)
    assert eff.value == 1.1


def test_a_drafter_that_has_fallen_short_must_look_that_much_better() -> None:
    good = draft_option(GPU, 0.6, 0.2)  # expected to run 1.36x plain decoding
    assert plan(StepCost(GPU), [good]).name == "draft"
    shortfall = Option(good.name, good.accept, good.cost, good.k_max, efficiency=0.7)
    assert plan(StepCost(GPU), [shortfall]).name is None
    ngram = ngram_option(GPU, 0.5)
    assert plan(StepCost(GPU), [shortfall, ngram]).name == "ngram"
