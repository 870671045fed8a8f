"""Ollama's generation routes (`/api/chat`, `/api/generate`, `/api/version`); models are in `ollama_models`.

Streams are NDJSON, one object per line, the last with `done: true`; Ollama
streams unless the body says `"stream": false`. Durations are nanoseconds.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localspec.engine.harmony import harmony, reasons
from localspec.errors import LocalspecError, UserInputError
from localspec.keepalive import parse_keep_alive
from localspec.server.logprobs import chat_entries
from localspec.server.pool import DEFAULT
from localspec.server.responses import json_bytes, stats_fields
from localspec.server.schemas import (
    OllamaChatBody,
    OllamaGenerateBody,
    ollama_chat_request,
    ollama_generate_request,
    parse_body,
)
from localspec.server.state import ModelState, server_state
from localspec.server.streaming import respond
from localspec.server.toolschemas import ollama_tool_calls
from localspec.types import (
    GenerationRequest,
    GenerationResult,
    GenerationStats,
    TokenChunk,
    TokenLogprob,
    ToolCall,
)

# Plugins gate features on Ollama's version; this is the API level the routes here follow.
OLLAMA_COMPAT_VERSION = "0.9.0"
NS = 1_000_000_000


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _durations(stats: GenerationStats, load_s: float) -> dict[str, int]:
    """Ollama's durations, in nanoseconds; the total counts the wait for the model to load (`load_s`)."""
    return {
        "total_duration": int((load_s + stats.elapsed_s) * NS),
        "load_duration": int(load_s * NS),
        "prompt_eval_count": stats.prompt_tokens,
        "prompt_eval_duration": int(stats.ttft_s * NS),
        "eval_count": stats.tokens,
        "eval_duration": int(max(stats.elapsed_s - stats.ttft_s, 0.0) * NS),
    }


