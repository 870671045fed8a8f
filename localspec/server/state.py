"""Between the blocking engine and the async routes: the state every route shares, and runs.

The engine's worker thread delivers each request's events to its Handle, whose
`next_event()` blocks. One small pump thread per request moves those events
onto the event loop with `call_soon_threadsafe` (tens of microseconds a token),
so the loop never waits on the engine. A run also watches its connection: when
the client goes away, the handle is cancelled and the engine stops that
generation within one step.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from localspec import __version__
from localspec.engine.worker import Engine, Event, Handle
from localspec.errors import DaemonError, LocalspecError, ModelNotFoundError
from localspec.models.gguf_info import GGUFInfo
from localspec.server.config import ApiConfig
from localspec.server.metrics import Metrics
from localspec.server.ollama_info import names_model
from localspec.types import GenerationRequest, GenerationResult, SpecParams, TokenChunk

if TYPE_CHECKING:
    from localspec.engine.embedding import EmbeddingModel


class ServerState:
    """What every route shares: the engine, request defaults, metrics and the runs in flight."""

    def __init__(self, engine: Engine, config: ApiConfig) -> None:
        self.engine = engine
        self.config = config
        self.metrics = Metrics()
        self.started = time.time()
        self.spec_default = SpecParams(method=engine.config.method, k=engine.config.k)
        self.active: set[Handle] = set()
        self.shutting_down = False
        self._gguf_info: GGUFInfo | None = None
        self._embedder: EmbeddingModel | None = None
        self._embedder_lock = threading.Lock()

    @property
    def model_name(self) -> str:
        return self.engine.config.target.stem

    @property
    def unlimited(self) -> int:
        """max_tokens for "until the context is full": the engine stops at the context's end."""
        return max(1, self.engine.info.n_ctx or self.engine.config.load.n_ctx)

    def resolve_model(self, name: str) -> str:
        """The served model's name for a requested one. Names are compared, never opened as paths."""
        base = name.removesuffix(":latest")
        if base in (self.model_name, self.engine.config.target.name, self.config.alias):
            return self.model_name
        # An Ollama-style `family:tag` (qwen2.5-coder:1.5b), matched against the GGUF's own metadata.
        if ":" in name and names_model(self.gguf_info(), name):
            return self.model_name
        served = f"{self.model_name!r} (alias {self.config.alias!r})"
        raise ModelNotFoundError(f"model {name!r} is not loaded; this daemon serves {served}", param="model")

    def gguf_info(self) -> GGUFInfo:
        """The target's header, read once (blocking: call it off the event loop)."""
        if self._gguf_info is None:
            from localspec.models.gguf_info import read_gguf_info
            from localspec.paths import Paths

            self._gguf_info = read_gguf_info(self.engine.config.target, cache_dir=Paths.from_env().cache_dir)
        return self._gguf_info

    def embedder(self) -> EmbeddingModel | None:
        """The embedding model (--embed-model), loaded on first use; None when none is configured.

        Blocking (the first call loads the GGUF): call it off the event loop.
        """
        path = self.config.embed_model
        if path is None:
            return None
        with self._embedder_lock:
            if self._embedder is None:
                from localspec.engine.embedding import EmbeddingModel

                self._embedder = EmbeddingModel(path, n_threads=self.engine.config.load.n_threads)
            return self._embedder

    def health(self) -> dict[str, Any]:
        info = self.engine.info
        body: dict[str, Any] = {"status": info.status, "version": __version__}
        if info.status == "failed":
            body["error"] = info.error
        if info.status != "ready":
            return body
        return body | {
            "model": self.model_name,
            "target": info.target,
            "draft": info.draft if info.draft_error is None else None,
            "draft_error": info.draft_error,
            "pick": self.config.pick,
            "methods": info.methods,
            "method": self.spec_default.method,
            "k": self.spec_default.k,
            "n_ctx": info.n_ctx,
            # Batch-invariant (--exact: bit-identical greedy output) or llama.cpp's own loading.
            "exact": self.engine.config.load.batch_invariant,
            "gpu_offload": info.gpu_offload,
            "queue_depth": self.engine.queue_depth,
            "in_flight": len(self.active),
            "uptime_s": round(time.time() - self.started, 3),
        }

    def cancel_all(self) -> None:
        """Shutting down: every run ends within one engine step. Safe from a signal handler."""
        self.shutting_down = True
        self.engine.renderer.interrupt()  # a chat template being rendered ends now, too
        for handle in list(self.active):
            handle.cancel()

    async def start(self, request: Request, greq: GenerationRequest) -> Run:
        if self.shutting_down:
            raise DaemonError("the daemon is shutting down; retry once it is back")
        # The chat template runs off the event loop and off the engine thread, within its budget.
        greq = await asyncio.to_thread(self.engine.prepare, greq)
        if self.shutting_down:
            raise DaemonError("the daemon is shutting down; retry once it is back")
        handle = self.engine.submit(greq)  # OverloadedError when the queue is full
        self.active.add(handle)
        return Run(self, handle, request)


class Run:
    """One request's generation as an async source of events, cancelled when its client leaves."""

    def __init__(self, state: ServerState, handle: Handle, request: Request) -> None:
        self.state = state
        self.handle = handle
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        threading.Thread(target=self._pump, name="localspec-bridge", daemon=True).start()
        self._watcher = asyncio.create_task(self._cancel_on_disconnect(request))

    def _pump(self) -> None:
        while True:
            event = self.handle.next_event()
            try:
                self._loop.call_soon_threadsafe(self._deliver, event)
            except RuntimeError:  # the loop is closed: the daemon is exiting
                return
            if not isinstance(event, TokenChunk):
                return

    def _deliver(self, event: Event) -> None:
        # Counted here, not where the route reads it: a run whose client left is read by nobody.
        if isinstance(event, GenerationResult):
            self.state.metrics.finished(event.finish_reason, event.stats)
        elif isinstance(event, LocalspecError):
            self.state.metrics.failed()
        self._events.put_nowait(event)

    async def _cancel_on_disconnect(self, request: Request) -> None:
        # The body has been read, so the next message uvicorn delivers is the disconnect.
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.handle.cancel()

    def settle(self, event: Event) -> TokenChunk | GenerationResult:
        """A chunk or the result as is; an error (or a stop for shutdown) raised."""
        if isinstance(event, TokenChunk):
            return event
        stopped = isinstance(event, LocalspecError) or event.finish_reason == "cancelled"
        if stopped and self.state.shutting_down:
            raise DaemonError("the daemon is shutting down; the generation was stopped")
        if isinstance(event, LocalspecError):
            raise event
        return event  # a "cancelled" result only reaches a client that has left

    async def next_raw(self) -> Event:
        """The next event as the engine sent it (errors returned, not raised)."""
        return await self._events.get()

    async def next(self) -> TokenChunk | GenerationResult:
        """The next chunk, or the result at the end; errors are raised."""
        return self.settle(await self.next_raw())

    def ready(self) -> list[Event]:
        """The events already delivered, unsettled, without waiting."""
        out: list[Event] = []
        while not self._events.empty():
            out.append(self._events.get_nowait())
        return out

    async def collect(self) -> GenerationResult:
        while not isinstance(event := await self.next(), GenerationResult):
            pass
        return event

    def close(self) -> None:
        """Idempotent; cancelling a finished handle does nothing."""
        self.handle.cancel()
        self._watcher.cancel()
        self.state.active.discard(self.handle)


def server_state(request: Request) -> ServerState:
    """The ServerState of the app serving this request."""
    state: ServerState = request.app.state.localspec
    return state
