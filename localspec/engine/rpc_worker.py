"""`localspec rpc-worker`: llama.cpp's RPC server, run from the wheel's own library.

The same ggml-rpc build as the client's (so the protocol always matches), started through
ctypes (engine.ggml_backend.serve) instead of a separately compiled rpc-server binary. It
serves this machine's GPUs, else its CPU, to one client at a time.
"""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Callable

from localspec.engine.rpc import is_loopback
from localspec.errors import RpcWorkerError, UserInputError

REMOTE_WARNING = (
    "WARNING: this RPC worker listens on {host}, beyond this machine. llama.cpp's RPC protocol "
    "has no authentication and no encryption: anyone who can reach {host}:{port} can run "
    "computations here and read what is sent. Use it only on a trusted network."
)


def check_host(host: str, allow_remote: bool) -> str | None:
    """The loud warning for a non-loopback host given the flag; UserInputError without it."""
    if is_loopback(host):
        return None
    if not allow_remote:
        raise UserInputError(
            f"--host {host} would serve beyond this machine, and RPC has no authentication; "
            "add --allow-remote on a trusted network, or keep the default 127.0.0.1"
        )
    return REMOTE_WARNING


def check_port(host: str, port: int) -> None:
    """UserInputError naming the port when it cannot be bound (in use, or not an address here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ggml-rpc's own server socket
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UserInputError(
                    f"port {port} on {host} is in use (another worker?); pick another with --port"
                ) from None
            raise UserInputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def run_worker(host: str, port: int, threads: int, say: Callable[[str], None]) -> None:
    """Serve until interrupted; RpcWorkerError if llama.cpp's server stops by itself."""
    from localspec.engine import ggml_backend
    from localspec.engine.rpc import unsupported

    if not ggml_backend.rpc_supported():
        raise unsupported()
    check_port(host, port)
    endpoint = f"{host}:{port}"
    # In a thread: the server blocks in C (accept) and would keep Ctrl-C from reaching Python.
    run = ggml_backend.rpc_server(endpoint, threads)
    server = threading.Thread(target=run, name="rpc-server", daemon=True)
    server.start()
    say(f"RPC worker on {endpoint} with {threads} threads; use it with --rpc {endpoint}. Ctrl-C stops it.")
    while server.is_alive():
        server.join(0.5)
    raise RpcWorkerError(f"llama.cpp's RPC server on {endpoint} stopped; its own message is above")
