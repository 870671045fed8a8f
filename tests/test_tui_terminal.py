"""`localspec chat` in a real pseudo-terminal, its screen read back through a terminal emulator (pyte).

No daemon runs, so the chat starts one for the session on the tiny model, and
stops it on exit.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyte
import pytest
from daemonproc import daemon_env, start_daemon

pytestmark = pytest.mark.timeout(120)

COLUMNS, LINES = 80, 24


def _own_terminal() -> None:
    """In the child: a session of its own whose controlling terminal is the pty, as a shell in a
    terminal window has (so closing the window hangs it up)."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """A process on a pty of COLUMNS x LINES, and the screen as a terminal would show it."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, preexec_fn=_own_terminal, close_fds=True
        )
        os.close(slave)
        self.screen = pyte.Screen(COLUMNS, LINES)
        self.stream = pyte.ByteStream(self.screen)

    def text(self) -> str:
        return "\n".join(self.screen.display)

    def pump(self, seconds: float) -> None:
        """Read what the program writes for up to `seconds`."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.master], [], [], left)
            if not ready:
                return
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the program has exited and closed the terminal
                return
            if not data:
                return
            self.stream.feed(data)

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump(0.1)
            if predicate(self.text()):
                return self.text()
            if self.proc.poll() is not None:
                break
        raise AssertionError(f"the screen never showed what was expected:\n{self.text()}")

    def send(self, data: str) -> None:
        os.write(self.master, data.encode())

    def hang_up(self) -> None:
        """Close the terminal, as closing its window does: the kernel sends SIGHUP."""
        os.close(self.master)
        self.master = -1

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.master >= 0:
            os.close(self.master)


def chat_terminal(home: Path, *args: str) -> Terminal:
    argv = [
        sys.executable,
        "-c",
        "from localspec.cli import main; main()",
        "chat",
        "--max-tokens",
        "24",
        *args,
    ]
    env = {**daemon_env(home), "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"}
    return Terminal(argv, env)


@pytest.fixture
def terminal(localspec_home: Path, tiny_target: Path) -> Iterator[Terminal]:
    term = chat_terminal(localspec_home, "--target", str(tiny_target), "--threads", "1", "--ctx", "512")
    yield term
    term.close()


def test_chat_starts_a_daemon_sends_a_message_and_shows_the_reply(
    terminal: Terminal, localspec_home: Path
) -> None:
    screen = terminal.wait_for(lambda s: "target tiny-target" in s)
    assert "Message (Enter sends" in screen
    terminal.send("hello world")
    terminal.wait_for(lambda s: "hello world" in s)
    terminal.send("\r")
    screen = terminal.wait_for(lambda s: "assistant" in s and "tok/s" in s and "TTFT" in s)
    assert "you" in screen and "hello world" in screen
    terminal.send("\x1bOP")  # F1
    terminal.wait_for(lambda s: "Keys" in s and "stop the reply" in s)
    terminal.send("\x1b")
    terminal.wait_for(lambda s: "stop the reply" not in s)
    terminal.send("\x11")  # ctrl+q
    assert terminal.proc.wait(timeout=30) == 0
    # The daemon started for the chat has stopped and taken its socket with it.
    assert not list((localspec_home / "run").glob("chat-*.sock"))
    chats = list((localspec_home / "state" / "chats").glob("*.json"))
    assert len(chats) == 1 and "hello world" in chats[0].read_text()


def test_closing_the_terminal_stops_the_chat_and_its_daemon_cleanly(
    terminal: Terminal, localspec_home: Path
) -> None:
    """The daemon the chat started shares its terminal, so it gets the hang-up too: it stops as
    cleanly as on SIGTERM, its socket and pidfile gone (they were left behind)."""
    terminal.wait_for(lambda s: "target tiny-target" in s)
    run = localspec_home / "run"
    (pid_file,) = run.glob("chat-*.pid")
    daemon = int(pid_file.read_text())
    terminal.hang_up()
    terminal.proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{daemon}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{daemon}").exists()
    assert not list(run.glob("chat-*.sock")) and not list(run.glob("chat-*.pid"))


def test_chat_uses_the_running_daemon_and_leaves_it_running(localspec_home: Path, tiny_target: Path) -> None:
    daemon = start_daemon(localspec_home, tiny_target, ctx=512)
    term = chat_terminal(localspec_home)
    try:
        term.wait_for(lambda s: "connected to the running daemon" in s and "target tiny-target" in s)
        term.send("hi\r")
        term.wait_for(lambda s: "assistant" in s and "tok/s" in s)
        term.send("\x11")
        assert term.proc.wait(timeout=30) == 0
        assert daemon.proc.poll() is None
    finally:
        term.close()
        assert daemon.stop() == 0
