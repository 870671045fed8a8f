"""Sampling and acceptance as pure functions, with exact and statistical checks (no model)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from localspec.engine.sampling import Dist, Draws, distribution, greedy_accept, probabilities, sample_at
from localspec.types import SamplingParams


def test_probabilities_temperature_sharpens_and_flattens() -> None:
    logits = np.array([2.0, 1.0, 0.0], dtype=np.float32)
    cold = probabilities(logits, SamplingParams(temperature=0.5))
    hot = probabilities(logits, SamplingParams(temperature=2.0))
    base = probabilities(logits, SamplingParams(temperature=1.0))
    assert cold[0] > base[0] > hot[0]
    assert np.allclose(base, np.exp(logits) / np.exp(logits).sum())
    for p in (cold, hot, base):
        assert p.sum() == pytest.approx(1.0)


def test_top_k_top_p_min_p_cut_the_tail() -> None:
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.1]))
    top_k = probabilities(logits, SamplingParams(temperature=1.0, top_k=2))
    assert np.count_nonzero(top_k) == 2 and top_k[0] == pytest.approx(2 / 3)
    top_p = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert np.count_nonzero(top_p) == 2  # 0.5 + 0.25 reaches 0.7
    min_p = probabilities(logits, SamplingParams(temperature=1.0, min_p=0.35))
    assert np.count_nonzero(min_p) == 2  # 0.15 < 0.35 * 0.5
    assert probabilities(logits, SamplingParams(temperature=1.0, top_p=0.01))[0] == 1.0


def test_greedy_accept_counts_the_matching_prefix() -> None:
    assert greedy_accept([1, 2, 3], [1, 2, 3, 4]) == 3
    assert greedy_accept([1, 2, 3], [1, 5, 3, 4]) == 1
    assert greedy_accept([7], [1, 2]) == 0
    assert greedy_accept([], [9]) == 0


def test_a_seed_gives_each_position_its_own_uniform() -> None:
    draws = Draws(3)
    assert draws.at(7) == Draws(3).at(7)  # reproducible
    assert draws.at(7) != draws.at(8) and draws.at(7) != Draws(4).at(7)
    spread = np.array([draws.at(i) for i in range(4000)])
    assert stats.kstest(spread, "uniform").pvalue > 1e-3
    assert abs(np.corrcoef(spread[:-1], spread[1:])[0, 1]) < 0.06  # neighbours independent
    seeds = np.array([Draws(seed).at(0) for seed in range(4000)])  # and one position across seeds
    assert stats.kstest(seeds, "uniform").pvalue > 1e-3


def _reference(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The definition, written the slow way: temperature, top-k, a stable sort of the whole
    vocabulary for top-p, min-p, each renormalised."""
    scaled = np.asarray(logits, dtype=np.float64) / max(params.temperature, 1e-6)
    if 0 < params.top_k < scaled.shape[0]:
        scaled = np.where(scaled >= np.sort(scaled)[-params.top_k], scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        n_keep = int(np.searchsorted(np.cumsum(probs[order]), params.top_p) + 1)
        kept = np.zeros_like(probs)
        kept[order[:n_keep]] = probs[order[:n_keep]]
        probs = kept / kept.sum()
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
        probs /= probs.sum()
    return probs


def _logits(kind: str, rng: np.random.Generator, size: int = 151_936) -> np.ndarray:
    if kind == "peaked":  # a few tokens hold the mass, as in code
        x = rng.standard_normal(size) * 2.0
        x[rng.choice(size, 5, replace=False)] += 14.0
    elif kind == "flat":  # prose at temperature 1: top-p needs thousands of tokens
        x = rng.standard_normal(size) * 0.3
    elif kind == "ties":  # quantised logits: many exact ties at every cut
        x = np.round(rng.standard_normal(size) * 2.0, 1)
    else:  # a grammar's mask: most of the vocabulary at -inf
        x = rng.standard_normal(size) * 2.0
        x[rng.random(size) < 0.999] = -np.inf
    return x.astype(np.float32)


@pytest.mark.parametrize("kind", ["peaked", "flat", "ties", "masked"])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_p=0.95),
        SamplingParams(temperature=0.8, top_k=40, top_p=0.9),
        SamplingParams(temperature=1.3, top_p=0.5, min_p=0.05),
        SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=0.9, min_p=0.1),
    ],
    ids=lambda p: f"t{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}",
)
def test_the_fast_distribution_keeps_the_definitions_tokens_and_mass(
    kind: str, params: SamplingParams
) -> None:
    logits = _logits(kind, np.random.default_rng(len(kind)))
    want = _reference(logits, params)
    got = distribution(logits, params)
    assert np.array_equal(
        np.flatnonzero(got.dense()), np.flatnonzero(want)
    )  # the same kept set, ties and all
    assert np.allclose(got.dense(), want, rtol=1e-5, atol=1e-12)  # float32 over the vocabulary
    assert got.dense().sum() == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["peaked", "flat", "ties", "masked"])
