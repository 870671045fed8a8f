"""Calibration: how long this machine takes to decode n tokens in one batch, measured once and cached.

Whether speculation pays is a property of the machine: verifying 5 tokens costs
about one token's time on a GPU and ~3 on a 2-core CPU. The auto policy needs
that curve, V(n) for n = 1..16 and a few wider verifies (for long n-gram copies), for
the target and the draft model. Measuring it
takes a few seconds, so it is cached per model file (path, size, mtime), thread
count, offload and llama.cpp build; a change to any of them measures again.

Robust on a busy machine: every pass runs all sizes in turn, so a burst of load
from elsewhere hits all sizes alike rather than one, and each size keeps the
fastest of its passes (the cost of the work itself, not of the interruptions).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp

from localspec.atomicfile import write_text_atomic
from localspec.auto.costmodel import K_MAX, LONG_WIDTHS, VERIFY_MAX, Curve
from localspec.engine.config import LoadOptions, default_threads, flash_attention
from localspec.engine.llama import LlamaModel, default_gpu_layers, gpu_offload_supported, offloads
from localspec.errors import StorageError, storage_error

# Every size for a target: the curve is not smooth. llama.cpp's CPU matrix kernels work in
# blocks of 4 rows, so on this machine V(4) < V(3), V(8) < V(7) and V(16) < V(15) (measured).
# And on x86 the K-quant tensors that are not repacked (Q6_K: a third of a Q4_K_M file's bytes,
# its output matrix among them) take llama.cpp's tiled kernel from 8 rows on (ggml-cpu/tiled,
# GGML_CPU_TILED_MM): on 2 AVX2 cores V(8) = 6.2 V(1) against 3.8 for V(7), and 4.5 with that
# kernel off (docs/benchmarks.md, session 35). It stays on: it is what reads prompts fast there
# (the plain copy 44-50 tok/s with it, 25-30 without), and auto learns the dear widths from this
# curve. Past 16 only the widths auto may use (costmodel.LONG_WIDTHS).
SIZES = (*range(1, K_MAX + 2), *LONG_WIDTHS)
# A draft is charged per token and for short catch-ups: a few sizes, interpolated, are enough.
DRAFT_SIZES = (1, 2, 4, 8, 16)
PASSES = 3
# Passes stop early past this many seconds (a slow or busy machine), after the first.
BUDGET_S = 4.0
# ...except for the widths up to this one, which get every pass anyway. A pass over every width of
# a 1.5B on 2 CPU cores takes ~5 s, so past the budget each width would be one timing, and one-token
# decodes timed in a row there read 63-84 ms (Qwen2.5-Coder-1.5B Q4_K_M, 2 AVX-512 cores): V(1) is
# the denominator of every cost auto weighs, and widths 1-4 are the short bets it makes most. Their
# extra passes cost ~0.4 s each there (a width-64 decode costs 0.7 s alone).
NARROW = 4
# Decode after a short prefix, as in generation, without paying for a long prompt at load.
PREFIX = 16
CACHE_VERSION = 2
# A cached curve is measured again when one token now decodes this much faster than it says: it
# was measured on a busy machine. (Slower now means busy now: the cached curve is the better one.)
FASTER = 0.75
# ...and by at least this much in absolute terms. A tiny test model decodes a token in ~0.05 ms
# on this CPU, so scheduler jitter is "25% faster" there; a real model's 25% is well above it
# (Qwen2.5-Coder-1.5B Q4_K_M: ~34 ms a token on 2 cores, so ~8.5 ms). Under 4 ms a token it takes
# more than a 25% drop to fire; a curve off by under 1 ms a step costs little, and OnlineCosts
# rescales it from each step's measured time anyway.
BUSY_MIN_S = 1e-3
SPOT_REPEATS = 3
# A width timed this far above every measured neighbour was interrupted in each pass that ran (a VM
# stall: width 8 of the 1.5B once came out at 18x a one-token decode, between 5.2x and 5.7x). Cached,
# it would keep auto off that width until the next calibration, so it is timed again. A real width
# is seldom above its wider neighbour and never by half (a block edge: V(15) = 1.26 V(16)); only the
# widest, with one neighbour, may be flagged for real (V(16) against V(8) on a curve that grows
# linearly), and then re-timing costs a few decodes and changes nothing: each keeps its fastest.
OUTLIER = 1.5
# Any text works; code tokenizes into ordinary pieces on every vocabulary.
_TEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"

ProgressFn = Callable[[float], None]
Key = dict[str, Any]


@dataclass(frozen=True)
class Calibration:
    """One model's decode curve on this machine, and what it was measured for."""

    key: Key
    curve: Curve
    from_cache: bool
    not_saved: str | None = None  # why the curve could not be cached (a read-only or full folder)


