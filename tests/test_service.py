"""`localspec service`: the daemon as a systemd user unit or a launchd agent.

systemd's user manager and launchd cannot run here (no user bus, not macOS), so `systemctl` and
`launchctl` are stand-ins on PATH that log each call; the one that "starts" the unit runs its
ExecStart with its Environment, as systemd would. Everything else is real: the unit is checked by
systemd's own `systemd-analyze verify` where it is installed, the plist by plistlib, and the daemon
the unit names is a real `localspec serve` answering on its socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import plistlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result

from localspec.cli import cli
from localspec.errors import ConfigError, DaemonError
from localspec.process import service
from localspec.process.pidfile import daemon_pid, listening

# The stand-in manager: logs its argv; FAKE_MODE "nobus" fails as systemctl --user does without a
# user bus; "run" starts the unit's command on `restart` and stops it on `disable --now`.
FAKE = r"""
import json, os, shlex, signal, subprocess, sys
from pathlib import Path
argv = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps([Path(sys.argv[0]).name, *argv]) + "\n")
mode = os.environ.get("FAKE_MODE", "ok")
if mode == "nobus":
    sys.exit("Failed to connect to bus: No medium found")
pidfile = Path(os.environ["FAKE_LOG"]).with_suffix(".pid")
if mode == "run" and argv[-2:] == ["restart", "localspec.service"]:
    unit = Path(os.environ["XDG_CONFIG_HOME"], "systemd", "user", "localspec.service").read_text()
    lines = dict(l.split("=", 1) for l in unit.splitlines() if "=" in l and not l.startswith("#"))
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}
    for line in unit.splitlines():
        if line.startswith("Environment="):
            key, _, value = shlex.split(line.partition("=")[2])[0].partition("=")
            env[key] = value.replace("%%", "%")
    command = [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(lines["ExecStart"])]
    out = open(Path(os.environ["FAKE_LOG"]).with_suffix(".out"), "ab")
    proc = subprocess.Popen(command, env=env, stdout=out, stderr=out, start_new_session=True)
    pidfile.write_text(str(proc.pid))
if mode == "run" and argv[-3:] == ["disable", "--now", "localspec.service"] and pidfile.exists():
    os.kill(int(pidfile.read_text()), signal.SIGTERM)
"""


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A HOME and config folder of the test's own, and the stand-in managers first on PATH."""
    home = tmp_path / "user"
    (home / ".config").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("systemctl", "launchctl"):
        tool = bin_dir / name
        tool.write_text(f"#!{sys.executable}\n{FAKE}")
        tool.chmod(0o755)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "manager.log"))
    monkeypatch.setattr(sys, "platform", "linux")
    yield home


def calls(user: Path) -> list[list[str]]:
    log = user.parent / "manager.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def unit_file(user: Path) -> Path:
    return user / ".config" / "systemd" / "user" / "localspec.service"


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, ["service", *args], env=env, catch_exceptions=False)


def test_install_runs_serve_with_the_settings_and_never_the_token(user: Path, tiny_target: Path) -> None:
    env = {"LOCALSPEC_TARGET": str(tiny_target), "LOCALSPEC_TOKEN": "s3cret", "LOCALSPEC_THREADS": "1"}
    done = invoke("install", "--tcp", "127.0.0.1:11434", env={**env, "FAKE_MODE": "nobus"})
    text = unit_file(user).read_text()
    assert done.exit_code == 2
    assert "systemctl --user daemon-reload` failed: Failed to connect to bus" in done.output
    assert oct(unit_file(user).stat().st_mode & 0o777) == "0o600"
    assert f'ExecStart="{sys.executable}" "-m" "localspec" "serve" "--tcp" "127.0.0.1:11434"' in text
    assert f'Environment="LOCALSPEC_TARGET={tiny_target}"' in text
    assert "s3cret" not in text and "TOKEN" not in text
    assert "RestartPreventExitStatus=2" in text


def test_the_unit_passes_systemd_analyze(user: Path, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # An interpreter at a path with a space and a "%" (a specifier, unescaped): systemd must find it.
    odd = tmp_path / "a dir%b"
    odd.mkdir()
    (odd / "python").symlink_to(sys.executable)
    env = {"LOCALSPEC_HOME": "/tmp/50% of $HOME", "HF_HOME": '/tmp/"quoted" \\ path'}
    text = service.Systemd().render([str(odd / "python"), "-m", "localspec", "serve"], env, user)
    unit = tmp_path / "units" / "localspec.service"
    unit.parent.mkdir()
    unit.write_text(text)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    checked = subprocess.run(
        [analyze, "verify", "--user", str(unit)],
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
    )
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")
    # The same unit written without escaping fails the same check: the check can tell.
    unit.write_text(text.replace("%%", "%"))
    broken = subprocess.run(
        [analyze, "verify", "--user", str(unit)],
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)},
    )
    assert broken.returncode != 0 or broken.stderr


