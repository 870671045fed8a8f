"""The process an isolated engine runs in: `python -m localspec.engine.engine_child READ_FD WRITE_FD`.

ggml-rpc aborts its whole process when an RPC worker dies mid-request ("Remote RPC server
crashed"), so an engine whose target lives on RPC workers runs here, and such an abort
ends this child only; the parent (engine.isolated) turns it into an error for the
requests in flight. Protocol: pickled tuples over two pipes (multiprocessing's framing).

parent -> child: ("submit", id, request, stream), ("cancel", id), ("call", id, name, arg),
                 ("interrupt",), ("close",)
child -> parent: ("progress", what, fraction), ("info", EngineInfo), ("event", id, event),
                 ("reply", id, value), ("error", id | None, ErrorState)
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from localspec import errors
from localspec.engine.config import EngineConfig
from localspec.engine.handle import Handle
from localspec.engine.worker import Engine
from localspec.errors import LocalspecError
from localspec.types import GenerationResult


@dataclass(frozen=True)
class ErrorState:
    """A LocalspecError as it crosses the pipe: its type's name, message and attributes."""

    kind: str
    message: str
    param: str | None
    attrs: dict[str, Any]

    @classmethod
    def of(cls, exc: LocalspecError) -> ErrorState:
        attrs = {k: v for k, v in vars(exc).items() if k not in ("message", "param")}
        return cls(type(exc).__name__, exc.message, exc.param, attrs)

    def rebuild(self) -> LocalspecError:
        """The same type where localspec.errors defines it (else the base), without its __init__."""
        kind = getattr(errors, self.kind, LocalspecError)
        if not (isinstance(kind, type) and issubclass(kind, LocalspecError)):
            kind = LocalspecError
        exc = kind.__new__(kind)
        Exception.__init__(exc, self.message)
        exc.message, exc.param = self.message, self.param
        for key, value in self.attrs.items():
            setattr(exc, key, value)
        return exc


def as_error(exc: BaseException) -> LocalspecError:
    return exc if isinstance(exc, LocalspecError) else LocalspecError(f"internal error: {exc}")


class Child:
    """Serves one Engine to the parent over the pipes."""

    def __init__(self, reader: Connection, writer: Connection, config: EngineConfig) -> None:
        self._reader, self._writer = reader, writer
        self._lock = threading.Lock()
        self._handles: dict[int, Handle] = {}
        self.engine = Engine(config, progress=lambda what, f: self.send(("progress", what, f)))

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self._writer.send(message)

    def run(self) -> None:
        threading.Thread(target=self._report_ready, daemon=True).start()
        while True:
            try:
                message = self._reader.recv()
            except (EOFError, OSError):  # the parent is gone
                break
            if message[0] == "close":
                break
            self._dispatch(message)
        self.engine.close()

    def _report_ready(self) -> None:
        with contextlib.suppress(LocalspecError):  # the info says why
            self.engine.wait_ready()
        self.send(("info", replace(self.engine.info)))

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "submit":
            _, job, request, stream = message
            try:
                handle = self.engine.submit(request, stream)
            except LocalspecError as exc:
                self.send(("error", job, ErrorState.of(exc)))
                return
            self._handles[job] = handle
            self.send(("reply", job, None))
            threading.Thread(target=self._forward, args=(job, handle), daemon=True).start()
        elif kind == "cancel":
            running = self._handles.get(message[1])
            if running is not None:
                running.cancel()
        elif kind == "call":
            threading.Thread(target=self._call, args=message[1:], daemon=True).start()
        elif kind == "interrupt":
            self.engine.renderer.interrupt()

    def _forward(self, job: int, handle: Handle) -> None:
        try:
            while True:
                event = handle.next_event()
                if isinstance(event, LocalspecError):
                    self.send(("error", job, ErrorState.of(event)))
                    return
                self.send(("event", job, event))
                if isinstance(event, GenerationResult):
                    return
        finally:
            self._handles.pop(job, None)

    def _call(self, job: int, name: str, arg: Any) -> None:
        try:
            if name == "prepare":
                value: Any = self.engine.prepare(arg)
            elif name == "count_prompt_tokens":
                value = self.engine.count_prompt_tokens(arg)
            elif name == "tokenize":
                value = self.engine.tokenize(*arg)
            elif name == "pieces":
                value = self.engine.pieces(arg)
            else:
                value = self.engine.queue_depth
        except Exception as exc:
            self.send(("error", job, ErrorState.of(as_error(exc))))
        else:
            self.send(("reply", job, value))


def main(argv: list[str]) -> None:
    reader = Connection(int(argv[0]), writable=False)
    writer = Connection(int(argv[1]), readable=False)
    config = reader.recv()
    Child(reader, writer, config).run()


if __name__ == "__main__":
    # Run with -m, this file is __main__, and an ErrorState it pickled would name __main__, where
    # the parent cannot find it: every error sent back hung the request until its call timed out.
    # The importable module's main pickles the importable module's classes.
    from localspec.engine.engine_child import main as _main

    _main(sys.argv[1:])
