"""The OpenAPI 3.1 schema of every route, request bodies from each API's pydantic models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from localspec.server.embeddings import OllamaEmbedBody, OllamaEmbeddingsBody, OpenAIEmbeddingsBody
from localspec.server.schemas import (
    ChatCompletionBody,
    CompletionBody,
    OllamaChatBody,
    OllamaGenerateBody,
    OllamaShowBody,
)
from localspec.server.schemas_anthropic import CountTokensBody, MessagesBody
from localspec.server.schemas_llamaserver import (
    DetokenizeBody,
    InfillBody,
    NativeCompletionBody,
    TokenizeBody,
)
from localspec.server.schemas_responses import ConversationBody, ResponsesBody

# /api/pull and /api/delete are left out: one downloads, the other deletes files, and the schema
# drives a fuzzer. So are the routes that only say what to do instead (/api/create, ...).
REQUEST_BODIES: dict[tuple[str, str], type[BaseModel]] = {
    ("post", "/v1/chat/completions"): ChatCompletionBody,
    ("post", "/v1/completions"): CompletionBody,
    ("post", "/v1/responses"): ResponsesBody,
    ("post", "/v1/conversations"): ConversationBody,
    ("post", "/v1/messages"): MessagesBody,
    ("post", "/v1/messages/count_tokens"): CountTokensBody,
    ("post", "/v1/embeddings"): OpenAIEmbeddingsBody,
    ("post", "/infill"): InfillBody,
    ("post", "/completion"): NativeCompletionBody,
    ("post", "/tokenize"): TokenizeBody,
    ("post", "/detokenize"): DetokenizeBody,
    ("post", "/api/chat"): OllamaChatBody,
    ("post", "/api/generate"): OllamaGenerateBody,
    ("post", "/api/show"): OllamaShowBody,
    ("post", "/api/embed"): OllamaEmbedBody,
    ("post", "/api/embeddings"): OllamaEmbeddingsBody,
}
GET_ROUTES = (
    "/health",
    "/props",
    "/tokenizer_info",
    "/v1/models",
    "/api/version",
    "/api/tags",
    "/api/ps",
    "/metrics",
    "/openapi.json",
)

_ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def openapi_schema(version: str) -> dict[str, Any]:
    """OpenAPI 3.1 for every route, request bodies from the pydantic models above."""
    _, defs = models_json_schema(
        [(m, "validation") for m in REQUEST_BODIES.values()], ref_template="#/components/schemas/{model}"
    )
    errors = {
        str(code): {"description": why, "content": {"application/json": {"schema": _ERROR_SCHEMA}}}
        for code, why in ((400, "bad request"), (404, "unknown model"), (413, "body too large"))
    }
    paths: dict[str, Any] = {p: {"get": {"responses": {"200": {"description": "OK"}}}} for p in GET_ROUTES}
    for (method, path), model in REQUEST_BODIES.items():
        body = {"$ref": f"#/components/schemas/{model.__name__}"}
        paths[path] = {
            method: {
                "summary": (model.__doc__ or "").strip().splitlines()[0],
                "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                "responses": {"200": {"description": "OK (JSON, SSE or NDJSON when streaming)"}, **errors},
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": "localspec", "version": version},
        "paths": paths,
        "components": {"schemas": defs.get("$defs", {})},
    }
