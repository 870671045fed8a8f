"""`localspec serve`, `localspec status` and `localspec stop`: the daemon's lifecycle."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from localspec.cli.app import cli
from localspec.errors import DaemonError, LocalspecError
from localspec.printable import printable
from localspec.types import METHODS

if TYPE_CHECKING:
    from localspec.client import Health, LoadedModel

LOG_LEVELS = ("debug", "info", "warning", "error")


def _socket_for(socket_path: Path | None) -> Path:
    from localspec.paths import Paths
    from localspec.settings import load_settings_reading

    # Only the socket: a bad value elsewhere must not keep `localspec stop` from reaching the daemon.
    return socket_path or load_settings_reading(("socket",)).socket or Paths.from_env().socket_path


@cli.command("serve")
@click.option("--target", type=click.Path(path_type=Path, dir_okay=False), help="Target GGUF file.")
@click.option("--draft", type=click.Path(path_type=Path, dir_okay=False), help="Draft GGUF file.")
@click.option("--method", type=click.Choice(METHODS), help="Default speculation method.")
@click.option("-k", "k", type=click.IntRange(1, 32), help="Default most tokens drafted per step.")
@click.option("--ctx", "n_ctx", type=click.IntRange(min=64), help="Context size in tokens.")
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), help="Unix socket path.")
@click.option("--tcp", metavar="HOST:PORT", help="Also listen on TCP (default port 8977).")
@click.option("--token", help="Bearer token required on TCP; prefer LOCALSPEC_TOKEN (argv is visible).")
@click.option(
    "--embed-model",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Embedding GGUF for the embeddings routes (loaded on first use).",
)
@click.option("--queue-size", type=click.IntRange(min=1), help="Requests that may wait before 503.")
@click.option(
    "--rpc",
    metavar="HOST:PORT[,HOST:PORT]",
    help="Put the target's layers on these RPC workers (`localspec rpc-worker`); the draft stays here.",
)
@click.option(
    "--max-body",
    type=click.IntRange(min=1024),
    default=4 * 1024 * 1024,
    show_default=True,
    help="Body limit.",
)
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True)
@click.option("--access-log/--no-access-log", default=True, show_default=True, help="Log every request.")
def serve_command(
    target: Path | None,
    draft: Path | None,
    method: str | None,
    k: int | None,
    n_ctx: int | None,
    socket_path: Path | None,
    tcp: str | None,
    token: str | None,
    embed_model: Path | None,
    queue_size: int | None,
    rpc: str | None,
    max_body: int,
    log_level: str,
    access_log: bool,
) -> None:
    """Run the daemon in the foreground: OpenAI- and Ollama-compatible APIs on a unix socket.

    Logs go to stderr. SIGTERM, Ctrl-C or closing its terminal stops it cleanly. Unset options
    come from LOCALSPEC_* variables and config.toml; without --target, the catalog's default model.
    """
    from localspec.server.daemon import daemon_config, run
    from localspec.settings import load_settings

    settings = load_settings(
        target=target,
        draft=draft,
        method=method,
        k=k,
        n_ctx=n_ctx,
        socket=socket_path,
        tcp=tcp,
        token=token,
        queue_size=queue_size,
        embed_model=embed_model,
        rpc=rpc,
    )
    config = daemon_config(settings, max_body_bytes=max_body, access_log=access_log)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_PrintableFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=log_level.upper(), handlers=[handler])
    run(config)


class _PrintableFormatter(logging.Formatter):
    """Log lines with control characters escaped: they quote model names and paths from GGUF files."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(printable(line) for line in super().format(record).split("\n"))


def _uptime(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes}m {secs}s" if hours else f"{minutes}m {secs}s"


def _status_lines(health: Health, pid: int | None, socket_path: Path) -> list[str]:
    lines = [f"localspec daemon: {health.status} (pid {pid or '?'})", f"socket: {socket_path}"]
    if not health.ready:
        return lines + ([f"error: {health.error}"] if health.error else [])
    draft = health.draft or f"none ({health.draft_error or 'not configured'})"
    return [
        *lines,
        f"uptime: {_uptime(health.uptime_s)}",
        f"model: {health.model} ({health.target})",
        f"draft: {draft}",
        *([f"pick: {health.pick}"] if health.pick else []),
        f"method: {health.method} (k={health.k or 'default'}); available: {', '.join(health.methods)}",
        f"context: {health.n_ctx} tokens",
        "loading: exact (bit-identical to the target alone)"
        if health.exact
        else "loading: fast (llama.cpp's own; identical to the target alone up to rounding)"
        + ("; prompts read with plain weights" if health.plain_prefill else ""),
        f"queue: {health.queue_depth} waiting, {health.in_flight} in flight",
        *_worker_lines(health),
    ]


