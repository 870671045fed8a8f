"""Ollama's model routes: `/api/tags`, `/api/show`, `/api/ps`, `/api/delete`, shaped as Ollama answers them.

The daemon serves every model its catalog lists, each loaded on its first request
at a context of its own (pickdraft.context, unless --ctx sets one for all): that is
what these report, a model not loaded yet the one its load will use, so a client
sizes its prompts to the served context (`model_info`, `parameters` num_ctx), not
to the GGUF's trained one. /api/ps lists the loaded models, what each takes by the memory plan,
and when its keep_alive runs out. /api/delete removes a model's files from the models
folder (what `localspec pull` and /api/pull write), never another program's: Ollama's
store, the Hugging Face cache and LM Studio's folders keep their own tools. Creating,
copying and pushing models (Ollama's Modelfiles and registry) have no counterpart in a
daemon that serves GGUF files as they are: those routes say what to do instead.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localspec.errors import NotSupportedError
from localspec.models.gguf_info import read_tokens
from localspec.models.remove import removable_files, remove_files
from localspec.paths import Paths
from localspec.server import ollama_info
from localspec.server.catalog import ServedModel
from localspec.server.ollama_template import ollama_template
from localspec.server.pool import Resident
from localspec.server.schemas import OllamaDeleteBody, OllamaShowBody, parse_body
from localspec.server.state import ServerState, server_state

log = logging.getLogger("localspec.api")

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
    footprint = res.footprint
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
        # Conversations' caches kept in memory beside the plan's bytes (engine.promptcache).
        "saved_prompts": info.saved_prompts,
        "saved_prompt_bytes": info.saved_prompt_bytes,
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


def _show(state: ServerState, model: ServedModel) -> dict[str, Any]:
    info = model.info
    n_ctx = state.served_context(model)
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
    name = parse_body(await request.body(), OllamaShowBody).named()
    model = await anyio.to_thread.run_sync(state.catalog.resolve, name)
    return JSONResponse(await anyio.to_thread.run_sync(_show, state, model))


STARTED_WITH = "is the model this daemon was started with: stop the daemon, then delete its file"


async def delete(request: Request) -> Response:
    """Ollama's DELETE /api/delete: the model's files go now; if loaded, it unloads once idle."""
    state = server_state(request)
    name = parse_body(await request.body(), OllamaDeleteBody).named()
    model = await anyio.to_thread.run_sync(state.catalog.resolve, name)
    models_dir = Paths.from_env().models_dir
    paths = await anyio.to_thread.run_sync(
        lambda: removable_files(model.name, model.path, model.source, models_dir, where=STARTED_WITH)
    )
    await state.pool.unload(model.name)  # a busy model finishes its requests (its file stays mapped)
    state.pool.forget(model.name)  # a file of the same name pulled later is planned afresh
    await anyio.to_thread.run_sync(remove_files, model.name, paths)
    log.info("deleted %s (%s)", model.name, ", ".join(p.name for p in paths))
    await anyio.to_thread.run_sync(lambda: state.catalog.models(fresh=True))
    return Response(status_code=200)


def _not_supported(message: str) -> Callable[[Request], Awaitable[Response]]:
    async def refuse(request: Request) -> Response:
        folder = Paths.from_env().models_dir
        raise NotSupportedError(f"{request.method} {request.url.path}: {message.format(folder=folder)}")

    return refuse


CREATE = (
    "localspec serves GGUF files as they are and creates no models: put the GGUF (every part of "
    "a split one) in the models folder ({folder}) or `localspec pull OWNER/REPO`; it is listed at once"
)

ROUTES = [
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/ps", ps, methods=["GET"]),
    Route("/api/delete", delete, methods=["DELETE"]),
    Route("/api/create", _not_supported(CREATE), methods=["POST"]),
    Route("/api/blobs/{digest}", _not_supported(CREATE), methods=["HEAD", "POST"]),
    Route(
        "/api/copy",
        _not_supported(
            "localspec names each model after its file and keeps no copies: copy or link the GGUF "
            "into the models folder ({folder}) under the new name"
        ),
        methods=["POST"],
    ),
    Route(
        "/api/push",
        _not_supported(
            "localspec publishes no models: upload the GGUF to the Hugging Face Hub (`hf upload`)"
        ),
        methods=["POST"],
    ),
]
