"""A submitted request between the engine's thread and its reader: its events, and who wakes whom.

The engine's thread puts a request's chunks, then its result or error, on its Handle; the reader
(a server's request, a script) takes them. A chunk wakes the reader only while it waits with nothing
to read: on a machine whose cores all run llama.cpp, a wake-up per token costs the engine time.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Iterator

from localspec.errors import LocalspecError
from localspec.types import GenerationRequest, GenerationResult, PromptProgress, TokenChunk

Event = TokenChunk | GenerationResult | LocalspecError


class Handle:
    """One submitted request: iterate it for chunks; `result` is set once it ends."""

    def __init__(self, request: GenerationRequest, stream: bool = True) -> None:
        self.request = request
        # False: only the result is delivered. Each chunk wakes the reading thread, and on a
        # 2-core machine a thread woken per token takes its time slice from llama.cpp's workers.
        self.stream = stream
        self.cancelled = threading.Event()
        self.result: GenerationResult | None = None
        self._events: deque[Event] = deque()
        self._ready = threading.Condition(threading.Lock())
        # Set while a reader waits with nothing to read. Only then does a chunk wake it; a reader
        # gathering chunks (`gather`) is woken by the end alone (see `gather`).
        self._hungry = False

    def cancel(self) -> None:
        """Stop this request; takes effect within one decoding step."""
        self.cancelled.set()

    def tell(self, progress: PromptProgress) -> None:
        """How far the prompt's read has got, as a chunk of its own (GenerationRequest.progress)."""
        self.put(TokenChunk("", (), progress=progress))

    def put(self, event: Event) -> None:
        with self._ready:
            self._events.append(event)
            if self._hungry or not isinstance(event, TokenChunk):
                self._ready.notify()

    def next_event(self, timeout: float | None = None) -> Event:
        """The next chunk, the result, or the error (returned, not raised). Blocks.

        Raises queue.Empty when `timeout` passes first.
        """
        with self._ready:
            self._wait_for_any(timeout)
            return self._events.popleft()

    def take(self) -> list[Event]:
        """Every event delivered so far, at least one (blocks for it), in order."""
        with self._ready:
            self._wait_for_any(None)
            events = list(self._events)
            self._events.clear()
            return events

    def gather(self, seconds: float) -> None:
        """Let chunks gather for up to `seconds` unwoken; the end (result or error) cuts it short.

        A streaming reader that takes every chunk as it comes wakes once a token: on a machine
        whose cores all run llama.cpp, each wake-up and the GIL it hands around costs the
        engine's thread time (docs/benchmarks.md, session 39).
        """
        deadline = time.monotonic() + seconds
        with self._ready:
            while not self._ended() and (left := deadline - time.monotonic()) > 0:
                self._ready.wait(left)

    def _ended(self) -> bool:
        return bool(self._events) and not isinstance(self._events[-1], TokenChunk)

    def _wait_for_any(self, timeout: float | None) -> None:
        if self._events:
            return
        self._hungry = True
        try:
            if not self._ready.wait_for(lambda: self._events, timeout):
                raise queue.Empty
        finally:
            self._hungry = False

    def __iter__(self) -> Iterator[TokenChunk]:
        while True:
            event = self.next_event()
            if isinstance(event, LocalspecError):
                raise event
            if isinstance(event, GenerationResult):
                self.result = event
                return
            yield event

    def wait(self) -> GenerationResult:
        for _ in self:
            pass
        assert self.result is not None
        return self.result
