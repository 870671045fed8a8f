"""A reply shown with the text that came from accepted drafts coloured (the draft colouring toggle)."""

from __future__ import annotations

from collections.abc import Sequence

from textual.content import Content
from textual.widgets import Static

from localspec.types import TokenChunk
from tui.widgets.message_view import ROLE_LABELS

# Subtle: the theme's success text colour, the assistant's border colour.
DRAFT_STYLE = "$text-success"
# A thinking model's reasoning, before its answer: set apart, drafted or not.
REASONING_STYLE = "$text-muted italic"


class DraftView(Static):
    """Plain text (no Markdown), styled per chunk: cheap enough for thousands of chunks.

    A chunk is one decoding step: the drafted tokens it accepted, then the target's own
    token. It is coloured when any of its tokens came from an accepted draft, which is
    most of its text.
    """

    def __init__(self) -> None:
        super().__init__("", classes="message assistant drafts")
        self.role = "assistant"
        self.border_title = f"{ROLE_LABELS['assistant']} · draft text coloured"
        self.spans: list[tuple[str, str]] = []  # (text, style), neighbours of one style merged

    def append(self, chunks: Sequence[TokenChunk]) -> None:
        for chunk in chunks:
            if chunk.reasoning:
                self._add(chunk.reasoning, REASONING_STYLE)
            if chunk.text:
                if self.spans and self.spans[-1][1] == REASONING_STYLE:
                    self._add("\n\n", "")
                self._add(chunk.text, DRAFT_STYLE if chunk.from_draft else "")
        self.update(Content.assemble(*(span if span[1] else span[0] for span in self.spans)))

    def _add(self, text: str, style: str) -> None:
        if self.spans and self.spans[-1][1] == style:
            self.spans[-1] = (self.spans[-1][0] + text, style)
        else:
            self.spans.append((text, style))

    def mark(self, note: str) -> None:
        """A note under the message: "stopped", "failed"."""
        self.border_subtitle = note
