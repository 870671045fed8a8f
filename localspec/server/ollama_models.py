"""Ollama's model routes: `/api/tags`, `/api/show`, `/api/ps`, shaped as Ollama answers them.

The daemon serves one model, loaded for as long as it runs, at one context size:
that is what these report, so a client sizes its prompts to the served context
(`model_info`, `parameters` num_ctx), not to the GGUF's trained one.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localspec.errors import UserInputError
from localspec.models.gguf_info import read_tokens
from localspec.paths import Paths
from localspec.server import ollama_info
from localspec.server.ollama_template import ollama_template
from localspec.server.schemas import OllamaShowBody, parse_body
from localspec.server.state import ServerState, server_state

# Loaded until the daemon stops: Ollama reports keep_alive < 0 models with a far expiry.
NEVER = "9999-12-31T23:59:59Z"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _entry(state: ServerState) -> dict[str, Any]:
    """One /api/tags entry, as Ollama lists a model (blocking: reads the header once, stats the file)."""
    info = state.gguf_info()
    st = state.engine.config.target.stat()
    modified = _iso(st.st_mtime)
    # Hashing gigabytes per listing would stall it; clients use the digest only as an identifier.
    digest = hashlib.sha256(f"{state.model_name}:{st.st_size}:{modified}".encode()).hexdigest()
    name = f"{state.model_name}:latest"
    return {
        "name": name,
        "model": name,
        "modified_at": modified,
        "size": st.st_size,
        "digest": digest,
        "details": ollama_info.details(info),
    }


async def tags(request: Request) -> Response:
    entry = await anyio.to_thread.run_sync(_entry, server_state(request))
    return JSONResponse({"models": [entry]})


async def ps(request: Request) -> Response:
    state = server_state(request)
    entry = await anyio.to_thread.run_sync(_entry, state)
    on_gpu = state.engine.info.gpu_offload
    running = {
        **entry,
        "expires_at": NEVER,
        "size_vram": entry["size"] if on_gpu else 0,
        "context_length": state.unlimited,
    }
    return JSONResponse({"models": [running]})


def _show(state: ServerState) -> dict[str, Any]:
    info = state.gguf_info()
    caps = ollama_info.capabilities(info)
    tokens = read_tokens(info, cache_dir=Paths.from_env().cache_dir)
    template = ollama_template(info, tokens, caps)
    stops = [tokens[info.eos_id]] if info.eos_id is not None and 0 <= info.eos_id < len(tokens) else []
    params = ollama_info.parameters(state.unlimited, stops)
    return {
        "license": "",
        "modelfile": ollama_info.modelfile(str(state.engine.config.target), template, params),
        "parameters": params,
        "template": template,
        "details": ollama_info.details(info),
        "model_info": ollama_info.model_info(info, state.unlimited),
        "capabilities": caps,
        "modified_at": _iso(state.engine.config.target.stat().st_mtime),
    }


async def show(request: Request) -> Response:
    state = server_state(request)
    body = parse_body(await request.body(), OllamaShowBody)
    name = body.model or body.name
    if not name:
        raise UserInputError("model is required", param="model")
    state.resolve_model(name)
    return JSONResponse(await anyio.to_thread.run_sync(_show, state))


ROUTES = [
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/ps", ps, methods=["GET"]),
]
