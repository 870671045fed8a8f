"""The embedding routes of every API, answered with a clear 400: this daemon's model only generates.

`/v1/embeddings` and `/embeddings` (OpenAI, llama-server), `/api/embed` and
`/api/embeddings` (Ollama) exist so that an editor asking for embeddings learns
why it gets none, in its own API's error shape (app.render_error), instead of a 404.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from localspec.errors import UserInputError
from localspec.server.state import server_state


class EmbeddingsUnsupportedError(UserInputError):
    """An embeddings request to a daemon whose model is loaded to generate text."""

    code = "embeddings_unsupported"


async def embeddings(request: Request) -> Response:
    name = server_state(request).model_name
    raise EmbeddingsUnsupportedError(
        f"{name} is a generative model, loaded without embeddings, so this daemon computes none; "
        "for embeddings, serve an embedding model (a GGUF such as nomic-embed-text or bge) elsewhere",
        param="model",
    )


ROUTES = [
    Route(path, embeddings, methods=["POST"])
    for path in ("/v1/embeddings", "/embeddings", "/api/embed", "/api/embeddings")
]
