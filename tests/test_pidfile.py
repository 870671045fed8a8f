"""The pidfile beside a socket in a folder someone else may control: planted files are refused, never used.

And `localspec stop` signals only this user's localspec daemon holding the pidfile, whatever pid it names.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from localspec.cli import cli
from localspec.errors import DaemonError
from localspec.process.pidfile import PidLock, daemon_pid, is_our_daemon

ROOT = os.geteuid() == 0


def private(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    return folder


def test_a_planted_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    pid_file = private(tmp_path) / "d.pid"
    pid_file.symlink_to(victim)
    with pytest.raises(DaemonError, match="symbolic link"):
        PidLock(pid_file).acquire()
    assert victim.read_text() == "precious\n"
    assert daemon_pid(pid_file) is None


def test_a_planted_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    pid_file = private(tmp_path) / "d.pid"
    os.mkfifo(pid_file)
    outcome: list[BaseException | None] = []

    def acquire() -> None:
        try:
            PidLock(pid_file).acquire()
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=acquire, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "opening the FIFO blocked"
    assert isinstance(outcome[0], DaemonError) and "not a regular file" in str(outcome[0])


def test_a_hard_link_to_another_file_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    pid_file = private(tmp_path) / "d.pid"
    os.link(victim, pid_file)
    with pytest.raises(DaemonError, match="hard links"):
        PidLock(pid_file).acquire()
    assert victim.read_text() == "precious\n"


@pytest.mark.skipif(not ROOT, reason="giving a file to another user needs root")
def test_a_pidfile_of_another_user_is_refused(tmp_path: Path) -> None:
    pid_file = private(tmp_path) / "d.pid"
    pid_file.write_text("1\n")
    os.chown(pid_file, 65534, 65534)
    with pytest.raises(DaemonError, match="another user"):
        PidLock(pid_file).acquire()
    assert pid_file.read_text() == "1\n"


def test_a_folder_others_can_write_is_refused_unless_sticky(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(DaemonError, match="other users can write"):
        PidLock(shared / "d.pid").acquire()
    assert not (shared / "d.pid").exists()
    shared.chmod(0o1777)  # as /tmp: nobody may remove or replace a file of ours
    with PidLock(shared / "d.pid"):
        assert int((shared / "d.pid").read_text()) == os.getpid()


def test_an_existing_pidfile_of_ours_is_made_private(tmp_path: Path) -> None:
    pid_file = private(tmp_path) / "d.pid"
    pid_file.write_text("")
    pid_file.chmod(0o644)
    with PidLock(pid_file):
        assert pid_file.stat().st_mode & 0o777 == 0o600


# `localspec stop` against a pidfile whose lock holder is not a localspec daemon.

_HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, (sys.argv[2] + "\\n").encode())
    print("locked", flush=True)
    time.sleep(60)
    """
)


def test_stop_refuses_to_signal_a_pid_that_is_no_localspec_daemon(tmp_path: Path) -> None:
    socket_path = private(tmp_path) / "d.sock"
    pid_file = socket_path.with_suffix(".pid")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(pid_file), str(bystander.pid)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert daemon_pid(pid_file) == bystander.pid
        assert not is_our_daemon(bystander.pid, pid_file)
        assert not is_our_daemon(holder.pid, pid_file)  # holds the file, but is no localspec daemon
        result = CliRunner().invoke(cli, ["stop", "--socket", str(socket_path), "--timeout", "1"])
        assert result.exit_code == 2
        assert f"pid {bystander.pid}, which is not your localspec daemon" in result.output
        assert bystander.poll() is None and holder.poll() is None
    finally:
        for proc in (bystander, holder):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        if holder.stdout is not None:
            holder.stdout.close()
