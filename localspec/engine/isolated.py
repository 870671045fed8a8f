"""An Engine whose models live in a child process, so that llama.cpp aborting kills only the child.

ggml-rpc aborts the process when an RPC worker dies mid-request. A target on RPC workers
therefore loads in engine.engine_child; this proxy keeps the Engine interface (submit,
prepare, count_prompt_tokens, tokenize, pieces, queue_depth, wait_ready, close, info, renderer), so the
daemon's pool, the routes and `generate` use it as they use an Engine. When the child dies,
each request in flight ends with an RpcWorkerError that names the worker that is down, and
the engine's status turns "failed" (the pool loads it anew for the next request).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from localspec.engine.config import EngineConfig
from localspec.engine.engine_child import ErrorState
from localspec.engine.handle import Handle
from localspec.engine.rpc import worker_states
from localspec.engine.templating import TemplateRenderer
from localspec.engine.worker import Engine, EngineInfo, ProgressFn
from localspec.errors import LocalspecError, RpcWorkerError
from localspec.types import GenerationRequest, GenerationResult

log = logging.getLogger("localspec.engine")

CALL_TIMEOUT_S = 60.0
CLOSE_TIMEOUT_S = 30.0


def open_engine(config: EngineConfig, progress: ProgressFn | None = None) -> Engine:
    """The engine for `config`: in this process, or in a child when its target is on RPC workers."""
    if config.load.rpc:
        return IsolatedEngine(config, progress)
    return Engine(config, progress)


class _ProxyHandle(Handle):
    def __init__(self, owner: IsolatedEngine, job: int, request: GenerationRequest, stream: bool) -> None:
        super().__init__(request, stream)
        self._owner, self._job = owner, job

    def cancel(self) -> None:
        super().cancel()
        self._owner._send(("cancel", self._job))


class _ChildRenderer(TemplateRenderer):
    """The parent renders nothing: interrupting reaches the child's renderer."""

    def __init__(self, owner: IsolatedEngine) -> None:
        super().__init__()
        self._owner = owner

    def interrupt(self) -> None:
        self._owner._send(("interrupt",))


class _Call:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: LocalspecError | None = None


