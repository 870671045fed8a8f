"""The TUI's pure parts, without a terminal: live stats, saved chats, the stats lines, its imports."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Static

from localspec.client import Health
from localspec.types import ChatMessage, GenerationStats, PromptProgress
from tui.chats import Chat, ChatNotFoundError, ChatStore
from tui.live_stats import BUCKET_S, LiveStats
from tui.reply import TAKE_MAX_S, TAKE_MIN_S, UI_SHARE, take_interval
from tui.widgets.stats_bar import StatsBar, format_bytes, models_line, speed_line

TUI = Path(__file__).resolve().parent.parent / "tui"
# The TUI reaches the engine only through the daemon: these are the localspec modules it may import.
ALLOWED = {
    "localspec.client",
    "localspec.types",
    "localspec.errors",
    "localspec.settings",
    "localspec.paths",
    "localspec.process.pidfile",
    "localspec.process.parentwatch",
    "localspec.atomicfile",
    "localspec.printable",
}


def test_tui_imports_only_the_client_and_shared_types() -> None:
    for path in sorted(TUI.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith("llama_cpp"), f"{path.name} imports {name}"
                if name.startswith("localspec"):
                    assert name in ALLOWED, f"{path.name} imports {name}"


def test_live_stats_rates_ttft_and_series() -> None:
    live = LiveStats(started=10.0)
    assert live.ttft_s is None and live.tokens_per_second_now(10.0) == 0.0
    for i in range(20):  # 2 tokens every 50 ms from t=10.5: 40 tokens/s
        live.add(2, 1, 10.5 + i * 0.05)
    assert live.ttft_s == pytest.approx(0.5)
    assert live.tokens == 40 and live.draft_share == 0.5
    assert live.tokens_per_second_avg() == pytest.approx(39 / 0.95)
    assert live.tokens_per_second_now(11.5) == pytest.approx(40.0)  # the last second held all 40
    assert live.tokens_per_second_now(20.0) == 0.0  # paused
    assert len(live.series()) == int(0.95 / BUCKET_S) + 1
    assert sum(live.series()) * BUCKET_S == 40
    live.finish(GenerationStats(tokens=40, ttft_s=0.4, tokens_per_second=42.0))
    assert live.ttft_s == 0.4 and live.tokens_per_second_avg() == 42.0


def test_a_take_waits_for_what_the_last_cost_over_the_apps_share_of_a_core() -> None:
    assert take_interval(0.0) == TAKE_MIN_S  # cheap drawing: ten takes a second
    assert take_interval(UI_SHARE * 0.4) == pytest.approx(0.4)  # 20 ms of CPU: one take in 0.4 s
    assert take_interval(5.0) == TAKE_MAX_S  # never less than a take a second


def test_speed_and_models_lines() -> None:
    assert speed_line(None, 0.0, "auto", 4, 64 << 20) == "ready · auto k=4 · 64 MB"
    live = LiveStats(started=0.0)
    live.add(1, 0, 0.25)
    assert "TTFT 250 ms" in speed_line(live, 0.3, "draft", 3, None)
    stats = GenerationStats(method="draft", k=3, tokens=9, drafted=8, accepted=6, ttft_s=1.5)
    stats.tokens_per_second, stats.acceptance_rate, stats.mean_accepted_length = 123.4, 0.75, 2.25
    live.finish(stats)
    line = speed_line(live, 9.0, "auto", 4, 3 << 30)
    assert line == "123 tok/s · TTFT 1.50 s · draft k=3 · accept 75% · mean len 2.25 · 3.0 GB"
    assert len(line) <= 78  # one line of an 80-column terminal
    assert format_bytes(None) == "mem ?"
    # Before the first token of a long prompt: how much of it is read, how fast, how long is left.
    reading = LiveStats(started=0.0)
    reading.reading = PromptProgress(total=12_002, cached=2, processed=2_050, seconds=8.0)
    line = speed_line(reading, 8.0, "auto", 4, 3 << 30)
    assert line == "reading 2,050/12,002 prompt tokens · 256 tok/s · ~38.88 s left · 3.0 GB"
    assert len(line) <= 78
    reading.reading = PromptProgress(total=12_002, cached=0, processed=0, seconds=0.0)
    assert speed_line(reading, 8.0, "auto", 4, 3 << 30) == "reading 0/12,002 prompt tokens · 3.0 GB"
    reading.add(1, 0, 9.0)  # the first token: speeds again
    assert "tok/s" in speed_line(reading, 9.1, "auto", 4, None)
    assert "reading" not in speed_line(reading, 9.1, "auto", 4, None)
    health = Health(status="ready", model="t", draft=None, draft_error="tokenizers differ")
    assert models_line(health) == "target t · draft none (tokenizers differ)"
    exact = Health(status="ready", model="t", draft="d", exact=True)
    assert models_line(exact) == "target t · draft d · exact"


def test_chats_save_load_by_prefix_and_list(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats")
    assert store.saved() == []
    chat = Chat.new("be brief")
    chat.messages.append(ChatMessage("user", "  what is\nspeculative decoding? " + "x" * 80))
    path = store.save(chat)
    assert path.stat().st_mode & 0o777 == 0o600
    assert store.load(chat.id) == chat
    assert store.load(chat.id[:12]).id == chat.id
    assert chat.title.startswith("what is speculative decoding?") and len(chat.title) == 60
    assert chat.request_messages()[0] == ChatMessage("system", "be brief")
    (store.directory / "20250101-000000-ffff.json").write_text("{not json")
    assert [c.id for c in store.saved()] == [chat.id]
    assert json.loads(path.read_text())["messages"][0]["role"] == "user"


@pytest.mark.parametrize("bad", ["../../etc/passwd", "nope", "", "2025"])
def test_unknown_or_unsafe_chat_ids_are_refused(tmp_path: Path, bad: str) -> None:
    store = ChatStore(tmp_path)
    store.save(Chat.new())
    store.save(Chat.new())
    with pytest.raises(ChatNotFoundError):
        store.load(bad)


@pytest.mark.asyncio
async def test_the_stats_bar_ignores_a_tick_while_its_lines_are_being_removed() -> None:
    # The app's timer may tick while it shuts down: part of the bar gone must not raise (it once did,
    # NoMatches on #stats-speed, failing a TUI test at random).
    class Bar(App[None]):
        def compose(self) -> ComposeResult:
            yield StatsBar(id="stats")

    app = Bar()
    async with app.run_test() as pilot:
        bar = app.query_one(StatsBar)
        health = Health(status="ready", model="t", draft=None)
        await bar.query_one("#stats-speed", Static).remove()
        await pilot.pause()
        assert bar.children  # the row is still there: the old guard let this through
        bar.show(live=None, now=0.0, method="auto", k=None, memory=None, health=health)
        assert "auto" in bar.speed_text
