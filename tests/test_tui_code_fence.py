"""A streamed reply's code block, drawn in pieces (tui/widgets/code_fence.py), with Textual's pilot.

The view must look as Textual's own fence draws the same block, and a take must cost the piece
still growing, not the block's whole length.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.strip import Strip
from textual.widgets import Label, Markdown

from localspec.types import TokenChunk
from tui.reply import MarkdownOutput
from tui.widgets import code_fence
from tui.widgets.code_fence import PIECE_LINES, PiecedFence, pieces
from tui.widgets.message_view import MessageView

# A docstring open across the first piece's end: highlighted alone, the second piece would start
# as code where it is still the string.
CODE = (
    "class Tree:\n"
    + "".join(f"    def method_{i}(self) -> int:  # {'x' * 70}\n        return {i}\n" for i in range(15))
    + '    """A docstring\n    over\n    several\n    lines."""\n'
    + "".join(f"    def other_{i}(self, value: int) -> int:\n        return value * {i}\n" for i in range(60))
)
REPLY = f"Here it is:\n\n```python\n{CODE}```\n\nThat is the whole module.\n"


class _Chat(App[None]):
    def __init__(self, content: str = "") -> None:
        super().__init__()
        self.content = content

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield MessageView("assistant", self.content)


def _screen(app: App[None]) -> list[list[tuple[str, str]]]:
    """Every cell of the screen: its character and its style (the SVG export splits runs of one
    colour differently where the segments came from different widgets; the cells are the same)."""
    rows = []
    for line in app.screen._compositor.render_full_update().strips:
        segments = Strip.join(line).discard_meta()
        rows.append([(ch, str(seg.style)) for seg in segments if not seg.control for ch in seg.text])
    return rows


@contextmanager
def _counted_lines() -> Iterator[list[int]]:
    """The lines each highlight of a code block was asked to colour."""
    asked: list[int] = []
    highlight = code_fence.PiecedFence.highlight

    def counting(code: str, language: str, ansi: bool = False, dark: bool = False) -> Content:
        asked.append(code.count("\n") + 1)
        return highlight(code, language, ansi, dark)

    code_fence.PiecedFence.highlight = staticmethod(counting)  # type: ignore[method-assign]
    try:
        yield asked
    finally:
        code_fence.PiecedFence.highlight = highlight  # type: ignore[method-assign]


def test_pieces_split_the_code_by_lines() -> None:
    code = "\n".join(str(i) for i in range(2 * PIECE_LINES + 3))
    split = pieces(code)
    assert [p.count("\n") + 1 for p in split] == [PIECE_LINES, PIECE_LINES, 3]
    assert "\n".join(split) == code


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [(100, 200), (60, 40)])
async def test_a_streamed_block_ends_drawn_as_textuals_own_fence_draws_it(size: tuple[int, int]) -> None:
    # Textual's own fence, the whole reply at once: what the pieces must look like.
    own = _Chat(REPLY)
    MessageView.BLOCKS, saved = Markdown.BLOCKS, MessageView.BLOCKS
    try:
        async with own.run_test(size=size) as pilot:
            await pilot.pause()
            expected = _screen(own)
    finally:
        MessageView.BLOCKS = saved
    whole = _Chat(REPLY)
    async with whole.run_test(size=size) as pilot:
        await pilot.pause()
        assert _screen(whole) == expected
    streamed = _Chat()
    async with streamed.run_test(size=size) as pilot:
        view = streamed.query_one(MessageView)
        out = MarkdownOutput(view)
        for i in range(0, len(REPLY), 120):
            await out.write([TokenChunk(REPLY[i : i + 120], (1,))])
            await pilot.pause()
        await out.stop()
        await pilot.pause()
        fence = view.query_one(PiecedFence)
        assert len(fence.query_children(Label)) == len(pieces(CODE.rstrip()))
        assert _screen(streamed) == expected


@pytest.mark.asyncio
async def test_a_take_highlights_the_growing_piece_not_the_whole_block() -> None:
    app = _Chat()
    async with app.run_test(size=(100, 40)) as pilot:
        view = app.query_one(MessageView)
        out = MarkdownOutput(view)
        with _counted_lines() as asked:
            for i in range(0, len(REPLY), 120):
                before = len(asked)
                await out.write([TokenChunk(REPLY[i : i + 120], (1,))])
                await pilot.pause()
                fence = view.query(PiecedFence)
                if fence:  # what the pieces show is the code so far
                    shown = [str(label.content) for label in fence.first().query_children(Label)]
                    assert "\n".join(shown) == fence.first().code
                # A take colours the piece that grew (and one it opened): never the block.
                assert sum(asked[before:]) <= 2 * PIECE_LINES, asked[before:]
            takes = len(asked)
            await out.stop()
        # The reply's end colours the block once, whole.
        assert len(asked) == takes + 1 and asked[-1] == CODE.rstrip().count("\n") + 1
