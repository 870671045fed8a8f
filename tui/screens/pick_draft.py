"""pick-draft's choice for the served target: the method and draft it recommends, why, and the runners-up."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from localspec.client import Health
from localspec.errors import LocalspecError
from localspec.printable import printable
from tui.draft_choice import DraftChoice, pick_draft, served_path
from tui.model_list import list_models


def choice_text(choice: DraftChoice, daemon_pick: str | None) -> str:
    lines = [
        f"target: {choice.target}",
        f"memory: {choice.device}",
        f"choice: {choice.summary()}",
        f"why: {choice.reason}",
        "",
        "best candidates (✗: cannot be used here):",
        *(f"  {c.text()}" for c in choice.candidates),
    ]
    if daemon_pick:
        lines += ["", f"the daemon at its start: {daemon_pick}"]
    return "\n".join(lines)


class PickDraftScreen(ModalScreen[None]):
    """Runs pick-draft's fast path (no weights loaded) in a worker and shows its report; Esc closes."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "close", "Close")]

    def __init__(self, health: Health, known: Sequence[Path]) -> None:
        super().__init__()
        self.health = health
        self.known = list(known)
        self.choice: DraftChoice | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="pick-body") as body:
            body.border_title = "pick-draft"
            body.border_subtitle = "Esc closes"
            yield Static(
                f"asking pick-draft about {printable(self.health.target)}…", id="pick-text", markup=False
            )

    def on_mount(self) -> None:
        self.run_pick()

    @work(thread=True, exclusive=True)
    def run_pick(self) -> None:
        name = self.health.target or ""
        try:
            path = served_path(name, self.known, [])
            if path is None:
                path = served_path(name, [], [m.path for m in list_models()])
            if path is None:
                shown = printable(name)
                text = f"no file named {shown} on this machine; run `localspec pick-draft --target FILE`"
                self.app.call_from_thread(self._show, text)
                return
            choice = pick_draft(path, self.health.n_ctx)
        except LocalspecError as exc:
            self.app.call_from_thread(self._show, printable(exc.message))
            return
        self.app.call_from_thread(self._show, choice_text(choice, self.health.pick), choice)

    def _show(self, text: str, choice: DraftChoice | None = None) -> None:
        self.choice = choice
        self.query_one("#pick-text", Static).update(text)

    def action_close(self) -> None:
        self.dismiss(None)
