"""Answers mixing text and tool calls, framed by the Anthropic and Responses formats, read by the real SDKs.

A tiny model never writes text and then a call, so these results are built by hand; the frames
they make are served over an in-memory transport to the real `anthropic` and `openai` clients,
whose stream helpers accumulate them as they accumulate Anthropic's and OpenAI's own.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx2
import ollama
import openai
from anthropic.types import Message
from openai.types.responses import Response

from localspec.server.anthropic import AnthropicFormat
from localspec.server.ollama import OllamaFormat
from localspec.server.openai import OpenAIFormat
from localspec.server.responses_api import ResponsesFormat
from localspec.server.schemas_responses import ResponsesBody
from localspec.types import CallDelta, FinishReason, GenerationResult, GenerationStats, TokenChunk, ToolCall

CALLS = (ToolCall("get_weather", '{"city": "Paris"}'), ToolCall("get_time", "{}"))
TEXT = ["Let me ", "check."]


def _result(text: str, calls: tuple[ToolCall, ...], reason: FinishReason | None = None) -> GenerationResult:
    reason = reason or ("tool_calls" if calls else "stop")
    return GenerationResult(
        text, (1, 2, 3), reason, GenerationStats(tokens=3, prompt_tokens=5), tool_calls=calls
    )


def _frames(
    chunk: Callable[[TokenChunk], bytes],
    final: Callable[[GenerationResult], bytes],
    calls: tuple[ToolCall, ...],
) -> bytes:
    # A held-back step (no text) comes first, as when the engine withholds a call being written.
    pieces = [chunk(TokenChunk("", (9,)))] + [chunk(TokenChunk(t, (1,))) for t in TEXT]
    return b"".join(pieces) + final(_result("".join(TEXT), calls))


def _sse(body: bytes) -> Callable[[object], httpx2.Response]:
    return lambda _: httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})


# The first call streamed as the engine streams it (engine.callstream): its name with the first
# piece, each piece a prefix of the arguments it ends with; then text the model wrote after it.
PIECES = [CallDelta(0, "get_weather", '{"city": '), CallDelta(0, "", '"Par'), CallDelta(0, "", 'is"}')]


def _streamed_frames(
    chunk: Callable[[TokenChunk], bytes], final: Callable[[GenerationResult], bytes], result: GenerationResult
) -> tuple[bytes, bytes]:
    """The frames sent as the steps came (text, then the call's pieces, then the text the engine
    sends after the call) and the final ones."""
    steps = [TokenChunk(t, (1,)) for t in TEXT] + [TokenChunk("", (2,), calls=(p,)) for p in PIECES]
    return b"".join(chunk(s) for s in [*steps, TokenChunk(" Done.", (3,))]), final(result)


def _anthropic_stream(body: bytes) -> tuple[str, Message]:
    """The text and the final message the `anthropic` stream helper makes of the frames."""
    http = httpx2.Client(transport=httpx2.MockTransport(_sse(body)))
    with (
        anthropic.Anthropic(base_url="http://localhost", api_key="x", http_client=http) as client,
        client.messages.stream(
            model="m", max_tokens=9, messages=[{"role": "user", "content": "x"}]
        ) as stream,
    ):
        return "".join(stream.text_stream), stream.get_final_message()


def test_anthropic_text_then_two_tool_use_blocks() -> None:
    fmt = AnthropicFormat("m", 5)
    text, final = _anthropic_stream(_frames(fmt.chunk, fmt.final, CALLS))
    assert text == "Let me check." and final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    uses = [b for b in final.content if b.type == "tool_use"]
    assert [(u.name, u.input) for u in uses] == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert uses[0].id != uses[1].id
    whole = AnthropicFormat("m", 5).whole(_result("Let me check.", CALLS))
    assert [b["type"] for b in whole["content"]] == ["text", "tool_use", "tool_use"]


def test_anthropic_calls_alone_have_no_text_block_and_no_calls_an_empty_one() -> None:
    fmt = AnthropicFormat("m", 5)
    _, final = _anthropic_stream(fmt.chunk(TokenChunk("", (9,))) + fmt.final(_result("", CALLS[:1])))
    assert [b.type for b in final.content] == ["tool_use"]
    _, final = _anthropic_stream(AnthropicFormat("m", 5).final(_result("", ())))
    assert [(b.type, getattr(b, "text", None)) for b in final.content] == [("text", "")]
    assert final.stop_reason == "end_turn"


def test_responses_message_then_two_function_calls() -> None:
    body = ResponsesBody.model_validate({"model": "m", "input": "x", "tools": [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
        {"type": "function", "name": "get_time"}]})  # fmt: skip
    fmt = ResponsesFormat("m", body)
    http = httpx2.Client(transport=httpx2.MockTransport(_sse(_frames(fmt.chunk, fmt.final, CALLS))))
    with (
        openai.OpenAI(base_url="http://localhost/v1", api_key="x", http_client=http) as client,
        client.responses.stream(model="m", input="x") as stream,
    ):
        events = list(stream)
        final = stream.get_final_response()
    assert [o.type for o in final.output] == ["message", "function_call", "function_call"]
    assert final.output_text == "Let me check."
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", "{}"),
    ]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.output_index for e in added] == [0, 1, 2]
    assert len({c.call_id for c in calls}) == 2


def _responses_stream(body: bytes) -> tuple[list[Any], Response]:
    """The events and the final response the `openai` stream helper makes of the frames."""
    http = httpx2.Client(transport=httpx2.MockTransport(_sse(body)))
    with (
        openai.OpenAI(base_url="http://localhost/v1", api_key="x", http_client=http) as client,
        client.responses.stream(model="m", input="x") as stream,
    ):
        return list(stream), stream.get_final_response()


WEATHER_TOOLS: list[dict[str, object]] = [
    {"type": "function", "name": "get_weather", "parameters": {"type": "object"}},
    {"type": "function", "name": "get_time"},
]


def test_anthropic_streams_the_first_calls_input_as_it_is_written() -> None:
    fmt = AnthropicFormat("m", 5)
    steps, end = _streamed_frames(fmt.chunk, fmt.final, _result("Let me check. Done.", CALLS))
    # The text block closed and the tool_use block opened with the call's first piece, each piece
    # its own delta as its step came; nothing of the call waits for the end.
    assert steps.count(b'"content_block_stop"') == 1 and steps.count(b"input_json_delta") == 3
    assert b'"partial_json":"{\\"city\\": "' in steps and b"Done." not in steps
    text, final = _anthropic_stream(steps + end)
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use", "text"]
    assert text == "Let me check.Done." and final.stop_reason == "tool_use"
    uses = [b for b in final.content if b.type == "tool_use"]
    assert [(u.name, u.input) for u in uses] == [("get_weather", {"city": "Paris"}), ("get_time", {})]


def test_anthropic_a_streamed_call_cut_short_closes_as_it_was_sent() -> None:
    fmt = AnthropicFormat("m", 5)
    pieces = b"".join(fmt.chunk(TokenChunk("", (2,), calls=(p,))) for p in PIECES[:2])
    _, final = _anthropic_stream(pieces + fmt.final(_result("", (), "length")))
    (block,) = final.content
    assert block.type == "tool_use" and block.name == "get_weather" and final.stop_reason == "max_tokens"


def test_responses_streams_the_first_calls_arguments_as_they_are_written() -> None:
    body = ResponsesBody.model_validate({"model": "m", "input": "x", "tools": WEATHER_TOOLS})
    fmt = ResponsesFormat("m", body)
    steps, end = _streamed_frames(fmt.chunk, fmt.final, _result("Let me check. Done.", CALLS))
    assert steps.count(b"response.function_call_arguments.delta") == 6  # each event names its type twice
    assert steps.count(b"response.output_item.done") == 2 and b"Done." not in steps
    events, final = _responses_stream(steps + end)
    assert [o.type for o in final.output] == ["message", "function_call", "function_call", "message"]
    texts = [
        c.text for o in final.output if o.type == "message" for c in o.content if c.type == "output_text"
    ]
    assert texts == ["Let me check.", "Done."]
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", "{}"),
    ]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [e.output_index for e in added] == [0, 1, 2, 3]
    # The body a request without stream gets lists the same items, the streamed call's ids kept.
    whole = fmt.whole(_result("Let me check. Done.", CALLS))
    assert [o["id"] for o in whole["output"]] == [o.id for o in final.output]


def test_responses_a_custom_tools_input_streams_decoded() -> None:
    tools: list[dict[str, object]] = [{"type": "custom", "name": "shell"}]
    body = ResponsesBody.model_validate({"model": "m", "input": "x", "tools": tools})
    fmt = ResponsesFormat("m", body)
    raw = ['{"input": "ls', " -l \\", 'n"}']
    steps = b"".join(
        fmt.chunk(TokenChunk("", (2,), calls=(CallDelta(0, "shell" if i == 0 else "", p),)))
        for i, p in enumerate(raw)
    )
    events, final = _responses_stream(steps + fmt.final(_result("", (ToolCall("shell", "".join(raw)),))))
    deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    assert deltas == ["ls", " -l ", "\n"]
    (item,) = final.output
    assert item.type == "custom_tool_call" and item.input == "ls -l \n"


def test_responses_a_streamed_call_cut_short_is_an_incomplete_item() -> None:
    body = ResponsesBody.model_validate({"model": "m", "input": "x", "tools": WEATHER_TOOLS})
    fmt = ResponsesFormat("m", body)
    pieces = b"".join(fmt.chunk(TokenChunk("", (2,), calls=(p,))) for p in PIECES[:2])
    http = httpx2.Client(transport=httpx2.MockTransport(_sse(pieces + fmt.final(_result("", (), "length")))))
    with openai.OpenAI(base_url="http://localhost/v1", api_key="x", http_client=http) as client:
        # The stream helper's final response needs response.completed; an incomplete one ends so.
        events = list(client.responses.create(model="m", input="x", stream=True))
    added = [e.item for e in events if e.type == "response.output_item.added"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    last = events[-1]
    assert last.type == "response.incomplete" and last.response.output == done
    (item,) = done
    assert item.type == "function_call" and item.status == "incomplete"
    assert item.arguments == '{"city": "Par' and [item.id] == [a.id for a in added]


# Two calls streamed one after the other (parallel calls), each with its index.
TWO = [*PIECES, CallDelta(1, "get_time", "{"), CallDelta(1, "", "}")]


def _two_streamed(chunk: Callable[[TokenChunk], bytes]) -> bytes:
    steps = [TokenChunk(t, (1,)) for t in TEXT] + [TokenChunk("", (2,), calls=(p,)) for p in TWO]
    return b"".join(chunk(s) for s in steps)


def test_anthropic_streams_each_call_in_its_own_block() -> None:
    fmt = AnthropicFormat("m", 5)
    steps = _two_streamed(fmt.chunk)
    # Each call's block opened as its first piece came; the first closed as the second began.
    assert steps.count(b'"content_block_start"') == 3 and steps.count(b'"content_block_stop"') == 2
    _, final = _anthropic_stream(steps + fmt.final(_result("Let me check.", CALLS)))
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    uses = [b for b in final.content if b.type == "tool_use"]
    assert [(u.name, u.input) for u in uses] == [("get_weather", {"city": "Paris"}), ("get_time", {})]


def test_responses_streams_each_call_in_its_own_item() -> None:
    body = ResponsesBody.model_validate({"model": "m", "input": "x", "tools": WEATHER_TOOLS})
    fmt = ResponsesFormat("m", body)
    steps = _two_streamed(fmt.chunk)
    assert steps.count(b"response.output_item.added") == 6 and steps.count(b"response.output_item.done") == 4
    events, final = _responses_stream(steps + fmt.final(_result("Let me check.", CALLS)))
    assert [o.type for o in final.output] == ["message", "function_call", "function_call"]
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", "{}"),
    ]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.id) for e in added] == [(i, o.id) for i, o in enumerate(final.output)]


def test_chat_completions_stream_each_call_with_its_index() -> None:
    fmt = OpenAIFormat("m", chat=True, include_usage=False)
    body = _two_streamed(fmt.chunk) + fmt.final(_result("Let me check.", CALLS))
    frames = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]
    heads = [c for f in frames for ch in f["choices"] for c in ch["delta"].get("tool_calls", ()) if "id" in c]
    assert [(c["index"], c["function"]["name"]) for c in heads] == [(0, "get_weather"), (1, "get_time")]
    http = httpx2.Client(transport=httpx2.MockTransport(_sse(body)))
    with (
        openai.OpenAI(base_url="http://localhost/v1", api_key="x", http_client=http) as client,
        client.chat.completions.stream(model="m", messages=[{"role": "user", "content": "x"}]) as stream,
    ):
        message = stream.get_final_completion().choices[0].message
    assert message.content == "Let me check." and message.tool_calls is not None
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("get_weather", '{"city": "Paris"}'),
        ("get_time", "{}"),
    ]


def test_ollama_sends_each_call_whole_as_soon_as_it_is_written() -> None:
    # Ollama streams calls whole (arguments an object), each in a chunk of its own once parsed.
    fmt = OllamaFormat("m", chat=True)
    done = [*PIECES[:-1], CallDelta(0, "", 'is"}', done=True), CallDelta(1, "get_time", "{}", done=True)]
    frames = [fmt.chunk(TokenChunk("", (2,), calls=(d,))) for d in done]
    first = [ollama.ChatResponse.model_validate(json.loads(line)) for line in frames[2].splitlines()]
    assert [c.function.name for r in first for c in r.message.tool_calls or []] == ["get_weather"]
    assert first[-1].message.tool_calls[0].function.arguments == {"city": "Paris"}  # type: ignore[index]
    body = b"".join(frames) + fmt.final(_result("", CALLS))
    chunks = [ollama.ChatResponse.model_validate(json.loads(line)) for line in body.splitlines()]
    sent = [(c.function.name, c.function.arguments) for r in chunks for c in r.message.tool_calls or []]
    assert sent == [("get_weather", {"city": "Paris"}), ("get_time", {})] and chunks[-1].done
