"""OpenAI's routes: `/v1/chat/completions`, `/v1/completions` (with `suffix` for FIM), `/v1/models`.

Each is served without the `/v1` prefix too, as llama-server does: clients configured with a
bare base URL (`http://localhost:8012`) call `/chat/completions`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localspec.errors import LocalspecError
from localspec.server.catalog import ServedModel
from localspec.server.logprobs import chat_entries, legacy_lists
from localspec.server.responses import finish_reason, json_bytes, openai_error_body, stats_fields
from localspec.server.schemas import (
    ChatCompletionBody,
    CompletionBody,
    chat_request,
    completion_request,
    parse_body,
)
from localspec.server.state import server_state
from localspec.server.streaming import respond
from localspec.server.toolschemas import openai_tool_calls
from localspec.types import GenerationResult, TokenChunk, TokenLogprob


class OpenAIFormat:
    """Chat completions (`delta`/`message`) or text completions (`text`), as OpenAI shapes them."""

    media_type = "text/event-stream"

    def __init__(self, model: str, chat: bool, include_usage: bool, logprobs: bool = False) -> None:
        self.model = model
        self.chat = chat
        self.include_usage = include_usage
        self.logprobs = logprobs
        self._offset = 0  # a streamed completion's text so far, where its tokens' offsets count from
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self._role_sent = False

    def _head(self, streamed: bool) -> dict[str, Any]:
        obj = f"{self.object}.chunk" if streamed and self.chat else self.object
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _choice(
        self, text: str | None, finish: str | None, logprobs: Sequence[TokenLogprob] = ()
    ) -> dict[str, Any]:
        if not self.chat:
            return {
                "index": 0,
                "text": text or "",
                "logprobs": self._logprobs(logprobs),
                "finish_reason": finish,
            }
        # A step whose text is held back (a tool call being written) sends no content.
        delta: dict[str, Any] = {"content": text} if text else {}
        if not self._role_sent:
            delta["role"] = "assistant"
            self._role_sent = True
        return {"index": 0, "delta": delta, "logprobs": self._logprobs(logprobs), "finish_reason": finish}

    def _logprobs(self, logprobs: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        """choices[].logprobs where asked: chat's `content` entries, or text completions' lists."""
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": chat_entries(logprobs), "refusal": None}
        lists = legacy_lists(logprobs, self._offset)
        self._offset += sum(len(lp.text) for lp in logprobs)
        return lists

    @staticmethod
    def _sse(data: dict[str, Any]) -> bytes:
        return b"data: " + json_bytes(data) + b"\n\n"

    def chunk(self, chunk: TokenChunk) -> bytes:
        # localspec extension: token ids and how many came from the draft, for live acceptance views.
        extra = {"token_ids": list(chunk.token_ids), "from_draft": chunk.from_draft}
        choice = self._choice(chunk.text, None, chunk.logprobs)
        return self._sse({**self._head(True), "choices": [choice], "localspec": extra})

    def final(self, result: GenerationResult) -> bytes:
        frames = []
        if result.tool_calls:
            # The calls in one delta each: clients join the deltas of an index into one call.
            calls = [{"index": i, **c} for i, c in enumerate(self._tool_calls(result))]
            choice = {"index": 0, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}
            frames.append(self._sse({**self._head(True), "choices": [choice]}))
        last = {**self._choice(None, finish_reason(result)), "logprobs": None}  # each token's went with it
        body = {**self._head(True), "choices": [last]}
        frames.append(self._sse({**body, **stats_fields(result.stats)}))
        if self.include_usage:
            frames.append(self._sse({**self._head(True), "choices": [], "usage": _usage(result)}))
        return b"".join(frames) + b"data: [DONE]\n\n"

    def error(self, exc: LocalspecError) -> bytes:
        return self._sse(openai_error_body(exc))

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        finish = finish_reason(result)
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": result.text}
            if result.tool_calls:
                message["content"] = result.text or None
                message["tool_calls"] = self._tool_calls(result)
            choice = {
                "index": 0,
                "message": message,
                "logprobs": self._logprobs(result.logprobs),
                "finish_reason": finish,
            }
        else:
            choice = self._choice(result.text, finish, result.logprobs)
        return {
            **self._head(False),
            "choices": [choice],
            "usage": _usage(result),
            **stats_fields(result.stats),
        }

    def _tool_calls(self, result: GenerationResult) -> list[dict[str, Any]]:
        ids = [f"call_{uuid.uuid4().hex[:24]}" for _ in result.tool_calls]
        return openai_tool_calls(list(result.tool_calls), ids)


def _usage(result: GenerationResult) -> dict[str, Any]:
    stats = result.stats
    prompt, completion = stats.prompt_tokens, stats.tokens
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if stats.prediction_tokens:  # as OpenAI counts a prediction: its tokens the reply has, and not
        usage["completion_tokens_details"] = {
            "accepted_prediction_tokens": stats.prediction_accepted,
            "rejected_prediction_tokens": stats.prediction_tokens - stats.prediction_accepted,
        }
    return usage


async def chat_completions(request: Request) -> Response:
    body = parse_body(await request.body(), ChatCompletionBody)
    state = await server_state(request).use(request, body.model)
    model = state.resolve_model(body.model)
    greq = chat_request(body, state.spec_default, state.unlimited)
    fmt = OpenAIFormat(model, chat=True, include_usage=body.include_usage(), logprobs=body.logprobs)
    return await respond(await state.start(request, greq, body.stream), body.stream, fmt)


async def completions(request: Request) -> Response:
    body = parse_body(await request.body(), CompletionBody)
    state = await server_state(request).use(request, body.model)
    model = state.resolve_model(body.model)
    greq = completion_request(body, state.spec_default, state.unlimited)
    fmt = OpenAIFormat(
        model, chat=False, include_usage=body.include_usage(), logprobs=body.logprobs is not None
    )
    return await respond(await state.start(request, greq, body.stream), body.stream, fmt)


def _model_entry(model: ServedModel) -> dict[str, Any]:
    try:
        created = int(model.path.stat().st_mtime)
    except OSError:
        created = 0
    return {"id": model.name, "object": "model", "created": created, "owned_by": "localspec"}


async def list_models(request: Request) -> Response:
    """Every model the daemon serves (each loads on its first request), the default first."""
    models = await anyio.to_thread.run_sync(server_state(request).catalog.models)
    return JSONResponse({"object": "list", "data": [_model_entry(m) for m in models]})


async def get_model(request: Request) -> Response:
    catalog = server_state(request).catalog
    model = await anyio.to_thread.run_sync(catalog.resolve, request.path_params["model"])
    return JSONResponse(_model_entry(model))


_ROUTES = [
    ("/models", list_models, "GET"),
    ("/models/{model:path}", get_model, "GET"),
    ("/chat/completions", chat_completions, "POST"),
    ("/completions", completions, "POST"),
]
ROUTES = [
    Route(prefix + path, endpoint, methods=[method])
    for prefix in ("/v1", "")
    for path, endpoint, method in _ROUTES
]
