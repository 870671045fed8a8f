"""Ask RPC workers their memory, in a child: `python -m localspec.engine.rpc_probe HOST:PORT...`.

A child because ggml-rpc aborts its process when a worker fails, and because a worker serves
one client at a time: the parent gives up after a timeout instead of waiting behind a client
that holds the worker. Prints one JSON list of [free, total] bytes, in endpoint order, or
{"error": ...} with exit code 1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

from localspec.errors import LocalspecError, RpcWorkerError

PROBE_TIMEOUT_S = 15.0


def probe_memory(endpoints: Sequence[str], timeout: float = PROBE_TIMEOUT_S) -> list[tuple[int, int]]:
    """(free, total) bytes of each worker; RpcWorkerError, naming the worker, when one cannot say."""
    cmd = [sys.executable, "-m", "localspec.engine.rpc_probe", *endpoints]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RpcWorkerError(
            f"the RPC workers ({', '.join(endpoints)}) did not answer within {timeout:.0f} s; a worker "
            "serves one client at a time: is another localspec using it?"
        ) from None
    try:
        reply = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):  # it died before answering (ggml-rpc aborts on a failure)
        why = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
        names = ", ".join(endpoints)
        raise RpcWorkerError(f"asking the RPC workers ({names}) their memory failed: {why}") from None
    if isinstance(reply, dict):
        raise RpcWorkerError(str(reply.get("error")))
    return [(int(free), int(total)) for free, total in reply]


def main(endpoints: Sequence[str]) -> int:
    from localspec.engine import ggml_backend
    from localspec.engine.rpc import check_reachable, unsupported

    try:
        for endpoint in endpoints:
            check_reachable(endpoint)
        if not ggml_backend.rpc_supported():
            raise unsupported()
        memory = ggml_backend.worker_memory(endpoints)
    except LocalspecError as exc:
        print(json.dumps({"error": exc.message}))
        return 1
    print(json.dumps(memory))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
