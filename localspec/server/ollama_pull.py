"""Ollama's `/api/pull`: download a GGUF from Hugging Face with `localspec pull`'s code, progress as NDJSON.

Ollama pulls from its own library; localspec pulls from the Hub, so a model is
named as Ollama names Hub models, `hf.co/OWNER/REPO[:QUANT]`, or as `localspec pull`
does, `OWNER/REPO[:FILE.gguf]`. The file lands in the models folder; the daemon
keeps serving the model it was started with. A library name that names the
served model succeeds at once, as pulling a model already present does in Ollama.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from pydantic import Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from localspec.errors import LocalspecError, ModelNotFoundError, UserInputError
from localspec.models import hub
from localspec.server.responses import json_bytes
from localspec.server.schemas import OllamaNamedBody, parse_body
from localspec.server.state import server_state

log = logging.getLogger("localspec.api")
HUB_HOSTS = ("hf.co/", "huggingface.co/")

Emit = Callable[[dict[str, Any]], None]


class OllamaPullBody(OllamaNamedBody):
    """POST /api/pull."""

    insecure: bool = False
    stream: bool = Field(True, description="Ollama streams unless told not to.")


def hub_spec(name: str) -> tuple[str, str | None, str | None]:
    """(repository, file, quantisation) for `hf.co/OWNER/REPO[:QUANT]` or `OWNER/REPO[:FILE.gguf]`."""
    spec = name
    for host in HUB_HOSTS:
        spec = spec.removeprefix(host)
    repo, _, tag = spec.partition(":")
    if tag.lower().endswith(".gguf"):
        return (*hub.parse_spec(spec), None)
    repo, _ = hub.parse_spec(repo)
    return repo, None, (tag if tag and tag != "latest" else None)


def _download(name: str, emit: Emit) -> None:
    """The pull itself, blocking; every step reported to `emit` as Ollama words it."""
    repo, filename, quant = hub_spec(name)
    emit({"status": "pulling manifest"})

    def progress(file: str, done: int, total: int | None) -> None:
        emit({"status": f"pulling {file}", "digest": file, "total": total or 0, "completed": done})

    hub.pull(repo, filename, progress=False, quant=quant, on_progress=progress)
    emit({"status": "verifying sha256 digest"})
    emit({"status": "writing manifest"})


async def _stream(name: str) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def emit(event: dict[str, Any] | None) -> None:
        loop.call_soon_threadsafe(events.put_nowait, event)

    def work() -> None:
        try:
            _download(name, emit)
            emit({"status": "success"})
        except LocalspecError as exc:
            emit({"error": exc.message})
        except Exception as exc:  # a bug must cost this pull, not the daemon
            log.exception("pull failed")
            emit({"error": f"internal error: {type(exc).__name__}"})
        finally:
            emit(None)

    threading.Thread(target=work, name="localspec-pull", daemon=True).start()
    while (event := await events.get()) is not None:
        yield json_bytes(event) + b"\n"


async def pull(request: Request) -> Response:
    state = server_state(request)
    body = parse_body(await request.body(), OllamaPullBody)
    name = body.named()
    if "/" not in name:
        try:
            await anyio.to_thread.run_sync(state.catalog.resolve, name)
        except ModelNotFoundError:
            raise UserInputError(
                f"{name!r} is an Ollama library name; localspec pulls GGUFs from Hugging Face: "
                "name one as hf.co/OWNER/REPO[:QUANT]",
                param="model",
            ) from None
        success = {"status": "success"}
        return JSONResponse(success) if not body.stream else _ndjson([json_bytes(success) + b"\n"])
    hub_spec(name)  # a malformed name is a 400 before any stream starts
    if not body.stream:
        await anyio.to_thread.run_sync(_download, name, lambda _event: None)
        return JSONResponse({"status": "success"})
    return StreamingResponse(_stream(name), media_type="application/x-ndjson")


def _ndjson(lines: list[bytes]) -> Response:
    return Response(b"".join(lines), media_type="application/x-ndjson")


ROUTES = [Route("/api/pull", pull, methods=["POST"])]