def _worker_lines(health: Health) -> list[str]:
    """One line per RPC worker: up, or down and why."""
    return [
        f"rpc worker {w['endpoint']}: " + ("up" if w.get("up") else f"DOWN ({w.get('error')})")
        for w in health.rpc_workers
    ]


@cli.command("status")
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), help="Unix socket path.")
@click.option("--json", "as_json", is_flag=True, help="Print /health as JSON.")
def status_command(socket_path: Path | None, as_json: bool) -> None:
    """Show whether the daemon runs, what it serves and for how long."""
    from localspec.client import Client, Health
    from localspec.process.pidfile import daemon_pid, pid_file_for

    path = _socket_for(socket_path)
    pid = daemon_pid(pid_file_for(path))
    try:
        with Client(socket_path=path) as client:
            raw = client.health_raw()
    except DaemonError as exc:
        raise DaemonError(exc.message + _service_hint()) from None
    if as_json:
        click.echo(json.dumps({"pid": pid, "socket": str(path), **raw}, indent=2))
        return
    for line in _status_lines(Health.from_dict(raw), pid, path):
        click.echo(printable(line))  # model names and errors come from GGUF files


def _service_hint() -> str:
    """Where a service should be running the daemon and is not: where to look."""
    from localspec.process import service

    try:
        installed = service.check_ours(service.this_platform().file(os.environ))
    except LocalspecError:
        return ""
    return (
        "; a localspec service is installed: see `localspec service status` and its logs" if installed else ""
    )


def _ps_lines(models: list[LoadedModel], now: datetime) -> list[str]:
    rows = [("NAME", "SIZE", "SAVED PROMPTS", "DRAFT", "STATUS", "UNTIL")]
    for m in models:
        until = "stopped" if m.kept else _until(m.expires_at, now)
        status = f"{m.status}, {m.busy} busy" if m.busy else m.status
        saved = f"{m.saved_prompt_bytes / (1 << 20):.0f} MiB" if m.saved_prompt_bytes else "-"
        rows.append((m.name, f"{m.size / (1 << 20):.0f} MiB", saved, m.draft or "none", status, until))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]) for row in rows]


def _until(expires_at: str, now: datetime) -> str:
    if not expires_at:
        return "idle soon"
    left = (datetime.fromisoformat(expires_at.replace("Z", "+00:00")) - now).total_seconds()
    return f"{_uptime(max(0.0, left))} from now"


@cli.command("ps")
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), help="Unix socket path.")
@click.option("--json", "as_json", is_flag=True, help="Print /api/ps as JSON.")
def ps_command(socket_path: Path | None, as_json: bool) -> None:
    """List the models the daemon has loaded: memory by the plan, draft, and until when."""
    from localspec.client import Client

    with Client(socket_path=_socket_for(socket_path)) as client:
        models = client.loaded()
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(m) for m in models], indent=2))
        return
    for line in _ps_lines(models, datetime.now(UTC)):
        click.echo(printable(line))  # model names come from file names and GGUF headers


def _wait_for_pid(pid_file: Path) -> int | None:
    """The daemon's pid; a daemon that has just taken the lock writes its pid a moment later."""
    from localspec.process.pidfile import daemon_pid

    deadline = time.monotonic() + 2.0
    while (pid := daemon_pid(pid_file)) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    return pid or None


@cli.command("stop")
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), help="Unix socket path.")
@click.option(
    "--timeout", type=click.FloatRange(min=0), default=30.0, show_default=True, help="Seconds to wait."
)
def stop_command(socket_path: Path | None, timeout: float) -> None:
    """Stop the running daemon (SIGTERM) and wait until it has exited."""
    from localspec.errors import DaemonError
    from localspec.process.pidfile import daemon_pid, is_our_daemon, pid_file_for

    path = _socket_for(socket_path)
    pid_file = pid_file_for(path)
    pid = _wait_for_pid(pid_file)
    if pid is None:
        raise DaemonError(f"no localspec daemon is running ({pid_file} is not locked)")
    if not is_our_daemon(pid, pid_file):
        # Whoever holds the lock wrote this pid; only our own daemon holding this file gets a signal.
        raise DaemonError(
            f"{pid_file} names pid {pid}, which is not your localspec daemon; not signalling it"
        )
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while daemon_pid(pid_file) is not None:
        if time.monotonic() > deadline:
            raise DaemonError(
                f"the daemon (pid {pid}) did not stop within {timeout:g}s; `kill -9 {pid}` ends it"
            )
        time.sleep(0.05)
    click.echo(f"stopped localspec daemon (pid {pid})")
