"""`localspec pick-draft`: which draft (or self-speculative method) to use for a target, and why."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from localspec.cli.app import cli
from localspec.paths import Paths
from localspec.pickdraft.context import AUTO_CTX_MIN

if TYPE_CHECKING:
    from localspec.pickdraft.rank import Candidate, PickResult
    from localspec.settings import Settings

KV_TYPES = ("f16", "q8_0", "q4_0")


@cli.command("pick-draft")
@click.option(
    "--target", type=click.Path(path_type=Path, dir_okay=False), help="Target GGUF (default: settings)."
)
@click.option(
    "--search-path",
    "search_paths",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Also look for drafts in this folder or file (repeatable).",
)
@click.option("--vram", metavar="SIZE", help="Plan for this much GPU memory (8G, 24GiB; 0: CPU only).")
@click.option("--ram", metavar="SIZE", help="Plan for this much free RAM (16GB, 64G).")
@click.option(
    "--ctx", "n_ctx", type=click.IntRange(min=64), help="Context size in tokens (default: settings)."
)
@click.option("--kv-type", type=click.Choice(KV_TYPES), help="KV cache type (default: settings).")
@click.option(
    "--exact/--fast", "exact", default=None, help="Plan for exact (default) or --fast loading (see generate)."
)
@click.option(
    "--rpc",
    metavar="HOST:PORT[,HOST:PORT]",
    help="Also plan the target on these RPC workers: their memory, and which layers each would hold.",
)
@click.option("--measure", is_flag=True, help="Measure speed and acceptance here instead of using priors.")
@click.option("--json", "as_json", is_flag=True, help="Print the choice and every candidate as JSON.")
@click.option(
    "--save",
    is_flag=True,
    help="Write the choice to config.toml, which serve and chat read (method auto where auto runs it).",
)
def pick_draft_command(
    target: Path | None,
    search_paths: Sequence[Path],
    vram: str | None,
    ram: str | None,
    n_ctx: int | None,
    kv_type: str | None,
    exact: bool | None,
    rpc: str | None,
    measure: bool,
    as_json: bool,
    save: bool,
) -> None:
    """Rank every draft this target could use by tokenizer match, memory and expected speed.

    Candidates are the GGUFs `localspec models` finds, the self-speculative methods
    (ngram, layerskip) and none; known drafts from the catalog when nothing local fits.
    Speed comes from a cost model (or, with --measure, from this machine).
    """
    from localspec.pickdraft.devices import parse_size
    from localspec.pickdraft.machine import pick_for_machine
    from localspec.pickdraft.rank import CHOICE_KEYS
    from localspec.resolve import serve_context, target_path
    from localspec.settings import Settings, load_settings_reading, save_settings

    # Not the choice's own keys, which --save rewrites: a bad one there (as an older --save wrote,
    # k = 0) must not keep the save from replacing it.
    reads = set(Settings.model_fields) - CHOICE_KEYS
    settings = load_settings_reading(reads, target=target, n_ctx=n_ctx, kv_type=kv_type, exact=exact, rpc=rpc)
    target_file = target_path(settings, Paths.from_env())
    result = pick_for_machine(
        target_file,
        search_paths=search_paths,
        n_ctx=settings.n_ctx or AUTO_CTX_MIN,
        kv_type=settings.kv_type,
        vram=parse_size(vram) if vram is not None else None,
        ram=parse_size(ram) if ram is not None else None,
        repack=not settings.exact,
    )
    if measure:
        result = _measured(result, quiet=as_json)
    workers = _worker_plan(settings, target_file)
    # The choice is planned at AUTO_CTX_MIN where no context is set; serve then sizes it to the pair.
    served = (
        None
        if settings.n_ctx or workers
        else serve_context(settings, target_file, result.choice, result.device)
    )
    if as_json:
        extra = ({"rpc": workers} if workers else {}) | ({"serve_n_ctx": served} if served else {})
        click.echo(json.dumps(result.to_dict() | extra, indent=2))
    else:
        for line in (
            report_lines(result) + ([f"rpc: {workers}"] if workers else []) + _serve_line(result, served)
        ):
            click.echo(line)
    if save:
        values = result.choice.settings_values(result.target.path)
        if settings.n_ctx is None:  # saved, it would hold serve at the context the choice was planned at
            values.pop("n_ctx")
        path = save_settings(values)
        click.echo(f"saved to {path}", err=as_json)


def _serve_line(result: PickResult, served: int | None) -> list[str]:
    if served is None:
        return []
    trained = result.target.n_ctx_train
    return [
        f"serve: context {served} tokens (trained for {trained}, as this machine's memory allows; "
        "--ctx or n_ctx in config.toml sets one)"
    ]


def _worker_plan(settings: Settings, target: Path) -> str | None:
    """With --rpc (or the rpc setting): each worker's memory, asked now, and the layers it would hold."""
    if not settings.rpc:
        return None
    from localspec.engine.rpc import parse_endpoints
    from localspec.pickdraft.rpcplan import worker_line

    endpoints = parse_endpoints(settings.rpc)
    n_ctx = settings.n_ctx or AUTO_CTX_MIN
    return worker_line(target, endpoints, n_ctx, settings.kv_type, Paths.from_env().cache_dir)


def _measured(result: PickResult, *, quiet: bool) -> PickResult:
    from localspec.pickdraft.measure import measure

    if quiet:
        return measure(result)
    with click.progressbar(length=1000, label="measuring", show_eta=False, file=sys.stderr) as bar:
        done = 0

        def progress(label: str, fraction: float) -> None:
            nonlocal done
            bar.label = f"{label[:40]:<40}"
            step = int(fraction * 1000) - done
            if step > 0:
                bar.update(step)
                done += step

        return measure(result, progress=progress)


def report_lines(result: PickResult) -> list[str]:
    """The human-readable report: device, one line per candidate, the choice and its memory plan."""
    from localspec.cli.models import format_bytes

    info = result.target
    choice = result.choice
    lines = [
        f"target: {info.path.name} ({format_bytes(info.size_bytes)}, {info.n_layers} layers)",
        f"memory: {result.device.describe()}",
        "",
    ]
    header = ("", "CANDIDATE", "METHOD", "TOKENIZER", "FITS", "SPEEDUP", "K", "REASON")
    rows = [_row(c, c.method == choice.method and c.path == choice.draft) for c in result.candidates]
    lines += _table([header, *rows])
    gpu = "all" if choice.gpu_layers < 0 else str(choice.gpu_layers)
    draft = choice.draft.name if choice.draft else "-"
    lines += [
        "",
        f"choice: {choice.method} (draft {draft}, k={choice.k}, context {choice.n_ctx}, "
        f"target GPU layers {gpu})",
        f"why: {choice.reason}",
    ]
    plan = next(c.plan for c in result.candidates if c.method == choice.method and c.path == choice.draft)
    if plan is not None:
        lines += [f"plan: {line}" for line in plan.describe()]
    return lines


def _row(cand: Candidate, chosen: bool) -> tuple[str, ...]:
    speed = f"{cand.expected_speedup:.2f}x" if cand.expected_speedup is not None else "-"
    k = str(cand.estimate.k) if cand.estimate else "-"
    ok = "ok" if cand.compatible else "differs"
    fits = "yes" if cand.fits else "no"
    if not cand.compatible:
        fits = "-"
    return ("*" if chosen else "", cand.label, cand.method, ok, fits, speed, k, cand.reason)


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    # The reason column is last and left ragged: it is a sentence, not a value.
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    ]