def backend_id() -> str:
    """The llama.cpp build and the features it uses here (CPU flags, GPU backends)."""
    info = llama_cpp.llama_print_system_info()
    text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    return f"llama-cpp-python {llama_cpp.__version__}; offload={gpu_offload_supported()}; {text.strip()}"


def calibration_key(path: Path, options: LoadOptions, sizes: Sequence[int] = SIZES) -> Key:
    """Everything that changes the curve: the file, the threads, the offload, the cache type, the build."""
    st = path.stat()
    # Over RPC each step pays the network's round trips: V(n) is measured with them, per worker set
    # (only then in the key, so the curves cached for local models stay valid).
    rpc = {"rpc": list(options.rpc)} if options.rpc else {}
    gpu_layers = default_gpu_layers(options.gpu_layers)
    return rpc | {
        "version": CACHE_VERSION,
        "file": str(path.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "threads": options.n_threads or default_threads(),
        "gpu_layers": gpu_layers,
        "kv_type": options.kv_type,
        "n_batch": options.n_batch,
        "batch_invariant": options.batch_invariant,
        # The attention the loading decodes with, which the context's size can decide (a curve
        # measured at 4,096 positions with flash attention is not one of a 16,384-position context).
        "flash_attn": flash_attention(options, offloads(gpu_layers, options)),
        "machine": f"{platform.machine()} cpus={os.cpu_count()}",
        "backend": backend_id(),
        "sizes": list(sizes),
    }


def cache_file(cache_dir: Path, key: Key) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir / "calibration" / f"{digest}.json"


def load_cached(cache_dir: Path, key: Key) -> Curve | None:
    """The stored curve for exactly this key, or None (missing, unreadable, or for another key)."""
    path = cache_file(cache_dir, key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != key:
            return None
        return Curve(tuple(float(v) for v in data["seconds"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(cache_dir: Path, key: Key, curve: Curve) -> Path:
    """Write the curve for this key (atomically: a reader never sees half a file).

    StorageError, naming the folder, when it is read-only or full.
    """
    path = cache_file(cache_dir, key)
    payload = {"key": key, "seconds": list(curve.seconds), "measured_at": time.time()}
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(payload, indent=1))
    except OSError as exc:
        raise storage_error(exc, path.parent) from None
    return path


def measure(
    model: LlamaModel,
    *,
    sizes: Sequence[int] = SIZES,
    passes: int = PASSES,
    budget_s: float = BUDGET_S,
    progress: ProgressFn | None = None,
    prefix: int = PREFIX,
) -> Curve:
    """V(n): the fastest of up to `passes` timed decodes of n tokens (logits at each) for each size,
    each after `prefix` tokens of context; sizes up to NARROW get all `passes` within any budget.

    `progress` hears 0.0 first, the fraction of the passes done after each size, and 1.0 at the end
    (a pass over every width of a 1.5B takes ~15 s on 2 slow cores: one report a pass was silence).
    Leaves the model's cache empty.
    """
    report = progress or (lambda _fraction: None)
    report(0.0)
    tokens = _tokens(model, prefix + max(sizes))
    model.reset()
    model.decode(tokens[:prefix], 1)
    # One untimed decode first: the first touches of the weights and buffers are slow.
    _timed(model, tokens, max(sizes), prefix)
    best = {n: math.inf for n in sizes}
    started = time.perf_counter()
    ran = 0
    for p in range(passes):
        # Alternate the order, so no size always follows the largest decode.
        for j, n in enumerate(sizes if p % 2 == 0 else reversed(sizes)):
            best[n] = min(best[n], _timed(model, tokens, n, prefix))
            done = (p + (j + 1) / len(sizes)) / passes
            if done < 1.0:  # 1.0 once, at the very end
                report(done)
        ran = p + 1
        if ran == passes or time.perf_counter() - started > budget_s:
            break
    for _ in range(ran, passes):  # the budget stopped the passes: the narrow widths still get theirs
        for n in (m for m in sizes if m <= NARROW):
            best[n] = min(best[n], _timed(model, tokens, n, prefix))
    _retime_outliers(model, tokens, best, prefix)
    model.reset()
    report(1.0)
    return Curve.from_points(best, VERIFY_MAX)


def _retime_outliers(model: LlamaModel, tokens: Sequence[int], best: dict[int, float], prefix: int) -> None:
    """Time again, SPOT_REPEATS times, each width more than OUTLIER x its measured neighbours."""
    sizes = sorted(best)
    for i, n in enumerate(sizes):
        around = [best[m] for m in (*sizes[max(0, i - 1) : i], *sizes[i + 1 : i + 2])]
        if around and best[n] > OUTLIER * max(around):
            best[n] = min(best[n], *(_timed(model, tokens, n, prefix) for _ in range(SPOT_REPEATS)))


def _timed(model: LlamaModel, tokens: Sequence[int], n: int, prefix: int = PREFIX) -> float:
    seconds = model.decode(tokens[prefix : prefix + n], n)
    model.truncate(prefix)
    return seconds


def _tokens(model: LlamaModel, n: int) -> list[int]:
    tokens = model.tokenize(_TEXT, add_special=False, parse_special=False)
    if not tokens:
        raise ValueError(f"{model.path.name} tokenizes the calibration text to nothing")
    return (tokens * (n // len(tokens) + 1))[:n]


def calibrate(
    model: LlamaModel,
    cache_dir: Path,
    *,
    sizes: Sequence[int] = SIZES,
    refresh: bool = False,
    progress: ProgressFn | None = None,
) -> Calibration:
    """The model's curve from the cache, or measured now (and stored) when missing, stale or `refresh`.

    Stale includes a cache measured while the machine was busy, found by a one-token spot check.
    """
    sizes = usable_sizes(model, sizes)
    key = calibration_key(model.path, model.options, sizes)
    if model.plain_prefill:
        # Batches of PREFILL_MIN+ tokens (the wide verifies) then run on the plain copy: another
        # curve than the repacked model's alone (only then in the key, as with RPC workers).
        key["plain_prefill"] = True
    cached = None if refresh else load_cached(cache_dir, key)
    if cached is not None and not measured_busy(cached(1), spot_check(model)):
        return Calibration(key, cached, from_cache=True)
    curve = measure(model, sizes=sizes, progress=progress)
    if cached is not None:
        # The cache was measured while something else loaded the machine: keep the fastest of both.
        curve = Curve(tuple(min(a, b) for a, b in zip(curve.seconds, cached.seconds, strict=True)))
    try:
        store(cache_dir, key, curve)
    except StorageError as exc:  # the curve is still good for this process; it is measured again next time
        return Calibration(key, curve, from_cache=False, not_saved=exc.message)
    return Calibration(key, curve, from_cache=False)


def usable_sizes(model: LlamaModel, sizes: Sequence[int]) -> tuple[int, ...]:
    """The sizes this loading can use: no wider verify than it allows (--exact: a few tokens), every
    width up to K_MAX + 1 still measured (the draft's decodes use them), and none past the context."""
    widest = min(max(K_MAX + 1, model.max_verify_batch), model.options.n_ctx - PREFIX)
    return tuple(n for n in sizes if n <= widest) or (1,)


def measured_busy(cached_s: float, now_s: float) -> bool:
    """Whether a cached one-token time looks measured on a busy machine, given one measured now."""
    return now_s < FASTER * cached_s and cached_s - now_s > BUSY_MIN_S


def spot_check(model: LlamaModel) -> float:
    """One token's decode now, the fastest of a few: cheap enough for every load."""
    tokens = _tokens(model, PREFIX + 1)
    model.reset()
    model.decode(tokens[:PREFIX], 1)
    seconds = min(_timed(model, tokens, 1) for _ in range(SPOT_REPEATS))
    model.reset()
    return seconds
