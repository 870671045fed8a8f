"""The daemon's pidfile: an flock held for the daemon's life, so two daemons never share a socket.

Standard library only, so the TUI and the CLI can find a daemon without importing
the engine. The kernel drops the lock when the process dies, so a pidfile left by
a crashed daemon reads as "not running".
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from localspec.errors import DaemonError


def pid_file_for(socket_path: Path) -> Path:
    """The pidfile sits beside its socket, so daemons on different sockets never share one."""
    return socket_path.with_suffix(".pid")


class PidLock:
    """An flock on the pidfile, held while the daemon lives; the kernel drops it if the process dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                pid = daemon_pid(self.path)
                running = f"a localspec daemon is already running (pid {pid}, {self.path})"
                raise DaemonError(f"{running}; stop it with `localspec stop`") from None
            # A daemon exiting may have unlinked the file between our open and our lock: retry on the new one.
            if _same_file(fd, self.path):
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        if _same_file(self._fd, self.path):
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> PidLock:
        self.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def daemon_pid(pid_file: Path) -> int | None:
    """The pid of the daemon holding `pid_file`'s lock, or None when no daemon does."""
    try:
        fd = os.open(pid_file, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 32).decode(errors="replace").strip()
            return int(text) if text.isdigit() else 0  # locked but not yet written: starting up
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def listening(socket_path: Path) -> bool:
    """Whether a server accepts on the unix socket `socket_path`.

    Probed with a socket closed here: httpcore leaks the socket of a refused unix connect, and a
    daemon that has bound its socket but not yet listens (or a crashed one's file) refuses.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(socket_path))
        except OSError:
            return False
    return True
