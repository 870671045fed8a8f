"""Anthropic's Messages API: `/v1/messages` and `/v1/messages/count_tokens`, for Claude Code and the SDK.

Requests become the same GenerationRequest as OpenAI chat, tools included; answers are
built from the GenerationResult by `AnthropicFormat`, streamed as Anthropic's event
sequence (message_start, then per content block content_block_start, content_block_delta...,
content_block_stop, a ping after the first start; then message_delta, message_stop). The
daemon serves one model, so a `claude-*` model name (what Claude Code asks for unless told
otherwise) means the model served here. Errors have Anthropic's shape (app.render_error).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localspec.errors import LocalspecError
from localspec.server.responses import anthropic_error_body, json_bytes, text_after, unsent
from localspec.server.schemas import parse_body
from localspec.server.schemas_anthropic import CountTokensBody, MessagesBody, messages_request
from localspec.server.state import ModelState, server_state
from localspec.server.streaming import respond
from localspec.types import CallDelta, GenerationRequest, GenerationResult, TokenChunk, ToolCall


def stop_reason(result: GenerationResult) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for a result."""
    if result.finish_reason == "length":
        return "max_tokens", None
    if result.finish_reason == "tool_calls":
        return "tool_use", None
    if result.stop_string is not None:
        return "stop_sequence", result.stop_string
    return "end_turn", None


