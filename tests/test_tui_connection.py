"""How `localspec chat` finds its daemon: the shared one on its socket, or one it starts and stops."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from daemonproc import listening, start_daemon

from localspec.errors import DaemonError
from localspec.paths import Paths
from localspec.settings import load_settings
from tui.connection import find_or_start, read_pid

pytestmark = pytest.mark.timeout(120)


def test_uses_the_running_daemon_on_the_default_socket(localspec_home: Path, tiny_target: Path) -> None:
    daemon = start_daemon(localspec_home, tiny_target, ctx=512)
    try:
        assert daemon.socket_path == Paths.from_env().socket_path
        connection = find_or_start(load_settings())
        try:
            assert not connection.started_here
            assert "the running daemon" in connection.describe()
            health = connection.wait_ready(lambda _: None)
            assert health is not None and health.model == "tiny-target"
            assert connection.pid() == daemon.proc.pid == read_pid(daemon.socket_path)
            memory = connection.memory()
            assert memory is not None and memory > 1 << 20
        finally:
            connection.close()
        assert daemon.proc.poll() is None  # a shared daemon outlives the chat
    finally:
        assert daemon.stop() == 0


def test_starts_a_private_daemon_with_the_model_flags_and_stops_it(tiny_target: Path) -> None:
    settings = load_settings(target=tiny_target, threads=1, n_ctx=512, method="none", exact=True)
    connection = find_or_start(settings)
    session = connection.session
    try:
        assert session is not None and connection.started_here
        assert "started for this chat" in connection.describe()
        assert session.socket_path != Paths.from_env().socket_path
        progress: list[str] = []
        health = connection.wait_ready(progress.append)
        assert health is not None and health.model == "tiny-target" and health.method == "none"
        assert health.n_ctx == 512 and health.exact  # --exact reaches the daemon it starts
        assert listening(session.socket_path)
    finally:
        connection.close()
    assert not session.running
    assert not session.socket_path.exists()


def test_a_daemon_that_cannot_load_is_reported_and_recovery_retries(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    connection = find_or_start(load_settings(target=broken, threads=1))
    try:
        with pytest.raises(DaemonError, match="exited"):
            connection.wait_ready(lambda _: None, timeout=60)
        assert connection.session is not None and connection.session.log_tail()
        connection.recover()  # restarts it; it fails the same way, and says so again
        start = time.monotonic()
        with pytest.raises(DaemonError):
            connection.wait_ready(lambda _: None, timeout=60)
        assert time.monotonic() - start < 60
    finally:
        connection.close()
