"""Lossless up to rounding, checked: every divergence from the target alone must be a near-tie.

With llama.cpp's own loading (the default), a batched verify rounds a little differently from
one-token decoding, so greedy speculative output may leave the target alone's path. That is
lossless "up to float rounding" only where the target alone's own choice was a near-tie: its
logit for the token it chose exceeds the logit of the token the method chose by no more than
the batched kernels can move a logit gap (the rounding margin, measured on this machine).
A divergence past that margin would be a bug, and `explain` reports it as unexplained.

Pure helpers over token lists and logit rows, and thin measurements over a LlamaModel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from localspec.engine.llama import LlamaModel

# The rivals of the top token whose gap shifts are measured: the nearest four decide every
# greedy choice that rounding could flip (a fifth-best token is never within rounding).
RIVALS = 4


@dataclass(frozen=True)
class Divergence:
    """Where a method's greedy output first left the target alone's, and whether rounding explains it."""

    position: int  # index into the generated tokens
    alone: int  # the token the target alone chose there
    got: int  # the token the method's output has there
    gap: float  # logit[alone] - logit[got] in the target alone's row: what rounding had to overturn
    top_two_gap: float  # the target alone's own top-two gap at that position
    margin: float
    explained: bool

    def to_dict(self) -> dict[str, float | int | bool]:
        return {
            "position": self.position,
            "alone": self.alone,
            "got": self.got,
            "gap": round(self.gap, 5),
            "top_two_gap": round(self.top_two_gap, 5),
            "margin": round(self.margin, 5),
            "explained": self.explained,
        }


def first_divergence(alone: Sequence[int], got: Sequence[int]) -> int | None:
    """The first index where the two outputs differ (one ending early counts), or None."""
    for i, (a, b) in enumerate(zip(alone, got, strict=False)):
        if a != b:
            return i
    return None if len(alone) == len(got) else min(len(alone), len(got))


def top_two_gap(row: npt.NDArray[np.float32]) -> float:
    """How far the best logit leads the second best."""
    top = np.partition(row, -2)[-2:]
    return float(top[1] - top[0])


def alone_row(
    model: LlamaModel, prompt: Sequence[int], tokens: Sequence[int], position: int
) -> npt.NDArray[np.float32]:
    """The target alone's logits before `tokens[position]`, computed as `none` computes them:
    the prompt in batches, then one token at a time."""
    model.reset()
    model.decode(prompt)
    for token in tokens[:position]:
        model.decode([token])
    return model.logits(-1).copy()


def explain(
    model: LlamaModel,
    prompt: Sequence[int],
    alone: Sequence[int],
    got: Sequence[int],
    margin: float,
) -> Divergence | None:
    """The first divergence of `got` from `alone` (the target alone's greedy output), judged."""
    i = first_divergence(alone, got)
    if i is None or i >= len(alone) or i >= len(got):
        return None  # identical, or one stopped early at a shared prefix (a stop, not a choice)
    row = alone_row(model, prompt, alone, i)
    gap = float(row[alone[i]] - row[got[i]])
    return Divergence(i, alone[i], got[i], gap, top_two_gap(row), margin, explained=gap <= margin)


def rounding_margin(model: LlamaModel, prompt: Sequence[int], n_tokens: int, batch: int) -> float:
    """The most a verify of `batch` positions moves the gap between the top token and its nearest
    rivals, against one-token decoding, along a greedy continuation of `prompt`.

    The continuation is decoded one token at a time, then decoded again in consecutive batches
    from the same prompt, so the batched side's KV history is batched too, as after speculative
    steps that accepted everything.
    """
    model.reset()
    model.decode(prompt)
    single: list[npt.NDArray[np.float32]] = []
    generated: list[int] = []
    for _ in range(n_tokens):
        row = model.logits(-1).copy()
        single.append(row)
        generated.append(int(row.argmax()))
        model.decode([generated[-1]])
    model.truncate(len(prompt) - 1)
    # Re-decoding the prompt's last token in the first batch gives its row a batched twin too.
    feed = [prompt[-1], *generated[:-1]]
    shift = 0.0
    for s in range(0, n_tokens, batch):
        chunk = feed[s : s + batch]
        model.decode(chunk, len(chunk))
        for j in range(len(chunk)):
            ref, got = single[s + j], model.logits(j)
            order = np.argsort(ref)[-(RIVALS + 1) :]
            best, rivals = order[-1], order[:-1]
            moved = np.abs((got[best] - got[rivals]) - (ref[best] - ref[rivals]))
            shift = max(shift, float(moved.max()))
    return shift
