"""`localspec bench`: every method on every prompt of a set, against `none`, in-process."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localspec.cli.app import cli
from localspec.cli.options import LoadProgress, model_options, pop_model_settings
from localspec.process.hugepages import huge_pages
from localspec.types import METHODS, Method

if TYPE_CHECKING:
    from localspec.engine.bench import BenchRow

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@cli.command()
@model_options
@click.option(
    "--prompts",
    "prompts_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=SCRIPTS / "bench_set.json",
    show_default="scripts/bench_set.json",
    help='A bench set ({"prompts": [{"name", "kind", "messages"}, ...]}) or an object name -> message.',
)
@click.option("--kinds", help="Comma-separated kinds of prompt to run (default: all), e.g. code_edit,chat.")
@click.option("--max-tokens", type=click.IntRange(1), default=128, show_default=True)
@click.option(
    "--methods",
    default="none,draft,ngram,layerskip,auto",
    show_default=True,
    help="Comma-separated methods to compare with none.",
)
@click.option(
    "--repeat",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Keep the fastest of N runs (taking turns between methods); spread: fastest against slowest.",
)
@click.option("--json", "as_json", is_flag=True, help="Print settings, every row and the medians as JSON.")
def bench(
    prompts_file: Path,
    kinds: str | None,
    max_tokens: int,
    methods: str,
    repeat: int,
    as_json: bool,
    **kwargs: Any,
) -> None:
    """Run every method on every prompt (greedy) and compare speed and output with `none`.

    Reports decode tok/s (after the first token), end-to-end tok/s and time to first token per
    prompt and method, the speedup of decode tok/s over `none`, and the medians per kind.
    """
    from localspec.engine.bench import kind_medians, report_json, run_bench
    from localspec.engine.benchset import load_selected
    from localspec.engine.isolated import open_engine
    from localspec.resolve import engine_config
    from localspec.settings import load_settings

    chosen = _methods(methods)
    settings = load_settings(**pop_model_settings(kwargs))
    prompts = load_selected(prompts_file, kinds or "")
    # Every method runs each prompt after `none` did: with a memory of earlier requests, n-gram
    # would copy none's own output and measure a repeat, not the method. Each reads its prompt
    # whole, so no earlier prompt's cache is saved either.
    config = replace(engine_config(settings), ngram_memory_tokens=0, prompt_cache_bytes=0)
    total = len(prompts) * len(set(chosen) | {"none"}) * repeat
    started = _now()
    with open_engine(config, progress=LoadProgress()) as engine:
        engine.wait_ready()
        with click.progressbar(length=total, label="bench", file=sys.stderr) as bar:
            report = run_bench(
                engine,
                prompts,
                chosen,
                max_tokens=max_tokens,
                k=settings.k,
                repeat=repeat,
                on_run=lambda _p, _m: bar.update(1),
            )
        target, draft = engine.info.target, engine.info.draft
    # As loaded: the engine says whether each run was exact (batch-invariant weights) or fast.
    exact = all(row.exact for rows in report.values() for row in rows.values())
    if as_json:
        run = {
            "prompts_file": str(prompts_file),
            "kinds": kinds or "all",
            "methods": chosen,
            "max_tokens": max_tokens,
            "repeat": repeat,
            "target": target,
            "draft": draft,
            "threads": settings.threads,
            "n_ctx": config.load.n_ctx,
            "exact": exact,
            "huge_pages": huge_pages(),
            "started": started,
            "finished": _now(),
        }
        click.echo(json.dumps(report_json(prompts, report, run), indent=2, ensure_ascii=False))
        return
    kind_of = {p.name: p.kind for p in prompts}
    _print_rows(report, kind_of)
    _print_medians(kind_medians(prompts, report))
    if not exact:
        click.echo(
            "(fast loading: outputs may differ from none where the top two logits nearly tie; "
            "--exact for bit-identity)",
            err=True,
        )


def _methods(methods: str) -> list[Method]:
    names = [m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise click.BadParameter(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    return [m for m in METHODS if m in names]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _print_rows(report: Mapping[str, Mapping[str, BenchRow]], kind_of: Mapping[str, str]) -> None:
    click.echo(
        f"{'prompt':<28} {'kind':<10} {'method':<10} {'decode':>7} {'e2e':>7} {'ttft ms':>8} "
        f"{'spread':>6} {'speedup':>8} {'accept':>7} {'mean k':>6} {'same':>5}"
    )
    for name, rows in report.items():
        for method, row in rows.items():
            same = "yes" if row.identical_to_none else "NO"
            click.echo(
                f"{name[:28]:<28} {kind_of[name][:10]:<10} {method:<10} {row.decode_tps:>7.1f} "
                f"{row.e2e_tps:>7.1f} {row.ttft_s * 1000:>8.0f} {row.spread:>6.0%} "
                f"{row.speedup_vs_none:>7.2f}x {row.acceptance_rate:>7.0%} {row.mean_k:>6.1f} {same:>5}"
            )


def _print_medians(medians: Mapping[str, Mapping[str, Mapping[str, float]]]) -> None:
    click.echo()
    click.echo(
        f"{'median per kind':<28} {'method':<10} {'prompts':>7} {'decode':>7} {'e2e':>7} "
        f"{'ttft ms':>8} {'speedup':>8}"
    )
    for kind, by_method in medians.items():
        for method, m in by_method.items():
            click.echo(
                f"{kind[:28]:<28} {method:<10} {m['prompts']:>7.0f} {m['decode_tps']:>7.1f} "
                f"{m['e2e_tps']:>7.1f} {m['ttft_s'] * 1000:>8.0f} {m['speedup_vs_none']:>7.2f}x"
            )
