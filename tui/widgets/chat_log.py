"""The scrolling conversation: one view per turn, kept scrolled to the newest."""

from __future__ import annotations

from textual.containers import VerticalScroll

from tui.widgets.draft_view import DraftView
from tui.widgets.message_view import MessageView

Turn = MessageView | DraftView


class ChatLog(VerticalScroll, can_focus=False):
    """The turns of the current chat, oldest first."""

    def on_mount(self) -> None:
        self.anchor()  # follow the newest text, until the user scrolls up to read

    async def add(self, role: str, content: str = "") -> MessageView:
        view = MessageView(role, content)
        await self.mount(view)
        return view

    async def add_draft_view(self) -> DraftView:
        """A reply whose text from accepted drafts is coloured (plain text, not Markdown)."""
        view = DraftView()
        await self.mount(view)
        return view

    async def clear(self) -> None:
        await self.remove_children()

    @property
    def views(self) -> list[Turn]:
        return [child for child in self.children if isinstance(child, MessageView | DraftView)]
