"""Chunks handed from the streaming thread to the UI, coalesced so the UI never falls behind.

A tiny model streams thousands of chunks a second; one Textual message each
would queue faster than the screen redraws, and keys (Esc) would wait behind
them. The thread appends here and posts a message only when none is pending;
the UI takes everything that has arrived in one go.
"""

from __future__ import annotations

import threading

from localspec.types import TokenChunk


class ChunkBuffer:
    """Thread-safe: `put` from the worker thread, `take` on the UI's event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[TokenChunk, float]] = []
        self._pending = False

    def put(self, chunk: TokenChunk, at: float) -> bool:
        """Add a chunk that arrived at `at`; True when the caller should tell the UI."""
        with self._lock:
            self._items.append((chunk, at))
            if self._pending:
                return False
            self._pending = True
            return True

    def take(self) -> list[tuple[TokenChunk, float]]:
        """Everything since the last take; the next put tells the UI again."""
        with self._lock:
            items, self._items = self._items, []
            self._pending = False
            return items
