"""Ollama's API (`/api/*`), so plugins written for Ollama work by changing the port.

Streams are NDJSON, one object per line, the last with `done: true`; Ollama
streams unless the body says `"stream": false`. Durations are nanoseconds.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localspec.engine.toolcalls import supports_tools
from localspec.errors import LocalspecError, UserInputError
from localspec.models.gguf_info import GGUFInfo
from localspec.server.responses import json_bytes, stats_fields
from localspec.server.schemas import (
    OllamaChatBody,
    OllamaGenerateBody,
    OllamaShowBody,
    ollama_chat_request,
    ollama_generate_request,
    parse_body,
)
from localspec.server.state import ServerState
from localspec.server.streaming import respond
from localspec.server.toolschemas import ollama_tool_calls
from localspec.types import GenerationResult, GenerationStats, TokenChunk

# Plugins gate features on Ollama's version; this is the API level the routes here follow.
OLLAMA_COMPAT_VERSION = "0.9.0"
NS = 1_000_000_000


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _durations(stats: GenerationStats) -> dict[str, int]:
    return {
        "total_duration": int(stats.elapsed_s * NS),
        "load_duration": 0,
        "prompt_eval_count": stats.prompt_tokens,
        "prompt_eval_duration": int(stats.ttft_s * NS),
        "eval_count": stats.tokens,
        "eval_duration": int(max(stats.elapsed_s - stats.ttft_s, 0.0) * NS),
    }


class OllamaFormat:
    """Chat puts text in `message.content`, generate in `response`."""

    media_type = "application/x-ndjson"

    def __init__(self, model: str, chat: bool) -> None:
        self.model = model
        self.chat = chat

    def _text(self, text: str, result: GenerationResult | None = None) -> dict[str, Any]:
        if not self.chat:
            return {"response": text}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if result is not None and result.tool_calls:
            message["tool_calls"] = ollama_tool_calls(result.tool_calls)
        return {"message": message}

    def chunk(self, chunk: TokenChunk) -> bytes:
        body = {"model": self.model, "created_at": _now(), **self._text(chunk.text), "done": False}
        return json_bytes(body) + b"\n"

    def _done(self, result: GenerationResult, text: str) -> dict[str, Any]:
        done_reason = "length" if result.finish_reason == "length" else "stop"
        return {
            "model": self.model,
            "created_at": _now(),
            **self._text(text, result),
            "done": True,
            "done_reason": done_reason,
            **_durations(result.stats),
            **stats_fields(result.stats),
        }

    def final(self, result: GenerationResult) -> bytes:
        head = b""
        if result.tool_calls:  # as Ollama streams them: the calls in a chunk of their own, then done
            calls = {"model": self.model, "created_at": _now(), **self._text("", result), "done": False}
            head = json_bytes(calls) + b"\n"
        return head + json_bytes({**self._done(result, ""), **self._text("")}) + b"\n"

    def error(self, exc: LocalspecError) -> bytes:
        return json_bytes({"error": exc.message}) + b"\n"

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        return self._done(result, result.text)


def _loaded(model: str, text: dict[str, Any]) -> dict[str, Any]:
    """Ollama's answer to an empty prompt or chat, its way to preload a model: at once, no generation."""
    return {"model": model, "created_at": _now(), **text, "done": True, "done_reason": "load"}


async def chat(request: Request) -> Response:
    state: ServerState = request.app.state.localspec
    body = parse_body(await request.body(), OllamaChatBody)
    model = state.resolve_model(body.model)
    if not body.messages:
        return JSONResponse(_loaded(model, {"message": {"role": "assistant", "content": ""}}))
    greq = ollama_chat_request(body, state.spec_default, state.unlimited)
    return await respond(await state.start(request, greq), body.stream, OllamaFormat(model, chat=True))


async def generate(request: Request) -> Response:
    state: ServerState = request.app.state.localspec
    body = parse_body(await request.body(), OllamaGenerateBody)
    model = state.resolve_model(body.model)
    if not body.prompt and not body.suffix:
        return JSONResponse(_loaded(model, {"response": ""}))
    greq = ollama_generate_request(body, state.spec_default, state.unlimited)
    return await respond(await state.start(request, greq), body.stream, OllamaFormat(model, chat=False))


async def version(request: Request) -> Response:
    return JSONResponse({"version": OLLAMA_COMPAT_VERSION})


def _param_size(n: int) -> str:
    if n >= 1_000_000_000:
        return f"{n / 1e9:.1f}B"
    return f"{n / 1e6:.0f}M" if n >= 1_000_000 else str(n)


def _details(info: GGUFInfo) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": info.arch,
        "families": [info.arch],
        "parameter_size": _param_size(info.n_params),
        "quantization_level": info.quant,
    }


def _modified(state: ServerState) -> tuple[str, int]:
    st = state.engine.config.target.stat()
    when = datetime.fromtimestamp(st.st_mtime, UTC).isoformat().replace("+00:00", "Z")
    return when, st.st_size


async def tags(request: Request) -> Response:
    state: ServerState = request.app.state.localspec
    info = await anyio.to_thread.run_sync(state.gguf_info)
    modified, size = await anyio.to_thread.run_sync(_modified, state)
    # Hashing gigabytes per listing would stall it; clients use the digest only as an identifier.
    digest = hashlib.sha256(f"{state.model_name}:{size}:{modified}".encode()).hexdigest()
    entry = {
        "name": state.model_name,
        "model": state.model_name,
        "modified_at": modified,
        "size": size,
        "digest": digest,
        "details": _details(info),
    }
    return JSONResponse({"models": [entry]})


async def show(request: Request) -> Response:
    state: ServerState = request.app.state.localspec
    body = parse_body(await request.body(), OllamaShowBody)
    name = body.model or body.name
    if not name:
        raise UserInputError("model is required", param="model")
    state.resolve_model(name)
    info = await anyio.to_thread.run_sync(state.gguf_info)
    modified, _ = await anyio.to_thread.run_sync(_modified, state)
    model_info = {
        "general.architecture": info.arch,
        "general.parameter_count": info.n_params,
        f"{info.arch}.context_length": info.n_ctx_train,
        f"{info.arch}.embedding_length": info.n_embd,
        f"{info.arch}.block_count": info.n_layers,
    }
    return JSONResponse(
        {
            "modelfile": "",
            "parameters": "",
            "template": info.chat_template or "",
            "details": _details(info),
            "model_info": model_info,
            "capabilities": [
                "completion",
                *(["insert"] if info.has_fim else []),
                *(["tools"] if supports_tools(info.chat_template) else []),
            ],
            "modified_at": modified,
        }
    )


ROUTES = [
    Route("/api/version", version, methods=["GET"]),
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate, methods=["POST"]),
]
