"""A code block drawn in pieces, so a streamed reply's growing block costs its last piece, not its length.

Textual's MarkdownFence is one Label holding the whole block. A reply streams into its last block,
and every take of the stream made a new fence (which highlighted the whole code) and redrew the
shown one (every line to strips again): at 300 lines of code a take cost ~170 ms of CPU, growing
with the block, and the chat then took its chunks about once a second (tui/reply.py take_interval).
Here the code is shown as Labels of PIECE_LINES lines each: a take highlights and redraws only the
piece still growing (and any new one), the pieces above keep what they drew. A piece highlighted
alone starts the lexer afresh, so a string or comment open across its first line would be coloured
as code until `settle()`, which highlights the block whole, as MarkdownFence does, once the reply
has ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from markdown_it.token import Token
from textual.content import Content
from textual.widgets import Label, Markdown
from textual.widgets._markdown import MarkdownBlock, MarkdownFence

PIECE_LINES = 32
T = TypeVar("T")


def _groups(lines: Sequence[T]) -> list[Sequence[T]]:
    """`lines` in runs of PIECE_LINES, one a piece."""
    return [lines[i : i + PIECE_LINES] for i in range(0, len(lines), PIECE_LINES)]


def pieces(code: str) -> list[str]:
    """The code's lines in groups of PIECE_LINES, each group's lines joined."""
    return ["\n".join(group) for group in _groups(code.split("\n"))]


class PiecedFence(MarkdownFence):
    """A fenced or indented code block, highlighted as MarkdownFence highlights it, shown in pieces."""

    # MarkdownFence pads its one Label 1 2 (1 0 in ANSI colours): here the fence takes the vertical
    # padding, above the first piece and below the last, and each piece the horizontal.
    DEFAULT_CSS = """
    PiecedFence {
        layout: vertical;
        padding: 1 0;
        & > Label {
            padding: 0 2;
        }
    }
    PiecedFence:ansi > Label {
        padding: 0;
    }
    """

    def __init__(self, markdown: Markdown, token: Token, code: str) -> None:
        # Not MarkdownFence.__init__, which highlights the whole code: the stream builds a fence
        # for every take only to update the one shown from it, and this one highlights when drawn.
        MarkdownBlock.__init__(self, markdown, token)
        self.code = code
        self.lexer = token.info
        self.auto_links = False  # no links in code
        self._drawn: list[str] = []  # each piece's code, as its Label shows it
        self._settled = False  # every piece drawn from the block's whole highlight

    def _highlight(self, code: str) -> Content:
        return self.highlight(
            code, self.lexer, ansi=self.app.native_ansi_color, dark=self.app.current_theme.dark
        )

    def _whole(self) -> list[Content]:
        """Each piece's share of the block highlighted whole (the lexer's state carried across)."""
        lines = self._highlight(self.code).split("\n", allow_blank=True)
        return [Content("\n").join(group) for group in _groups(lines)]

    def compose(self):  # type: ignore[no-untyped-def]  # MarkdownFence's, untyped
        self._drawn = pieces(self.code)
        self._settled = True
        for content in self._whole():
            yield Label(content, expand=True)

    async def _update_from_block(self, block: MarkdownBlock) -> None:
        if not isinstance(block, MarkdownFence):
            await super()._update_from_block(block)
            return
        lexer = self.lexer  # the info string may still be arriving: ```py, then ```python
        self._copy_context(block)
        now = pieces(self.code)
        kept = max(len(self._drawn) - 1, 0)  # the last drawn piece may have grown
        if now[:kept] != self._drawn[:kept] or self.lexer != lexer:
            await self._redraw(now)
            return
        labels = list(self.query_children(Label))
        for i in range(kept, len(now)):
            content = self._highlight(now[i])
            if i < len(labels):
                labels[i].update(content)
            else:
                await self.mount(Label(content, expand=True))
        for extra in labels[len(now) :]:
            await extra.remove()
        self._drawn = now
        self._settled = False

    def _copy_context(self, block: MarkdownBlock) -> None:
        if isinstance(block, MarkdownFence):
            self.code, self.lexer = block.code, block.lexer
        MarkdownBlock._copy_context(self, block)  # not MarkdownFence's: it copies a whole highlight

    async def _redraw(self, now: list[str]) -> None:
        await self.remove_children()
        self._drawn = now
        await self.mount_all(Label(content, expand=True) for content in self._whole())
        self._settled = True

    async def settle(self) -> None:
        """Every piece from the block's whole highlight (the stream has ended)."""
        if not self._settled:
            await self._redraw(pieces(self.code))

    def notify_style_update(self) -> None:
        """The theme changed: every piece highlighted again, in its colours."""
        labels = list(self.query_children(Label))
        if labels and len(labels) == len(self._drawn):
            for label, content in zip(labels, self._whole(), strict=True):
                label.update(content)
        MarkdownBlock.notify_style_update(self)  # not MarkdownFence's: it highlights into one Label
