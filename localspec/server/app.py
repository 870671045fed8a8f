"""The daemon's HTTP API as an ASGI app: OpenAI-compatible routes, Ollama's (api_ollama), and localspec's own.

`make_app(engine, config)` builds it around an engine it does not own; the
daemon runs it under uvicorn, tests may too. Every error leaves as the
LocalspecError type's status and shape: OpenAI's `{"error": {...}}`, or
Ollama's `{"error": "..."}` under /api/.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localspec import __version__, api_ollama
from localspec.api_bridge import (
    ApiConfig,
    ServerState,
    error_response,
    finish_reason,
    json_bytes,
    openai_error_body,
    respond,
    stats_fields,
)
from localspec.api_schemas import (
    ChatCompletionBody,
    CompletionBody,
    chat_request,
    completion_request,
    openapi_schema,
    parse_body,
)
from localspec.api_security import SecurityMiddleware, SecurityPolicy
from localspec.engine import Engine
from localspec.errors import LocalspecError
from localspec.types import GenerationResult, TokenChunk

log = logging.getLogger("localspec.api")


class OpenAIFormat:
    """Chat completions (`delta`/`message`) or text completions (`text`), as OpenAI shapes them."""

    media_type = "text/event-stream"

    def __init__(self, model: str, chat: bool, include_usage: bool) -> None:
        self.model = model
        self.chat = chat
        self.include_usage = include_usage
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self._role_sent = False

    def _head(self, streamed: bool) -> dict[str, Any]:
        obj = f"{self.object}.chunk" if streamed and self.chat else self.object
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _choice(self, text: str | None, finish: str | None) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        delta: dict[str, Any] = {} if text is None else {"content": text}
        if not self._role_sent:
            delta["role"] = "assistant"
            self._role_sent = True
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    @staticmethod
    def _sse(data: dict[str, Any]) -> bytes:
        return b"data: " + json_bytes(data) + b"\n\n"

    def chunk(self, chunk: TokenChunk) -> bytes:
        # localspec extension: token ids and how many came from the draft, for live acceptance views.
        extra = {"token_ids": list(chunk.token_ids), "from_draft": chunk.from_draft}
        return self._sse(
            {**self._head(True), "choices": [self._choice(chunk.text, None)], "localspec": extra}
        )

    def final(self, result: GenerationResult) -> bytes:
        body = {**self._head(True), "choices": [self._choice(None, finish_reason(result))]}
        frames = [self._sse({**body, **stats_fields(result.stats)})]
        if self.include_usage:
            frames.append(self._sse({**self._head(True), "choices": [], "usage": _usage(result)}))
        return b"".join(frames) + b"data: [DONE]\n\n"

    def error(self, exc: LocalspecError) -> bytes:
        return self._sse(openai_error_body(exc))

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        finish = finish_reason(result)
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
        return {
            **self._head(False),
            "choices": [choice],
            "usage": _usage(result),
            **stats_fields(result.stats),
        }


def _usage(result: GenerationResult) -> dict[str, int]:
    prompt, completion = result.stats.prompt_tokens, result.stats.tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.localspec
    return state


async def chat_completions(request: Request) -> Response:
    state = _state(request)
    body = parse_body(await request.body(), ChatCompletionBody)
    model = state.resolve_model(body.model)
    greq = chat_request(body, state.spec_default, state.unlimited)
    fmt = OpenAIFormat(model, chat=True, include_usage=body.include_usage())
    return await respond(await state.start(request, greq), body.stream, fmt)


async def completions(request: Request) -> Response:
    state = _state(request)
    body = parse_body(await request.body(), CompletionBody)
    model = state.resolve_model(body.model)
    greq = completion_request(body, state.spec_default)
    fmt = OpenAIFormat(model, chat=False, include_usage=body.include_usage())
    return await respond(await state.start(request, greq), body.stream, fmt)


async def list_models(request: Request) -> Response:
    state = _state(request)
    entry = {
        "id": state.model_name,
        "object": "model",
        "created": int(state.started),
        "owned_by": "localspec",
    }
    return JSONResponse({"object": "list", "data": [entry]})


async def get_model(request: Request) -> Response:
    state = _state(request)
    name = state.resolve_model(request.path_params["model"])
    return JSONResponse(
        {"id": name, "object": "model", "created": int(state.started), "owned_by": "localspec"}
    )


async def health(request: Request) -> Response:
    body = _state(request).health()
    return JSONResponse(body, status_code=200 if body["status"] == "ready" else 503)


async def metrics(request: Request) -> Response:
    state = _state(request)
    text = state.metrics.render(
        queue_depth=state.engine.queue_depth,
        in_flight=len(state.active),
        ready=state.engine.info.status == "ready",
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)


def _is_ollama(scope: Scope) -> bool:
    return str(scope.get("path", "")).startswith("/api/")


def render_error(scope: Scope, exc: LocalspecError) -> Response:
    return error_response(exc, _is_ollama(scope))


async def _on_localspec_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LocalspecError)
    return render_error(request.scope, exc)


class RouteError(LocalspecError):
    """A path or method the API does not have (404, 405)."""

    error_type = "invalid_request_error"

    def __init__(self, message: str, status: int, code: str | None) -> None:
        super().__init__(message)
        self.http_status = status
        self.code = code


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    where = f"{request.method} {request.url.path}"
    codes = {404: "not_found", 405: "method_not_allowed"}
    error = RouteError(f"{where}: {exc.detail}", exc.status_code, codes.get(exc.status_code))
    return render_error(request.scope, error)


async def _on_crash(request: Request, exc: Exception) -> Response:
    # The route failed, not the daemon: one 500 for this request, the traceback in the log.
    log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return render_error(request.scope, LocalspecError(f"internal error: {type(exc).__name__}"))


class CountRequests:
    """Counts each response by route and status for /metrics."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.state.metrics.request(path, int(message["status"]))
            await send(message)

        await self.app(scope, receive, counting_send)


ROUTES = [
    Route("/health", health, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model:path}", get_model, methods=["GET"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    *api_ollama.ROUTES,
]


def make_app(engine: Engine, config: ApiConfig | None = None) -> Starlette:
    """The ASGI app serving `engine`; `app.state.localspec` holds the ServerState."""
    config = config or ApiConfig()
    state = ServerState(engine, config)
    policy = SecurityPolicy(token=config.token, max_body_bytes=config.max_body_bytes)
    app = Starlette(
        routes=ROUTES,
        middleware=[
            Middleware(CountRequests, state=state),
            Middleware(SecurityMiddleware, policy=policy, render_error=render_error),
        ],
        exception_handlers={
            LocalspecError: _on_localspec_error,
            HTTPException: _on_http_error,
            Exception: _on_crash,
        },
    )
    app.state.localspec = state
    app.state.openapi = openapi_schema(__version__)
    return app