class IsolatedEngine(Engine):
    """The Engine interface over a child process that owns the models (engine.engine_child)."""

    def __init__(self, config: EngineConfig, progress: ProgressFn | None = None) -> None:
        # Not Engine.__init__: no worker thread and no models here.
        self.config = config
        self.info = EngineInfo(target=config.target.name, draft=config.draft.name if config.draft else None)
        self.renderer = _ChildRenderer(self)
        self._progress = progress
        self._ready = threading.Event()
        self._ids = itertools.count(1)
        self._handles: dict[int, _ProxyHandle] = {}
        self._calls: dict[int, _Call] = {}
        # Messages go out through a queue and one writer thread: cancel() and the renderer's
        # interrupt() run in the daemon's signal handler, which must never wait on a lock.
        self._outbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._closing = False
        self._proc, self._reader, self._writer = _spawn(config)
        self._sender = threading.Thread(target=self._write, name="localspec-isolated-send", daemon=True)
        self._sender.start()
        self._last_words = ""
        self._relay = threading.Thread(target=self._relay_output, name="localspec-isolated-log", daemon=True)
        self._relay.start()
        self._thread = threading.Thread(target=self._listen, name="localspec-isolated", daemon=True)
        self._thread.start()

    # --- the Engine interface ---------------------------------------------------------

    def limit_growth(self, may_grow: Callable[[int], bool]) -> None:
        """Nothing to bound: a target on RPC workers reads its prompts itself, with no plain copy
        (engine.prefill), and the check could not reach the child anyway."""

    def wait_ready(self, timeout: float | None = None) -> EngineInfo:
        self._ready.wait(timeout)
        if self.info.status == "failed":
            raise LocalspecError(self.info.error or "loading failed")
        return self.info

    def submit(self, request: GenerationRequest, stream: bool = True) -> Handle:
        if self.info.status in ("failed", "closed"):
            raise RpcWorkerError(self.info.error or "the engine is closed")
        job = next(self._ids)
        handle = _ProxyHandle(self, job, request, stream)
        self._handles[job] = handle
        try:
            self._request(("submit", job, request, stream), job)
        except LocalspecError:
            self._handles.pop(job, None)
            raise
        return handle

    def prepare(self, request: GenerationRequest) -> GenerationRequest:
        if not request.messages or request.suffix is not None or self.info.status != "ready":
            return request
        value = self._ask("prepare", request)
        assert isinstance(value, GenerationRequest)
        return value

    def count_prompt_tokens(self, request: GenerationRequest) -> int:
        if self.info.status != "ready":
            raise LocalspecError(f"the model is not ready ({self.info.status}); retry once it is loaded")
        return int(self._ask("count_prompt_tokens", request))

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        return list(self._ask("tokenize", (text, add_special, parse_special)))

    def pieces(self, tokens: Sequence[int]) -> list[bytes]:
        return list(self._ask("pieces", list(tokens)))

    def drop_saved_prompts(self) -> int:
        # The child's info is sent once, at load, so its saved caches (none unless prompt_cache is
        # set: resolve.prompt_cache_bytes) are not counted as memory the daemon could free either.
        return 0

    @property
    def queue_depth(self) -> int:
        return max(0, len(self._handles) - 1)  # the one running is not waiting

    def close(self) -> None:
        self._closing = True
        self._send(("close",))
        try:
            self._proc.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._outbox.put(None)
        self._sender.join(5.0)
        self._thread.join(5.0)
        self._relay.join(5.0)
        self._fail_pending(LocalspecError("the engine is shutting down; the request was not run"))
        for end in (self._writer, self._reader, self._proc.stdout):
            if end is not None:
                end.close()
        self.info.status = "closed"

    # --- the pipe ---------------------------------------------------------------------

    def _send(self, message: tuple[Any, ...]) -> None:
        self._outbox.put(message)  # SimpleQueue.put is safe in a signal handler

    def _write(self) -> None:
        while (message := self._outbox.get()) is not None:
            # The child gone (OSError, or ValueError for a closed pipe): the listener reports it.
            with contextlib.suppress(OSError, ValueError):
                self._writer.send(message)

    def _request(self, message: tuple[Any, ...], job: int) -> Any:
        call = self._calls[job] = _Call()
        self._send(message)
        if not call.done.wait(CALL_TIMEOUT_S):
            self._calls.pop(job, None)
            raise LocalspecError(f"the engine process did not answer within {CALL_TIMEOUT_S:.0f} s")
        if call.error is not None:
            raise call.error
        return call.value

    def _ask(self, name: str, arg: Any) -> Any:
        job = next(self._ids)
        return self._request(("call", job, name, arg), job)

    def _relay_output(self) -> None:
        """The child's output to our log; its last line says why it stopped, if it aborted."""
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            if line:
                log.info("engine process: %s", line)
                self._last_words = line

    def _listen(self) -> None:
        while True:
            try:
                message = self._reader.recv()
            except (EOFError, OSError):
                break
            self._receive(message)
        self._child_ended()

    def _receive(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "progress" and self._progress is not None:
            self._progress(message[1], message[2])
        elif kind == "info":
            self.info = message[1]
            self._ready.set()
        elif kind == "event":
            self._deliver(message[1], message[2])
        elif kind == "reply":
            self._answer(message[1], message[2], None)
        elif kind == "error":
            assert isinstance(message[2], ErrorState)
            error = message[2].rebuild()
            if not self._answer(message[1], None, error):
                self._deliver(message[1], error)

    def _deliver(self, job: int, event: Any) -> None:
        handle = self._handles.get(job)
        if handle is None:
            return
        if isinstance(event, GenerationResult | LocalspecError):
            self._handles.pop(job, None)
        handle.put(event)

    def _answer(self, job: int, value: Any, error: LocalspecError | None) -> bool:
        call = self._calls.pop(job, None)
        if call is None:
            return False
        call.value, call.error = value, error
        call.done.set()
        return True

    def _child_ended(self) -> None:
        code = self._proc.wait()
        if self._closing:
            return
        why = death_reason(self.config.load.rpc, code, self._last_words)
        log.info("%s", why)  # each request in flight gets it as its error; /health shows the workers
        self.info.status, self.info.error = "failed", why
        self._ready.set()
        self._fail_pending(RpcWorkerError(why))

    def _fail_pending(self, error: LocalspecError) -> None:
        for job in list(self._handles):
            self._deliver(job, error)
        for job in list(self._calls):
            self._answer(job, None, error)


def death_reason(endpoints: tuple[str, ...], code: int, last_words: str = "") -> str:
    """Why the engine's child stopped, naming the workers that are down now."""
    down = [s.endpoint for s in worker_states(endpoints) if not s.up]
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    # ggml's abort message, without the source path before it: "…/ggml-rpc.cpp:566: Remote RPC …".
    said = last_words.rsplit(": ", 1)[-1] if ".cpp:" in last_words else ""
    how += f": {said}" if said else ""
    if down:
        return (
            f"the RPC worker at {', '.join(down)} is down (the engine process ended with {how}); "
            "the request was dropped: restart the worker, the next request loads the model again"
        )
    return f"the engine process ended with {how}; the request was dropped, the next one loads the model again"


def _spawn(config: EngineConfig) -> tuple[subprocess.Popen[bytes], Connection, Connection]:
    """Start the child with a pipe each way; send it the config."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    # Its output (llama.cpp's messages; nothing else writes there) goes to our log, not to our
    # stdout, which `generate` prints the answer on. An abort here is a worker gone, not a bug:
    # no backtrace (ggml would attach gdb to print one).
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec.engine.engine_child", str(to_child_r), str(from_child_w)],
        pass_fds=(to_child_r, from_child_w),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=os.environ | {"GGML_NO_BACKTRACE": "1"},
    )
    os.close(to_child_r)
    os.close(from_child_w)
    writer = Connection(to_child_w, readable=False)
    reader = Connection(from_child_r, writable=False)
    writer.send(config)
    return proc, reader, writer
