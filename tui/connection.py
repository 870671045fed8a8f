"""How the chat reaches a daemon: the one running on its socket, or one it starts for the session.

A daemon started here is a `localspec serve` subprocess with the chat's model
flags, on a private socket beside the shared one (so it never fights a shared
daemon over its socket or pidfile), logging to a file next to it, and stopped
when the chat exits. Only the client and shared types are imported: the engine
lives in that other process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from localspec.client import Client, Health
from localspec.errors import DaemonError
from localspec.paths import Paths
from localspec.process.parentwatch import PARENT_PID_ENV
from localspec.process.pidfile import daemon_pid, listening, pid_file_for
from localspec.settings import Settings

STOP_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 600.0  # a large model read from a slow disk; the user can quit meanwhile
POLL_S = 0.1
StatusFn = Callable[[str], object]


def read_pid(socket_path: Path) -> int | None:
    """The pid of the daemon serving `socket_path`, from the pidfile it holds locked."""
    pid = daemon_pid(pid_file_for(socket_path))
    return pid or None  # 0: locked but not yet written (starting up)


def memory_bytes(pid: int | None) -> int | None:
    """Resident memory of the daemon process (models, KV cache, Python), or None when unknown."""
    if pid is None:
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, OSError):
        return None


class SessionDaemon:
    """A `localspec serve` subprocess owned by this chat, on a private socket."""

    def __init__(self, settings: Settings, paths: Paths | None = None) -> None:
        paths = paths or Paths.from_env()
        self.settings = settings
        self.socket_path = paths.runtime_dir / f"chat-{os.getpid()}.sock"
        self.log_path = paths.runtime_dir / f"chat-{os.getpid()}.log"
        self.target: Path | None = settings.target
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        s = self.settings
        argv = [sys.executable, "-c", "from localspec.cli import main; main()", "serve"]
        argv += ["--socket", str(self.socket_path), "--no-access-log", "--method", s.method]
        if s.n_ctx is not None:
            argv += ["--ctx", str(s.n_ctx)]
        if s.k is not None:
            argv += ["-k", str(s.k)]
        if self.target is not None:
            argv += ["--target", str(self.target)]
        if s.draft is not None:
            argv += ["--draft", str(s.draft)]
        return argv

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Loading flags that `serve` takes only from the environment.
        for name, value in (
            ("THREADS", self.settings.threads),
            ("GPU_LAYERS", self.settings.gpu_layers),
            ("DRAFT_GPU_LAYERS", self.settings.draft_gpu_layers),
            ("KV_TYPE", self.settings.kv_type),
            ("RPC", self.settings.rpc),
            ("EXACT", self.settings.exact),
            ("PLAIN_PREFILL", self.settings.plain_prefill),
            ("NGRAM_MEMORY", self.settings.ngram_memory),
        ):
            if value is not None:
                env[f"LOCALSPEC_{name}"] = str(value)
        # A private daemon listens on its socket only, even if the config file names a TCP port.
        env["LOCALSPEC_TCP"] = ""
        # It watches this process and stops when the chat dies, even by SIGKILL (localspec.parentwatch).
        env[PARENT_PID_ENV] = str(os.getpid())
        return env

    def start(self) -> None:
        if self.running:
            return
        self.socket_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The daemon's log names model paths: private from the first byte, like every state file.
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with open(fd, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv(), env=self.env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM (the daemon cancels, removes its socket and exits 0); SIGKILL if it hangs."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.socket_path.unlink(missing_ok=True)  # after a SIGKILL the daemon could not

    def restart(self, target: Path | None = None) -> None:
        self.stop()
        if target is not None:
            self.target = target
        self.start()


class Connection:
    """The daemon this chat talks to, how it got it, and how to get it back after a failure."""

    def __init__(self, client: Client, settings: Settings, session: SessionDaemon | None = None) -> None:
        self.client = client
        self.settings = settings
        self.session = session

    @property
    def started_here(self) -> bool:
        return self.session is not None

    def describe(self) -> str:
        if self.session is not None:
            return f"a daemon started for this chat (pid {self.session.pid}, {self.session.socket_path})"
        return f"the running daemon at {self.client.where}"

    def target_files(self) -> list[Path]:
        """The target files this chat asked for: its own daemon's, and --target's."""
        own = self.session.target if self.session is not None else None
        return [path for path in (own, self.settings.target) if path is not None]

    def pid(self) -> int | None:
        if self.session is not None:
            return self.session.pid
        return read_pid(self.client.socket_path) if self.client.socket_path is not None else None

    def memory(self) -> int | None:
        return memory_bytes(self.pid())

    def wait_ready(
        self,
        on_status: StatusFn,
        should_stop: Callable[[], bool] = lambda: False,
        timeout: float = READY_TIMEOUT_S,
    ) -> Health | None:
        """Poll /health until ready (None if `should_stop` says so first).

        DaemonError when the daemon dies, fails to load its models or never answers.
        """
        start = time.monotonic()
        while not should_stop():
            elapsed = time.monotonic() - start
            if self.session is not None and not self.session.running:
                raise DaemonError(self._exit_message())
            try:
                health = self.health()
            except DaemonError:
                if self.session is None or elapsed > timeout:
                    raise
                health = None
            if health is not None and health.ready:
                return health
            if health is not None and health.status == "failed":
                raise DaemonError(f"the daemon failed to load its models: {health.error}")
            if elapsed > timeout:
                raise DaemonError(f"the daemon at {self.client.where} was not ready within {timeout:g} s")
            on_status(self._progress(health, elapsed))
            time.sleep(POLL_S)
        return None

    def health(self) -> Health:
        path = self.client.socket_path
        if path is not None and not listening(path):
            raise DaemonError(f"no localspec daemon listens on {path}")
        return self.client.health()

    def _progress(self, health: Health | None, elapsed: float) -> str:
        doing = "starting the daemon" if health is None else "loading models"
        text = f"{doing}… {elapsed:.0f} s"
        if self.session is not None:
            # The daemon's last log line ("... localspec.daemon: loading target: 50%"), its message part.
            last = self.session.log_tail(1).split(": ", 1)[-1]
            text += f" · {last}" if last else ""
        return text

    def _exit_message(self) -> str:
        assert self.session is not None
        code = self.session.proc.returncode if self.session.proc is not None else None
        tail = self.session.log_tail(1)
        return f"the daemon exited (code {code}): {tail or 'no output'}; log: {self.session.log_path}"

    def recover(self) -> None:
        """After a failure: restart our own daemon, or find the shared one, or start one for the chat."""
        if self.session is not None:
            if not self.session.running:
                self.session.restart()
            return
        try:
            self.health()
            return
        except DaemonError:
            pass
        self.client.close()
        self.session = SessionDaemon(self.settings)
        self.session.start()
        self.client = Client(socket_path=self.session.socket_path)

    def switch_target(self, target: Path) -> None:
        """Serve another model: only a daemon this chat started can be restarted with it."""
        if self.session is None:
            raise DaemonError(
                f"this chat uses the shared daemon at {self.client.where}; "
                f"restart it with `localspec serve --target {target}`"
            )
        self.session.restart(target)

    def close(self) -> None:
        self.client.close()
        if self.session is not None:
            self.session.stop()


def find_or_start(settings: Settings) -> Connection:
    """The shared daemon if one answers on its socket, else a daemon started for this chat."""
    client = Client.from_env(settings)
    shared = Connection(client, settings)
    try:
        shared.health()
        return shared
    except DaemonError:
        client.close()
    session = SessionDaemon(settings)
    session.start()
    return Connection(Client(socket_path=session.socket_path), settings, session)
