"""Python's full garbage collections kept out of the decode loop.

A full collection walks every container object the process holds. With llama-cpp-python
imported (its ctypes prototypes and structures) one takes 30-40 ms on 2 AVX2 cores here
(`import llama_cpp; gc.collect()`: 33 ms over 33,000 objects; 4 ms for 40,000 plain dicts),
and CPython starts one whenever enough objects have outlived the younger collections, between
any two tokens: on an H200's host a 16-21 ms stall of that size (most likely one) fell inside a
reply whose steps took 13 ms (a 32B-shaped target; docs/benchmarks.md, session 33).

What an engine loads lives as long as the engine, and what a request leaves behind is young,
freed by the young collections. So once an engine has loaded, what is alive is frozen
(gc.freeze): later collections walk only what came after. A closed engine is still freed, as
nothing it loaded is in a reference cycle (tests/test_heap.py); and when one closes, everything
is unfrozen, collected and frozen again, so what became garbage while frozen (a request in
flight on another engine during a load) goes then.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()


def settle() -> None:
    """After a load: collect what is garbage now, then leave the survivors out of later collections."""
    with _lock:
        gc.collect()
        gc.freeze()


def refresh() -> None:
    """After an unload: collect everything, frozen objects included, and freeze the survivors again."""
    with _lock:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
