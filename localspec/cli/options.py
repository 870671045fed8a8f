"""Flags shared by every command that loads models (generate, bench, serve, chat)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from localspec.types import METHODS

F = TypeVar("F", bound=Callable[..., Any])

MODEL_OPTIONS: list[Callable[[Any], Any]] = [
    click.option("--target", type=click.Path(path_type=Path), help="Target GGUF (default: catalog default)."),
    click.option("--draft", type=click.Path(path_type=Path), help="Draft GGUF with the same tokenizer."),
    click.option("--method", type=click.Choice(METHODS), help="Speculation method (default: auto)."),
    click.option("-k", "k", type=click.IntRange(1, 32), help="Most tokens drafted per step."),
    click.option(
        "--ctx",
        "n_ctx",
        type=click.IntRange(64),
        help="Context size in tokens (serve, chat: the model's own where memory allows; else 4096).",
    ),
    click.option("--threads", type=click.IntRange(1), help="CPU threads (default: physical cores)."),
    click.option("--gpu-layers", type=int, help="Target layers on the GPU (-1: all; default: all if any)."),
    click.option("--draft-gpu-layers", type=int, help="Draft layers on the GPU (-1: all)."),
    click.option("--kv-type", type=click.Choice(["f16", "q8_0", "q4_0"]), help="KV cache type."),
    click.option(
        "--exact/--fast",
        "exact",
        default=None,
        help="--exact: batch-invariant loading, greedy output bit-identical to the target alone, "
        "slower on the CPU. Default (--fast): llama.cpp's own loading, identical up to float rounding.",
    ),
    click.option(
        "--rpc",
        metavar="HOST:PORT[,HOST:PORT]",
        help="Put the target's layers on these RPC workers (`localspec rpc-worker`); the draft stays here.",
    ),
]

MODEL_KEYS = (
    "target",
    "draft",
    "method",
    "k",
    "n_ctx",
    "threads",
    "gpu_layers",
    "draft_gpu_layers",
    "kv_type",
    "exact",
    "rpc",
)


def model_options(func: F) -> F:
    """Add the model-loading flags; their values are passed through to load_settings()."""
    for option in reversed(MODEL_OPTIONS):
        func = option(func)
    return func


def pop_model_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the model flags out of a command's kwargs, as settings overrides."""
    return {key: kwargs.pop(key) for key in MODEL_KEYS if key in kwargs}


class LoadProgress:
    """Loading progress on stderr: a live percentage on a terminal, one line per model otherwise."""

    def __init__(self) -> None:
        self._started: dict[str, float] = {}
        self._tty = sys.stderr.isatty()

    def __call__(self, what: str, fraction: float) -> None:
        start = self._started.setdefault(what, time.perf_counter())
        if fraction >= 1.0:
            click.echo(f"\rloading {what}: done in {time.perf_counter() - start:.1f} s   ", err=True)
        elif self._tty:
            click.echo(f"\rloading {what}: {fraction:4.0%}", err=True, nl=False)
