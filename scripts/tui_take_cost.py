"""What a take of a streamed reply costs the chat's view, as its code block grows: Textual's own
fence against the pieced one (tui/widgets/code_fence.py), headless, in Textual's pilot.

    .venv/bin/python scripts/tui_take_cost.py --lines 300 --take 80

Streams a reply of one code block of --lines lines into a MessageView, --take characters a take
(about 20 tokens), and prints each fence's CPU a take (the take and the redraw after it): the median,
the last tenth's, and the whole reply's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Markdown

from tui.widgets.message_view import MessageView


def reply(lines: int) -> str:
    body = "".join(
        f"    def method_{i}(self, value: int) -> int:\n        return value * {i} + self.offset  # {i}\n"
        for i in range(max(1, lines // 2))
    )
    return f"Here is the module:\n\n```python\nclass Tree:\n{body}```\n\nThat is all.\n"


class _View(App[None]):
    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield MessageView("assistant")


async def takes(text: str, take: int, size: tuple[int, int]) -> list[float]:
    """CPU seconds of each take, its redraw included."""
    app = _View()
    costs: list[float] = []
    async with app.run_test(size=size) as pilot:
        stream = Markdown.get_stream(app.query_one(MessageView))
        for i in range(0, len(text), take):
            began = time.process_time()
            await stream.write(text[i : i + take])
            await pilot.pause()
            costs.append(time.process_time() - began)
        await stream.stop()
    return costs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=300)
    ap.add_argument("--take", type=int, default=80, help="characters a take")
    ap.add_argument("--size", default="120x35", help="the terminal, columns x rows")
    args = ap.parse_args()
    cols, rows = (int(n) for n in args.size.split("x"))
    text = reply(args.lines)
    pieced = MessageView.BLOCKS
    for name, blocks in (("textual's fence", Markdown.BLOCKS), ("pieced fence", pieced)):
        MessageView.BLOCKS = blocks
        costs = asyncio.run(takes(text, args.take, (cols, rows)))
        tail = costs[-max(1, len(costs) // 10) :]
        print(
            f"{name:<16} {len(costs)} takes: median {statistics.median(costs) * 1e3:.1f} ms, "
            f"last tenth {statistics.median(tail) * 1e3:.1f} ms, whole reply {sum(costs):.2f} s of CPU"
        )
    MessageView.BLOCKS = pieced


if __name__ == "__main__":
    main()
