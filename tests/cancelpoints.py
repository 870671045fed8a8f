"""Cancelling at a chosen point, without timing: an event whose `is_set` is a predicate."""

from __future__ import annotations

import threading
from collections.abc import Callable


class SetWhen(threading.Event):
    """An event that reads as set once `predicate` holds: cancellation at a chosen point, no timing."""

    def __init__(self, predicate: Callable[[], bool]) -> None:
        super().__init__()
        self.predicate = predicate

    def is_set(self) -> bool:
        return self.predicate()
