"""`localspec calibrate`: the decode curves `auto` decides with, measured here (or read from the cache)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from localspec.cli.app import cli
from localspec.cli.options import LoadProgress
from localspec.printable import printable

SHOWN_K = (1, 2, 3, 4, 6, 8, 15, 31, 63)


@cli.command()
@click.option("--target", type=click.Path(path_type=Path), help="Target GGUF (default: catalog default).")
@click.option("--draft", type=click.Path(path_type=Path), help="Draft GGUF (default: the catalog's pair).")
@click.option("--threads", type=click.IntRange(1), help="CPU threads (default: physical cores).")
@click.option("--gpu-layers", type=int, help="Target layers on the GPU (-1: all).")
@click.option("--draft-gpu-layers", type=int, help="Draft layers on the GPU (-1: all).")
@click.option("--kv-type", type=click.Choice(["f16", "q8_0", "q4_0"]), help="KV cache type.")
@click.option("--exact/--fast", "exact", default=None, help="Curves for --exact or the default fast loading.")
@click.option("--rpc", metavar="HOST:PORT[,...]", help="The target on these RPC workers (as serve --rpc).")
@click.option("--refresh", is_flag=True, help="Measure again even when a cached curve exists.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def calibrate(refresh: bool, as_json: bool, **flags: Any) -> None:
    """Measure how long verifying n = 1..16 tokens (and 24, 32, 48, 64) in one batch takes here.

    `auto` speculates only where that pays: on a GPU verifying 8 tokens costs about one;
    on a small CPU it costs several. Curves are cached per model file, threads and backend.
    """
    from dataclasses import replace

    from localspec.auto.calibrate import DRAFT_SIZES, SIZES
    from localspec.auto.calibrate import calibrate as run_calibration
    from localspec.engine.config import LoadOptions
    from localspec.engine.llama import LlamaModel
    from localspec.engine.prefill import attach_plain_prefill
    from localspec.engine.rpc import parse_endpoints
    from localspec.paths import Paths
    from localspec.resolve import draft_path, target_path
    from localspec.settings import load_settings

    settings = load_settings(**flags)
    paths = Paths.from_env()
    target = target_path(settings, paths)
    draft = draft_path(settings, paths, target)
    options = LoadOptions(
        n_ctx=256,
        n_threads=settings.threads,
        gpu_layers=settings.gpu_layers,
        kv_type=settings.kv_type,
        batch_invariant=settings.exact,
    )
    # The target through its workers, as serve --rpc loads it; the draft here.
    target_options = replace(options, rpc=parse_endpoints(settings.rpc) if settings.rpc else ())
    report: dict[str, Any] = {"exact": settings.exact, "target": None, "draft": None}
    progress = None if as_json else LoadProgress()
    for role, path, opts in (
        ("target", target, target_options),
        ("draft", draft, replace(options, gpu_layers=settings.draft_gpu_layers)),
    ):
        if path is None:
            continue
        model = LlamaModel(path, opts)
        if role == "target":  # as the engine loads it: wide verifies may run on a plain copy
            attach_plain_prefill(model, paths.cache_dir)
        try:
            result = run_calibration(
                model,
                paths.cache_dir,
                sizes=SIZES if role == "target" else DRAFT_SIZES,
                refresh=refresh,
                progress=_progress(progress, f"{role} calibration"),
            )
        finally:
            model.close()
        if result.not_saved is not None:
            click.echo(f"warning: {printable(result.not_saved)}", err=True)
        report[role] = {
            "file": str(path),
            "from_cache": result.from_cache,
            "threads": result.key["threads"],
            "gpu_layers": result.key["gpu_layers"],
            "seconds": list(result.curve.seconds),
            # The widths timed; the others are interpolated (auto drafts only into these past 16).
            "measured": list(result.key["sizes"]),
        }
    report["break_even"] = _break_even(report)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print(report)


def _progress(progress: LoadProgress | None, what: str) -> Callable[[float], None] | None:
    if progress is None:
        return None
    return lambda fraction: progress(what, fraction)


def _break_even(report: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """The acceptance each drafter needs, at each k, to match plain decoding (None: it never can)."""
    from localspec.auto.costmodel import Curve, StepCost, break_even

    verify = Curve(tuple(report["target"]["seconds"]))
    costs = {"ngram": StepCost(verify)}
    if report["draft"] is not None:
        per = report["draft"]["seconds"][0]
        costs["draft"] = StepCost(verify, 0.0, per, per)
    widest = max(report["target"]["measured"])
    out: dict[str, dict[str, float | None]] = {}
    for name, cost in costs.items():
        values = {str(k): break_even(cost, k) for k in SHOWN_K if k < widest}
        out[name] = {k: (None if math.isinf(v) else round(v, 3)) for k, v in values.items()}
    return out


def _print(report: dict[str, Any]) -> None:
    target = report["target"]
    seconds = target["seconds"]
    source = "cached" if target["from_cache"] else "measured now"
    click.echo(f"target {Path(target['file']).name}: {source}, {target['threads']} threads, ", nl=False)
    click.echo(f"gpu layers {target['gpu_layers']}")
    click.echo("   n   V(n) ms   V(n)/V(1)   tok/s if all n kept")
    for n in target["measured"]:
        s = seconds[n - 1]
        click.echo(f"{n:4d} {s * 1e3:9.2f} {s / seconds[0]:11.2f} {n / s:17.1f}")
    draft = report["draft"]
    if draft is not None:
        d1 = draft["seconds"][0]
        source = "cached" if draft["from_cache"] else "measured now"
        click.echo(
            f"draft {Path(draft['file']).name}: {source}; one token {d1 * 1e3:.2f} ms "
            f"= {d1 / seconds[0]:.2f} of a target token"
        )
    click.echo("acceptance needed to match plain decoding (same at every position; - : never pays):")
    click.echo("   k " + "".join(f"{name:>8}" for name in report["break_even"]))
    for k in report["break_even"]["ngram"]:  # the SHOWN_K this curve measured far enough for
        cells = [report["break_even"][name][k] for name in report["break_even"]]
        click.echo(f"{int(k):4d} " + "".join("       -" if c is None else f"{c:8.2f}" for c in cells))
