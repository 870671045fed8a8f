"""The pieces every API's bodies share: error bodies, finish reasons, speculation stats, compact JSON."""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

from starlette.responses import JSONResponse

from localspec.errors import ContextOverflowError, LocalspecError, OverloadedError
from localspec.server.config import RETRY_AFTER_S
from localspec.types import GenerationResult, GenerationStats, PromptProgress

log = logging.getLogger("localspec.api")


def _message(exc: LocalspecError, api: str) -> str:
    return exc.in_words_of(api) if isinstance(exc, ContextOverflowError) else exc.message


def openai_error_body(exc: LocalspecError) -> dict[str, Any]:
    message = _message(exc, "openai")
    return {"error": {"message": message, "type": exc.error_type, "param": exc.param, "code": exc.code}}


Api = Literal["openai", "ollama", "anthropic"]
# Anthropic names its error types by status (docs.anthropic.com, "Errors").
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_body(exc: LocalspecError) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(exc.http_status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": _message(exc, "anthropic")}}


def error_body(exc: LocalspecError, api: Api) -> dict[str, Any]:
    if api == "ollama":
        return {"error": exc.message}
    return anthropic_error_body(exc) if api == "anthropic" else openai_error_body(exc)


def error_response(exc: LocalspecError, api: Api) -> JSONResponse:
    """The error in its API's shape (OpenAI's, Ollama's `{"error": "..."}`, Anthropic's); status by type."""
    body = error_body(exc, api)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if isinstance(exc, OverloadedError) else None
    return JSONResponse(body, status_code=exc.http_status, headers=headers)


def finish_reason(result: GenerationResult) -> str:
    # "cancelled" only reaches a client that left; OpenAI's vocabulary has stop, length, tool_calls.
    return result.finish_reason if result.finish_reason in ("length", "tool_calls") else "stop"


def progress_fields(progress: PromptProgress) -> dict[str, Any]:
    """llama-server's `prompt_progress` (return_progress): the read's progress is processed/total,
    its timed part (processed - cache)/(total - cache)."""
    return {
        "prompt_progress": {
            "total": progress.total,
            "cache": progress.cached,
            "processed": progress.processed,
            "time_ms": round(progress.seconds * 1000, 3),
        }
    }


def stats_fields(stats: GenerationStats) -> dict[str, Any]:
    """Speculation stats for every response: llama-server's `timings` names plus localspec's own.

    `timings` means what llama-server's does, as editor plugins show it beside llama-server's: the
    prompt's time up to the first token, then the generation's after it, whose speed counts the
    tokens after the first (the first comes with the prompt's logits). localspec's own
    `tokens_per_second` is the whole request's. A request that generated nothing (a warm-up past
    its prompt budget, a stop while the prompt was read) spent all its time on the prompt."""
    prompt_s = stats.ttft_s if stats.tokens else stats.elapsed_s
    gen_s = max(stats.elapsed_s - prompt_s, 0.0)
    steps = max(stats.tokens - 1, 0)
    timings = {
        "prompt_n": stats.prompt_tokens,
        "prompt_ms": round(prompt_s * 1000, 3),
        "prompt_per_token_ms": round(prompt_s * 1000 / max(stats.prompt_tokens, 1), 3),
        "prompt_per_second": round(stats.prompt_tokens / prompt_s, 3) if prompt_s > 0 else 0.0,
        "predicted_n": stats.tokens,
        "predicted_ms": round(gen_s * 1000, 3),
        "predicted_per_token_ms": round(gen_s * 1000 / max(steps, 1), 3),
        "predicted_per_second": round(steps / gen_s, 3) if gen_s > 0 else 0.0,
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
    }
    return {"timings": timings, "localspec": stats.to_dict()}


def json_bytes(data: dict[str, Any]) -> bytes:
    try:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        # A lone surrogate (a call's JSON may escape one, `"\\ud800"`) has no UTF-8: escaped, the
        # body is still the same JSON value.
        return json.dumps(data, separators=(",", ":")).encode()


def unsent(arguments: str, sent: str) -> str:
    """What is left of a streamed call's arguments (or input) once `sent` went out: ToolCallFilter.finish
    keeps them one text, so anything else is logged and nothing more is sent."""
    if not arguments.startswith(sent):
        log.warning("a streamed call's arguments are not the ones it ended with")
        return ""
    return arguments[len(sent) :]


def text_after(streamed: str, text: str) -> str:
    """The reply's text after a call that streamed: its content past the text streamed before the
    call (the content is the text with the calls taken out, stripped)."""
    before = streamed.strip()
    if not text.startswith(before):  # ToolCallFilter.finish keeps the streamed text a prefix
        return text
    return text[len(before) :].strip()
