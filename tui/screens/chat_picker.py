"""Pick a saved chat to resume, newest first."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from tui.chats import Chat


def chat_label(chat: Chat) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(chat.updated))
    return f"{when}  {chat.title}  ({len(chat.messages)} msgs)"


class ChatPickerScreen(ModalScreen[str | None]):
    """A list of saved chats; Enter resumes the highlighted one, Esc keeps the current chat."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, chats: Sequence[Chat]) -> None:
        super().__init__()
        self.chats = chats

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-body"):
            yield Label("Resume a chat (Enter opens, Esc cancels)" if self.chats else "No saved chats yet")
            yield OptionList(*(Option(chat_label(c), id=c.id) for c in self.chats), id="picker-list")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
