"""A conversation longer than the context drops its oldest messages, as Ollama's chat does.

Ollama's /api/chat (server/prompt.go, chatPrompt) keeps a long conversation going: unless the
request says `truncate: false`, it drops messages from the front until the rendered prompt fits
the context, always keeping the system messages and the latest message, and never leaving a
tool result without the assistant turn that called the tool. Here the kept part also opens
with a user turn or a tool-calling assistant turn, which every chat template accepts. Chat
front ends built on it (Open WebUI, Enchanted, ...) send the whole history every turn and
rely on this. Here it is GenerationRequest.truncate: on by default for /api/chat, asked for on
/v1/chat/completions with localspec's `truncate` (as `localspec chat` does).

Ollama then shifts the context while it generates; localspec's engine does not, so the prompt is
cut to leave the reply room: its max_tokens, at most a quarter of the context. A conversation
whose latest message alone (with the system messages) cannot fit is left as it is: the engine's
one-line error says by how much.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from localspec.types import ChatMessage, GenerationRequest

# The reply's room when the prompt is cut: its max_tokens, but no more than this share of the
# context (a reply "until the context is full" would otherwise leave no room for any history).
REPLY_SHARE = 4


def tool_block_start(messages: Sequence[ChatMessage], index: int) -> int:
    """Where a conversation may start at `index`: a tool result goes back to the assistant turn
    whose call it answers (and the results beside it), so no result is orphaned."""
    if index <= 0 or index >= len(messages) or messages[index].role != "tool":
        return index
    start = index
    while start > 0 and messages[start - 1].role == "tool":
        start -= 1
    caller = start - 1
    if caller >= 0 and messages[caller].role == "assistant" and messages[caller].tool_calls:
        return caller
    return index


def kept_from(messages: Sequence[ChatMessage], start: int) -> tuple[ChatMessage, ...]:
    """The conversation from `start` on, with the system messages before it."""
    return (*(m for m in messages[:start] if m.role == "system"), *messages[start:])


def fit_messages(
    messages: Sequence[ChatMessage], count: Callable[[tuple[ChatMessage, ...]], int], budget: int
) -> tuple[ChatMessage, ...]:
    """The latest messages whose prompt (`count` tokens) fits `budget`, system messages kept.

    Fewer messages never make a longer prompt, so the earliest start that fits is found by
    bisection (a template rendered and tokenized a few times, not once per message)."""
    whole = tuple(messages)
    if len(whole) < 2 or count(whole) <= budget:
        return whole
    starts = sorted(
        {*(i for i in range(1, len(whole)) if _opens(whole[i])), tool_block_start(whole, len(whole) - 1)}
    )
    low, high = 0, len(starts) - 1  # the answer is starts[high] if nothing earlier fits
    while low < high:
        mid = (low + high) // 2
        if count(kept_from(whole, starts[mid])) <= budget:
            high = mid
        else:
            low = mid + 1
    return kept_from(whole, starts[high])


def _opens(message: ChatMessage) -> bool:
    """Whether a kept conversation may start at `message`: a user turn, or an assistant turn
    that calls tools (its results follow it). Templates that want turns to alternate from a
    user's (Mistral's, Gemma's) raise on a conversation that opens with a plain assistant turn."""
    return message.role == "user" or (message.role == "assistant" and bool(message.tool_calls))


def truncated(
    request: GenerationRequest,
    count: Callable[[GenerationRequest], int],
    n_ctx: int,
    bound: Callable[[GenerationRequest], int | None] = lambda _request: None,
) -> GenerationRequest:
    """`request` with its oldest messages dropped where its prompt and reply would not fit `n_ctx`,
    and how many in `dropped_messages`; or, for Ollama's /api/generate with an earlier exchange's
    `context`, that context's oldest tokens (after its first: `fit_context`).

    `bound`: at least as many as `count` tokens, cheaply (None: not known), so that a request that
    surely fits is not tokenized twice (its prompt's bytes: 0.3 ms, where counting a 3,000-token
    chat's tokens took 3.6 ms on the 2-core machine)."""
    budget = n_ctx - min(request.max_tokens, n_ctx // REPLY_SHARE)
    most = bound(request)
    if most is not None and most <= budget:
        return request
    if request.context_ids:  # /api/generate: its messages are a system prompt and the prompt
        return fit_context(request, count(request) - budget)
    kept = fit_messages(request.messages, lambda m: count(replace(request, messages=m)), budget)
    dropped = len(request.messages) - len(kept)
    return replace(request, messages=kept, dropped_messages=dropped) if dropped else request


def fit_context(request: GenerationRequest, over: int) -> GenerationRequest:
    """`request` with `over` tokens of its `context` left out after the first, as Ollama's runner cuts
    an input past the context (it keeps the first few, num_keep, and the latest); all of them where
    that is not enough (the prompt alone may still not fit: the engine's error then)."""
    context = request.context_ids
    if over <= 0:
        return request
    kept = context[:1] + context[1 + over :] if over < len(context) - 1 else ()
    return replace(request, context_ids=kept)
