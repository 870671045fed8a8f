"""llama-server's own routes: `/infill` (code completion at the cursor, for llama.vim and
llama.vscode), `/completion` (a raw prompt, for llama.cpp providers such as Continue's), and
`/tokenize`, `/detokenize` and `/props`, which llama-server's web UI and front ends read. The
tokenizer routes answer vLLM's shapes too, with its `/tokenizer_info` (lm-evaluation-harness).

The bodies are llama-server's (`input_prefix`, `prompt`, `input_suffix`, `input_extra`, ...),
and so is the answer: `content`, `timings`, `tokens_cached`, `generation_settings`, as
JSON, or `data: {...}` frames when streaming, without OpenAI's `[DONE]`. llama.vim reads
a body only if it matches `"content"\\s*:"`, so the JSON stays compact (no space after `:`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localspec import __version__
from localspec.errors import DaemonError, LocalspecError, UserInputError
from localspec.server.logprobs import llama_server_probs
from localspec.server.responses import json_bytes, progress_fields, stats_fields
from localspec.server.schemas import ChatCompletionBody, chat_request, parse_body
from localspec.server.schemas_llamaserver import (
    DetokenizeBody,
    InfillBody,
    LlamaServerBody,
    NativeCompletionBody,
    TokenizeBody,
    completion_request,
    infill_request,
    pick_fields,
)
from localspec.server.state import ModelState, server_state
from localspec.server.streaming import respond
from localspec.types import GenerationResult, TokenChunk, TokenLogprob


class LlamaServerFormat:
    """llama-server's completion shape: partial `content` frames, then the final body with `stop: true`."""

    media_type = "text/event-stream"

    def __init__(self, model: str, n_ctx: int, fields: list[str] | None, probs: bool = False) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self.fields = fields
        self.probs = probs  # n_probs asked: each token's log-probability, in the frame it goes out in
        self._predicted = 0

    def _probs(self, logprobs: Sequence[TokenLogprob]) -> dict[str, Any]:
        return {"completion_probabilities": llama_server_probs(logprobs)} if self.probs else {}

    @staticmethod
    def _sse(data: dict[str, Any], event: str = "data") -> bytes:
        return event.encode() + b": " + json_bytes(data) + b"\n\n"

    def chunk(self, chunk: TokenChunk) -> bytes:
        self._predicted += len(chunk.token_ids)
        body = {
            "index": 0,
            "content": chunk.text,
            "tokens": list(chunk.token_ids),
            "stop": False,
            "id_slot": 0,
            "tokens_predicted": self._predicted,
            **self._probs(chunk.logprobs),
        }
        if chunk.progress is not None:
            body.update(tokens_evaluated=chunk.progress.total, **progress_fields(chunk.progress))
        return self._sse(body)

    def final(self, result: GenerationResult) -> bytes:
        return self._sse({**self._body(result), "content": ""})

    def error(self, exc: LocalspecError) -> bytes:
        # llama-server names a failed stream's frame `error:`, not `data:`.
        return self._sse({"code": exc.http_status, "message": exc.message, "type": exc.error_type}, "error")

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        return pick_fields({**self._body(result), **self._probs(result.logprobs)}, self.fields)

    def _body(self, result: GenerationResult) -> dict[str, Any]:
        stats = result.stats
        return {
            "index": 0,
            "content": result.text,
            "tokens": [],
            "id_slot": 0,
            "stop": True,
            "model": self.model,
            "tokens_predicted": stats.tokens,
            "tokens_evaluated": stats.prompt_tokens,
            "generation_settings": {"n_ctx": self.n_ctx, "model": self.model},
            "has_new_line": "\n" in result.text,
            "truncated": False,
            "stop_type": _stop_type(result),
            "stopping_word": result.stop_string or "",
            # What the cache holds afterwards, so the next request that shares it starts there.
            "tokens_cached": stats.prompt_tokens + max(stats.tokens - 1, 0),
            **stats_fields(stats),
        }


def _stop_type(result: GenerationResult) -> str:
    if result.finish_reason == "length":
        return "limit"
    return "word" if result.stop_string is not None else "eos"


def _check_fim(state: ModelState) -> None:
    if not state.gguf_info().has_fim:
        raise UserInputError(
            f"{state.model_name} has no fill-in-the-middle tokens, so /infill cannot run; "
            "serve a code model trained for infill (e.g. Qwen2.5-Coder)",
            param="input_prefix",
        )


async def infill(request: Request) -> Response:
    body = parse_body(await request.body(), InfillBody)
    state = await server_state(request).use(request, body.model or None)
    model = state.model_name
    await anyio.to_thread.run_sync(_check_fim, state)
    greq = infill_request(body, state.spec_default, state.unlimited)
    fmt = LlamaServerFormat(model, state.unlimited, body.response_fields, body.n_probs > 0)
    return await respond(await state.start(request, greq, body.stream), body.stream, fmt)


