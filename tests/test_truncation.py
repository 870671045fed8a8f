"""The chat truncation rule (server.truncation) on plain messages, a token a character."""

from __future__ import annotations

import itertools

from localspec.engine.prompting import cut_to_context
from localspec.server.truncation import fit_context, fit_messages, kept_from, tool_block_start, truncated
from localspec.types import ChatMessage, GenerationRequest, ToolCall


def count(messages: tuple[ChatMessage, ...]) -> int:
    return sum(len(m.content) for m in messages)


def turns(n: int, size: int = 10) -> list[ChatMessage]:
    return [ChatMessage("user" if i % 2 == 0 else "assistant", str(i % 10) * size) for i in range(n)]


CALL = ToolCall(id="call_1", name="read", arguments="{}")


def test_a_conversation_that_fits_is_kept_whole() -> None:
    messages = [ChatMessage("system", "s" * 5), *turns(5)]
    assert fit_messages(messages, count, 55) == tuple(messages)


def test_the_oldest_turns_go_first_and_the_system_message_stays() -> None:
    messages = [ChatMessage("system", "s" * 5), *turns(9)]  # 95 characters
    kept = fit_messages(messages, count, 50)
    assert kept[0] == messages[0] and kept[-1] == messages[-1]
    assert count(kept) <= 50 and kept[1].role == "user"
    # The earliest user turn that fits: one more turn back would not.
    start = messages.index(kept[1])
    assert count(kept_from(messages, start - 2)) > 50
    # Whatever the budget, the answer is the longest fitting tail a linear scan (Ollama's) finds.
    for budget in range(0, 100):
        linear = next(
            (kept_from(messages, i) for i in range(1, len(messages)) if messages[i].role == "user"
             and count(kept_from(messages, i)) <= budget),
            kept_from(messages, len(messages) - 1),
        )  # fmt: skip
        assert fit_messages(messages, count, budget) == (
            tuple(messages) if count(tuple(messages)) <= budget else linear
        )


def test_the_latest_message_is_kept_even_when_it_alone_does_not_fit() -> None:
    messages = [ChatMessage("system", "s"), *turns(3), ChatMessage("user", "x" * 100)]
    assert fit_messages(messages, count, 20) == (messages[0], messages[-1])


def test_a_tool_result_keeps_the_call_it_answers() -> None:
    messages = [
        ChatMessage("user", "u" * 40),
        ChatMessage("assistant", "", tool_calls=(CALL,)),
        ChatMessage("tool", "r" * 10, tool_call_id="call_1"),
        ChatMessage("tool", "r" * 10, tool_call_id="call_1"),
    ]
    assert tool_block_start(messages, 3) == 1 and tool_block_start(messages, 2) == 1
    assert fit_messages(messages, count, 25) == tuple(messages[1:])


def test_system_messages_after_the_cut_stay_where_they_are() -> None:
    messages = [*turns(4), ChatMessage("system", "late"), ChatMessage("user", "now")]
    kept = fit_messages(messages, count, 10)
    assert kept == (messages[4], messages[5])


def test_a_context_too_long_keeps_its_first_token_and_its_latest() -> None:
    request = GenerationRequest(prompt="next", context_ids=tuple(range(10)))
    assert fit_context(request, 0) is request
    assert fit_context(request, 3).context_ids == (0, 4, 5, 6, 7, 8, 9)
    assert fit_context(request, 9).context_ids == ()  # nothing of it is worth keeping


def test_a_request_whose_bound_fits_is_not_counted() -> None:
    request = GenerationRequest(messages=tuple(turns(6)), max_tokens=10)
    counted: list[int] = []

    def counting(r: GenerationRequest) -> int:
        counted.append(1)
        return count(r.messages)

    assert truncated(request, counting, 100, most=90) is request and not counted
    cut = truncated(request, counting, 100, most=91)  # 60 tokens: fits, but it had to count
    assert cut is request and counted
    assert truncated(request, counting, 40).dropped_messages == 4  # 2 turns of 10 fit 40 - 10


def test_a_growing_conversation_is_cut_at_places_the_next_turns_keep() -> None:
    """Cut in steps, the place moves once per step's worth of growth (the turns between go on from
    the cache); cut the least, it moves with every turn."""
    system = ChatMessage("system", "s" * 5)
    history = [ChatMessage("user" if i % 2 == 0 else "assistant", f"{i:02d}" * 5) for i in range(40)]

    def places(step: int) -> list[int]:
        out = []
        for n in range(1, len(history) + 1):
            messages = [system, *history[:n]]
            kept = fit_messages(messages, count, 100, step)
            assert count(kept) <= 100 and kept[0] == system and kept[-1] == messages[-1]
            out.append(n - (len(kept) - 1))  # messages dropped
        return out

    stepped, least = places(40), places(0)
    assert all(b >= a for a, b in itertools.pairwise(stepped))
    moves = [b - a for a, b in itertools.pairwise(stepped) if b != a]
    assert moves and all(m >= 4 for m in moves)  # 40 tokens: 4 turns of 10 at a time
    assert len(moves) * 2 <= len({*least}) - 1  # the least cut moves at least twice as often


def test_a_prompt_past_the_context_keeps_its_first_tokens_and_its_latest() -> None:
    """Ollama's cut (llm/llama_server.go): num_keep (4) and a BOS, then the latest, to about half the
    context; a prompt the context holds (one position left for the reply) is as it was."""
    tokens = list(range(3000))
    cut = cut_to_context(tokens, 1024)
    assert len(cut) == 1024 - (1024 - 5) // 2 == 515
    assert cut == tokens[:5] + tokens[-510:]
    assert cut_to_context(tokens[:1023], 1024) == tokens[:1023]
    assert len(cut_to_context(tokens[:1024], 1024)) == 515
    assert cut_to_context(tokens, 4) == tokens[:3]  # a tiny context: room for the first ones only
