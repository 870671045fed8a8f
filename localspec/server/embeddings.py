"""The embedding routes of every API: `/v1/embeddings` and `/embeddings` (OpenAI, llama-server),
`/api/embed` and `/api/embeddings` (Ollama).

With `--embed-model FILE` they embed with that GGUF, whatever model name the
request gives (llama.vscode sends "GPT-4"; the daemon has one embedding model).
Without one they answer a clear 400, in the API's own error shape, saying why:
the served model generates, and which kind of model to load.
"""

from __future__ import annotations

import base64
import time
from typing import Any, Literal

import anyio
import numpy as np
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localspec.engine.embedding import EmbeddingModel
from localspec.errors import UserInputError
from localspec.server.schemas import _Body, parse_body
from localspec.server.state import ServerState, server_state

MAX_INPUTS = 2048  # OpenAI's own limit on inputs per request
NS = 1_000_000_000


class EmbeddingsUnsupportedError(UserInputError):
    """An embeddings request to a daemon started without an embedding model."""

    code = "embeddings_unsupported"


class OpenAIEmbeddingsBody(_Body):
    """POST /v1/embeddings."""

    model: str = ""
    input: str | list[str] = Field(..., description="Text, or a list of texts (token arrays are not taken).")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input


class OllamaEmbedBody(_Body):
    """POST /api/embed."""

    model: str = ""
    input: str | list[str]

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else self.input


class OllamaEmbeddingsBody(_Body):
    """POST /api/embeddings, Ollama's older route: one `prompt`."""

    model: str = ""
    prompt: str


async def _embed(state: ServerState, texts: list[str]) -> tuple[str, list[list[float]], int]:
    """(embedding model's name, one vector per text, tokens read); the 400 when there is no model."""
    model = await anyio.to_thread.run_sync(state.embedder)
    if model is None:
        raise EmbeddingsUnsupportedError(
            f"{state.model_name} is a generative model, loaded without embeddings, so this daemon "
            "computes none; start it with --embed-model FILE, an embedding model (a GGUF such as "
            "nomic-embed-text or bge)",
            param="model",
        )
    if not 1 <= len(texts) <= MAX_INPUTS:
        raise UserInputError(f"send between 1 and {MAX_INPUTS} inputs", param="input")
    vectors, n_tokens = await anyio.to_thread.run_sync(EmbeddingModel.embed, model, texts)
    return model.path.stem, vectors, n_tokens


def _base64(vector: list[float]) -> str:
    # OpenAI's base64 form: little-endian float32, what its SDK asks for and decodes by default.
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


async def openai_embeddings(request: Request) -> Response:
    state = server_state(request)
    body = parse_body(await request.body(), OpenAIEmbeddingsBody)
    name, vectors, n_tokens = await _embed(state, body.texts())
    if body.dimensions is not None and body.dimensions != len(vectors[0]):
        raise UserInputError(f"{name} embeds in {len(vectors[0])} dimensions only", param="dimensions")
    data: list[dict[str, Any]] = [
        {
            "object": "embedding",
            "index": i,
            "embedding": _base64(v) if body.encoding_format == "base64" else v,
        }
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    return JSONResponse({"object": "list", "data": data, "model": name, "usage": usage})


async def ollama_embed(request: Request) -> Response:
    state = server_state(request)
    body = parse_body(await request.body(), OllamaEmbedBody)
    t0 = time.perf_counter()
    name, vectors, n_tokens = await _embed(state, body.texts())
    took = int((time.perf_counter() - t0) * NS)
    return JSONResponse(
        {
            "model": name,
            "embeddings": vectors,
            "total_duration": took,
            "load_duration": 0,
            "prompt_eval_count": n_tokens,
        }
    )


async def ollama_embeddings(request: Request) -> Response:
    state = server_state(request)
    body = parse_body(await request.body(), OllamaEmbeddingsBody)
    _, vectors, _ = await _embed(state, [body.prompt])
    return JSONResponse({"embedding": vectors[0]})


ROUTES = [
    Route("/v1/embeddings", openai_embeddings, methods=["POST"]),
    Route("/embeddings", openai_embeddings, methods=["POST"]),
    Route("/api/embed", ollama_embed, methods=["POST"]),
    Route("/api/embeddings", ollama_embeddings, methods=["POST"]),
]
