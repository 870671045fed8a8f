"""Anthropic's Messages API: `/v1/messages` and `/v1/messages/count_tokens`, for Claude Code and the SDK.

Requests become the same GenerationRequest as OpenAI chat; answers are built
from the GenerationResult by `AnthropicFormat`, streamed as Anthropic's event
sequence (message_start, content_block_start, ping, content_block_delta...,
content_block_stop, message_delta, message_stop). The daemon serves one model,
so a `claude-*` model name (what Claude Code asks for unless told otherwise)
means the model served here. Errors have Anthropic's shape (app.render_error).
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localspec.errors import LocalspecError
from localspec.server.responses import anthropic_error_body, json_bytes
from localspec.server.schemas import parse_body
from localspec.server.schemas_anthropic import CountTokensBody, MessagesBody, messages_request
from localspec.server.state import ModelState, server_state
from localspec.server.streaming import respond
from localspec.types import GenerationRequest, GenerationResult, TokenChunk


def stop_reason(result: GenerationResult) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for a result."""
    if result.finish_reason == "length":
        return "max_tokens", None
    if result.stop_string is not None:
        return "stop_sequence", result.stop_string
    return "end_turn", None


class AnthropicFormat:
    """A Message as Anthropic shapes it: one text block, usage in input and output tokens."""

    media_type = "text/event-stream"

    def __init__(self, model: str, input_tokens: int) -> None:
        self.model = model
        self.input_tokens = input_tokens
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self._started = False

    @staticmethod
    def _event(data: dict[str, Any]) -> bytes:
        return f"event: {data['type']}\n".encode() + b"data: " + json_bytes(data) + b"\n\n"

    def _usage(self, output_tokens: int) -> dict[str, int]:
        # The whole prompt counts as input; nothing is billed, so no cache split is reported.
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output_tokens,
        }

    def _message(self, text: str | None, result: GenerationResult | None) -> dict[str, Any]:
        reason, sequence = stop_reason(result) if result is not None else (None, None)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [] if text is None else [{"type": "text", "text": text}],
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": self._usage(result.stats.tokens if result is not None else 0),
        }

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return b"".join(
            self._event(e)
            for e in (
                {"type": "message_start", "message": self._message(None, None)},
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                {"type": "ping"},
            )
        )

    def chunk(self, chunk: TokenChunk) -> bytes:
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": chunk.text},
        }
        return self._start() + self._event(delta)

    def final(self, result: GenerationResult) -> bytes:
        reason, sequence = stop_reason(result)
        events: list[dict[str, Any]] = [
            {"type": "content_block_stop", "index": 0},
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": {"output_tokens": result.stats.tokens},
            },
            {"type": "message_stop"},
        ]
        return self._start() + b"".join(self._event(e) for e in events)

    def error(self, exc: LocalspecError) -> bytes:
        return self._event(anthropic_error_body(exc))

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        return self._message(result.text, result)


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
    return await respond(await state.start(request, greq), body.stream, fmt)


async def count_tokens(request: Request) -> Response:
    body = parse_body(await request.body(), CountTokensBody)
    state = await server_state(request).use(request, _requested(body.model))
    _model(state, body.model)
    return JSONResponse({"input_tokens": await _count(state, GenerationRequest(messages=body.chat()))})


ROUTES = [
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
