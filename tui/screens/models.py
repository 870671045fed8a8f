"""The models: what the daemon serves and has loaded, and which one this chat talks to.

The daemon serves every model on this machine and loads each on its first request,
so switching is a choice of name: nothing restarts, the next message loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList, Static
from textual.widgets.option_list import Option

from localspec.client import Client, Health, LoadedModel
from localspec.errors import LocalspecError
from localspec.printable import printable


def served_text(health: Health | None, saved_draft: Path | None, current: str | None) -> str:
    lines = []
    if health is not None and health.ready:
        # Names and errors come from GGUF files: shown with their control characters escaped.
        draft = health.draft or f"none ({health.draft_error or 'not configured'})"
        lines += [f"daemon's default: {health.model} ({health.target})", f"its draft: {draft}"]
        lines.append(f"methods: {', '.join(health.methods)}; default {health.method} k={health.k}")
    lines.append(f"this chat: {current or (health.model if health else None) or 'the default model'}")
    lines.append(f"saved draft choice (pick-draft): {saved_draft or 'none'}")
    lines.append("Enter switches this chat to the highlighted model; the daemon loads it if need be.")
    return "\n".join(printable(line) for line in lines)


def model_label(name: str, loaded: LoadedModel | None, current: bool) -> str:
    """One line per served model: loaded or not, its memory and draft; names are escaped."""
    mark = "▶ " if current else "  "
    if loaded is None:
        return printable(f"{mark}{name}  (loads on first use)")
    state = loaded.status if loaded.status != "ready" else "loaded"
    return printable(
        f"{mark}{name}  {state}, {loaded.size / (1 << 20):.0f} MiB, draft {loaded.draft or 'none'}"
    )


class ModelsScreen(ModalScreen[str | None]):
    """Lists the daemon's models (read in a worker); Enter picks one for this chat, Esc closes."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Close")]

    def __init__(
        self, health: Health | None, saved_draft: Path | None, client: Client | None, current: str | None
    ) -> None:
        super().__init__()
        self.health = health
        self.saved_draft = saved_draft
        self.client = client
        self.current = current
        self.names: list[str] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="models-body"):
            # Paths and errors are shown as written: a "[" in a folder name is not markup.
            served = served_text(self.health, self.saved_draft, self.current)
            yield Static(served, id="models-served", markup=False)
            yield Label("asking the daemon…", id="models-note", markup=False)
            yield OptionList(id="models-list")

    def on_mount(self) -> None:
        self.load_models()

    @work(thread=True, exclusive=True)
    def load_models(self) -> None:
        if self.client is None:
            return
        try:
            names = self.client.models()
            loaded = {m.name: m for m in self.client.loaded()}
        except LocalspecError as exc:
            self.app.call_from_thread(self.query_one("#models-note", Label).update, printable(exc.message))
            return
        self.app.call_from_thread(self._show, names, loaded)

    def _show(self, names: list[str], loaded: dict[str, LoadedModel]) -> None:
        self.names = names
        note = f"{len(names)} models served, {len(loaded)} loaded"
        self.query_one("#models-note", Label).update(note)
        current = self.current or (self.health.model if self.health else None)
        options = self.query_one("#models-list", OptionList)
        labels = [model_label(n, loaded.get(n), n == current) for n in names]
        options.add_options([Option(Text(label), id=str(i)) for i, label in enumerate(labels)])

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.dismiss(self.names[int(event.option.id)])

    def action_cancel(self) -> None:
        self.dismiss(None)
