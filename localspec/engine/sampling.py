"""Sampling and speculative acceptance as pure functions over arrays.

The target's distribution is defined once, by `probabilities` (temperature,
then top-k, top-p and min-p, then renormalise). Greedy verification keeps the
longest prefix of the draft that matches the target's argmax. Sampled
verification is standard speculative rejection sampling (Leviathan et al. 2023,
Chen et al. 2023): accept drafted token x with probability min(1, p(x)/q(x));
on the first rejection, sample from normalize(max(0, p - q)); if every drafted
token is accepted, sample one more from the target's next distribution. The
output then follows p exactly, whatever q is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from localspec.types import SamplingParams

FloatArray = npt.NDArray[np.floating]


def probabilities(logits: FloatArray, params: SamplingParams) -> npt.NDArray[np.float64]:
    """The distribution the target samples from: float64, sums to 1, zero outside the kept set."""
    scaled = np.asarray(logits, dtype=np.float64) / max(params.temperature, 1e-6)
    keep = np.ones(scaled.shape[0], dtype=bool)
    if 0 < params.top_k < scaled.shape[0]:
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        keep &= scaled >= kth
    scaled = np.where(keep, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
        probs /= probs.sum()
    return probs


def _top_p(probs: npt.NDArray[np.float64], top_p: float) -> npt.NDArray[np.float64]:
    order = np.argsort(-probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    # Keep the smallest prefix whose mass reaches top_p (always at least one token).
    n_keep = int(np.searchsorted(cumulative, top_p) + 1)
    kept = np.zeros_like(probs)
    kept[order[:n_keep]] = probs[order[:n_keep]]
    return kept / kept.sum()


def sample(probs: npt.NDArray[np.float64], rng: np.random.Generator) -> int:
    """One draw from a normalised distribution (inverse CDF: one uniform per draw, reproducible)."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), probs.shape[0] - 1))


def greedy_accept(draft: Sequence[int], target_argmax: Sequence[int]) -> int:
    """How many drafted tokens match the target's greedy choices, counting from the first."""
    n = 0
    for drafted, wanted in zip(draft, target_argmax, strict=False):
        if drafted != wanted:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one draft: accepted prefix length and the token the target adds."""

    n_accepted: int
    next_token: int


def rejection_sample(
    draft: Sequence[int],
    draft_probs: Sequence[npt.NDArray[np.float64] | None],
    target_probs: Sequence[npt.NDArray[np.float64]],
    rng: np.random.Generator,
) -> Verdict:
    """Verify a sampled draft so that the result is distributed exactly as the target.

    `target_probs` has len(draft) + 1 rows: the target's distribution before each
    drafted token and after the last. `draft_probs[i]` is the distribution the
    drafter sampled token i from, or None for a deterministic draft (a point mass,
    as n-gram lookup proposes).
    """
    for i, token in enumerate(draft):
        p = target_probs[i]
        q = draft_probs[i]
        q_token = 1.0 if q is None else float(q[token])
        if q_token > 0.0 and rng.random() * q_token < p[token]:
            continue
        return Verdict(i, sample(_residual(p, q, token), rng))
    return Verdict(len(draft), sample(target_probs[len(draft)], rng))


def _residual(
    p: npt.NDArray[np.float64], q: npt.NDArray[np.float64] | None, token: int
) -> npt.NDArray[np.float64]:
    if q is None:
        residual = p.copy()
        residual[token] = 0.0
    else:
        residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    # p == q exactly leaves no mass; then any draw from p is correct (the rejection had probability 0).
    return residual / total if total > 0 else p
