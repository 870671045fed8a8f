"""LM Studio's REST API (`/api/v0`), as its clients read it: Zed's LM Studio provider, for one, lists
the models at /api/v0/models and chats at /api/v0/chat/completions (localhost:1234/api/v0 is its
default address).

Chat, completions and embeddings answer as the OpenAI routes do: LM Studio's are OpenAI's, with
a block of its own statistics beside that clients need not read. The model listing is LM
Studio's shape: `type` (llm, or embeddings for the --embed-model), `publisher`, `arch`,
`compatibility_type` gguf, `quantization`, `state` (loaded or not-loaded), the context lengths and
`capabilities` (`tool_use` where the chat template takes tools: Zed offers its agent only then).
`max_context_length` is the context this daemon serves the model at (or will, once it loads),
not the trained one, as /api/show reports it: a client that sized its prompts to the trained
one could overflow it.
"""

from __future__ import annotations

from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localspec.engine.toolcalls import supports_tools
from localspec.models.gguf_info import read_gguf_info
from localspec.paths import Paths
from localspec.server import embeddings, openai
from localspec.server.catalog import ServedModel
from localspec.server.state import ServerState, server_state

PREFIX = "/api/v0"
# A model in a models folder has no publisher of its own (LM Studio's folders are publisher/repo/).
LOCAL_PUBLISHER = "local"


def _entry(state: ServerState, model: ServedModel) -> dict[str, Any]:
    info = model.info
    loaded = model.name in state.pool.resident
    n_ctx = state.served_context(model)
    return {
        "id": model.name,
        "object": "model",
        "type": "llm",
        # A Hugging Face file is served as owner/repo:file: its owner publishes it, as in LM Studio.
        "publisher": model.name.split("/")[0] if "/" in model.name else LOCAL_PUBLISHER,
        "arch": info.arch,
        "compatibility_type": "gguf",
        "quantization": info.quant,
        "state": "loaded" if loaded else "not-loaded",
        "max_context_length": min(n_ctx, info.n_ctx_train) if info.n_ctx_train else n_ctx,
        **({"loaded_context_length": n_ctx} if loaded else {}),
        "capabilities": ["tool_use"] if supports_tools(info.chat_template) else [],
    }


def _embedding_entry(state: ServerState) -> dict[str, Any] | None:
    """The --embed-model, which the embedding routes use whatever model a request names."""
    path = state.config.embed_model
    if path is None:
        return None
    info = read_gguf_info(path, cache_dir=Paths.from_env().cache_dir)
    return {
        "id": path.stem,
        "object": "model",
        "type": "embeddings",
        "publisher": LOCAL_PUBLISHER,
        "arch": info.arch,
        "compatibility_type": "gguf",
        "quantization": info.quant,
        "state": "loaded" if state.embedder_loaded else "not-loaded",
        "max_context_length": info.n_ctx_train,
        "capabilities": [],
    }


def _listing(state: ServerState) -> list[dict[str, Any]]:
    entries = [_entry(state, m) for m in state.catalog.models()]
    embedding = _embedding_entry(state)
    return entries + ([embedding] if embedding is not None else [])


async def list_models(request: Request) -> Response:
    """Every model the daemon serves (each loads on its first request), the default first."""
    data = await anyio.to_thread.run_sync(_listing, server_state(request))
    return JSONResponse({"object": "list", "data": data})


def _one(state: ServerState, name: str) -> dict[str, Any]:
    embedding = _embedding_entry(state)
    if embedding is not None and name == embedding["id"]:
        return embedding
    return _entry(state, state.catalog.resolve(name))


async def get_model(request: Request) -> Response:
    state = server_state(request)
    return JSONResponse(await anyio.to_thread.run_sync(_one, state, request.path_params["model"]))


ROUTES = [
    Route(f"{PREFIX}/models", list_models, methods=["GET"]),
    Route(PREFIX + "/models/{model:path}", get_model, methods=["GET"]),
    Route(f"{PREFIX}/chat/completions", openai.chat_completions, methods=["POST"]),
    Route(f"{PREFIX}/completions", openai.completions, methods=["POST"]),
    Route(f"{PREFIX}/embeddings", embeddings.openai_embeddings, methods=["POST"]),
]
