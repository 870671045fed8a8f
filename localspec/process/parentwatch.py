"""Stop a daemon whose parent has died: the one `localspec chat` starts must not outlive the chat.

The chat passes its pid in LOCALSPEC_PARENT_PID to the daemon it starts. A thread
here checks every second whether that process is still the daemon's parent (or,
when it was not the direct parent, still alive) and, once it is gone, sends the
daemon SIGTERM: the same clean shutdown `localspec stop` gives (generations
cancelled, socket and pidfile removed), even when the chat was SIGKILLed.

Polling rather than Linux's PR_SET_PDEATHSIG: that is Linux only, it fires when
the *thread* that started the child exits (the chat restarts its daemon from a
worker thread), and it needs a preexec_fn, which is unsafe in a threaded parent.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping

PARENT_PID_ENV = "LOCALSPEC_PARENT_PID"
POLL_S = 1.0

log = logging.getLogger("localspec.parentwatch")


def _terminate_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def parent_gone(pid: int, direct: bool) -> bool:
    """Whether process `pid` has gone; `direct`: it was our parent, so reparenting tells at once."""
    if direct:
        return os.getppid() != pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, owned by someone else
        return False
    return False


def watch_parent(
    env: Mapping[str, str] | None = None,
    on_gone: Callable[[], None] = _terminate_self,
    interval: float = POLL_S,
) -> threading.Thread | None:
    """Watch the process named in LOCALSPEC_PARENT_PID and call `on_gone` once it has exited.

    Returns the watching thread (a daemon thread), or None when no parent is named.
    """
    value = (os.environ if env is None else env).get(PARENT_PID_ENV, "").strip()
    if not value:
        return None
    try:
        pid = int(value)
    except ValueError:
        log.warning("ignoring %s=%r: not a process id", PARENT_PID_ENV, value)
        return None
    direct = os.getppid() == pid
    thread = threading.Thread(
        target=_watch, args=(pid, direct, on_gone, interval), name="localspec-parentwatch", daemon=True
    )
    thread.start()
    return thread


def _watch(pid: int, direct: bool, on_gone: Callable[[], None], interval: float) -> None:
    while not parent_gone(pid, direct):
        time.sleep(interval)
    log.info("the process that started this daemon (pid %d) has exited; stopping", pid)
    on_gone()
