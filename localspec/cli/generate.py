"""`localspec generate`: the engine in-process, from the terminal."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from localspec.cli.app import cli
from localspec.cli.options import LoadProgress, model_options, pop_model_settings
from localspec.types import (
    REPEAT_LAST_N,
    ChatMessage,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    SpecParams,
    TokenChunk,
)

F = TypeVar("F", bound=Callable[..., Any])


# The repetition penalties, as llama.cpp's CLI names them: (flag, type, default, help).
PENALTIES: tuple[tuple[str, click.ParamType, float, str], ...] = (
    ("--repeat-penalty", click.FloatRange(0.0, min_open=True), 1.0,
     "Divide a repeated token's logit by this (llama.cpp's); 1 is off."),
    ("--frequency-penalty", click.FloatRange(-2.0, 2.0), 0.0,
     "Lower a repeated token's logit by this per repeat."),
    ("--presence-penalty", click.FloatRange(-2.0, 2.0), 0.0, "Lower a repeated token's logit by this once."),
    ("--repeat-last-n", click.IntRange(-1), REPEAT_LAST_N,
     "How many of the latest tokens the penalties look at; -1 all, 0 none."),
)  # fmt: skip


def penalty_options(command: F) -> F:
    for flag, kind, default, text in reversed(PENALTIES):
        command = click.option(flag, type=kind, default=default, show_default=True, help=text)(command)
    return command


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
@penalty_options
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
    echo = _printer(kwargs["as_json"])
    result = _remote(settings, request, echo) if kwargs["remote"] else _local(settings, request, echo)
    if kwargs["as_json"]:
        click.echo(json.dumps(_result_json(result)))
    else:
        click.echo()
        click.echo(_stats_line(result), err=True)


def _printer(as_json: bool) -> Callable[[TokenChunk], None]:
    """Each chunk's text to stdout as it comes, and a thinking model's reasoning before it to
    stderr, dimmed on a terminal: a person sees the model think, a pipe gets the answer alone."""
    thought = False  # some reasoning went out: the answer starts on a line of its own

    def show(chunk: TokenChunk) -> None:
        nonlocal thought
        if chunk.reasoning:
            click.echo(click.style(chunk.reasoning, dim=True), nl=False, err=True)
            thought = True
        if chunk.text:
            if thought:
                click.echo("\n", err=True)
                thought = False
            click.echo(chunk.text, nl=False)

    return (lambda _chunk: None) if as_json else show


def _local(settings: Any, request: GenerationRequest, echo: Any) -> GenerationResult:
    from localspec.engine.isolated import open_engine
    from localspec.resolve import engine_config

    with open_engine(engine_config(settings), progress=LoadProgress()) as engine:
        engine.wait_ready()
        if engine.info.draft_error:
            click.echo(f"note: draft not used: {engine.info.draft_error}", err=True)
        handle = engine.submit(request)
        for chunk in handle:
            echo(chunk)
    assert handle.result is not None
    return handle.result


def _remote(settings: Any, request: GenerationRequest, echo: Any) -> GenerationResult:
    from localspec.client import Client

    with Client.from_env(settings) as client:
        for event in client.stream(request):
            if isinstance(event, GenerationResult):
                return event
            echo(event)
    raise click.ClickException("the daemon closed the stream before the result")


def _request(prompt: str, method: Any, k: int | None, opts: dict[str, Any]) -> GenerationRequest:
    sampling = SamplingParams(
        temperature=opts["temperature"],
        top_k=opts["top_k"],
        top_p=opts["top_p"],
        min_p=opts["min_p"],
        seed=opts["seed"],
        repeat_penalty=opts["repeat_penalty"],
        frequency_penalty=opts["frequency_penalty"],
        presence_penalty=opts["presence_penalty"],
        repeat_last_n=opts["repeat_last_n"],
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
        **({"reasoning": result.reasoning} if result.reasoning else {}),
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
