"""A run's events as an HTTP response: one JSON body, or a stream of frames in the API's own shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from starlette.responses import JSONResponse, Response, StreamingResponse

from localspec.engine.handle import Event
from localspec.errors import LocalspecError
from localspec.server.state import Run
from localspec.types import GenerationResult, TokenChunk


class Format(Protocol):
    """How one API shapes a generation: streamed frames and the whole body."""

    media_type: str

    def chunk(self, chunk: TokenChunk) -> bytes: ...

    def final(self, result: GenerationResult) -> bytes: ...

    def error(self, exc: LocalspecError) -> bytes: ...

    def whole(self, result: GenerationResult) -> dict[str, Any]: ...


async def respond(run: Run, stream: bool, fmt: Format) -> Response:
    """Stream or not. A stream waits for its first event, so early errors keep their HTTP status."""
    if not stream:
        try:
            return JSONResponse(fmt.whole(await run.collect()))
        finally:
            run.close()
    try:
        first = await run.next()
    except BaseException:
        run.close()
        raise
    return stream_response(frames(run, first, fmt), fmt)


def stream_response(body: AsyncIterator[bytes], fmt: Format) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body, media_type=fmt.media_type, headers=headers)


async def frames(run: Run, first: TokenChunk | GenerationResult, fmt: Format) -> AsyncIterator[bytes]:
    """A run's frames, from its first event to its end (the result's frame, or an error's)."""
    # Everything already delivered goes out in one write: fewer syscalls under load, and after a
    # disconnect at most one write lands on the dead socket before Starlette cancels this
    # generator (its `finally` cancels the run).
    pending: list[Event] = [first]
    try:
        while True:
            out: list[bytes] = []
            for raw in pending:
                try:
                    event = run.settle(raw)
                except LocalspecError as exc:
                    yield b"".join([*out, fmt.error(exc)])
                    return
                if isinstance(event, GenerationResult):
                    yield b"".join([*out, fmt.final(event)])
                    return
                if (
                    event.text
                    or event.reasoning
                    or event.token_ids
                    or event.progress is not None
                    or event.calls
                ):
                    out.append(fmt.chunk(event))
            if out:
                yield b"".join(out)
            pending = [await run.next_raw(), *run.ready()]
    finally:
        run.close()
