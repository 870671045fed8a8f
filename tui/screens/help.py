"""The help screen: every key the chat answers to."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

KEY_WIDTH = 22


def keys_content(keys: Sequence[tuple[str, str]]) -> Content:
    """Two aligned columns: the key (highlighted) and what it does."""
    lines = [Content.assemble((key.ljust(KEY_WIDTH), "bold $accent"), what) for key, what in keys]
    return Content("\n").join(lines)


class HelpScreen(ModalScreen[None]):
    """A table of keys over the chat; any of Esc, F1 or q closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,f1,q", "close", "Close")]

    def __init__(self, keys: Sequence[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body") as body:
            body.border_title = "Keys"
            body.border_subtitle = "Esc closes"
            yield Static(keys_content(self.keys), id="help-keys")

    def action_close(self) -> None:
        self.dismiss(None)
