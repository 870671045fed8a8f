"""A daemon started for a chat stops cleanly when the chat dies, even by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from daemonproc import listening

from localspec.process.parentwatch import PARENT_PID_ENV, parent_gone, watch_parent
from localspec.process.pidfile import pid_file_for

pytestmark = pytest.mark.timeout(120)

# A stand-in for `localspec chat`: starts its session daemon, says where, then waits to be killed.
CHAT_LIKE = """
import sys, time
from pathlib import Path
from localspec.settings import load_settings
from tui.connection import SessionDaemon

session = SessionDaemon(load_settings(target=Path(sys.argv[1]), threads=1, n_ctx=256))
session.start()
print(session.pid, session.socket_path, flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    """Exited (a zombie counts: reparented to an init that may never reap it here)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_no_parent_named_means_no_watcher() -> None:
    assert watch_parent({}) is None
    assert watch_parent({PARENT_PID_ENV: "not-a-pid"}) is None


def test_the_watcher_calls_back_once_the_named_process_exits() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    called = threading.Event()
    try:
        thread = watch_parent({PARENT_PID_ENV: str(child.pid)}, on_gone=called.set, interval=0.02)
        assert thread is not None
        time.sleep(0.1)
        assert not called.is_set() and not parent_gone(child.pid, direct=False)
    finally:
        child.kill()
        child.wait()
    assert called.wait(5)
    assert parent_gone(os.getpid(), direct=True)  # we are not our own parent


def test_a_session_daemon_stops_and_cleans_up_when_its_chat_is_killed(
    localspec_home: Path, tiny_target: Path
) -> None:
    argv = [sys.executable, "-c", CHAT_LIKE, str(tiny_target)]
    env = {**os.environ, "LOCALSPEC_HOME": str(localspec_home)}
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env) as chat:
        assert chat.stdout is not None
        pid_text, socket_text = chat.stdout.readline().split()
        daemon_pid, socket_path = int(pid_text), Path(socket_text)
        log = socket_path.with_suffix(".log")
        try:
            assert wait_for(lambda: listening(socket_path), 90), log.read_text()
            chat.send_signal(signal.SIGKILL)
            chat.wait()
            assert wait_for(lambda: gone(daemon_pid), 15), log.read_text()
            assert not socket_path.exists() and not pid_file_for(socket_path).exists()
            assert "has exited; stopping" in log.read_text()
        finally:
            chat.kill()
            if not gone(daemon_pid):
                os.kill(daemon_pid, signal.SIGKILL)
