"""StreamAbort: a stream stopped from another thread at once, while the server has sent nothing yet.

The server here accepts and reads but never answers, like a daemon reading a long
prompt; what matters is that the reading thread wakes and the server sees the
client leave (EOF), both at once rather than at the read timeout.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.client import Client, StreamAbort, StreamEvent
from localspec.types import ChatMessage

pytestmark = pytest.mark.timeout(60)

HELLO = (ChatMessage("user", "hello"),)


class SilentServer:
    """Accepts connections on a unix socket and reads them until the client leaves."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen()
        self.requests = 0
        self.left = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            if conn.recv(65536):
                self.requests += 1
            while conn.recv(65536):
                pass
        self.left.set()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[SilentServer, Path]]:
    path = tmp_path / "silent.sock"
    srv = SilentServer(path)
    yield srv, path
    srv.close()


def read_in_thread(client: Client, abort: StreamAbort) -> tuple[threading.Thread, list[object]]:
    got: list[object] = []

    def run() -> None:
        try:
            events: list[StreamEvent] = list(client.chat_stream(HELLO, abort=abort))
            got.append(events)
        except Exception as exc:  # recorded for the assertion
            got.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, got


def test_abort_before_the_response_wakes_the_reader_and_the_server_sees_the_client_leave(
    server: tuple[SilentServer, Path],
) -> None:
    srv, path = server
    with Client(socket_path=path, timeout=30.0) as client:
        abort = StreamAbort()
        thread, got = read_in_thread(client, abort)
        deadline = time.monotonic() + 10
        while srv.requests == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv.requests == 1
        start = time.monotonic()
        abort.abort()
        thread.join(5)
        assert not thread.is_alive() and time.monotonic() - start < 2
        assert got == [[]]  # ended quietly: no events, no error
        assert srv.left.wait(2)


def test_abort_before_the_connection_is_made_sends_nothing(server: tuple[SilentServer, Path]) -> None:
    srv, path = server
    with Client(socket_path=path, timeout=30.0) as client:
        abort = StreamAbort()
        abort.abort()
        thread, got = read_in_thread(client, abort)
        thread.join(5)
        assert not thread.is_alive() and got == [[]]
        assert srv.left.wait(2) and srv.requests == 0
