"""Sampling and acceptance as pure functions, with exact and statistical checks (no model)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from localspec.engine.sampling import greedy_accept, probabilities, rejection_sample, sample
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


def test_sample_is_reproducible_for_a_seed() -> None:
    p = np.array([0.2, 0.3, 0.5])
    a = [sample(p, np.random.default_rng(3)) for _ in range(5)]
    b = [sample(p, np.random.default_rng(3)) for _ in range(5)]
    assert a == b


def _verify_many(p: list[np.ndarray], q: np.ndarray | None, n: int, seed: int) -> np.ndarray:
    """Draw n one-token drafts from q (or the point mass at token 0) and return the first output token."""
    rng = np.random.default_rng(seed)
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        drafted = 0 if q is None else sample(q, rng)
        verdict = rejection_sample([drafted], [q], p, rng)
        out[i] = drafted if verdict.n_accepted == 1 else verdict.next_token
    return out


@pytest.mark.parametrize("q", [np.array([0.7, 0.1, 0.1, 0.1]), np.array([0.05, 0.05, 0.1, 0.8]), None])
def test_rejection_sampling_output_follows_the_target(q: np.ndarray | None) -> None:
    p = [np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.25, 0.25, 0.25, 0.25])]
    n = 20_000
    counts = np.bincount(_verify_many(p, q, n, seed=11), minlength=4)
    result = stats.chisquare(counts, p[0] * n)
    assert result.pvalue > 1e-3, (counts, result)


def test_rejection_sampling_with_equal_distributions_accepts_everything() -> None:
    p = np.array([0.5, 0.5])
    rng = np.random.default_rng(0)
    for _ in range(200):
        verdict = rejection_sample([1, 0], [p, p], [p, p, p], rng)
        assert verdict.n_accepted == 2


def test_a_token_the_target_cannot_produce_is_always_rejected() -> None:
    p = [np.array([0.0, 1.0]), np.array([0.5, 0.5])]
    rng = np.random.default_rng(0)
    verdict = rejection_sample([0], [None], p, rng)
    assert verdict == verdict.__class__(0, 1)
