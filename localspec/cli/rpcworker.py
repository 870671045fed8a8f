"""`localspec rpc-worker`: lend this machine's CPU or GPU to a localspec elsewhere (llama.cpp RPC)."""

from __future__ import annotations

import click

from localspec.cli.app import cli

DEFAULT_PORT = 50052  # llama.cpp's rpc-server default (engine.rpc.DEFAULT_PORT)


@cli.command("rpc-worker")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)
@click.option("--threads", type=click.IntRange(1), help="CPU threads (default: physical cores).")
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Listen on a non-loopback --host. RPC has no authentication: trusted networks only.",
)
def rpc_worker(host: str, port: int, threads: int | None, allow_remote: bool) -> None:
    """Serve llama.cpp's RPC backend: a target loaded with `--rpc HOST:PORT` elsewhere keeps its
    layers here. Loopback only unless --allow-remote; one client at a time."""
    from localspec.engine.config import default_threads
    from localspec.engine.rpc_worker import check_host, run_worker

    warning = check_host(host, allow_remote)
    if warning is not None:
        bar = "!" * 72
        click.echo(f"{bar}\n{warning.format(host=host, port=port)}\n{bar}", err=True)
    run_worker(host, port, threads or default_threads(), lambda line: click.echo(line, err=True))
