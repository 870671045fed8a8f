"""The live stats bar: speed, time to first token, speculation figures, models, memory, a sparkline."""

from __future__ import annotations

import contextlib

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widgets import Sparkline, Static

from localspec.client import Health
from localspec.printable import printable
from localspec.types import PromptProgress
from tui.live_stats import LiveStats


def format_bytes(n: int | None) -> str:
    if n is None:
        return "mem ?"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GB"
    return f"{n / (1 << 20):.0f} MB"


def _rate(tps: float) -> str:
    return f"{tps:.0f} tok/s" if tps >= 100 else f"{tps:.1f} tok/s"


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _method_k(method: str, k: int | None) -> str:
    return f"{method} k={k}" if k is not None else method  # None: the method's own default


def speed_line(live: LiveStats | None, now: float, method: str, k: int | None, memory: int | None) -> str:
    """Line one: what the current (or last) reply does, or the defaults before the first one."""
    mem = format_bytes(memory)
    if live is None:
        return f"ready · {_method_k(method, k)} · {mem}"
    ttft = live.ttft_s
    ttft_text = "TTFT …" if ttft is None else f"TTFT {_duration(ttft)}"
    if live.final is None and live.first_at is None and live.reading is not None:
        return f"{reading_text(live.reading)} · {mem}"
    if live.final is None:
        now_tps = live.tokens_per_second_now(now)
        parts = [_rate(now_tps), f"avg {live.tokens_per_second_avg():.0f}", ttft_text]
        parts += [_method_k(method, k), f"from draft {live.draft_share:.0%}", mem]
        return " · ".join(parts)
    stats = live.final
    parts = [_rate(stats.tokens_per_second), ttft_text, f"{stats.method} k={stats.k}"]
    if stats.drafted:
        parts += [f"accept {stats.acceptance_rate:.0%}", f"mean len {stats.mean_accepted_length:.2f}"]
    parts.append(mem)
    return " · ".join(parts)


def reading_text(read: PromptProgress) -> str:
    """Before the first token: how much of the prompt is read, how fast, and about how long is left."""
    text = f"reading {read.processed:,}/{read.total:,} prompt tokens"
    done = read.processed - read.cached
    if done <= 0 or read.seconds <= 0 or read.processed >= read.total:
        return text
    rate = done / read.seconds
    return f"{text} · {rate:.0f} tok/s · ~{_duration((read.total - read.processed) / rate)} left"


def models_line(health: Health | None, model: str | None = None) -> str:
    """Line two: the model this chat talks to (the daemon's default unless switched) and its draft."""
    if health is None or not health.ready:
        return "target … · draft …"
    if model is not None and model != health.model:
        return printable(f"target {model} · draft as the daemon chose it (ctrl+p Models)")
    draft = health.draft or (f"none ({health.draft_error})" if health.draft_error else "none")
    mode = " · exact" if health.exact else ""  # fast, llama.cpp's own loading, is the default
    return f"target {health.model or health.target} · draft {draft}{mode}"


class StatsBar(Vertical):
    """Two lines under the conversation; the sparkline plots tokens/s over the current reply."""

    speed_text = "connecting…"

    def compose(self) -> ComposeResult:
        yield Static(self.speed_text, id="stats-speed")
        with Horizontal(id="stats-row"):
            yield Static("", id="stats-models")
            yield Sparkline([], id="stats-spark")

    def show_status(self, text: str) -> None:
        """Before the daemon is ready, line one says what is happening."""
        self.speed_text = text
        with contextlib.suppress(NoMatches):  # a status arriving while the app shuts down
            _set(self.query_one("#stats-speed", Static), text)

    def show(
        self,
        *,
        live: LiveStats | None,
        now: float,
        method: str,
        k: int | None,
        memory: int | None,
        health: Health | None,
        model: str | None = None,
    ) -> None:
        self.speed_text = speed_line(live, now, method, k, memory)
        try:
            speed = self.query_one("#stats-speed", Static)
            models = self.query_one("#stats-models", Static)
            spark = self.query_one("#stats-spark", Sparkline)
        except NoMatches:  # a timer's tick landing while the app shuts down, some of its lines removed
            return
        # Lines of a fixed size (app.tcss): no layout, and no repaint when nothing changed. This
        # runs 4 times a second while a reply streams, and a layout of the whole chat costs the
        # engine's cores (tui/reply.py, take_interval).
        _set(speed, self.speed_text)
        _set(models, models_line(health, model))
        series = live.series() if live is not None else []
        if series != spark.data:
            spark.data = series


def _set(line: Static, text: str) -> None:
    """`text` on a one-line Static of a fixed width: repainted only where it changed, never laid out."""
    if str(line.content) != text:
        line.update(text, layout=False)
