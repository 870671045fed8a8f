"""Python's full garbage collections kept out of the decode loop.

A full collection walks every container object the process holds. With llama-cpp-python
imported (its ctypes prototypes and structures) one takes 30-40 ms on 2 AVX2 cores here
(`import llama_cpp; gc.collect()`: 33 ms over 33,000 objects; 4 ms for 40,000 plain dicts),
and CPython starts one whenever enough objects have outlived the younger collections: on an
H200's host one fell between two tokens of a reply, a 16-21 ms stall where a 32B-shaped
target's step takes 13 ms (docs/benchmarks.md, session 33). What an engine loads lives as long
as the engine, and what a request allocates is freed by reference counting (a closed engine
is too: tests/test_heap.py), so once an engine has loaded, what is alive is frozen
(gc.freeze): later collections walk only what came after. When an engine closes, everything is
unfrozen, collected and frozen again, so nothing that became garbage since stays uncollected.
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
