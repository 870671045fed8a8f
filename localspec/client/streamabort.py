"""Stopping a client stream from another thread at once, even while the daemon has sent nothing.

Closing a stream's generator works only between events, in the thread that reads
it; while the daemon reads a long prompt that thread waits for the response
headers. StreamAbort shuts the stream's socket down instead: the reading thread
wakes, the stream ends quietly, and the daemon sees its client leave and cancels
the generation. The socket comes from httpx's `trace` request extension, on a
connection opened for that stream alone (see `Client.stream`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any


class StreamAbort:
    """Pass one to `Client.stream` (or `chat_stream`); `abort()` from any thread ends that stream."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.aborted = False

    def abort(self) -> None:
        with self._lock:
            self.aborted = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpx's `trace` request extension: a new connection hands over its socket here."""
        if event not in ("connection.connect_unix_socket.complete", "connection.connect_tcp.complete"):
            return
        sock = info["return_value"].get_extra_info("socket")
        with self._lock:
            self._sockets.append(sock)
            aborted = self.aborted
        if aborted:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed: the stream has ended
        sock.shutdown(socket.SHUT_RDWR)
