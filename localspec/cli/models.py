"""`localspec models`, `inspect`, `pull` and `rm`: the models on this machine."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localspec.cli.app import cli
from localspec.printable import printable

if TYPE_CHECKING:
    from localspec.models.discovery import FoundModel
    from localspec.models.gguf_info import GGUFInfo

FINGERPRINT_SHORT = 8


@cli.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
@click.option(
    "--search-path",
    "search_paths",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Also look in this folder or file (repeatable).",
)
def models_command(as_json: bool, search_paths: Sequence[Path]) -> None:
    """List the GGUF models found here: the models folder, Hugging Face, LM Studio and Ollama."""
    from localspec.models.discovery import discover

    found = discover(search_paths)
    for skip in found.skipped:
        click.echo(printable(f"skipped {skip.path}: {skip.reason}"), err=True)
    if as_json:
        click.echo(json.dumps([_model_dict(m) for m in found.models], indent=2))
        return
    if not found.models:
        click.echo("no models found; fetch one with `localspec pull OWNER/REPO`", err=True)
        return
    header = ("NAME", "ARCH", "PARAMS", "QUANT", "SIZE", "CTX", "TOKENIZER", "SOURCE")
    # Names, architectures and paths come from GGUF headers and hub file names: escaped.
    rows = [tuple(printable(cell) for cell in _model_row(m)) for m in found.models]
    for line in _table([header, *rows]):
        click.echo(line)


def _model_dict(model: FoundModel) -> dict[str, Any]:
    data = model.info.to_dict()
    data.pop("chat_template")  # kilobytes of Jinja per model; `inspect --json` shows it
    return {"display_name": model.display_name, "source": model.source, **data}


def _model_row(model: FoundModel) -> tuple[str, ...]:
    info = model.info
    return (
        model.display_name,
        info.arch,
        format_params(info.n_params),
        info.quant,
        format_bytes(info.size_bytes),
        str(info.n_ctx_train),
        info.tokenizer_fingerprint[:FINGERPRINT_SHORT],
        model.source,
    )


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


@cli.command("inspect")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print every field as JSON.")
def inspect_command(file: Path, as_json: bool) -> None:
    """Show what a GGUF file's header says: architecture, sizes, tokenizer, chat template."""
    from localspec.models.gguf_info import read_gguf_info

    info = read_gguf_info(file)
    if as_json:
        click.echo(json.dumps(info.to_dict(), indent=2))
        return
    for label, value in describe(info):
        click.echo(f"{label + ':':<18} {printable(value)}")


def describe(info: GGUFInfo) -> list[tuple[str, str]]:
    """Label/value pairs for a person reading `inspect`."""
    layers = info.layer_bytes
    per_layer = format_bytes(max(layers)) if layers else "-"
    outside = format_bytes(info.non_layer_bytes)
    return [
        ("path", str(info.path)),
        ("name", info.name),
        ("architecture", info.arch),
        ("parameters", f"{format_params(info.n_params)} ({info.n_params:,})"),
        ("quantization", info.quant),
        ("file size", f"{format_bytes(info.size_bytes)} ({info.size_bytes:,} bytes)"),
        ("context (train)", str(info.n_ctx_train)),
        ("layers", f"{info.n_layers} (largest {per_layer}; outside them {outside})"),
        ("embedding", str(info.n_embd)),
        ("heads", f"{info.n_head} query, {info.n_head_kv} key/value"),
        ("head dims", f"key {info.head_dim_k}, value {info.head_dim_v}"),
        ("tokenizer", f"{info.vocab_type} ({info.llama_vocab_type}), pre {info.tokenizer_pre or '-'}"),
        ("vocabulary", f"{info.vocab_size} tokens"),
        ("BOS", _special(info.bos_id, info.add_bos)),
        ("EOS", _special(info.eos_id, info.add_eos)),
        ("fill-in-middle", _fim(info)),
        ("fingerprint", info.tokenizer_fingerprint),
        ("chat template", _template(info.chat_template)),
    ]


def _special(token_id: int | None, added: bool) -> str:
    shown = "-" if token_id is None else str(token_id)
    return f"{shown} ({'added to prompts' if added else 'not added'})"


def _fim(info: GGUFInfo) -> str:
    if not info.has_fim:
        return "no"
    return f"prefix {info.fim_prefix_id}, suffix {info.fim_suffix_id}, middle {info.fim_middle_id}"


def _template(template: str | None) -> str:
    if template is None:
        return "none"
    return f"yes ({len(template.splitlines())} lines; `inspect --json` prints it)"


@cli.command("pull")
@click.argument("spec", metavar="REPO[:FILE]")
@click.option("--revision", default="main", show_default=True, help="Branch, tag or commit.")
@click.option("--dest", type=click.Path(path_type=Path), help="Folder to write to (default: models folder).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def pull_command(spec: str, revision: str, dest: Path | None, quiet: bool) -> None:
    """Download a GGUF from the Hugging Face Hub (the Q4_K_M file when no FILE is named)."""
    from localspec.models.gguf_info import read_gguf_info
    from localspec.models.hub import parse_spec, pull

    repo, filename = parse_spec(spec)
    path = pull(repo, filename, dest, progress=not quiet, revision=revision)
    info = read_gguf_info(path)
    size = format_bytes(info.size_bytes)
    click.echo(printable(f"{path}  ({info.arch}, {format_params(info.n_params)}, {info.quant}, {size})"))


@cli.command("rm")
@click.argument("name")
def rm_command(name: str) -> None:
    """Delete a model from the models folder (through the daemon when one runs: it unloads it)."""
    from localspec.cli.serve import _socket_for
    from localspec.client import Client
    from localspec.process.pidfile import daemon_pid, pid_file_for

    socket = _socket_for(None)
    if daemon_pid(pid_file_for(socket)) is not None:
        with Client(socket_path=socket) as client:
            client.delete(name)
        click.echo(printable(f"deleted {name}"))
        return
    paths = _remove_here(name)
    click.echo(printable(f"deleted {name} ({', '.join(str(p) for p in paths)})"))


def _remove_here(name: str) -> list[Path]:
    """Delete the found model called `name` (its file's name, with or without .gguf) here."""
    from localspec.errors import UserInputError
    from localspec.models.discovery import discover
    from localspec.models.remove import removable_files, remove_files
    from localspec.paths import Paths

    found = [m for m in discover().models if name in (m.display_name, m.display_name.removesuffix(".gguf"))]
    if not found:
        raise UserInputError(f"no model named {name!r} here; `localspec models` lists them")
    if len(found) > 1:
        where = ", ".join(f"{m.path} ({m.source})" for m in found)
        raise UserInputError(f"{name!r} names {len(found)} models ({where}); delete the one you mean by hand")
    model = found[0]
    paths = removable_files(name, model.path, model.source, Paths.from_env().models_dir)
    remove_files(name, paths)
    return paths


def format_bytes(n: int) -> str:
    """17 B, 12.0 KiB, 234.5 MiB, 1.04 GiB."""
    if n < 1024:
        return f"{n} B"
    size, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{size:.2f} {unit}" if size < 10 else f"{size:.1f} {unit}"


def format_params(n: int) -> str:
    """1.78B, 135M, 94K."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{suffix}" if n < 10 * scale else f"{n / scale:.0f}{suffix}"
    return str(n)
