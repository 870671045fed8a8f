"""`localspec service install|uninstall|status`: the daemon started at login by the platform's manager."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import click

from localspec.cli.app import UserError, cli
from localspec.process import service
from localspec.process.pidfile import daemon_pid, pid_file_for

# How long install waits to see the started daemon take its pidfile or socket. The daemon takes the
# pidfile before it loads anything, so this is an interpreter's start and imports, not a model's load.
START_WAIT_S = 30.0


@cli.group("service")
def service_group() -> None:
    """Run the daemon at login: a systemd user service (Linux) or a launchd agent (macOS)."""


@service_group.command("install")
@click.option(
    "--tcp", metavar="HOST:PORT", help="Also listen on TCP (127.0.0.1:11434 is where Ollama's clients look)."
)
@click.option("--print", "print_only", is_flag=True, help="Print the service file; write and start nothing.")
def install_command(tcp: str | None, print_only: bool) -> None:
    """Write the service file and start the daemon now and at every login.

    It runs this interpreter's `localspec serve` with config.toml and the LOCALSPEC_* variables set
    now (never LOCALSPEC_TOKEN: a service reads its token from config.toml). Install again after
    moving localspec or changing those variables; `localspec service uninstall` removes it.
    """
    manager = service.this_platform()
    socket_path = _check_serves(tcp)
    argv, env = service.serve_argv(tcp), service.service_env(os.environ)
    if print_only:
        click.echo(manager.render(argv, env, service.user_home(os.environ)), nl=False)
        return
    pid = daemon_pid(pid_file_for(socket_path))
    fresh = not service.check_ours(manager.file(os.environ))
    if pid is not None and fresh:
        # Started by hand, so the service's daemon would find the socket taken: write it, start nothing.
        path = service.install(manager, argv, env, start=False).path
        click.echo(f"installed {path}")
        raise UserError(
            f"a daemon started by hand runs (pid {pid}), so the service was not started: "
            "stop it (`localspec stop`) and run `localspec service install` again, or log in again"
        )
    done = service.install(manager, argv, env)
    click.echo(f"installed {done.path}")
    if done.failed:
        raise UserError(f"{done.failed}; the file is in place: start it from your login session")
    started = _wait_for_daemon(socket_path, replaced=pid)
    for hint in manager.hints():
        click.echo(hint)
    if started is None:
        raise UserError(
            f"{manager.name} started the service, but no daemon came up on {socket_path}; see its logs"
        )
    click.echo(f"running: pid {started}, socket {socket_path}")


@service_group.command("uninstall")
def uninstall_command() -> None:
    """Stop the service and remove its file (only a file `service install` wrote)."""
    manager = service.this_platform()
    done = service.uninstall(manager)
    if done is None:
        click.echo(f"no localspec service is installed ({manager.file(os.environ)})")
        return
    click.echo(f"removed {done.path}")
    if done.failed:
        raise UserError(f"{done.failed}; the file is gone, so it will not start at the next login")


@service_group.command("status")
def status_command() -> None:
    """Show whether the service is installed, what its manager says, and whether the daemon runs."""
    manager = service.this_platform()
    path = manager.file(os.environ)
    installed = service.check_ours(path)
    click.echo(f"{manager.name}: {path} ({'installed' if installed else 'not installed'})")
    if installed:
        said = service.run_quietly(manager.state())
        first = (said.stdout or said.stderr).strip().splitlines()
        click.echo(f"manager: {first[0] if first else f'exit status {said.returncode}'}")
    socket_path = _socket()
    pid = daemon_pid(pid_file_for(socket_path))
    click.echo(
        f"daemon: running, pid {pid}, socket {socket_path}" if pid else f"daemon: not running ({socket_path})"
    )


def _socket() -> Path:
    from localspec.cli.serve import _socket_for

    return _socket_for(None)


def _check_serves(tcp: str | None) -> Path:
    """Resolve what the service will serve, as it will see its settings (no LOCALSPEC_TOKEN); its socket.

    A setting the daemon would refuse is refused here, before anything is written.
    """
    from localspec.server.daemon import check_target, daemon_config
    from localspec.settings import load_settings

    with _without(service.SECRET):
        config = daemon_config(load_settings(tcp=tcp), max_body_bytes=1)
    check_target(config)
    return config.socket_path


@contextlib.contextmanager
def _without(name: str) -> Iterator[None]:
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


def _wait_for_daemon(socket_path: Path, replaced: int | None) -> int | None:
    """The pid of the daemon the manager started, once it holds the pidfile (not `replaced`'s)."""
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        pid = daemon_pid(pid_file_for(socket_path))
        if pid and pid != replaced:  # 0: a daemon starting, its pid not yet written
            return pid
        time.sleep(0.2)
    return None