def test_installed_service_serves_and_uninstall_stops_it(user: Path, tiny_target: Path) -> None:
    env = {"LOCALSPEC_TARGET": str(tiny_target), "LOCALSPEC_THREADS": "1", "FAKE_MODE": "run"}
    done = invoke("install", env=env)
    try:
        assert done.exit_code == 0, done.output
        assert [c[1:] for c in calls(user)] == [
            ["--user", "daemon-reload"],
            ["--user", "enable", "localspec.service"],
            ["--user", "restart", "localspec.service"],
        ]
        socket_path = Path(os.environ["LOCALSPEC_HOME"]) / "run" / "localspec.sock"
        pid = int((user.parent / "manager.pid").read_text())
        assert f"running: pid {pid}, socket {socket_path}" in done.output
        assert "journalctl --user -u localspec.service" in done.output
        transport = httpx.HTTPTransport(uds=str(socket_path))
        with httpx.Client(transport=transport, base_url="http://localhost", timeout=60) as http:
            assert _health(http, socket_path)["model"] == tiny_target.stem
        status = invoke("status", env=env)
        assert f"daemon: running, pid {pid}" in status.output and "(installed)" in status.output
    finally:
        gone = invoke("uninstall", env=env)
    assert gone.exit_code == 0, gone.output
    assert calls(user)[-2][1:] == ["--user", "disable", "--now", "localspec.service"]
    assert not unit_file(user).exists()
    assert _exits(pid)


def _health(http: httpx.Client, socket_path: Path) -> dict[str, object]:
    """/health once the daemon is ready (it answers 503 while its model loads)."""
    deadline = time.monotonic() + 90
    while True:
        # Probe first: httpcore leaks the socket of a refused unix connect, and the daemon binds
        # its socket before it listens (CI failed on that ResourceWarning once).
        if listening(socket_path):
            with contextlib.suppress(httpx.TransportError):
                answer: dict[str, object] = http.get("/health").json()
                if answer["status"] == "ready":
                    return answer
        assert time.monotonic() < deadline, "the service's daemon never became ready"
        time.sleep(0.2)


