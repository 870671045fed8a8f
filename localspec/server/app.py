"""The daemon's HTTP API as an ASGI app: OpenAI's, Ollama's, Anthropic's, llama-server's and its own routes.

`make_app(catalog, pool, config)` builds it around a pool of engines it does not own; the
daemon runs it under uvicorn, tests may too. Every error leaves as the
LocalspecError type's status and its API's shape: OpenAI's `{"error": {...}}`,
Ollama's `{"error": "..."}` under /api/, Anthropic's under /v1/messages.
"""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localspec import __version__
from localspec.errors import LocalspecError
from localspec.server import (
    anthropic,
    conversations_api,
    embeddings,
    llamaserver,
    lmstudio,
    ollama,
    ollama_models,
    ollama_pull,
    openai,
    responses_api,
)
from localspec.server.catalog import ModelCatalog
from localspec.server.config import ApiConfig
from localspec.server.openapi import openapi_schema
from localspec.server.pool import ModelPool
from localspec.server.responses import Api, error_response
from localspec.server.security import SecurityMiddleware, SecurityPolicy
from localspec.server.state import ServerState, server_state

log = logging.getLogger("localspec.api")


async def root(request: Request) -> Response:
    # Ollama clients probe `/` to see whether a server is up before they call anything else.
    return PlainTextResponse("localspec is running (OpenAI, Ollama, Anthropic and llama-server APIs)")


async def health(request: Request) -> Response:
    body = server_state(request).health()
    return JSONResponse(body, status_code=200 if body["status"] == "ready" else 503)


async def metrics(request: Request) -> Response:
    state = server_state(request)
    text = state.metrics.render(
        queue_depth=state.queue_depth(), in_flight=len(state.active), ready=state.status() == "ready"
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi)


def api_of(scope: Scope) -> Api:
    """Whose error shape a path gets: Ollama's under /api/, Anthropic's under /v1/messages."""
    path = str(scope.get("path", ""))
    if path.startswith(lmstudio.PREFIX + "/"):
        return "openai"  # LM Studio's REST API answers errors as OpenAI's does
    if path.startswith("/api/"):
        return "ollama"
    return "anthropic" if path.startswith("/v1/messages") else "openai"


def render_error(scope: Scope, exc: LocalspecError) -> Response:
    return error_response(exc, api_of(scope))


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
    """Counts each response by route and status for /metrics; releases its models once it has ended."""

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

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.state.release(scope)  # the models it used may start their keep_alive


ROUTES = [
    Route("/", root, methods=["GET", "HEAD"]),
    Route("/health", health, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
    *openai.ROUTES,
    *ollama.ROUTES,
    *ollama_models.ROUTES,
    *ollama_pull.ROUTES,
    *llamaserver.ROUTES,
    *anthropic.ROUTES,
    *responses_api.ROUTES,
    *conversations_api.ROUTES,
    *embeddings.ROUTES,
    *lmstudio.ROUTES,
]


def make_app(catalog: ModelCatalog, pool: ModelPool, config: ApiConfig | None = None) -> Starlette:
    """The ASGI app serving the catalog's models from `pool`; `app.state.localspec` holds the ServerState."""
    config = config or ApiConfig()
    state = ServerState(catalog, pool, config)
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
