"""Between the blocking engine and the async routes: the state every route shares, and runs.

Each loaded model's engine (server.pool) has a worker thread that delivers each
request's events to its Handle, whose `take()` blocks. One small pump thread per
request moves those events onto the event loop with `call_soon_threadsafe`, so the
loop never waits on the engine. After each batch it lets the chunks that follow
gather for the configured interval (Handle.gather): the first chunk goes out at
once, the rest every 40 ms by default rather than once a token. A run also watches
its connection: when the client goes away, the handle is cancelled and the engine
stops that generation within one step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.types import Scope

from localspec import __version__
from localspec.engine.handle import Event, Handle
from localspec.engine.rpc import worker_states
from localspec.errors import DaemonError, LocalspecError
from localspec.models.gguf_info import GGUFInfo
from localspec.process.hugepages import huge_pages
from localspec.server.catalog import ModelCatalog, ServedModel
from localspec.server.config import ApiConfig
from localspec.server.metrics import Metrics
from localspec.server.pool import DEFAULT, ModelPool, Resident
from localspec.server.response_store import ConversationStore, ResponseStore
from localspec.server.truncation import truncated
from localspec.types import GenerationRequest, GenerationResult, SpecParams, TokenChunk

if TYPE_CHECKING:
    from localspec.engine.embedding import EmbeddingModel

log = logging.getLogger("localspec.api")

# Where a request's scope keeps the models it uses, released when its response ends (app.CountRequests).
LEASES = "localspec.leases"


class ServerState:
    """What every route shares: the served models and their pool, request defaults, metrics, runs."""

    def __init__(self, catalog: ModelCatalog, pool: ModelPool, config: ApiConfig) -> None:
        self.catalog = catalog
        self.pool = pool
        self.config = config
        self.metrics = Metrics()
        self.responses = ResponseStore()  # the Responses API's kept responses
        self.conversations = ConversationStore()  # and its conversations
        self.started = time.time()
        # Whether the weights llama.cpp copies into memory sit in huge pages (process.hugepages):
        # fixed when the process started, so read once.
        self.huge_pages = huge_pages()
        self.active: set[Handle] = set()
        self.shutting_down = False
        self._ready = False
        self._embedder: EmbeddingModel | None = None
        self._embedder_lock = threading.Lock()

    @property
    def model_name(self) -> str:
        """The default model's name: the one the daemon was started with."""
        return self.catalog.default.name

    @property
    def default(self) -> Resident | None:
        return self.pool.resident.get(self.catalog.default.name)

    async def use(self, request: Request, name: str | None, keep_alive: object = DEFAULT) -> ModelState:
        """The named model (the default for None), loaded if need be, busy until the response ends.

        A name the daemon does not serve is ModelNotFoundError; a load that fails is this
        request's ModelLoadError. `keep_alive` (seconds, None: forever) applies once it ends.
        """
        if self.shutting_down:
            raise DaemonError("the daemon is shutting down; retry once it is back")
        model = await asyncio.to_thread(self.catalog.resolve, name)
        res = await self.pool.acquire(model)
        request.scope.setdefault(LEASES, []).append((res, keep_alive))
        return ModelState(self, res)

    def release(self, scope: Scope) -> None:
        """The response has ended: its models' keep_alive may start."""
        for res, keep_alive in scope.pop(LEASES, ()):
            self.pool.release(res, keep_alive)

    def served_context(self, model: ServedModel) -> int:
        """The context a model answers in (what /api/show and LM Studio's listing report): its
        engine's where it is loaded; otherwise the one its load will use, planned now (blocking:
        call it off the event loop), or the daemon's where no plan can be made (the load says why)."""
        res = self.pool.resident.get(model.name)
        if res is not None and res.engine.info.n_ctx:
            return res.engine.info.n_ctx
        try:
            return self.pool.plan(model).config.load.n_ctx
        except LocalspecError:
            return self.config.n_ctx

    @property
    def embedder_loaded(self) -> bool:
        """Whether the embedding model has been loaded (by a first embeddings request)."""
        return self._embedder is not None

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

                self._embedder = EmbeddingModel(path, n_threads=self.config.n_threads)
            return self._embedder

    def status(self) -> str:
        """loading while the default model first loads, failed if that failed, else ready.

        Once ready, the daemon stays ready: a model loading on demand later is in `loading`.
        """
        default = self.default
        if self._ready or default is None or default.engine.info.status == "ready":
            self._ready = True
            return "ready"
        return "failed" if default.engine.info.status == "failed" else "loading"

    def health(self) -> dict[str, Any]:
        status = self.status()
        body: dict[str, Any] = {"status": status, "version": __version__, "huge_pages": self.huge_pages}
        default = self.default
        if status == "failed" and default is not None:
            body["error"] = default.engine.info.error
        body |= self._rpc_workers()
        if status != "ready":
            return body | {"loading": self.pool.loading or self.model_name}
        body |= {"model": self.model_name, "loading": self.pool.loading, "models": self.loaded()}
        if default is None or default.engine.info.status != "ready":
            return body | {"in_flight": len(self.active), "uptime_s": round(time.time() - self.started, 3)}
        return body | ModelState(self, default).health()

    def _rpc_workers(self) -> dict[str, Any]:
        """{"rpc_workers": [{"endpoint", "up", "error", "in_use"}]} for the targets' RPC workers.

        A worker serves one client at a time and queues at most a connection or two (llama.cpp
        listens with a backlog of 1): probing one that a live engine holds would fill its queue
        and time out. So a worker held by a live engine is up (when it dies, the engine dies at
        its next step and the worker is probed from then on); the others are probed now.
        """
        endpoints = self.pool.rpc_endpoints()
        if not endpoints:
            return {}
        live = [r for r in self.pool.resident.values() if r.engine.info.status in ("loading", "ready")]
        held = {e for res in live for e in res.loadout.config.load.rpc}
        probed = {s.endpoint: asdict(s) for s in worker_states([e for e in endpoints if e not in held], 0.5)}
        held_state = {"up": True, "error": None}
        return {
            "rpc_workers": [
                {"endpoint": e, "in_use": e in held} | (held_state if e in held else probed[e])
                for e in endpoints
            ]
        }

    def loaded(self) -> list[dict[str, Any]]:
        """The loaded and loading models, for /health and /api/ps."""
        return [_resident_summary(res) for res in self.pool.resident.values()]

    def queue_depth(self) -> int:
        return sum(engine.queue_depth for engine in self.pool.engines())

    def cancel_all(self) -> None:
        """Shutting down: every run ends within one engine step. Safe from a signal handler."""
        self.shutting_down = True
        for engine in self.pool.engines():
            engine.renderer.interrupt()  # a chat template being rendered ends now, too
        for handle in list(self.active):
            handle.cancel()


