"""Edit the current chat's system prompt."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, TextArea


class SystemPromptScreen(ModalScreen[str | None]):
    """A text box with the system prompt; ctrl+s keeps it, Esc leaves it as it was."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+s", "save", "Keep", priority=True),
        Binding("escape", "cancel", "Cancel"),
    ]

    def __init__(self, prompt: str) -> None:
        super().__init__()
        self.prompt = prompt

    def compose(self) -> ComposeResult:
        with Vertical(id="system-body"):
            yield Label("System prompt for this chat (ctrl+s keeps it, Esc cancels)")
            yield TextArea(self.prompt, id="system-text", soft_wrap=True)

    def action_save(self) -> None:
        self.dismiss(self.query_one("#system-text", TextArea).text.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
