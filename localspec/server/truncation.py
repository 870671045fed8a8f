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
cut to leave the reply room: its max_tokens, at most a quarter of the context. And it cuts in
steps of a quarter of the context (CUT_STEP_SHARE), each at a place the next turns keep, so
they go on from the cache instead of reading the whole conversation again each turn. A conversation
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
# Old messages go in steps of this share of the context (fit_messages), so that the next turns are
# cut at the same place: each new place starts the cached prompt over after the system messages,
# and reading it again is the turn's whole wait (a chat past a 2,048-token context, the 1.5B on 2
# cores: 7-8.5 s to the first token on every turn with the least cut, 1.4 s on a turn that kept
# the cache; docs/benchmarks.md, session 44). llama.cpp's context shift drops half of what it may.
CUT_STEP_SHARE = 4


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
    messages: Sequence[ChatMessage],
    count: Callable[[tuple[ChatMessage, ...]], int],
    budget: int,
    step: int = 0,
) -> tuple[ChatMessage, ...]:
    """The whole conversation where its prompt (`count` tokens) fits `budget`; else the latest
    messages that fit, system messages kept.

    `step` 0 cuts the fewest messages (Ollama's cut). Otherwise the oldest messages go in steps
    of at least `step` tokens, each step's end set by the messages it drops alone: a conversation
    that grows by a turn is cut at the same place, and goes on from the cache, until it needs
    the next step. Fewer messages never make a longer prompt, so each place is found by
    bisection (a template rendered and tokenized a few times, not once per message)."""
    whole = tuple(messages)
    if len(whole) < 2:
        return whole
    total = count(whole)
    if total <= budget:
        return whole
    starts = sorted(
        {*(i for i in range(1, len(whole)) if _opens(whole[i])), tool_block_start(whole, len(whole) - 1)}
    )
    sizes: dict[int, int] = {}

    def kept(i: int) -> int:
        if i not in sizes:
            sizes[i] = count(kept_from(whole, starts[i]))
        return sizes[i]

    if step <= 0:
        return kept_from(whole, starts[_first(len(starts), lambda i: kept(i) <= budget)])

    def step_end(j: int) -> int:  # the first start that drops j steps' tokens, or the last
        return _first(len(starts), lambda i: total - kept(i) >= j * step)

    steps = _first(-(-(total - budget) // step), lambda j: kept(step_end(j + 1)) <= budget) + 1
    return kept_from(whole, starts[step_end(steps)])


def _first(n: int, holds: Callable[[int], bool]) -> int:
    """The least i in 0..n-1 where `holds` (true from some i on), or n - 1 where it never does."""
    low, high = 0, n - 1
    while low < high:
        mid = (low + high) // 2
        if holds(mid):
            high = mid
        else:
            low = mid + 1
    return low


def _opens(message: ChatMessage) -> bool:
    """Whether a kept conversation may start at `message`: a user turn, or an assistant turn
    that calls tools (its results follow it). Templates that want turns to alternate from a
    user's (Mistral's, Gemma's) raise on a conversation that opens with a plain assistant turn."""
    return message.role == "user" or (message.role == "assistant" and bool(message.tool_calls))


def truncated(
    request: GenerationRequest,
    count: Callable[[GenerationRequest], int],
    n_ctx: int,
    most: int | None = None,
) -> GenerationRequest:
    """`request` with its oldest messages dropped where its prompt and reply would not fit `n_ctx`,
    and how many in `dropped_messages`; or, for Ollama's /api/generate with an earlier exchange's
    `context`, that context's oldest tokens (after its first: `fit_context`).

    `most`: at least as many as `count` tokens, known cheaply (None: not known), so that a request
    that surely fits is not tokenized twice (its prompt's bytes: 0.3 ms, where counting a
    3,000-token chat's tokens took 3.6 ms on the 2-core machine)."""
    budget = n_ctx - min(request.max_tokens, n_ctx // REPLY_SHARE)
    if most is not None and most <= budget:
        return request
    if request.context_ids:  # /api/generate: its messages are a system prompt and the prompt
        return fit_context(request, count(request) - budget)
    step = n_ctx // CUT_STEP_SHARE
    kept = fit_messages(request.messages, lambda m: count(replace(request, messages=m)), budget, step)
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
