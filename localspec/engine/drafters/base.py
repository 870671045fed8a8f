"""The drafter seam: what every drafter proposes, and the few helpers they share.

The seam is small on purpose (as llama-cpp-python's `LlamaDraftModel`): given the
accepted tokens so far, return up to k token ids (a sampled draft draws the token
for each position with the request's uniform there, `Draws`). A drafter never
touches the target's state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from localspec.engine.sampling import Draws
from localspec.types import SamplingParams

KeepFn = Callable[[int, float], bool]


@dataclass
class Draft:
    """Proposed tokens, the seconds drafting them took, and the match length behind them (n-gram)."""

    tokens: list[int] = field(default_factory=list)
    seconds: float = 0.0
    evidence: int = 0


class Drafter(Protocol):
    name: str

    def start(self, prompt: Sequence[int], fresh: bool = True) -> None:
        """A new request begins with these prompt tokens.

        `fresh` drops what earlier requests left; otherwise (the request reuses the last one's
        KV cache) `propose` finds what the drafter's state shares with the new tokens.
        """

    def propose(self, tokens: Sequence[int], k: int, params: SamplingParams, draws: Draws) -> Draft:
        """Up to k tokens to follow `tokens` (every accepted token, the last one included)."""
        ...


@runtime_checkable
class Preparing(Protocol):
    """A drafter with work to do on the prompt alone (an n-gram index), before the reply begins."""

    def prepare(self, prompt: Sequence[int]) -> None: ...


# A fixed draft model stops drafting once its own top probability falls under this: on prose its
# unconfident guesses are mostly rejected (replayed: 0.38x of plain decoding at k=4 without a floor,
# 0.70x with it; code 0.81x and 0.87x).
DRAFT_MIN_CONFIDENCE = 0.75


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest shared prefix of two token lists."""
    n = min(len(a), len(b))
    # Usually one extends the other (a step's tokens after the last): compared whole, in C. Auto
    # asks this of the draft model every step, and a Python loop over a 1,000-token context took
    # ~0.07 ms, 4% of a 1.9 ms GPU step.
    if (a[:n] == b[:n]) if type(a) is type(b) else (list(a[:n]) == list(b[:n])):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: halve the gap, each half compared in C
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if list(a[lo:mid]) == list(b[lo:mid]):
            lo = mid
        else:
            hi = mid
    return lo
