"""The scrolling conversation: one MessageView per turn, kept scrolled to the newest."""

from __future__ import annotations

from textual.containers import VerticalScroll

from tui.widgets.message_view import MessageView


class ChatLog(VerticalScroll, can_focus=False):
    """The turns of the current chat, oldest first."""

    def on_mount(self) -> None:
        self.anchor()  # follow the newest text, until the user scrolls up to read

    async def add(self, role: str, content: str = "") -> MessageView:
        view = MessageView(role, content)
        await self.mount(view)
        return view

    async def clear(self) -> None:
        await self.remove_children()

    @property
    def views(self) -> list[MessageView]:
        return list(self.query(MessageView))
