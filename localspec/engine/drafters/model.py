"""A draft model, or the target's own first layers, drafting token by token with its own KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from localspec.engine.drafters.base import Draft, KeepFn, common_prefix
from localspec.engine.llama import LlamaModel
from localspec.engine.promptcache import Saved
from localspec.engine.sampling import Draws, adjusted, distribution, sample_at
from localspec.errors import LocalspecError
from localspec.types import SamplingParams


class ModelDrafter:
    """A smaller model (or the target's own first layers) drafting token by token.

    It keeps its KV cache in step with the accepted tokens: each call feeds only
    what it has not seen, after rolling back what the target rejected.
    """

    def __init__(self, model: LlamaModel, name: str = "draft", min_confidence: float = 0.0) -> None:
        self.model = model
        self.name = name
        self.min_confidence = min_confidence
        self._seen: list[int] = []

    def start(self, prompt: Sequence[int], fresh: bool = True) -> None:
        if fresh:
            self.model.reset()
            self._seen = []

    def propose(self, tokens: Sequence[int], k: int, params: SamplingParams, draws: Draws) -> Draft:
        return self._propose(tokens, k, params, draws, None)

    def propose_while(
        self,
        tokens: Sequence[int],
        k: int,
        params: SamplingParams,
        draws: Draws,
        keep: KeepFn,
    ) -> Draft:
        """As `propose`, but `keep(i, confidence)` decides whether the i-th drafted token is kept.

        Drafting stops at the first token it refuses (min_confidence is not used). Confidence is
        the top probability of the draft's distribution there (its greedy token's), so the caller
        can stop where a verify stops paying, without looking at which token a sample drew.
        """
        return self._propose(tokens, k, params, draws, keep)

    @property
    def seen(self) -> Sequence[int]:
        """The tokens the draft model's cache holds, position by position."""
        return self._seen

    def save(self) -> Saved | None:
        """The draft model's cache, for `restore` (engine.promptcache); None where llama.cpp
        wrote nothing."""
        state = self.model.save_state()
        return None if state is None else Saved(tuple(self._seen), state, len(state))

    def restore(self, saved: Saved) -> None:
        """Go back to a cache `save` wrote; where llama.cpp refuses it, start empty (the draft
        reads what it needs again)."""
        try:
            self.model.load_state(saved.state, len(saved.tokens))
        except LocalspecError:
            self.start((), fresh=True)
            return
        self._seen = list(saved.tokens)

    def lag(self, tokens: Sequence[int]) -> int:
        """How many tokens the next proposal must feed before its first draft (its catch-up)."""
        return max(1, len(tokens) - common_prefix(self._seen, tokens))

    def _propose(
        self,
        tokens: Sequence[int],
        k: int,
        params: SamplingParams,
        draws: Draws,
        keep: KeepFn | None,
    ) -> Draft:
        draft = Draft()
        k = min(k, self.model.n_ctx - len(tokens) - 1)
        if k <= 0:
            return draft
        common = common_prefix(self._seen, tokens)
        if common == len(tokens):
            common -= 1  # the last token must be decoded again to get its logits
        self.model.truncate(common)
        del self._seen[common:]
        feed = list(tokens[common:])
        for _ in range(k):
            draft.seconds += self.model.decode(feed, 1)
            self._seen.extend(feed)
            # Penalised as the target's logits are, so the draft guesses what the target decides.
            logits = adjusted(self.model.logits(-1), params, tokens, draft.tokens)
            # The target's uniform at this position: both draw it, so the draft guesses the target's draw.
            u = 0.0 if params.greedy else draws.at(len(tokens) + len(draft.tokens))
            if keep is None:
                token, confident = self._choose(logits, params, u)
            else:
                token, confidence = _pick_with_confidence(logits, params, u)
                confident = keep(len(draft.tokens), confidence)
            if not confident:
                break
            draft.tokens.append(token)
            feed = [token]
        return draft

    def _choose(self, logits: npt.NDArray[np.float32], params: SamplingParams, u: float) -> tuple[int, bool]:
        if params.greedy and self.min_confidence <= 0.0:
            return int(logits.argmax()), True  # no floor: the confidence is never read
        token, confidence = _pick_with_confidence(logits, params, u)
        return token, confidence >= self.min_confidence


def _pick_with_confidence(
    logits: npt.NDArray[np.float32], params: SamplingParams, u: float
) -> tuple[int, float]:
    # Confidence is the distribution's top probability, not the drawn token's: how far a draft goes
    # should follow how sure the draft is, not which token one uniform happened to land on.
    if params.greedy:
        token = int(logits.argmax())
        # float32 is plenty for a stopping rule and several times cheaper than float64 over the vocabulary.
        return token, 1.0 / float(np.exp(logits - logits[token]).sum())
    q = distribution(logits, params)
    return sample_at(q, u), q.top()
