"""Answers mixing text and tool calls, framed by the Anthropic and Responses formats, read by the real SDKs.

A tiny model never writes text and then a call, so these results are built by hand; the frames
they make are served over an in-memory transport to the real `anthropic` and `openai` clients,
whose stream helpers accumulate them as they accumulate Anthropic's and OpenAI's own.
"""

from __future__ import annotations

from collections.abc import Callable

import anthropic
import httpx2
import openai
from anthropic.types import Message

from localspec.server.anthropic import AnthropicFormat
from localspec.server.responses_api import ResponsesFormat
from localspec.server.schemas_responses import ResponsesBody
from localspec.types import FinishReason, GenerationResult, GenerationStats, TokenChunk, ToolCall

CALLS = (ToolCall("get_weather", '{"city": "Paris"}'), ToolCall("get_time", "{}"))
TEXT = ["Let me ", "check."]


def _result(text: str, calls: tuple[ToolCall, ...]) -> GenerationResult:
    reason: FinishReason = "tool_calls" if calls else "stop"
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