def test_the_kept_set_holds_where_the_vocabulary_is_not_a_whole_number_of_blocks(kind: str) -> None:
    # Top-k and top-p look at strided blocks of the vocabulary first; 100,003 tokens leave a tail.
    logits = _logits(kind, np.random.default_rng(11), size=100_003)
    logits[-1] = logits.max() + 1.0  # the most probable token in the tail past the last block
    for params in (SamplingParams(temperature=0.8, top_k=40), SamplingParams(temperature=0.7, top_p=0.95)):
        want = _reference(logits, params)
        assert np.array_equal(np.flatnonzero(distribution(logits, params).dense()), np.flatnonzero(want))


def test_a_draw_from_the_support_is_the_draw_from_the_whole_vocabulary() -> None:
    dense = _reference(_logits("ties", np.random.default_rng(5)), SamplingParams(temperature=1.0, top_p=0.9))
    dist = Dist.from_dense(dense)
    cdf = np.cumsum(dense)
    for u in np.random.default_rng(6).random(500):
        want = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        assert sample_at(dist, u) == want


def test_a_distribution_kept_by_its_support_gives_back_the_dense_vector_and_its_top() -> None:
    dist = Dist.from_dense(np.array([0.0, 0.5, 0.0, 0.25, 0.25]))
    assert dist.top() == 0.5
    assert np.array_equal(dist.dense(), [0.0, 0.5, 0.0, 0.25, 0.25])


def _verify(draft: list[int], p: list[Dist], draws: Draws) -> tuple[int, int]:
    """As the engine verifies a sampled draft: (tokens kept, the token the target adds)."""
    for i, token in enumerate(draft):
        drawn = sample_at(p[i], draws.at(i))
        if drawn != token:
            return i, drawn
    return len(draft), sample_at(p[len(draft)], draws.at(len(draft)))


def _first_tokens(p: list[np.ndarray], q: np.ndarray | None, n: int) -> tuple[np.ndarray, float]:
    """n requests (seeds) with a one-token draft from q drawn with the position's uniform, or the
    point mass at token 0: the first output token of each, and how often the draft was kept."""
    rows = [Dist.from_dense(row) for row in p]
    q_dist = None if q is None else Dist.from_dense(q)
    out = np.empty(n, dtype=np.int64)
    kept_count = 0
    for seed in range(n):
        draws = Draws(seed)
        drafted = 0 if q_dist is None else sample_at(q_dist, draws.at(0))
        kept, token = _verify([drafted], rows, draws)
        out[seed] = drafted if kept == 1 else token
        kept_count += kept
    return out, kept_count / n


@pytest.mark.parametrize("q", [np.array([0.7, 0.1, 0.1, 0.1]), np.array([0.05, 0.05, 0.1, 0.8]), None])
def test_sampled_verification_output_follows_the_target(q: np.ndarray | None) -> None:
    p = [np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.25, 0.25, 0.25, 0.25])]
    n = 20_000
    tokens, kept = _first_tokens(p, q, n)
    result = stats.chisquare(np.bincount(tokens, minlength=4), p[0] * n)
    assert result.pvalue > 1e-3, result
    # A point mass is kept with probability p(token), as rejection sampling keeps it; a draft drawn
    # with the same uniform, where both draws land on one token: their intervals' overlap in the CDFs.
    if q is None:
        expected = p[0][0]
    else:
        hi, lo = (
            np.minimum(np.cumsum(p[0]), np.cumsum(q)),
            np.maximum(np.cumsum(p[0]) - p[0], np.cumsum(q) - q),
        )
        expected = float(np.clip(hi - lo, 0.0, None).sum())
    assert kept == pytest.approx(expected, abs=0.01)


def test_a_draft_drawn_from_the_targets_own_distribution_is_always_kept() -> None:
    p = Dist.from_dense(np.array([0.5, 0.5]))
    for seed in range(200):
        draws = Draws(seed)
        draft = [sample_at(p, draws.at(0)), sample_at(p, draws.at(1))]
        assert _verify(draft, [p, p, p], draws)[0] == 2


def test_a_token_the_target_cannot_produce_is_never_kept() -> None:
    p = [Dist.from_dense(np.array([0.0, 1.0])), Dist.from_dense(np.array([0.5, 0.5]))]
    for seed in range(50):
        assert _verify([0], p, Draws(seed)) == (0, 1)