class OllamaFormat:
    """Chat puts text in `message.content`, generate in `response`."""

    media_type = "application/x-ndjson"

    def __init__(
        self, model: str, chat: bool, logprobs: bool = False, context: bool = False, load_s: float = 0.0
    ) -> None:
        """`context`: the final answer carries the exchange's tokens (generate, unless raw); `load_s`:
        how long the request waited for its model to load (Ollama's load_duration)."""
        self.model = model
        self.load_s = load_s
        self.chat = chat
        self.logprobs = logprobs
        self.context = context
        # The calls being written, by index: their names and their arguments' pieces so far.
        self._writing: dict[int, tuple[str, list[str]]] = {}
        self._sent: dict[int, str] = {}  # the calls that went out whole, by index: their names

    def _logprobs(self, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        return {"logprobs": chat_entries(logprobs)} if self.logprobs else {}

    def _text(self, text: str, calls: tuple[ToolCall, ...] = (), thinking: str = "") -> dict[str, Any]:
        """The reply's text where this route puts it, and a thinking model's reasoning beside it."""
        if not self.chat:
            return {"response": text, **({"thinking": thinking} if thinking else {})}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = ollama_tool_calls(calls)
        return {"message": message}

    def chunk(self, chunk: TokenChunk) -> bytes:
        body = {
            "model": self.model,
            "created_at": _now(),
            **self._text(chunk.text, thinking=chunk.reasoning),
            **self._logprobs(chunk.logprobs),
            "done": False,
        }
        return json_bytes(body) + b"\n" + self._calls_written(chunk)

    def _calls_written(self, chunk: TokenChunk) -> bytes:
        """As Ollama streams calls: each whole in a chunk of its own as soon as it is written."""
        whole = []
        for delta in chunk.calls if self.chat else ():
            name, pieces = self._writing.setdefault(delta.index, (delta.name, []))
            pieces.append(delta.arguments)
            if delta.done:
                whole.append(ToolCall(name, "".join(pieces)))
                self._sent[delta.index] = name
        return b"".join(self._calls_chunk((call,)) for call in whole)

    def _calls_chunk(self, calls: tuple[ToolCall, ...]) -> bytes:
        body = {"model": self.model, "created_at": _now(), **self._text("", calls), "done": False}
        return json_bytes(body) + b"\n"

    def _done(self, result: GenerationResult, text: str, thinking: str = "") -> dict[str, Any]:
        done_reason = "length" if result.finish_reason == "length" else "stop"
        return {
            "model": self.model,
            "created_at": _now(),
            **self._text(text, result.tool_calls, thinking),
            "done": True,
            "done_reason": done_reason,
            # As Ollama answers it: the prompt's tokens and the reply's, for a next request's context.
            **({"context": [*result.prompt_ids, *result.token_ids]} if self.context else {}),
            **_durations(result.stats, self.load_s),
            **stats_fields(result.stats),
        }

    def final(self, result: GenerationResult) -> bytes:
        # The calls not yet sent (none streamed them) in a chunk of their own, then done.
        rest = tuple(c for i, c in enumerate(result.tool_calls) if self._sent.get(i) != c.name)
        head = self._calls_chunk(rest) if rest else b""
        return head + json_bytes({**self._done(result, ""), **self._text("")}) + b"\n"

    def error(self, exc: LocalspecError) -> bytes:
        return json_bytes({"error": exc.message}) + b"\n"

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        return {**self._done(result, result.text, result.reasoning), **self._logprobs(result.logprobs)}


def _loaded(model: str, text: dict[str, Any]) -> dict[str, Any]:
    """Ollama's answer to an empty prompt or chat, its way to preload a model: at once, no generation."""
    return {"model": model, "created_at": _now(), **text, "done": True, "done_reason": "load"}


async def _use(request: Request, body: OllamaChatBody | OllamaGenerateBody, empty: bool) -> ModelState | str:
    """The model for this request, loaded; or, for an empty one with keep_alive 0, its name once unloaded.

    An empty prompt or chat is Ollama's way to load a model (and, with keep_alive 0, to unload it).
    """
    server = server_state(request)
    keep_alive = DEFAULT if body.keep_alive is None else parse_keep_alive(body.keep_alive)
    if empty and keep_alive == 0:
        model = await anyio.to_thread.run_sync(server.catalog.resolve, body.model)
        await server.pool.unload(model.name)
        return model.name
    return await server.use(request, body.model, keep_alive)


def _unloaded(model: str, text: dict[str, Any]) -> dict[str, Any]:
    """Ollama's answer to an empty request with keep_alive 0: the model is unloaded."""
    return {"model": model, "created_at": _now(), **text, "done": True, "done_reason": "unload"}


async def chat(request: Request) -> Response:
    body = parse_body(await request.body(), OllamaChatBody)
    started = time.monotonic()
    state = await _use(request, body, not body.messages)
    load_s = time.monotonic() - started
    if isinstance(state, str):
        return JSONResponse(_unloaded(state, {"message": {"role": "assistant", "content": ""}}))
    model = state.resolve_model(body.model)
    if not body.messages:
        return JSONResponse(_loaded(model, {"message": {"role": "assistant", "content": ""}}))
    greq = thinking(ollama_chat_request(body, state.spec_default, state.unlimited), body.think, state)
    return await respond(
        await state.start(request, greq, body.stream),
        body.stream,
        OllamaFormat(model, chat=True, logprobs=body.logprobs, load_s=load_s),
    )


async def generate(request: Request) -> Response:
    body = parse_body(await request.body(), OllamaGenerateBody)
    started = time.monotonic()
    state = await _use(request, body, not body.prompt and not body.suffix)
    load_s = time.monotonic() - started
    if isinstance(state, str):
        return JSONResponse(_unloaded(state, {"response": ""}))
    model = state.resolve_model(body.model)
    if not body.prompt and not body.suffix:
        return JSONResponse(_loaded(model, {"response": ""}))
    greq = ollama_generate_request(body, state.spec_default, state.unlimited)
    greq = thinking(greq, body.think, state)
    return await respond(
        await state.start(request, greq, body.stream),
        body.stream,
        OllamaFormat(model, chat=False, logprobs=body.logprobs, context=not body.raw, load_s=load_s),
    )


def thinking(greq: GenerationRequest, think: bool | str | None, state: ModelState) -> GenerationRequest:
    """Ollama's `think`: a thinking model's reasoning comes apart, in `thinking`, unless it is false,
    which also asks the template for a reply without it (`enable_thinking`; a level goes to the
    template as `reasoning_effort`, which gpt-oss's reads). A model that does not think refuses
    true, as Ollama does."""
    template = state.gguf_info().chat_template
    if not reasons(template):
        if think is not None and think is not False:
            raise UserInputError(f"{state.model_name!r} does not support thinking", param="think")
        return greq
    if think is None:  # a model that thinks does, by default
        return greq
    if harmony(template):
        # gpt-oss cannot answer without its analysis: false asks for the least (its effort low), which
        # still comes apart, in `thinking`; true is its template's default effort.
        effort = "low" if think is False else think if isinstance(think, str) else None
        return replace(greq, template_kwargs={"reasoning_effort": effort} if effort else {})
    kwargs: dict[str, Any] = {"enable_thinking": think is not False}
    if isinstance(think, str):
        kwargs["reasoning_effort"] = think
    return replace(greq, split_reasoning=think is not False, template_kwargs=kwargs)


async def version(request: Request) -> Response:
    return JSONResponse({"version": OLLAMA_COMPAT_VERSION})


ROUTES = [
    Route("/api/version", version, methods=["GET"]),
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
]
