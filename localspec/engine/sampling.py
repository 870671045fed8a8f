"""Sampling and speculative acceptance as pure functions over arrays.

The target's distribution is defined once, by `distribution` (temperature,
then top-k, top-p and min-p, then renormalise). Greedy verification keeps the
longest prefix of the draft that matches the target's argmax. Sampled
verification does the same with the target's draws: each position's token is
drawn with that position's uniform (`Draws`), and a drafted token is kept where
it is the target's draw. The output is the target's own samples, whatever
drafted them.

Sampling runs once per generated token and once per verified position, so it
must cost little beside a decode: a stable sort of 152k float64 probabilities
for top-p took 14-22 ms a token on a 2-core CPU that decodes in 28 ms. So the
vocabulary is passed over in float32 (llama.cpp's samplers' precision) with no
sort: top-k and min-p are thresholds, top-p sorts only the most probable tokens,
as many as reach its mass, and a distribution keeps only its support (`Dist`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from localspec.types import SamplingParams, TokenLogprob

FloatArray = npt.NDArray[np.floating]
IdArray = npt.NDArray[np.intp]

# How many of the most probable tokens top-p sorts first; each time their mass falls short, 8x more.
TOP_P_FIRST = 64
# A top-k or top-p selection looks at the blocks of this many tokens that hold the largest logits.
NEAR = 64
# A draw over the whole vocabulary finds its block of this many tokens first, then the token in it.
BLOCK = 1024
# The largest logit a penalty leaves (see `adjusted`).
LOGIT_BOUND = np.float32(1e30)


@dataclass(frozen=True)
class Dist:
    """A distribution over a vocabulary of `size` tokens: token ids[j] has weights[j] / total.

    `ids` ascend; None stands for the whole vocabulary (weights[token] is the token's own).
    `blocks`, where given, is the cumulative sum of the weights by blocks of BLOCK (its last is the
    total): a draw over the whole vocabulary reads it instead of passing over the weights again."""

    ids: IdArray | None
    weights: FloatArray
    total: float
    size: int
    blocks: npt.NDArray[np.float64] | None = None

    @classmethod
    def from_dense(cls, probs: FloatArray) -> Dist:
        dense = np.asarray(probs, dtype=np.float64)
        ids = np.flatnonzero(dense > 0.0)
        return cls(ids, dense[ids], float(dense[ids].sum()), dense.shape[0])

    def dense(self) -> npt.NDArray[np.float64]:
        if self.ids is None:
            return np.asarray(self.weights, dtype=np.float64) / self.total
        out = np.zeros(self.size, dtype=np.float64)
        out[self.ids] = self.weights / self.total
        return out

    def top(self) -> float:
        return float(self.weights.max()) / self.total


def distribution(logits: FloatArray, params: SamplingParams) -> Dist:
    """The distribution the target samples from."""
    x = np.asarray(logits, dtype=np.float32)
    size = x.shape[0]
    inv_t = 1.0 / max(params.temperature, 1e-6)
    top = float(x.max())
    top_k = params.top_k if 0 < params.top_k < size else 0
    if not top_k and params.top_p >= 1.0 and params.min_p <= 0.0:
        weights = x - np.float32(top)
        weights *= np.float32(inv_t)
        np.exp(weights, out=weights)
        blocks = _block_cdf(weights)
        return Dist(None, weights, float(blocks[-1]), size, blocks)
    if top_k:
        ids = _at_least(x, top_k)
        probs = _normalised(x[ids], top, inv_t)
        if params.top_p < 1.0:
            ids, probs = _top_p_of(ids, probs, np.asarray(x[ids]), params.top_p)
    elif params.top_p < 1.0:
        ids, probs = _top_p(x, top, inv_t, params.top_p)
    else:  # min-p alone: p >= min_p * p_max is a threshold on the logit (loosened: min-p cuts below)
        ids = np.flatnonzero(x >= top + np.log(params.min_p) / inv_t - 1e-3)
        probs = _normalised(x[ids], top, inv_t)
    if params.min_p > 0.0:
        keep = probs >= params.min_p * probs.max()
        ids, probs = ids[keep], _renormalised(probs[keep])
    nonzero = probs > 0.0  # tokens a grammar masked to -inf
    if not nonzero.all():
        ids, probs = ids[nonzero], _renormalised(probs[nonzero])
    return Dist(ids, probs, 1.0, size)


def adjusted(
    logits: npt.NDArray[np.float32], params: SamplingParams, before: Sequence[int], ahead: Sequence[int] = ()
) -> npt.NDArray[np.float32]:
    """`logits` with the request's logit bias and the repetition penalties of the position after
    `before` + `ahead` applied, as llama.cpp's logit-bias and penalties samplers apply them
    (llama_sampler_penalties_apply), in float32.

    The window is the sequence's last repeat_last_n tokens, the prompt's included (llama-server
    feeds its sampler the prompt). In a verify, `ahead` is the draft before the position judged: a
    drafted token is judged as the target alone judges it after the tokens before it. A copy where
    anything changes: the logits passed in are llama.cpp's own buffer."""
    if params.logit_bias:
        logits = _biased(logits, params.logit_bias)
    if not params.penalized:
        return logits
    n = params.repeat_last_n if params.repeat_last_n > 0 else len(before) + len(ahead)
    window = [*before[max(0, len(before) - n) :], *ahead][-n:]
    ids, counts = np.unique(np.asarray(window, dtype=np.intp), return_counts=True)
    in_vocab = ids < logits.shape[0]  # a draft model's vocabulary may end before the target's
    ids, counts = ids[in_vocab], counts[in_vocab]
    if not ids.size:
        return logits
    out = logits if params.logit_bias else np.array(logits, dtype=np.float32)  # the bias made a copy
    seen = out[ids]
    # A penalty too small for float32 would divide by zero; a logit divided past LOGIT_BOUND is held
    # there, so no logit becomes infinite and a distribution's arithmetic (a difference, times 1 /
    # temperature) stays within float32.
    repeat = np.float32(max(params.repeat_penalty, float(np.finfo(np.float32).tiny)))
    with np.errstate(over="ignore"):
        seen = np.where(seen <= 0, seen * repeat, seen / repeat)
    np.clip(seen, -LOGIT_BOUND, LOGIT_BOUND, out=seen)
    seen -= counts.astype(np.float32) * np.float32(params.frequency_penalty) + np.float32(
        params.presence_penalty
    )
    out[ids] = seen
    return out


def token_logprob(logits: FloatArray, token: int, n_top: int, piece: Callable[[int], bytes]) -> TokenLogprob:
    """`token`'s log-probability under the softmax of `logits`, with the `n_top` most probable tokens
    (ties by id). `piece`: the bytes shown for a token (LlamaModel.shown_piece)."""
    x = np.asarray(logits, dtype=np.float32)
    top = float(x.max())
    shifted = x - np.float32(top)
    log_total = top + math.log(float(np.exp(shifted, out=shifted).sum(dtype=np.float64)))

    def entry(t: int) -> TokenLogprob:
        return token_entry(t, piece(t), float(x[t]) - log_total)

    alternatives: tuple[TokenLogprob, ...] = ()
    if n_top > 0:
        ids = _at_least(x, min(n_top, x.shape[0]))
        order = np.lexsort((ids, -x[ids]))[:n_top]
        alternatives = tuple(entry(int(t)) for t in ids[order])
    return replace(entry(token), top=alternatives)


def token_entry(token: int, shown: bytes, logprob: float | None) -> TokenLogprob:
    """`token` shown as `shown` (its bytes, LlamaModel.shown_piece), with `logprob` and no alternatives."""
    return TokenLogprob(token, shown.decode("utf-8", errors="replace"), shown, logprob)


def _biased(logits: npt.NDArray[np.float32], bias: Sequence[tuple[int, float]]) -> npt.NDArray[np.float32]:
    """A copy of `logits` with each (token, bias) added (a token past the vocabulary left out: a
    draft model's may end before the target's, which the request was checked against)."""
    out = np.array(logits, dtype=np.float32)
    for token, value in bias:
        if 0 <= token < out.shape[0]:
            out[token] += np.float32(value)
    return out


def probabilities(logits: FloatArray, params: SamplingParams) -> npt.NDArray[np.float64]:
    """`distribution` over the whole vocabulary (zeros outside the kept set)."""
    return distribution(logits, params).dense()


def _normalised(kept: FloatArray, top: float, inv_t: float) -> npt.NDArray[np.float64]:
    return _renormalised(np.exp((np.asarray(kept, dtype=np.float64) - top) * inv_t))


def _renormalised(probs: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return probs / probs.sum()


def _top_p(x: FloatArray, top: float, inv_t: float, top_p: float) -> tuple[IdArray, npt.NDArray[np.float64]]:
    """Top-p over the whole vocabulary without sorting it: the most probable m tokens, m growing."""
    n = x.shape[0]
    scaled = x - np.float32(top)
    scaled *= np.float32(inv_t)
    total = float(np.exp(scaled, out=scaled).sum(dtype=np.float64))
    m = min(n, TOP_P_FIRST)
    while True:
        ids = _at_least(x, m)
        probs = np.exp((np.asarray(x[ids], dtype=np.float64) - top) * inv_t) / total
        kept = _top_p_prefix(probs, np.asarray(x[ids]), top_p, whole=m >= n)
        if kept is not None:
            return ids[kept], _renormalised(probs[kept])
        m *= 8


def _at_least(x: FloatArray, m: int) -> IdArray:
    """Every token whose logit is at least the m-th largest, ties included (as a threshold keeps them).

    A selection over the whole vocabulary copies it (600 KB) a token: the selection runs over the
    blocks (every blocks-th token, NEAR of them) whose maximum is among the m largest maxima. The
    m-th largest logit is at least the m-th largest maximum, so every token it keeps lies in those
    blocks. Strided blocks make the maxima an elementwise max of NEAR contiguous rows."""
    n = x.shape[0]
    blocks = n // NEAR
    if m >= n or 4 * m > blocks:
        return np.arange(n) if m >= n else _top_m(x, m)
    near = _top_m(x[: blocks * NEAR].reshape(NEAR, blocks).max(axis=0), m)
    ids = (np.arange(NEAR)[:, None] * blocks + near).ravel()
    if blocks * NEAR < n:  # the tokens past the last whole block: every one looked at
        ids = np.concatenate([ids, np.arange(blocks * NEAR, n)])
    return np.sort(ids[_top_m(x[ids], m)])


def _top_m(values: npt.NDArray[np.float32], m: int) -> IdArray:
    """Positions (ascending) of the values at least the m-th largest, ties included (m < len)."""
    cut = values.shape[0] - m
    return np.flatnonzero(values >= np.partition(values, cut)[cut])


def _top_p_of(
    ids: IdArray, probs: npt.NDArray[np.float64], logits: FloatArray, top_p: float
) -> tuple[IdArray, npt.NDArray[np.float64]]:
    kept = _top_p_prefix(probs, logits, top_p, whole=True)
    assert kept is not None
    return ids[kept], _renormalised(probs[kept])


def _top_p_prefix(
    probs: npt.NDArray[np.float64], logits: FloatArray, top_p: float, whole: bool
) -> IdArray | None:
    """Positions (ascending) of the most probable tokens whose mass first reaches top_p, at least one;
    None if these candidates do not reach it and are not the `whole` distribution.

    Ordered by logit, ties by position (token id), as a stable sort of the probabilities orders them."""
    order = np.argsort(-logits, kind="stable")
    cut = int(np.searchsorted(np.cumsum(probs[order]), top_p))
    if cut >= order.shape[0] and not whole:
        return None
    return np.sort(order[: cut + 1])


def sample_at(dist: Dist, u: float) -> int:
    """The token at `u` in [0, 1) of the distribution's CDF, the token ids taken in order."""
    weights = dist.weights
    n = weights.shape[0]
    if n <= 4 * BLOCK:
        cdf = np.cumsum(weights, dtype=np.float64)
        j = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    else:  # a cumulative sum over 152k tokens costs 1 ms: find the block, then the token in it
        block_cdf = _block_cdf(weights) if dist.blocks is None else dist.blocks
        v = u * block_cdf[-1]
        b = min(int(np.searchsorted(block_cdf, v, side="right")), block_cdf.shape[0] - 1)
        before = float(block_cdf[b - 1]) if b else 0.0
        inner = before + np.cumsum(weights[b * BLOCK : (b + 1) * BLOCK], dtype=np.float64)
        # Within the block even where its sums round a hair apart from the blocks' total.
        j = b * BLOCK + min(int(np.searchsorted(inner, v, side="right")), inner.shape[0] - 1)
    j = min(j, n - 1)
    return j if dist.ids is None else int(dist.ids[j])


def _block_cdf(weights: FloatArray) -> npt.NDArray[np.float64]:
    return np.cumsum(np.add.reduceat(weights, np.arange(0, weights.shape[0], BLOCK), dtype=np.float64))


class Draws:
    """The uniforms a request draws its tokens with: one per position of the sequence, from its seed.

    The target draws the token at a position with that position's uniform, whichever step decides
    it, and a draft model draws its guess for the position with the same one. A drafted token is
    kept where it is the token the target draws there. The output is then the target's own draws,
    distributed exactly as the target's, whatever drafted it: a seed gives one text whether none,
    n-gram lookup, a draft model or auto decoded it, however auto's timing made it choose (until a
    batched verify's rounding, a few percent of a probability on a CPU, moves a draw across a
    token's edge). An n-gram's token is kept with probability p(token), as rejection sampling
    keeps a point mass; a draft model's, where both draws land on one token: measured on the
    Qwen2.5-Coder 0.5B drafting for the 1.5B, 0.873 of tokens against rejection sampling's 0.885.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._key = _mix(seed & _MASK64)

    def at(self, position: int) -> float:
        # A counter-based generator (SplitMix64's finaliser over the seed's key and the position):
        # a few integer operations, where a numpy Generator per position cost 90 us a token between
        # decodes.
        return (_mix((self._key + position * _GOLDEN) & _MASK64) >> 11) * 2.0**-53


_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(z: int) -> int:
    """SplitMix64's finaliser: every bit of the 64-bit input moves about half the output's bits."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def greedy_accept(draft: Sequence[int], target_argmax: Sequence[int]) -> int:
    """How many drafted tokens match the target's greedy choices, counting from the first."""
    n = 0
    for drafted, wanted in zip(draft, target_argmax, strict=False):
        if drafted != wanted:
            break
        n += 1
    return n
