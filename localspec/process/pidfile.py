"""The daemon's pidfile: an flock held for the daemon's life, so two daemons never share a socket.

Light (standard library, psutil), so the TUI and the CLI can find a daemon without
importing the engine. The kernel drops the lock when the process dies, so a pidfile
left by a crashed daemon reads as "not running".

The pidfile sits beside a socket whose folder the person chooses, so it is opened as
if that folder were hostile: never through a symlink, never a file of another user
or a second link to one, never in a folder others can write unless its sticky bit
keeps them from replacing our files; and a pid read from it is signalled only when
that process is this user's localspec daemon holding this very file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import stat
from pathlib import Path

from localspec.errors import DaemonError

# Never follow a planted symlink; never block opening a planted FIFO; never leak into children.
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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
        check_folder(self.path.parent)
        while True:
            fd = _open_own(self.path, os.O_RDWR | os.O_CREAT)
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


def check_folder(folder: Path) -> None:
    """DaemonError unless no other user can replace files in `folder`.

    That is: the folder is ours (or root's), and either only we can write it or its sticky bit
    (as on /tmp) lets nobody but a file's owner remove or rename that file.
    """
    st = os.stat(folder)
    if st.st_uid not in (os.geteuid(), 0):
        raise DaemonError(f"{folder} belongs to another user; choose a --socket in a folder of your own")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise DaemonError(
            f"other users can write to {folder}; choose a --socket in a folder only you can write"
        )


def _open_own(path: Path, flags: int) -> int:
    """An fd on `path`, which must be a regular file of ours with one link; made 0600 if it was not."""
    try:
        fd = os.open(path, flags | _OPEN_FLAGS, 0o600)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DaemonError(f"{path} is a symbolic link; remove it (a pidfile is never followed)") from None
        raise DaemonError(f"cannot open the pidfile {path}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = "is not a regular file"
    elif st.st_uid != os.geteuid():
        why = "belongs to another user"
    elif st.st_nlink != 1:
        why = "has other hard links"
    if why is not None:
        os.close(fd)
        raise DaemonError(f"{path} {why}; remove it or choose another --socket")
    if stat.S_IMODE(st.st_mode) != 0o600 and flags & os.O_RDWR:
        os.fchmod(fd, 0o600)
    return fd


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def daemon_pid(pid_file: Path) -> int | None:
    """The pid of the daemon holding `pid_file`'s lock, or None when no daemon does.

    A pidfile that is a symlink, not a regular file or not ours names no daemon of ours: None.
    """
    try:
        fd = _open_own(pid_file, os.O_RDONLY)
    except (FileNotFoundError, DaemonError):
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


def is_our_daemon(pid: int, pid_file: Path) -> bool:
    """Whether `pid` is a localspec daemon of this user holding `pid_file` open: safe to signal."""
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.uids().real != os.getuid():
            return False
        argv = proc.cmdline()
        held = {Path(f.path) for f in proc.open_files()}
    except (psutil.Error, OSError):
        return False  # gone, or not ours to look into
    looks_like_serve = "serve" in argv[1:] and any("localspec" in arg for arg in argv)
    return looks_like_serve and pid_file.resolve() in held
