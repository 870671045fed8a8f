"""Snapshots of the chat's main screens in 80x24 (pytest-textual-snapshot; `--snapshot-update` renews them).

The screens are made deterministic: a real daemon on the tiny models, saved
chats with fixed times, and the daemon's memory figure (which varies run to
run) fixed at 64 MB.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from daemonproc import Daemon
from test_tui_app import wait_until
from textual.pilot import Pilot

from localspec.client import Client
from localspec.settings import load_settings
from tui.app import ChatApp, make_app
from tui.chats import ChatStore
from tui.widgets.prompt_input import PromptInput

pytestmark = pytest.mark.timeout(120)

SIZE = (80, 24)
CHAT_ID = "20250102-030405-abcd"
REPLY = """Here is one:

```python
def add(a: int, b: int) -> int:
    return a + b
```

It returns the **sum**."""
Snap = Callable[..., bool]


@pytest.fixture
def store(localspec_home: Path, monkeypatch: pytest.MonkeyPatch) -> ChatStore:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    monkeypatch.setattr("tui.connection.memory_bytes", lambda pid: 64 << 20)
    store = ChatStore(localspec_home / "state" / "chats")
    store.directory.mkdir(parents=True)
    chat: dict[str, Any] = {
        "id": CHAT_ID,
        "created": 1735787045.0,
        "updated": 1735787045.0,
        "system_prompt": "",
        "messages": [
            {"role": "user", "content": "Write an add function in Python"},
            {"role": "assistant", "content": REPLY},
        ],
    }
    (store.directory / f"{CHAT_ID}.json").write_text(json.dumps(chat))
    return store


@pytest.fixture
def new_app(tiny_daemon: Daemon, store: ChatStore) -> Iterator[Callable[..., ChatApp]]:
    clients: list[Client] = []

    def factory(resume: str | None = CHAT_ID, socket: Path | None = None) -> ChatApp:
        client = Client(socket_path=socket or tiny_daemon.socket_path)
        clients.append(client)
        return make_app(load_settings(), client, store=store, resume=resume)

    yield factory
    for client in clients:
        client.close()


def steady(app: ChatApp) -> None:
    """No toasts ("connected to ..." names a temporary socket path) and no blinking cursor."""
    app.clear_notifications()
    app.query_one(PromptInput).cursor_blink = False


def ready(app: ChatApp) -> Callable[[Pilot[None]], Any]:
    async def run_before(pilot: Pilot[None]) -> None:
        await wait_until(pilot, lambda: app.health is not None and app.memory is not None)
        steady(app)
        await pilot.pause()

    return run_before


def test_main_screen(snap_compare: Snap, new_app: Callable[..., ChatApp]) -> None:
    app = new_app()
    assert snap_compare(app, terminal_size=SIZE, run_before=ready(app))


def test_help_screen(snap_compare: Snap, new_app: Callable[..., ChatApp]) -> None:
    app = new_app()
    assert snap_compare(app, terminal_size=SIZE, run_before=ready(app), press=["f1"])


def test_chat_picker(snap_compare: Snap, new_app: Callable[..., ChatApp]) -> None:
    app = new_app(resume="")
    assert snap_compare(app, terminal_size=SIZE, run_before=ready(app))


def test_no_daemon(snap_compare: Snap, new_app: Callable[..., ChatApp], tmp_path: Path) -> None:
    app = new_app(socket=tmp_path / "nobody.sock")

    async def run_before(pilot: Pilot[None]) -> None:
        await wait_until(pilot, lambda: "ctrl+r" in app.stats_bar.speed_text)
        steady(app)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
