"""The daemon as a login service: a systemd user unit (Linux) or a launchd agent (macOS).

Ollama and LM Studio are simply there when an editor asks; `localspec serve` runs in a terminal.
`localspec service install` writes the file the platform's service manager reads, so the daemon
starts at login and comes back after a crash, and has the manager start it now. The file runs this
interpreter's `-m localspec serve` with the LOCALSPEC_* (and model-folder) variables set where it was
installed, so the service serves what `localspec serve` would have; never the token, which a unit's
environment shows to anything that may ask the manager (systemd.exec(5)): a service reads it from
config.toml (0600).

The file carries a marker line. Install overwrites, and uninstall removes, only a file that holds
it and is not a link: a unit of the same name someone else wrote is refused, not replaced.
"""

from __future__ import annotations

import os
import plistlib
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from localspec.atomicfile import write_text_atomic
from localspec.errors import ConfigError, DaemonError

MARKER = "Written by `localspec service install`; `localspec service uninstall` removes it."
UNIT_NAME = "localspec.service"
AGENT_LABEL = "dev.localspec.serve"
# Exit status 2 is a user error (a missing model, a bad setting): restarting cannot mend it.
USER_ERROR_EXIT = 2
# Variables that decide what the daemon serves and where it keeps its state: the service sees them as
# the installing shell did. LOCALSPEC_TOKEN is left out on purpose (see the module's docstring).
CARRIED = (
    *("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ENDPOINT", "HF_HUB_OFFLINE", "OLLAMA_MODELS"),
    *("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"),
)
SECRET = "LOCALSPEC_TOKEN"

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def run_quietly(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a service manager's command, its output kept for the message if it fails."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        return subprocess.CompletedProcess(list(argv), 127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", "no answer in 60 s")


def user_home(env: Mapping[str, str]) -> Path:
    """The home folder the service manager reads its files from: HOME as set, else the account's."""
    return Path(env.get("HOME") or Path.home())


def serve_argv(tcp: str | None = None) -> list[str]:
    """What the service runs: this interpreter's localspec, in the foreground, as the manager expects."""
    return [sys.executable, "-m", "localspec", "serve", *(["--tcp", tcp] if tcp else [])]


def service_env(env: Mapping[str, str]) -> dict[str, str]:
    """The installing environment's variables the service needs, the token excepted."""
    keep = {k: v for k, v in env.items() if k.startswith("LOCALSPEC_") and k != SECRET}
    keep.update({k: env[k] for k in CARRIED if env.get(k)})
    for key, value in keep.items():
        if any(ord(c) < 32 or ord(c) == 127 for c in key + value):
            raise ConfigError(f"{key} holds a control character; a service file cannot carry it")
    return dict(sorted(keep.items()))


@dataclass(frozen=True)
class Installed:
    """What install did: the file, and what the manager said (None: started as asked)."""

    path: Path
    failed: str | None


class Manager(ABC):
    """One platform's service manager: where its file lives, what it holds, how to start and stop it."""

    name = ""

    @abstractmethod
    def file(self, env: Mapping[str, str]) -> Path:
        raise NotImplementedError

    @abstractmethod
    def render(self, argv: Sequence[str], env: Mapping[str, str], home: Path) -> str:
        raise NotImplementedError

    def prepare(self, home: Path) -> None:
        """Make what the file names and the manager will not make."""
        return None

    def enable(self, path: Path) -> list[list[str]]:
        """What makes the manager start it at the next login."""
        return []

    @abstractmethod
    def start(self, path: Path) -> list[list[str]]:
        """What (re)starts it now."""
        raise NotImplementedError

    @abstractmethod
    def stop(self) -> list[list[str]]:
        raise NotImplementedError

    def forget(self) -> list[list[str]]:
        """What tells the manager, once the file is gone, to drop it."""
        return []

    @abstractmethod
    def state(self) -> list[str]:
        raise NotImplementedError

    def hints(self) -> list[str]:
        return []


class Systemd(Manager):
    name = "systemd"

    def file(self, env: Mapping[str, str]) -> Path:
        config = env.get("XDG_CONFIG_HOME") or str(user_home(env) / ".config")
        return Path(config) / "systemd" / "user" / UNIT_NAME

    def render(self, argv: Sequence[str], env: Mapping[str, str], home: Path) -> str:
        environment = "".join(f"Environment={_systemd_word(f'{k}={v}')}\n" for k, v in env.items())
        return (
            f"# {MARKER}\n"
            "[Unit]\n"
            "Description=localspec: speculative decoding daemon (OpenAI, Ollama and Anthropic APIs)\n\n"
            "[Service]\n"
            "Type=simple\n"
            f"ExecStart={' '.join(_systemd_word(a, command=True) for a in argv)}\n"
            f"{environment}"
            # A crash (llama.cpp aborting) restarts it; a user error would only fail again.
            "Restart=on-failure\n"
            "RestartSec=5\n"
            f"RestartPreventExitStatus={USER_ERROR_EXIT}\n\n"
            "[Install]\n"
            "WantedBy=default.target\n"
        )

    def enable(self, path: Path) -> list[list[str]]:
        return [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", UNIT_NAME]]

    def start(self, path: Path) -> list[list[str]]:
        # restart, not start: a reinstall with other flags must replace the running daemon.
        return [["systemctl", "--user", "restart", UNIT_NAME]]

    def stop(self) -> list[list[str]]:
        return [["systemctl", "--user", "disable", "--now", UNIT_NAME]]

    def forget(self) -> list[list[str]]:
        return [["-", "systemctl", "--user", "daemon-reload"]]

    def state(self) -> list[str]:
        return ["systemctl", "--user", "is-active", UNIT_NAME]

    def hints(self) -> list[str]:
        return [
            f"logs: journalctl --user -u {UNIT_NAME}",
            "it starts at login and stops at logout; to keep it running without a login session: "
            "loginctl enable-linger",
        ]


class Launchd(Manager):
    name = "launchd"

    def file(self, env: Mapping[str, str]) -> Path:
        return user_home(env) / "Library" / "LaunchAgents" / f"{AGENT_LABEL}.plist"

    def _log(self, home: Path) -> Path:
        return home / "Library" / "Logs" / "localspec" / "serve.log"

    def prepare(self, home: Path) -> None:
        # launchd opens the log file but makes no folder for it, and a job whose log cannot open fails.
        self._log(home).parent.mkdir(mode=0o700, parents=True, exist_ok=True)

    def render(self, argv: Sequence[str], env: Mapping[str, str], home: Path) -> str:
        log = str(self._log(home))
        agent = {
            "Label": AGENT_LABEL,
            "ProgramArguments": list(argv),
            "EnvironmentVariables": dict(env),
            "RunAtLoad": True,
            # Back after a crash (a signal), not after an exit: a user error would only fail again.
            "KeepAlive": {"Crashed": True},
            # A person waits on its tokens: not throttled as background work is.
            "ProcessType": "Interactive",
            "StandardOutPath": log,
            "StandardErrorPath": log,
        }
        text = plistlib.dumps(agent).decode()
        head, _, rest = text.partition("<plist")
        return f"{head}<!-- {MARKER} -->\n<plist{rest}"

    def _domain(self) -> str:
        return f"gui/{os.getuid()}"

    # A file in LaunchAgents is loaded at every login: enabling it is writing it.

    def start(self, path: Path) -> list[list[str]]:
        # bootout first (its failure, when nothing is loaded, is expected): bootstrap refuses a loaded label.
        bootout = ["-", "launchctl", "bootout", f"{self._domain()}/{AGENT_LABEL}"]
        return [bootout, ["launchctl", "bootstrap", self._domain(), str(path)]]

    def stop(self) -> list[list[str]]:
        return [["-", "launchctl", "bootout", f"{self._domain()}/{AGENT_LABEL}"]]

    def state(self) -> list[str]:
        return ["launchctl", "print", f"{self._domain()}/{AGENT_LABEL}"]

    def hints(self) -> list[str]:
        return ["logs: ~/Library/Logs/localspec/serve.log"]


def this_platform() -> Manager:
    """The service manager of this platform; a clear error where localspec knows none."""
    if sys.platform == "darwin":
        return Launchd()
    if sys.platform.startswith("linux"):
        return Systemd()
    raise ConfigError(
        f"no service manager localspec knows on {sys.platform}; run `localspec serve` at login instead"
    )


def _systemd_word(word: str, *, command: bool = False) -> str:
    """One word quoted as systemd reads it back (systemd.syntax(7)): "%" starts a specifier everywhere,
    "$" a variable only in a command line (systemd.service(5)); each doubled is itself."""
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped.replace("$", "$$") if command else escaped}"'


def check_ours(path: Path) -> bool:
    """True where `path` is a service file this command wrote; False where there is none.

    Refuses a link (nothing here follows a link it did not make) and a file without the marker.
    """
    try:
        if path.is_symlink():
            raise DaemonError(f"{path} is a link; localspec writes and removes only its own file there")
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return False
    if MARKER not in text:
        raise DaemonError(f"{path} exists and was not written by localspec; move it away first")
    return True


def install(
    manager: Manager,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    start: bool = True,
    run: Runner = run_quietly,
) -> Installed:
    """Write the service file (0600, atomically), enable it and, unless told not to, start it now."""
    path = manager.file(os.environ)
    check_ours(path)
    home = user_home(os.environ)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    manager.prepare(home)
    write_text_atomic(path, manager.render(argv, env, home))
    commands = [*manager.enable(path), *(manager.start(path) if start else [])]
    return Installed(path, _run_all(commands, run))


def uninstall(manager: Manager, *, run: Runner = run_quietly) -> Installed | None:
    """Stop the service and remove its file; None where none is installed."""
    path = manager.file(os.environ)
    if not check_ours(path):
        return None
    failed = _run_all(manager.stop(), run)
    path.unlink()
    _run_all(manager.forget(), run)
    return Installed(path, failed)


def _run_all(commands: Sequence[Sequence[str]], run: Runner) -> str | None:
    """Run each command in turn; the first failure's one line, or None. A leading "-" may fail."""
    for command in commands:
        optional = command[0] == "-"
        argv = list(command[1:] if optional else command)
        done = run(argv)
        if done.returncode != 0 and not optional:
            said = (done.stderr or done.stdout or "").strip().splitlines()
            return f"`{' '.join(argv)}` failed: {said[0] if said else f'exit status {done.returncode}'}"
    return None