def tool_use_blocks(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    """Calls as Anthropic returns them: tool_use blocks, the input an object, each with an id."""
    return [
        {
            "type": "tool_use",
            "id": "toolu_" + uuid.uuid4().hex[:24],
            "name": c.name,
            "input": json.loads(c.arguments or "{}"),
        }
        for c in calls
    ]


class _Tool:
    """A call that streams: its name, its content block, its input's JSON sent so far."""

    def __init__(self, name: str, block: int) -> None:
        self.name = name
        self.block = block
        self.sent = ""


class AnthropicFormat:
    """A Message as Anthropic shapes it: a thinking block (a thinking model's reasoning), a text
    block and tool_use blocks, usage in input and output tokens.

    Streamed, each block opens with its first text (the reasoning comes first, and its block closes
    as the answer begins). Calls stream as the model writes them, where the engine streams them (a
    grammar holds them): the block before closes, the call's tool_use block opens, and its input
    goes out in input_json_delta pieces; text after the calls comes as a text block after them. A
    call that did not stream (none held it) goes out whole at the end, its input in one
    input_json_delta. A thinking block has no signature: nothing here signs it, and it comes back
    to this daemon only.
    """

    media_type = "text/event-stream"

    def __init__(self, model: str, input_tokens: int) -> None:
        self.model = model
        self.input_tokens = input_tokens
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self._started = False
        self._blocks = 0  # content blocks opened so far, the next block's index
        self._open_kind: str | None = None  # the block open now: "thinking" or "text"
        self._texted = False  # whether a text block was opened
        self._said = ""  # the text streamed so far
        # The calls that streamed, by their index: name, content block index, input JSON sent.
        self._tools: dict[int, _Tool] = {}

    @staticmethod
    def _event(data: dict[str, Any]) -> bytes:
        return f"event: {data['type']}\n".encode() + b"data: " + json_bytes(data) + b"\n\n"

    def _usage(self, result: GenerationResult | None) -> dict[str, int]:
        """Anthropic's split of the prompt: input_tokens read, cache_read_input_tokens taken from the
        cache (llama-server's split too). Before the reply ends the whole prompt counts as read."""
        if result is None:
            return {
                "input_tokens": self.input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 0,
            }
        cached = result.stats.cached_tokens
        return {
            "input_tokens": result.stats.prompt_tokens - cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": result.stats.tokens,
        }

    def _message(self, content: list[dict[str, Any]], result: GenerationResult | None) -> dict[str, Any]:
        reason, sequence = stop_reason(result) if result is not None else (None, None)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": self._usage(result),
        }

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return self._event({"type": "message_start", "message": self._message([], None)})

    def _open(self, block: dict[str, Any]) -> bytes:
        """Start the next content block; the first is followed by a ping, as Anthropic sends it."""
        index, self._blocks = self._blocks, self._blocks + 1
        start = self._event({"type": "content_block_start", "index": index, "content_block": block})
        return start + (self._event({"type": "ping"}) if index == 0 else b"")

    def _into(self, kind: str) -> bytes:
        """Make the open block one of `kind`: the other closed, a new one opened."""
        if self._open_kind == kind:
            return b""
        out = self._close()
        self._open_kind = kind
        if kind == "text":
            self._texted = True
            return out + self._open({"type": "text", "text": ""})
        return out + self._open({"type": "thinking", "thinking": "", "signature": ""})

    def _close(self) -> bytes:
        if self._open_kind is None:
            return b""
        self._open_kind = None
        return self._event({"type": "content_block_stop", "index": self._blocks - 1})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return self._event({"type": "content_block_delta", "index": self._blocks - 1, "delta": delta})

    def chunk(self, chunk: TokenChunk) -> bytes:
        # A step may have nothing to show (a call's text held back while it is written).
        out = [self._start()]
        if chunk.reasoning and not self._tools:
            out += [
                self._into("thinking"),
                self._delta({"type": "thinking_delta", "thinking": chunk.reasoning}),
            ]
        if chunk.text and not self._tools:  # text after a streamed call goes out at the end
            out += [self._into("text"), self._delta({"type": "text_delta", "text": chunk.text})]
            self._said += chunk.text
        out.extend(self._tool_piece(delta) for delta in chunk.calls)
        return b"".join(out)

    def _tool_piece(self, delta: CallDelta) -> bytes:
        """A piece of a streaming call; a call's first closes the block before it and opens its own."""
        out = []
        tool = self._tools.get(delta.index)
        if tool is None:
            if not delta.name:
                return b""
            last = self._last_tool()
            out.append(self._close() if last is None else self._stop(last.block))
            tool = _Tool(delta.name, self._blocks)
            self._tools[delta.index] = tool
            block = {"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24], "name": delta.name}
            out.append(self._open({**block, "input": {}}))
        if delta.arguments:
            tool.sent += delta.arguments
            out.append(self._json_delta(tool.block, delta.arguments))
        return b"".join(out)

    def _last_tool(self) -> _Tool | None:
        return next(reversed(self._tools.values()), None)

    def _stop(self, index: int) -> bytes:
        return self._event({"type": "content_block_stop", "index": index})

    def _json_delta(self, index: int, partial: str) -> bytes:
        delta = {"type": "input_json_delta", "partial_json": partial}
        return self._event({"type": "content_block_delta", "index": index, "delta": delta})

    def _end_tool(self, result: GenerationResult) -> bytes:
        """The last streamed call's end, then the calls and text after it, whole. A call cut short
        (max_tokens) closes as it was sent; the result has no such call."""
        last = self._last_tool()
        assert last is not None
        out, calls, whole = [], result.tool_calls, []
        for i, block in enumerate(tool_use_blocks(calls)):
            tool = self._tools.get(i)
            if tool is None or tool.name != calls[i].name:
                whole.append(block)
            elif tool is last:
                rest = unsent(calls[i].arguments, tool.sent)
                out.append(self._json_delta(tool.block, rest) if rest else b"")
        out.append(self._stop(last.block))
        out.extend(self._tool_use(b) for b in whole)
        after = text_after(self._said, result.text)
        if after:
            out += [self._into("text"), self._delta({"type": "text_delta", "text": after}), self._close()]
        return b"".join(out)

    def _tool_use(self, block: dict[str, Any]) -> bytes:
        index = self._blocks
        return b"".join(
            [
                self._open({**block, "input": {}}),
                self._json_delta(index, json.dumps(block["input"], ensure_ascii=False)),
                self._event({"type": "content_block_stop", "index": index}),
            ]
        )

    def final(self, result: GenerationResult) -> bytes:
        out = [self._start()]
        if self._tools:
            out.append(self._end_tool(result))
        else:
            if not self._texted and not result.tool_calls:
                out.append(self._into("text"))  # an empty answer is one empty text block
            out.append(self._close())
            out.extend(self._tool_use(b) for b in tool_use_blocks(result.tool_calls))
        reason, sequence = stop_reason(result)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        out.append(
            self._event(
                # The usage as it ends (the SDKs take each field given here over message_start's).
                {"type": "message_delta", "delta": delta, "usage": self._usage(result)}
            )
        )
        out.append(self._event({"type": "message_stop"}))
        return b"".join(out)

    def error(self, exc: LocalspecError) -> bytes:
        return self._event(anthropic_error_body(exc))

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        thinking = (
            [{"type": "thinking", "thinking": result.reasoning, "signature": ""}] if result.reasoning else []
        )
        text = [{"type": "text", "text": result.text}] if result.text or not result.tool_calls else []
        return self._message(thinking + text + tool_use_blocks(result.tool_calls), result)


def _requested(name: str) -> str | None:
    """Claude's model names mean the daemon's default model; any other names a served one."""
    return None if name.startswith("claude-") else name


def _model(state: ModelState, name: str) -> str:
    return state.model_name if name.startswith("claude-") else state.resolve_model(name)


async def _count(state: ModelState, greq: GenerationRequest) -> int:
    return await anyio.to_thread.run_sync(state.engine.count_prompt_tokens, greq)


async def messages(request: Request) -> Response:
    body = parse_body(await request.body(), MessagesBody)
    state = await server_state(request).use(request, _requested(body.model))
    model = _model(state, body.model)
    greq = messages_request(body, state.spec_default)
    fmt = AnthropicFormat(model, await _count(state, greq))
    return await respond(await state.start(request, greq, body.stream), body.stream, fmt)


async def count_tokens(request: Request) -> Response:
    body = parse_body(await request.body(), CountTokensBody)
    state = await server_state(request).use(request, _requested(body.model))
    _model(state, body.model)
    return JSONResponse({"input_tokens": await _count(state, body.request())})


ROUTES = [
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