def _exits(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # Not our child (the stand-in started it): a zombie waiting for init to reap it has exited.
        with contextlib.suppress(FileNotFoundError):
            if "State:\tZ" in Path(f"/proc/{pid}/status").read_text():
                return True
        time.sleep(0.1)
    return False


def test_install_waits_for_a_daemon_and_says_when_none_came(user: Path, tiny_target: Path) -> None:
    env = {"LOCALSPEC_TARGET": str(tiny_target)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("localspec.cli.service.START_WAIT_S", 0.5)
        done = invoke("install", env=env)  # the stand-in says yes and starts nothing
    assert done.exit_code == 2
    assert "systemd started the service, but no daemon came up" in done.output


def test_a_daemon_started_by_hand_is_left_alone(user: Path, tiny_target: Path) -> None:
    from daemonproc import start_daemon

    daemon = start_daemon(Path(os.environ["LOCALSPEC_HOME"]), tiny_target)
    try:
        done = invoke("install", env={"LOCALSPEC_TARGET": str(tiny_target)})
        assert done.exit_code == 2
        assert f"a daemon started by hand runs (pid {daemon.proc.pid})" in done.output
        enabled = [["--user", "daemon-reload"], ["--user", "enable", "localspec.service"]]
        assert [c[1:] for c in calls(user)] == enabled  # at the next login; not started now
        assert daemon.proc.poll() is None
        assert daemon_pid(daemon.socket_path.with_suffix(".pid")) == daemon.proc.pid
    finally:
        daemon.stop()


def test_settings_the_daemon_would_refuse_are_refused_before_writing(user: Path, tiny_target: Path) -> None:
    # The service never sees LOCALSPEC_TOKEN, so a TCP listener off loopback needs the token in config.toml.
    env = {"LOCALSPEC_TARGET": str(tiny_target), "LOCALSPEC_TOKEN": "s3cret"}
    done = invoke("install", "--tcp", "0.0.0.0:8977", env=env)
    assert done.exit_code == 2 and "set a token" in done.output
    assert not unit_file(user).exists() and calls(user) == []
    missing = invoke("install", env={"LOCALSPEC_TARGET": str(user / "nope.gguf")})
    assert missing.exit_code == 2 and "model file not found" in missing.output
    assert not unit_file(user).exists() and calls(user) == []
    config = Path(os.environ["LOCALSPEC_HOME"]) / "config.toml"
    config.write_text('token = "s3cret"\n')
    printed = invoke("install", "--tcp", "0.0.0.0:8977", "--print", env=env)
    assert printed.exit_code == 0 and '"--tcp" "0.0.0.0:8977"' in printed.output
    assert not unit_file(user).exists() and calls(user) == []


def test_a_unit_someone_else_wrote_is_never_replaced_or_removed(user: Path, tiny_target: Path) -> None:
    path = unit_file(user)
    path.parent.mkdir(parents=True)
    path.write_text("[Service]\nExecStart=/usr/bin/their-own\n")
    env = {"LOCALSPEC_TARGET": str(tiny_target)}
    for args in (("install",), ("uninstall",)):
        done = invoke(*args, env=env)
        assert done.exit_code == 2 and "was not written by localspec" in done.output
    assert path.read_text() == "[Service]\nExecStart=/usr/bin/their-own\n" and calls(user) == []
    # A link, even to a unit of ours, is not followed.
    ours = user / "elsewhere.service"
    ours.write_text(f"# {service.MARKER}\n")
    path.unlink()
    path.symlink_to(ours)
    done = invoke("install", env=env)
    assert done.exit_code == 2 and "is a link" in done.output
    assert path.is_symlink() and ours.read_text() == f"# {service.MARKER}\n"


def test_uninstall_without_a_service_says_so(user: Path) -> None:
    done = invoke("uninstall")
    assert done.exit_code == 0 and "no localspec service is installed" in done.output
    assert calls(user) == []


def test_launchd_agent(user: Path, tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr("localspec.cli.service.START_WAIT_S", 0.5)
    done = invoke("install", "--tcp", "127.0.0.1:11434", env={"LOCALSPEC_TARGET": str(tiny_target)})
    path = user / "Library" / "LaunchAgents" / "dev.localspec.serve.plist"
    agent = plistlib.loads(path.read_bytes())
    serve = [sys.executable, "-m", "localspec", "serve"]
    assert agent["ProgramArguments"] == [*serve, "--tcp", "127.0.0.1:11434"]
    assert agent["EnvironmentVariables"]["LOCALSPEC_TARGET"] == str(tiny_target)
    assert agent["KeepAlive"] == {"Crashed": True} and agent["RunAtLoad"] is True
    assert Path(agent["StandardErrorPath"]).parent.is_dir()  # launchd makes no folder for its log
    domain = f"gui/{os.getuid()}"
    assert calls(user) == [
        ["launchctl", "bootout", f"{domain}/dev.localspec.serve"],
        ["launchctl", "bootstrap", domain, str(path)],
    ]
    assert done.exit_code == 2 and "launchd started the service, but no daemon came up" in done.output
    gone = invoke("uninstall")
    assert gone.exit_code == 0 and not path.exists()
    assert calls(user)[-1] == ["launchctl", "bootout", f"{domain}/dev.localspec.serve"]


def test_service_env_carries_what_decides_the_models_and_refuses_control_characters() -> None:
    env = {"LOCALSPEC_HOME": "/h", "LOCALSPEC_TOKEN": "t", "HF_HOME": "/hf", "PATH": "/bin"}
    env["OLLAMA_MODELS"] = ""  # unset in effect: not carried
    assert service.service_env(env) == {"HF_HOME": "/hf", "LOCALSPEC_HOME": "/h"}
    with pytest.raises(ConfigError, match="LOCALSPEC_HOME holds a control character"):
        service.service_env({"LOCALSPEC_HOME": "/h\nExecStart=/bin/evil"})


def test_check_ours_reads_no_file_through_a_link(tmp_path: Path) -> None:
    link = tmp_path / "unit"
    link.symlink_to(tmp_path / "missing")
    with pytest.raises(DaemonError, match="is a link"):
        service.check_ours(link)
    assert service.check_ours(tmp_path / "none") is False


def test_python_m_localspec_is_the_cli() -> None:
    done = subprocess.run([sys.executable, "-m", "localspec", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("localspec, version")


def test_status_without_a_daemon_points_at_an_installed_service(user: Path, tiny_target: Path) -> None:
    none = CliRunner().invoke(cli, ["status"])
    assert none.exit_code == 2 and "service" not in none.output
    unit_file(user).parent.mkdir(parents=True)
    unit_file(user).write_text(f"# {service.MARKER}\n")
    told = CliRunner().invoke(cli, ["status"])
    assert told.exit_code == 2
    assert "no localspec daemon at" in told.output and "`localspec service status`" in told.output
