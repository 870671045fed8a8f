"""Token log-probabilities in each API's shape: OpenAI chat's and Ollama's entries, OpenAI's legacy
completions lists, and llama-server's `completion_probabilities`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from localspec.types import TokenLogprob


def _entry(lp: TokenLogprob) -> dict[str, Any]:
    return {"token": lp.text, "logprob": lp.logprob, "bytes": list(lp.piece)}


def chat_entries(logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """OpenAI chat's `logprobs.content` and Ollama's `logprobs`: token, logprob, bytes, top_logprobs."""
    return [{**_entry(lp), "top_logprobs": [_entry(t) for t in lp.top]} for lp in logprobs]


def legacy_lists(logprobs: Sequence[TokenLogprob], offset: int) -> dict[str, Any]:
    """OpenAI's text completions: parallel lists, each token's text offset counted from `offset`.
    An echoed prompt's first token has null for its log-probability and its alternatives."""
    offsets: list[int] = []
    for lp in logprobs:
        offsets.append(offset)
        offset += len(lp.text)
    return {
        "tokens": [lp.text for lp in logprobs],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [
            None if lp.logprob is None else {t.text: t.logprob for t in lp.top} for lp in logprobs
        ],
        "text_offset": offsets,
    }


def llama_server_probs(logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """llama-server's `completion_probabilities` (n_probs): ids beside the texts."""

    def one(lp: TokenLogprob) -> dict[str, Any]:
        return {"id": lp.token, **_entry(lp)}

    return [{**one(lp), "top_logprobs": [one(t) for t in lp.top]} for lp in logprobs]