def _resident_summary(res: Resident) -> dict[str, Any]:
    info = res.engine.info
    return {
        "name": res.name,
        "status": info.status,
        "draft": info.draft if info.draft_error is None else None,
        "method": res.loadout.config.method,
        "pick": res.loadout.pick,
        "bytes": res.footprint.total,
        "bytes_gpu": res.footprint.gpu,
        "busy": res.busy,
        "keep_alive": res.keep_alive,
        "expires_at": res.expires_at,
        "load_s": None if res.load_s is None else round(res.load_s, 3),
        # Earlier conversations' caches it keeps in RAM besides `bytes` (engine.promptcache).
        "saved_prompts": info.saved_prompts,
        "saved_prompt_bytes": info.saved_prompt_bytes,
    }


class ModelState:
    """One served model as a route sees it: its engine, name, defaults and runs.

    It answers what routes used to ask of the one-model ServerState (`engine`,
    `model_name`, `spec_default`, `unlimited`, `resolve_model`, `gguf_info`, `start`),
    for the model the request named.
    """

    def __init__(self, server: ServerState, res: Resident) -> None:
        self.server = server
        self.resident = res
        self.engine = res.engine
        self.config = server.config
        self.metrics = server.metrics
        self.started = server.started
        self.spec_default = SpecParams(method=res.engine.config.method, k=res.engine.config.k)

    @property
    def model_name(self) -> str:
        return self.resident.name

    @property
    def unlimited(self) -> int:
        """max_tokens for "until the context is full": the engine stops at the context's end."""
        return max(1, self.engine.info.n_ctx or self.engine.config.load.n_ctx)

    def resolve_model(self, name: str | None = None) -> str:
        """This model's name (the request's name already led here)."""
        return self.model_name

    def gguf_info(self) -> GGUFInfo:
        return self.resident.model.info

    def embedder(self) -> EmbeddingModel | None:
        return self.server.embedder()

    def health(self) -> dict[str, Any]:
        info = self.engine.info
        return {
            "model": self.model_name,
            "target": info.target,
            "draft": info.draft if info.draft_error is None else None,
            "draft_error": info.draft_error,
            "pick": self.resident.loadout.pick,
            "methods": info.methods,
            "method": self.spec_default.method,
            "k": self.spec_default.k,
            "n_ctx": info.n_ctx,
            # Batch-invariant (--exact: bit-identical greedy output) or llama.cpp's own loading.
            "exact": self.engine.config.load.batch_invariant,
            # Prompts read by a plain copy of the weights, generation by the repacked one.
            "plain_prefill": info.plain_prefill,
            "gpu_offload": info.gpu_offload,
            "queue_depth": self.engine.queue_depth,
            "in_flight": len(self.server.active),
            "uptime_s": round(time.time() - self.server.started, 3),
        }

    async def start(self, request: Request, greq: GenerationRequest, stream: bool = True) -> Run:
        """Queue a generation; unless `stream`, its chunks are never sent here, only its result."""
        server = self.server
        if server.shutting_down:
            raise DaemonError("the daemon is shutting down; retry once it is back")
        # The chat template runs off the event loop and off the engine thread, within its budget.
        prepared = await asyncio.to_thread(self.engine.prepare, greq)
        if greq.truncate and (greq.messages or greq.context_ids):
            count, n_ctx = (
                self.engine.count_prompt_tokens,
                min(self.unlimited, greq.context_limit or self.unlimited),
            )
            fitted = await asyncio.to_thread(truncated, greq, count, n_ctx, _most_tokens(prepared))
            if fitted is not greq:  # rendered again without what was left out
                prepared = await asyncio.to_thread(self.engine.prepare, fitted)
            if fitted.dropped_messages:
                log.info(
                    "%s: left out the %d oldest messages to fit the context",
                    self.model_name,
                    fitted.dropped_messages,
                )
        greq = prepared
        if server.shutting_down:
            raise DaemonError("the daemon is shutting down; retry once it is back")
        handle = self.engine.submit(greq, stream)  # OverloadedError when the queue is full
        server.active.add(handle)
        return Run(server, handle, request)


def _most_tokens(prepared: GenerationRequest) -> int | None:
    """At least the prompt tokens of a request `prepare` rendered: its prompt's bytes (every token
    holds one or more) and the earlier exchange's tokens; None where it is not known so."""
    if prepared.prompt is None or prepared.messages or prepared.suffix is not None or prepared.extra:
        return None  # not rendered here (a model still loading), or more than the prompt (FIM)
    return len(prepared.prompt.encode()) + len(prepared.context_ids) + 1  # a BOS the model may add


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
            events = self.handle.take()
            try:
                self._loop.call_soon_threadsafe(self._deliver, events)
            except RuntimeError:  # the loop is closed: the daemon is exiting
                return
            if not isinstance(events[-1], TokenChunk):
                return
            if self.state.config.stream_interval_s:
                self.handle.gather(self.state.config.stream_interval_s)

    def _deliver(self, events: list[Event]) -> None:
        for event in events:
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
