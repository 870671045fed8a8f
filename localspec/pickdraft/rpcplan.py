"""The memory plan for a target whose layers live on RPC workers: what each worker gets and holds.

llama.cpp splits the offloaded layers across the workers in proportion to the free memory
each reports (engine.rpc.layer_split mirrors it); each worker then holds its layers'
weights and their KV cache, the last one the output layer too. The draft, and the target's
token embeddings (llama.cpp keeps the input layer on the CPU), stay on this machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from localspec.engine.rpc import layer_split
from localspec.errors import RpcWorkerError
from localspec.pickdraft.memplan import ModelShape


@dataclass(frozen=True)
class WorkerShare:
    """One worker's part of the target."""

    endpoint: str
    free: int
    total: int
    first_layer: int
    n_layers: int  # of the repeating layers plus (on the last worker) the output layer
    need: int  # bytes: its layers' weights and KV cache

    @property
    def fits(self) -> bool:
        return self.need <= self.free

    def describe(self) -> str:
        last = self.first_layer + self.n_layers - 1
        span = "no layers" if self.n_layers == 0 else f"layers {self.first_layer}-{last}"
        return f"{self.endpoint}: {span}, {_gib(self.need)} of {_gib(self.free)} free"


def plan_workers(
    shape: ModelShape, endpoints: Sequence[str], memory: Sequence[tuple[int, int]], n_ctx: int, kv_type: str
) -> list[WorkerShare]:
    """Each worker's layers and bytes when the whole target is offloaded to them (as the engine does)."""
    counts = layer_split(shape.n_layers, [free for free, _ in memory])
    kv = shape.kv_bytes_per_layer(n_ctx, kv_type)
    shares, start = [], 0
    for endpoint, (free, total), count in zip(endpoints, memory, counts, strict=True):
        layers = range(start, min(start + count, shape.n_layers))
        need = sum(shape.layer_bytes[i] + kv for i in layers)
        if start + count > shape.n_layers:  # this worker also holds the output layer
            need += shape.head_bytes + shape.other_bytes
        shares.append(WorkerShare(endpoint, free, total, start, count, need))
        start += count
    return shares


def describe_workers(shares: Sequence[WorkerShare]) -> str:
    """One line for the load log, pick-draft and status: who holds which layers, and whether it fits."""
    output = sum(s.n_layers for s in shares) - 1  # llama.cpp numbers the output layer after the blocks
    text = f"target on RPC workers (layer {output} is the output layer): " + "; ".join(
        s.describe() for s in shares
    )
    short = [s.endpoint for s in shares if not s.fits]
    return text + (f" — does not fit on {', '.join(short)}" if short else "")


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def worker_line(
    target: Path, endpoints: Sequence[str], n_ctx: int, kv_type: str, cache_dir: Path | None
) -> str:
    """The plan line for a target on `endpoints`, asking each worker its memory now; when a worker
    cannot answer, the line says why (the load then fails with the same reason)."""
    from localspec.engine.rpc_probe import probe_memory

    try:
        memory = probe_memory(endpoints)
    except RpcWorkerError as exc:
        return f"target on RPC workers {', '.join(endpoints)}: {exc.message}"
    shape = ModelShape.from_file(target, cache_dir)
    return describe_workers(plan_workers(shape, endpoints, memory, n_ctx, kv_type))