async def completion(request: Request) -> Response:
    body = parse_body(await request.body(), NativeCompletionBody)
    state = await server_state(request).use(request, body.model or None)
    model = state.model_name
    greq = completion_request(body, state.spec_default, state.unlimited)
    fmt = LlamaServerFormat(model, state.unlimited, body.response_fields, body.n_probs > 0)
    return await respond(await state.start(request, greq, body.stream), body.stream, fmt)


async def tokenize(request: Request) -> Response:
    body = parse_body(await request.body(), TokenizeBody)
    state = await server_state(request).use(request, body.model or None)
    engine = state.engine
    tokens = await anyio.to_thread.run_sync(
        engine.tokenize, body.text(), body.adds_special(), body.parse_special
    )
    if body.vllm:
        return JSONResponse({"count": len(tokens), "max_model_len": state.unlimited, "tokens": tokens})
    if not body.with_pieces:
        return JSONResponse({"tokens": tokens})
    pieces = await anyio.to_thread.run_sync(engine.pieces, tokens)
    return JSONResponse(
        {"tokens": [{"id": t, "piece": _piece(p)} for t, p in zip(tokens, pieces, strict=True)]}
    )


def _piece(raw: bytes) -> str | list[int]:
    """A token's text, or its bytes where they are not whole UTF-8 (part of a character), as
    llama-server writes a piece."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


async def detokenize(request: Request) -> Response:
    body = parse_body(await request.body(), DetokenizeBody)
    engine = (await server_state(request).use(request, body.model or None)).engine
    pieces = await anyio.to_thread.run_sync(engine.pieces, body.tokens)
    text = b"".join(pieces).decode("utf-8", errors="replace")
    return JSONResponse({"content": text, "prompt": text})  # llama-server's name, and vLLM's


async def tokenizer_info(request: Request) -> Response:
    """vLLM's GET /tokenizer_info: lm-evaluation-harness tokenizes through the server where it finds it
    (with /tokenize), so evaluating a GGUF needs no tokenizer download."""
    state = await server_state(request).use(request, request.query_params.get("model") or None)
    info = state.gguf_info()
    special = [t for t in (info.bos_id, info.eos_id) if t is not None]
    names = dict(zip(special, await anyio.to_thread.run_sync(state.engine.pieces, special), strict=True))

    def name(token: int | None) -> str | None:
        return None if token is None else names[token].decode("utf-8", errors="replace")

    return JSONResponse(
        {
            "tokenizer_class": f"llama.cpp {info.vocab_type}",
            "bos_token": name(info.bos_id),
            "eos_token": name(info.eos_id),
            "pad_token": None,
            "add_bos_token": info.add_bos,
            "chat_template": info.chat_template,
            "model_max_length": state.unlimited,
        }
    )


async def props(request: Request) -> Response:
    """What llama-server's web UI and clients read of the server: the context, the sampling
    defaults of /completion, the chat template, the model."""
    state = await server_state(request).use(request, request.query_params.get("model") or None)
    info = state.gguf_info()
    defaults = LlamaServerBody.model_validate({}).sampling()
    params = {
        "n_predict": -1,
        "temperature": defaults.temperature,
        "top_k": defaults.top_k,
        "top_p": defaults.top_p,
        "min_p": defaults.min_p,
        "repeat_penalty": defaults.repeat_penalty,
        "repeat_last_n": defaults.repeat_last_n,
        "frequency_penalty": defaults.frequency_penalty,
        "presence_penalty": defaults.presence_penalty,
    }
    return JSONResponse(
        {
            "default_generation_settings": {"id": 0, "n_ctx": state.unlimited, "params": params},
            "total_slots": 1,
            "model_alias": state.model_name,
            "model_path": str(state.resident.model.path),
            "modalities": {"vision": False, "audio": False},
            "chat_template": info.chat_template or "",
            "build_info": f"localspec {__version__}",
        }
    )


class ApplyTemplateBody(ChatCompletionBody):
    """POST /apply-template: a chat completion's body, its model free to go unnamed (llama-server has one)."""

    model: str = ""


async def apply_template(request: Request) -> Response:
    """llama-server's POST /apply-template: a chat's messages (and tools, and chat_template_kwargs) as
    the model's template renders them into the prompt it would read, with nothing generated; the
    text can be edited and sent to /completion."""
    body = parse_body(await request.body(), ApplyTemplateBody)
    state = await server_state(request).use(request, body.model or None)
    greq = chat_request(body, state.spec_default, state.unlimited)
    prepared = await anyio.to_thread.run_sync(state.engine.prepare, greq)
    if prepared.prompt is None:  # the template comes with the model, which is still loading
        raise DaemonError(f"{state.model_name} is still loading; retry in a moment")
    return JSONResponse({"prompt": prepared.prompt})


ROUTES = [
    Route("/apply-template", apply_template, methods=["POST"]),
    Route("/infill", infill, methods=["POST"]),
    Route("/completion", completion, methods=["POST"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/props", props, methods=["GET"]),
    Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
]
