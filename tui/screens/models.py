"""The models: what the daemon serves, the saved draft choice, and every model found on this machine."""

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

from localspec.client import Health
from localspec.errors import LocalspecError
from localspec.printable import printable
from tui.model_list import ModelEntry, list_models


def served_text(health: Health | None, saved_draft: Path | None, can_switch: bool) -> str:
    lines = []
    if health is not None and health.ready:
        # Names and errors come from GGUF files: shown with their control characters escaped.
        draft = health.draft or f"none ({health.draft_error or 'not configured'})"
        lines += [f"serving: {health.model} ({health.target})", f"draft: {draft}"]
        lines.append(f"methods: {', '.join(health.methods)}; default {health.method} k={health.k}")
    lines.append(f"saved draft choice (pick-draft): {saved_draft or 'none'}")
    lines.append(
        "Enter restarts this chat's daemon with the highlighted model."
        if can_switch
        else "This chat uses the shared daemon: switching restarts it for everyone, so do that with serve."
    )
    return "\n".join(printable(line) for line in lines)


class ModelsScreen(ModalScreen[Path | None]):
    """Lists models (read in a worker); Enter picks one as the new target, Esc closes."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Close")]

    def __init__(self, health: Health | None, saved_draft: Path | None, can_switch: bool) -> None:
        super().__init__()
        self.health = health
        self.saved_draft = saved_draft
        self.can_switch = can_switch
        self.entries: list[ModelEntry] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="models-body"):
            # Paths and errors are shown as written: a "[" in a folder name is not markup.
            served = served_text(self.health, self.saved_draft, self.can_switch)
            yield Static(served, id="models-served", markup=False)
            yield Label("looking for models…", id="models-note", markup=False)
            yield OptionList(id="models-list")

    def on_mount(self) -> None:
        self.load_models()

    @work(thread=True, exclusive=True)
    def load_models(self) -> None:
        try:
            entries = list_models()
        except LocalspecError as exc:
            self.app.call_from_thread(self.query_one("#models-note", Label).update, printable(exc.message))
            return
        self.app.call_from_thread(self._show, entries)

    def _show(self, entries: list[ModelEntry]) -> None:
        self.entries = entries
        self.query_one("#models-note", Label).update(f"{len(entries)} models found (`localspec models`)")
        options = self.query_one("#models-list", OptionList)
        options.add_options([Option(Text(e.label()), id=str(i)) for i, e in enumerate(entries)])

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if not self.can_switch or event.option.id is None:
            self.notify("this chat uses the shared daemon; restart it with `localspec serve --target ...`")
            return
        self.dismiss(self.entries[int(event.option.id)].path)

    def action_cancel(self) -> None:
        self.dismiss(None)
