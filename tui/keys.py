"""The chat's keys in one table: the app's bindings and the help screen are both made from it."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType


@dataclass(frozen=True)
class Key:
    """One line of the help screen, and the app binding behind it (None: the prompt or Textual's own)."""

    keys: str
    help: str
    action: str | None = None
    label: str = ""
    footer: bool = False


KEYS = (
    Key("enter", "send the message"),
    Key("ctrl+j / shift+enter", "new line in the message"),
    Key("escape", "stop the reply being generated", "stop", "Stop", footer=True),
    Key("ctrl+n", "new chat (this one stays saved)", "new_chat", "New", footer=True),
    Key("ctrl+o", "resume a saved chat", "open_chat", "Open", footer=True),
    Key("ctrl+t", "edit the system prompt", "system_prompt", "System"),
    Key("ctrl+r", "retry the last message, or reconnect the daemon", "retry", "Retry"),
    Key("ctrl+p", "command palette: method, k, models, pick-draft"),
    Key("f2", "colour reply text from accepted drafts (on/off)", "toggle_draft_colours", "Drafts"),
    Key("f1", "this help", "help", "Help", footer=True),
    Key("ctrl+q", "quit (a daemon started for this chat stops too)"),
)


def bindings() -> list[BindingType]:
    return [Binding(k.keys, k.action, k.label, show=k.footer) for k in KEYS if k.action is not None]


def help_rows() -> list[tuple[str, str]]:
    return [(k.keys, k.help) for k in KEYS]
