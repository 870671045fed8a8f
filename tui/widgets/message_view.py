"""One turn of the conversation, rendered as Markdown (code blocks highlighted)."""

from __future__ import annotations

from textual.widgets import Markdown
from textual.widgets._markdown import MarkdownBlock

from tui.widgets.code_fence import PiecedFence

ROLE_LABELS = {"user": "you", "assistant": "assistant", "system": "system", "notice": "localspec"}


class MessageView(Markdown):
    """A message; the role is its CSS class and its border title. Streamed replies grow in place."""

    # Code blocks in pieces: a streamed reply's growing block redraws its last piece alone.
    BLOCKS: dict[str, type[MarkdownBlock]] = {  # noqa: RUF012  (Markdown's own is a plain dict)
        **Markdown.BLOCKS,
        "fence": PiecedFence,
        "code_block": PiecedFence,
    }

    def __init__(self, role: str, content: str = "") -> None:
        super().__init__(content, classes=f"message {role}")
        self.role = role
        self.content = content
        self.border_title = ROLE_LABELS.get(role, role)

    def mark(self, note: str) -> None:
        """A note under the message: "stopped", "failed"."""
        self.border_subtitle = note
