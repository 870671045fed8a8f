"""The daemon process: one pidfile lock, a private unix socket, an optional TCP listener, clean exits.

`run(config)` holds the lock for the process's life, binds the sockets itself
(so the unix socket is 0600 from the first instant, unlike uvicorn's own
`--uds`, which makes it 0666), loads the models in the background while
`/health` says "loading", and serves the API with uvicorn until SIGTERM or
SIGINT. Then it stops accepting, cancels the generations in flight, and
removes the socket and the pidfile.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import uvicorn

from localspec.engine.config import EngineConfig
from localspec.engine.isolated import open_engine
from localspec.engine.worker import Engine, ProgressFn
from localspec.errors import ConfigError, DaemonError, LocalspecError
from localspec.paths import Paths
from localspec.process.pidfile import PidLock, pid_file_for
from localspec.resolve import context_allowed, model_serve_config, target_path
from localspec.server.app import make_app
from localspec.server.config import STREAM_INTERVAL_S, ApiConfig
from localspec.server.connections import KERNEL_BACKLOG, ConnectionPolicy, guarded_protocol
from localspec.server.pool import Resident
from localspec.server.security import DEFAULT_MAX_BODY_BYTES
from localspec.server.serving import ServeOptions, build
from localspec.server.state import ServerState
from localspec.settings import Settings

log = logging.getLogger("localspec.daemon")

# Not 11434 (Ollama) nor anything next to it, so a plugin pointed at the wrong one fails loudly.
DEFAULT_TCP_PORT = 8977
SHUTDOWN_GRACE_S = 5


@dataclass(frozen=True)
class DaemonConfig:
    """Everything `run()` needs, built once by the CLI from Settings."""

    engine: EngineConfig
    socket_path: Path
    tcp: tuple[str, int] | None = None
    token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    access_log: bool = True
    pick: str | None = None  # what pick-draft chose and why; None when the person gave the draft
    embed_model: Path | None = None
    connections: ConnectionPolicy = field(default_factory=ConnectionPolicy)
    serve: ServeOptions = field(default_factory=ServeOptions)
    stream_interval_s: float = STREAM_INTERVAL_S
    context_allowed: int | None = None  # what the default model could hold where the settings hold less

    @property
    def pid_file(self) -> Path:
        return pid_file_for(self.socket_path)


def parse_tcp(value: str) -> tuple[str, int]:
    """`HOST:PORT`, `[::1]:PORT`, `HOST` or `:PORT`; the port defaults to DEFAULT_TCP_PORT."""
    host, port = value, str(DEFAULT_TCP_PORT)
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest.removeprefix(":") or port
    elif value.count(":") == 1:
        host, port = value.split(":")
    host = host or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"invalid --tcp {value!r}: expected HOST:PORT, e.g. 127.0.0.1:{DEFAULT_TCP_PORT}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def daemon_config(settings: Settings, *, max_body_bytes: int, access_log: bool = True) -> DaemonConfig:
    """Resolve settings into a DaemonConfig; refuses a network-facing listener without a token."""
    paths = Paths.from_env()
    tcp = parse_tcp(settings.tcp) if settings.tcp else None
    if tcp is not None and not is_loopback(tcp[0]) and not settings.token:
        raise ConfigError(
            f"--tcp {tcp[0]} is reachable from other machines; set a token (--token or LOCALSPEC_TOKEN) "
            "or listen on 127.0.0.1"
        )
    serve = ServeOptions.from_settings(settings)
    target = target_path(settings, paths)
    pin = serve.pins.get(target.stem, serve.pins.get(target.name))
    engine, pick = model_serve_config(settings, target, pin, paths, default=True)
    return DaemonConfig(
        engine=engine,
        socket_path=settings.socket or paths.socket_path,
        tcp=tcp,
        token=settings.token,
        max_body_bytes=max_body_bytes,
        access_log=access_log,
        pick=pick,
        embed_model=settings.embed_model.expanduser() if settings.embed_model else None,
        connections=ConnectionPolicy(
            settings.header_timeout, settings.body_timeout, max_per_listener=settings.max_connections
        ),
        serve=serve,
        stream_interval_s=settings.stream_interval_ms / 1000,
        context_allowed=context_allowed(settings, engine),
    )


# --- sockets ----------------------------------------------------------------------------


def _prepare_dir(directory: Path, private: bool) -> None:
    created = not directory.exists()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if created or private:
        directory.chmod(0o700)


def _clear_stale_socket(path: Path) -> None:
    """Remove a socket nobody answers on (a crashed daemon's); refuse a live one or a non-socket."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise DaemonError(f"{path} exists and is not a socket; remove it or choose another --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        log.info("removing stale socket %s (no process answers on it)", path)
        path.unlink(missing_ok=True)
        return
    except OSError as exc:
        raise DaemonError(f"cannot check the existing socket {path}: {exc.strerror or exc}") from None
    finally:
        probe.close()
    raise DaemonError(f"a server is already listening on {path}; stop it (`localspec stop`) or use --socket")


def bind_unix(path: Path, private_dir: bool) -> socket.socket:
    """A unix socket at `path`, mode 0600 from the start, in a 0700 directory."""
    _prepare_dir(path.parent, private_dir)
    _clear_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # bind() creates the file: no moment where others may connect
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise DaemonError(f"cannot create the socket {path}: {exc.strerror or exc}") from None
    finally:
        os.umask(old)
    path.chmod(0o600)
    return sock


def bind_tcp(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        why = "the port is in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise DaemonError(f"cannot listen on {host}:{port}: {why}; choose another --tcp") from None
    return sock


# --- running ----------------------------------------------------------------------------


class _Server(uvicorn.Server):
    """uvicorn's server, plus: a shutdown signal first cancels every generation in flight."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.localspec = state

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        for sock in sockets or []:
            # asyncio called listen(accept batch); the kernel's queue of pending connects stays long.
            sock.listen(KERNEL_BACKLOG)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.localspec.cancel_all()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn stops on SIGINT and SIGTERM; a closed terminal sends SIGHUP (to a daemon a chat
        # started in it too, before the chat's own watch can stop it), whose default action would
        # leave the socket and the pidfile behind. It stops the daemon as cleanly as the others.
        with super().capture_signals():
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = signal.signal(signal.SIGHUP, self.handle_exit)
            try:
                yield
            finally:
                signal.signal(signal.SIGHUP, previous)


def _progress_logger() -> ProgressFn:
    last: dict[str, int] = {}

    def report(what: str, fraction: float) -> None:
        quarter = int(fraction * 4)
        if last.get(what) != quarter:
            last[what] = quarter
            log.info("loading %s: %d%%", what, quarter * 25)

    return report


def _watch_loading(default: Resident, server: _Server, where: str) -> None:
    started = time.monotonic()
    try:
        info = default.engine.wait_ready()
    except LocalspecError as exc:
        log.error("loading failed: %s", exc.message)
        server.should_exit = True
        return
    default.load_s = time.monotonic() - started
    draft = info.draft if info.draft_error is None else f"none ({info.draft_error})"
    log.info("ready: %s, draft %s, context %d, on %s", info.target, draft, info.n_ctx, where)


@contextlib.contextmanager
def _quiet_signals() -> Iterator[None]:
    # uvicorn re-raises the signal that stopped it once it has shut down; land it here, so the
    # process cleans up and exits 0 instead of dying by the signal's default action.
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _where(config: DaemonConfig, tcp: socket.socket | None) -> str:
    where = f"unix:{config.socket_path}"
    if tcp is not None:
        host, port = tcp.getsockname()[:2]
        where += f" and http://{f'[{host}]' if ':' in host else host}:{port}"
    return where


def _make_engine(config: EngineConfig) -> Engine:
    # A target on RPC workers runs in a child process: a dying worker aborts that child, not the daemon.
    return open_engine(config, progress=_progress_logger())


def _serve(config: DaemonConfig, sockets: list[socket.socket], where: str) -> None:
    if config.pick is not None:
        log.info("%s", config.pick)
    if config.context_allowed is not None:
        log.warning(
            "context %d tokens, as --ctx or n_ctx in the settings ask (%s could hold %d here): an "
            "agent's system prompt and tools alone can be longer; leave --ctx and n_ctx unset to size "
            "it by the model",
            config.engine.load.n_ctx,
            config.engine.target.name,
            config.context_allowed,
        )
    api = ApiConfig(
        token=config.token,
        max_body_bytes=config.max_body_bytes,
        pick=config.pick,
        embed_model=config.embed_model,
        n_threads=config.engine.load.n_threads,
        n_ctx=config.engine.load.n_ctx,
        stream_interval_s=config.stream_interval_s,
    )
    served = build(config.engine, config.pick, config.serve, _make_engine, api.alias)
    engine = served.default.engine
    try:
        app = make_app(served.catalog, served.pool, api)
        uv_config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=config.access_log,
            proxy_headers=False,
            server_header=False,
            ws="none",
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
            http=guarded_protocol(config.connections),  # header/body timeouts, a cap per listener
            backlog=config.connections.accept_batch,  # see connections.py: asyncio's accept batch
        )
        server = _Server(uv_config, app.state.localspec)
        threading.Thread(target=_watch_loading, args=(served.default, server, where), daemon=True).start()
        log.info(
            "localspec daemon pid %d listening on %s; loading %s", os.getpid(), where, engine.info.target
        )
        with _quiet_signals():
            server.run(sockets=sockets)
    finally:
        served.pool.close()
        if engine.info.status != "closed":  # not evicted and closed already
            engine.close()
    if engine.info.error is not None and served.default.load_s is None:
        raise DaemonError(f"the daemon stopped: {engine.info.error}")


def check_target(config: DaemonConfig) -> None:
    """Fail at once, with one line, not after the sockets are up: a missing, foreign or corrupt file."""
    from localspec.engine.llama import check_gguf_file
    from localspec.models.gguf_info import check_model_file

    check_gguf_file(config.engine.target)
    check_model_file(config.engine.target, cache_dir=config.engine.cache_dir)


def run(config: DaemonConfig) -> None:
    """Serve until SIGTERM/SIGINT; returns normally after a clean shutdown."""
    from localspec.process.parentwatch import watch_parent

    check_target(config)
    watch_parent()  # a daemon started for one chat stops (cleanly) when that chat dies
    with PidLock(config.pid_file):
        private = config.socket_path.parent == Paths.from_env().runtime_dir
        unix = bind_unix(config.socket_path, private)
        tcp: socket.socket | None = None
        try:
            tcp = bind_tcp(*config.tcp) if config.tcp else None
            _serve(config, [s for s in (unix, tcp) if s is not None], _where(config, tcp))
        finally:
            for sock in (unix, tcp):
                if sock is not None:
                    sock.close()
            config.socket_path.unlink(missing_ok=True)
    log.info("stopped")
