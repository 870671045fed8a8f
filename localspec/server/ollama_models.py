"""Ollama's model routes: `/api/tags`, `/api/show`, `/api/ps`, shaped as Ollama answers them.

The daemon serves every model its catalog lists, each loaded on its first request,
all at one context size: that is what these report, so a client sizes its prompts
to the served context (`model_info`, `parameters` num_ctx), not to the GGUF's
trained one. /api/ps lists the loaded models, what each takes by the memory plan,
and when its keep_alive runs out.
"""

from __future__ import annotations

import hashlib
import time
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
from localspec.server.catalog import ServedModel
from localspec.server.ollama_template import ollama_template
from localspec.server.pool import Resident
from localspec.server.schemas import OllamaShowBody, parse_body
from localspec.server.state import ServerState, server_state

# Loaded until the daemon stops: Ollama reports keep_alive < 0 models with a far expiry.
NEVER = "9999-12-31T23:59:59Z"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def _entry(model: ServedModel) -> dict[str, Any]:
    """One /api/tags entry, as Ollama lists a model (blocking: stats the file)."""
    st = model.path.stat()
    modified = _iso(st.st_mtime)
    # Hashing gigabytes per listing would stall it; clients use the digest only as an identifier.
    digest = hashlib.sha256(f"{model.name}:{st.st_size}:{modified}".encode()).hexdigest()
    name = model.name if ":" in model.name else f"{model.name}:latest"
    return {
        "name": name,
        "model": name,
        "modified_at": modified,
        "size": st.st_size,
        "digest": digest,
        "details": ollama_info.details(model.info),
    }


def _entries(models: list[ServedModel]) -> list[dict[str, Any]]:
    out = []
    for model in models:
        try:
            out.append(_entry(model))
        except OSError:  # deleted since the scan: gone from the next listing
            continue
    return out


async def tags(request: Request) -> Response:
    """Every model the daemon serves; each loads on its first request."""
    models = await anyio.to_thread.run_sync(server_state(request).catalog.models)
    return JSONResponse({"models": await anyio.to_thread.run_sync(_entries, models)})


def _running(state: ServerState, res: Resident) -> dict[str, Any] | None:
    try:
        entry = _entry(res.model)
    except OSError:
        return None
    footprint = res.loadout.footprint
    info = res.engine.info
    return {
        **entry,
        # Ollama's size is what the model takes in memory, not the file: the plan's weights, KV, compute.
        "size": footprint.total,
        "size_vram": footprint.gpu if info.gpu_offload else 0,
        "expires_at": _expiry(res),
        "context_length": info.n_ctx or res.loadout.config.load.n_ctx,
        # localspec's own: what loaded with it, and whether it is still loading.
        "draft": info.draft if info.draft_error is None else None,
        "method": res.loadout.config.method,
        "pick": res.loadout.pick,
        "status": info.status,
        "busy": res.busy,
        "load_seconds": None if res.load_s is None else round(res.load_s, 3),
    }


def _expiry(res: Resident) -> str:
    """When it unloads: set once idle; while busy, its keep_alive from now, as Ollama reports it."""
    if res.expires_at is not None:
        return _iso(res.expires_at)
    if res.keep_alive is None and not res.unload_when_idle:
        return NEVER
    return _iso(time.time() + (0.0 if res.unload_when_idle else res.keep_alive or 0.0))


async def ps(request: Request) -> Response:
    """The loaded (and loading) models, what each takes and when it unloads."""
    state = server_state(request)
    residents = list(state.pool.resident.values())
    running = await anyio.to_thread.run_sync(lambda: [_running(state, r) for r in residents])
    return JSONResponse({"models": [r for r in running if r is not None]})


def _n_ctx(state: ServerState, model: ServedModel) -> int:
    res = state.pool.resident.get(model.name)
    if res is not None and res.engine.info.n_ctx:
        return res.engine.info.n_ctx
    return state.config.n_ctx


def _show(state: ServerState, model: ServedModel) -> dict[str, Any]:
    info = model.info
    n_ctx = _n_ctx(state, model)
    caps = ollama_info.capabilities(info)
    tokens = read_tokens(info, cache_dir=Paths.from_env().cache_dir)
    template = ollama_template(info, tokens, caps)
    stops = [tokens[info.eos_id]] if info.eos_id is not None and 0 <= info.eos_id < len(tokens) else []
    params = ollama_info.parameters(n_ctx, stops)
    return {
        "license": "",
        "modelfile": ollama_info.modelfile(str(model.path), template, params),
        "parameters": params,
        "template": template,
        "details": ollama_info.details(info),
        "model_info": ollama_info.model_info(info, n_ctx),
        "capabilities": caps,
        "modified_at": _iso(model.path.stat().st_mtime),
    }


async def show(request: Request) -> Response:
    """What a served model is, from its header: it need not be loaded."""
    state = server_state(request)
    body = parse_body(await request.body(), OllamaShowBody)
    name = body.model or body.name
    if not name:
        raise UserInputError("model is required", param="model")
    model = await anyio.to_thread.run_sync(state.catalog.resolve, name)
    return JSONResponse(await anyio.to_thread.run_sync(_show, state, model))


ROUTES = [
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/ps", ps, methods=["GET"]),
]
