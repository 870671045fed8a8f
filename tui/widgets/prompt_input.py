"""The multi-line prompt: Enter sends, ctrl+j (or shift+enter where the terminal tells) adds a line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual import events
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    """A TextArea whose Enter key submits instead of inserting a newline."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("ctrl+j,shift+enter", "newline", "Newline", show=False)]

    @dataclass
    class Submitted(Message):
        """The user pressed Enter on a non-empty prompt."""

        prompt_input: PromptInput
        text: str

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus")
        self.placeholder = "Message (Enter sends, ctrl+j new line, F1 help)"

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.text.strip():
                self.post_message(self.Submitted(self, self.text))
            return
        await super()._on_key(event)

    def action_newline(self) -> None:
        self.insert("\n")
