"""`localspec generate` and `localspec bench`: the engine in-process, from the terminal."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from localspec.cli.app import cli
from localspec.cli.options import LoadProgress, model_options, pop_model_settings
from localspec.types import (
    METHODS,
    ChatMessage,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    SpecParams,
)


@cli.command()
@click.argument("prompt")
@model_options
@click.option("--system", help="A system message before the prompt.")
@click.option("--raw", is_flag=True, help="Send PROMPT as is, without the chat template.")
@click.option("--max-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option(
    "--temperature", type=click.FloatRange(0.0), default=0.0, show_default=True, help="0 is greedy."
)
@click.option("--top-k", type=click.IntRange(0), default=0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0.0, 1.0), default=1.0, show_default=True)
@click.option("--min-p", type=click.FloatRange(0.0, 1.0), default=0.0, show_default=True)
@click.option("--seed", type=int, help="Fix the sampling seed (reproducible output).")
@click.option("--stop", multiple=True, help="Stop at this string (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with text, tokens and stats.")
@click.option(
    "--remote", is_flag=True, help="Use the running daemon (`localspec serve`) instead of loading models."
)
def generate(prompt: str, **kwargs: Any) -> None:
    """Generate a reply to PROMPT, streaming text as it is accepted, then one stats line."""
    from localspec.settings import load_settings

    settings = load_settings(**pop_model_settings(kwargs))
    request = _request(prompt, settings.method, settings.k, kwargs)
    echo = (lambda _text: None) if kwargs["as_json"] else (lambda text: click.echo(text, nl=False))
    result = _remote(settings, request, echo) if kwargs["remote"] else _local(settings, request, echo)
    if kwargs["as_json"]:
        click.echo(json.dumps(_result_json(result)))
    else:
        click.echo()
        click.echo(_stats_line(result), err=True)


def _local(settings: Any, request: GenerationRequest, echo: Any) -> GenerationResult:
    from localspec.engine.worker import Engine
    from localspec.resolve import engine_config

    with Engine(engine_config(settings), progress=LoadProgress()) as engine:
        engine.wait_ready()
        if engine.info.draft_error:
            click.echo(f"note: draft not used: {engine.info.draft_error}", err=True)
        handle = engine.submit(request)
        for chunk in handle:
            echo(chunk.text)
    assert handle.result is not None
    return handle.result


def _remote(settings: Any, request: GenerationRequest, echo: Any) -> GenerationResult:
    from localspec.client import Client

    with Client.from_env(settings) as client:
        for event in client.stream(request):
            if isinstance(event, GenerationResult):
                return event
            echo(event.text)
    raise click.ClickException("the daemon closed the stream before the result")


def _request(prompt: str, method: Any, k: int | None, opts: dict[str, Any]) -> GenerationRequest:
    sampling = SamplingParams(
        temperature=opts["temperature"],
        top_k=opts["top_k"],
        top_p=opts["top_p"],
        min_p=opts["min_p"],
        seed=opts["seed"],
    )
    common: dict[str, Any] = {
        "max_tokens": opts["max_tokens"],
        "stop": tuple(opts["stop"]),
        "sampling": sampling,
        "speculative": SpecParams(method, k),
    }
    if opts["raw"]:
        return GenerationRequest(prompt=prompt, **common)
    system = (ChatMessage("system", opts["system"]),) if opts["system"] else ()
    return GenerationRequest(messages=(*system, ChatMessage("user", prompt)), **common)


def _result_json(result: GenerationResult) -> dict[str, Any]:
    return {
        "text": result.text,
        "tokens": list(result.token_ids),
        "finish_reason": result.finish_reason,
        "stats": result.stats.to_dict(),
    }


def _stats_line(result: GenerationResult) -> str:
    st = result.stats
    line = (
        f"{st.tokens} tokens, {st.tokens_per_second:.1f} tok/s, ttft {st.ttft_s * 1000:.0f} ms, "
        f"method {st.method}"
    )
    if st.drafted:
        line += (
            f" (k={st.k}, mean k {st.mean_k:.1f}), accepted {st.accepted}/{st.drafted} "
            f"({st.acceptance_rate:.0%}), "
            f"mean accepted length {st.mean_accepted_length:.2f}"
        )
    if st.exact:
        line += "; exact: bit-identical to the target alone"
    else:
        line += "; fast: identical to the target alone up to rounding (--exact for bit-identity)"
    if st.fallback_reason:
        line += f"; fell back: {st.fallback_reason}"
    return line


@cli.command()
@model_options
@click.option(
    "--prompts",
    "prompts_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path(__file__).resolve().parents[2] / "scripts" / "bench_prompts.json",
    show_default="scripts/bench_prompts.json",
    help="JSON object: prompt name -> user message.",
)
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
@click.option("--json", "as_json", is_flag=True, help="Print {prompt: {method: {...}}} as JSON.")
def bench(
    prompts_file: Path, max_tokens: int, methods: str, repeat: int, as_json: bool, **kwargs: Any
) -> None:
    """Run every method on every prompt (greedy) and compare speed and output with `none`."""
    from localspec.engine.bench import load_prompts, report_json, run_bench
    from localspec.engine.worker import Engine
    from localspec.resolve import engine_config
    from localspec.settings import load_settings

    names = [m.strip() for m in methods.split(",") if m.strip()]
    chosen = [m for m in METHODS if m in names]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise click.BadParameter(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    settings = load_settings(**pop_model_settings(kwargs))
    prompts = load_prompts(prompts_file)
    total = len(prompts) * len(set(chosen) | {"none"}) * repeat
    # Every method runs each prompt after `none` did: with a memory of earlier requests, n-gram
    # would copy none's own output and measure a repeat, not the method.
    config = replace(engine_config(settings), ngram_memory_tokens=0)
    with Engine(config, progress=LoadProgress()) as engine:
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
    if as_json:
        click.echo(json.dumps(report_json(report), indent=2))
        return
    click.echo(
        f"{'prompt':<18} {'method':<10} {'tok/s':>7} {'spread':>6} {'speedup':>8} "
        f"{'accept':>7} {'mean k':>6} {'same':>5}"
    )
    for name, rows in report.items():
        for method, row in rows.items():
            same = "yes" if row.identical_to_none else "NO"
            click.echo(
                f"{name:<18} {method:<10} {row.tokens_per_second:>7.1f} {row.spread:>6.0%} "
                f"{row.speedup_vs_none:>7.2f}x "
                f"{row.acceptance_rate:>7.0%} {row.mean_k:>6.1f} {same:>5}"
            )
    if not settings.exact:
        click.echo(
            "(fast loading: outputs may differ from none where the top two logits nearly tie; "
            "--exact for bit-identity)",
            err=True,
        )
