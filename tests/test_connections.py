"""Slow and idle clients against a real daemon: they are cut off or pushed out, real clients still served.

All on loopback, bounded in count and time. The daemon runs with a low open-file limit
set here (256), so 1,100 connections would exhaust its descriptors if it kept them all.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemonproc import Daemon, start_daemon

pytestmark = pytest.mark.timeout(300)
NOFILE = 256
N_TCP, N_UNIX = 800, 300


@pytest.fixture
def flooded(tmp_path: Path, tiny_target: Path) -> Iterator[Daemon]:
    # A long header timeout: what frees room here must be the cap and its eviction, not the timeout.
    env = {"LOCALSPEC_HEADER_TIMEOUT": "120"}
    daemon = start_daemon(tmp_path / "home", tiny_target, tcp=True, env=env, nofile=NOFILE)
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
def impatient(tmp_path: Path, tiny_target: Path) -> Iterator[Daemon]:
    env = {"LOCALSPEC_HEADER_TIMEOUT": "1", "LOCALSPEC_BODY_TIMEOUT": "1"}
    daemon = start_daemon(tmp_path / "home", tiny_target, tcp=True, env=env)
    try:
        yield daemon
    finally:
        daemon.stop()


def _open(daemon: Daemon, family: int, first_bytes: bytes = b"") -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.connect(str(daemon.socket_path) if family == socket.AF_UNIX else ("127.0.0.1", daemon.port))
    if first_bytes:
        sock.sendall(first_bytes)
    return sock


def _health(daemon: Daemon, over_tcp: bool) -> tuple[int, float]:
    """Status and seconds of one GET /health on a fresh connection (a 10 s client timeout)."""
    start = time.monotonic()
    with daemon.tcp_http(timeout=10.0) if over_tcp else daemon.http(timeout=10.0) as http:
        status = http.get("/health").status_code
    return status, time.monotonic() - start


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        while data := sock.recv(4096):
            if b"HTTP/1.1" in data:  # an error answer before the close is fine too
                continue
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_connections_never_lock_out_real_clients(flooded: Daemon) -> None:
    idle: list[socket.socket] = []
    try:
        for i in range(N_TCP):
            idle.append(_open(flooded, socket.AF_INET, b"GET /health HT" if i % 2 else b""))
        for _ in range(N_UNIX):
            idle.append(_open(flooded, socket.AF_UNIX))
        # The 1,100 connections are open (or were accepted and pushed out): the daemon still answers,
        # on the owner's socket and on TCP.
        for over_tcp in (False, True):
            status, seconds = _health(flooded, over_tcp)
            assert status == 200
            print(f"{'tcp' if over_tcp else 'unix'}: /health answered in {seconds * 1000:.0f} ms")
        fds = len(os.listdir(f"/proc/{flooded.proc.pid}/fd"))
        assert fds < NOFILE - 32, f"the daemon holds {fds} descriptors"
    finally:
        for sock in idle:
            sock.close()
    assert flooded.proc.poll() is None


def test_slow_headers_and_bodies_are_cut_off(impatient: Daemon) -> None:
    head_only = [_open(impatient, socket.AF_INET, b"GET /health HTTP/1.1\r\nHost: x\r\n") for _ in range(40)]
    post = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
    partial_body = [_open(impatient, socket.AF_UNIX, post) for _ in range(20)]
    try:
        # A byte now and then must not keep a header alive (uvicorn's own keep-alive clock would restart).
        for _ in range(4):
            time.sleep(0.3)
            for sock in head_only:
                with contextlib.suppress(OSError):  # closed already: fine
                    sock.sendall(b"X")
        assert all(_closed_by_server(sock, within_s=20) for sock in head_only)
        assert all(_closed_by_server(sock, within_s=20) for sock in partial_body)
        assert _health(impatient, over_tcp=True)[0] == 200
    finally:
        for sock in head_only + partial_body:
            sock.close()
