"""llama.cpp's RPC backend, the parts that need no llama.cpp: endpoints, reachability, the layer split.

A target loaded with `--rpc host:port[,host:port]` keeps its weights and KV cache on the
workers (`localspec rpc-worker`, llama.cpp's rpc-server from the wheel's own library); the
draft stays on this machine. ggml-rpc aborts the whole process when a worker refuses a
connection or dies mid-request, so everything here checks first, in Python, with one clear
line naming the endpoint, and the engine of an RPC target runs in a child process
(engine.isolated) that such an abort kills alone.
"""

from __future__ import annotations

import bisect
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from localspec.errors import RpcUnsupportedError, RpcWorkerError, UserInputError

DEFAULT_PORT = 50052  # llama.cpp's rpc-server default
CONNECT_TIMEOUT_S = 3.0
REBUILD_HINT = (
    "rebuild llama-cpp-python with RPC: scripts/bootstrap does it, or "
    "CMAKE_ARGS='-DGGML_RPC=ON' pip install --no-cache-dir --force-reinstall --no-deps "
    "llama-cpp-python==0.3.36"
)


def unsupported() -> RpcUnsupportedError:
    return RpcUnsupportedError(f"this llama.cpp build has no RPC backend; {REBUILD_HINT}")


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of 'host:port'; UserInputError, naming it, when it is not one."""
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserInputError(f"RPC endpoint {endpoint!r} is not HOST:PORT (e.g. 192.168.1.20:{DEFAULT_PORT})")
    if ":" in host or host.startswith("["):
        # ggml-rpc splits at the last colon and resolves the rest as a host name: no IPv6 literals.
        raise UserInputError(
            f"RPC endpoint {endpoint!r}: IPv6 addresses are not supported; use IPv4 or a name"
        )
    return host, int(port)


def parse_endpoints(text: str | Sequence[str]) -> tuple[str, ...]:
    """'a:1,b:2' (or a list of them) as a tuple of checked 'host:port' strings, without duplicates."""
    parts = text.split(",") if isinstance(text, str) else [p for item in text for p in item.split(",")]
    endpoints: list[str] = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        host, port = split_endpoint(part)
        endpoint = f"{host}:{port}"
        if endpoint in endpoints:
            raise UserInputError(f"RPC endpoint {endpoint} is given twice")
        endpoints.append(endpoint)
    return tuple(endpoints)


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_reachable(endpoint: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """RpcWorkerError naming `endpoint` unless something accepts TCP connections there.

    A plain connect and close: the worker reads no hello from it and goes back to waiting. It
    must come before ggml-rpc's own connect, which aborts the process when refused.
    """
    host, port = split_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        raise RpcWorkerError(
            f"cannot reach the RPC worker at {endpoint}: {why}; start one there with "
            f"`localspec rpc-worker --port {port}` (and --host for another machine)"
        ) from None


@dataclass(frozen=True)
class WorkerState:
    """One worker as /health reports it."""

    endpoint: str
    up: bool
    error: str | None = None


def worker_states(endpoints: Sequence[str], timeout: float = 1.0) -> list[WorkerState]:
    """Whether each worker accepts connections now (a down worker is reported, not raised)."""
    states = []
    for endpoint in endpoints:
        try:
            check_reachable(endpoint, timeout)
        except RpcWorkerError as exc:
            states.append(WorkerState(endpoint, False, exc.message))
        else:
            states.append(WorkerState(endpoint, True))
    return states


def layer_split(n_layer: int, free: Sequence[int]) -> list[int]:
    """How many of a model's n_layer + 1 offloaded layers (the repeating ones and the output) each
    device gets when all are offloaded: llama.cpp's default split, proportional to each device's
    free memory (llama_model::load_tensors), so the plan says what the load will do."""
    if not free:
        return []
    weights = [float(f) for f in free]
    if sum(weights) <= 0:
        weights = [1.0] * len(weights)
    total, running, points = sum(weights), 0.0, []
    for w in weights:
        running += w
        points.append(running / total)
    counts = [0] * len(free)
    layers = n_layer + 1
    for il in range(layers):
        device = min(bisect.bisect_right(points, il / layers), len(free) - 1)
        counts[device] += 1
    return counts
