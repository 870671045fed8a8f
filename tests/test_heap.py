"""The engine keeps Python's full collections out of the decode loop (localspec.engine.heap)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.worker import Engine
from localspec.types import GenerationRequest, SpecParams


class Cycle:
    """An object that only the cycle collector can free."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    # Freezing is process-wide: whatever a test leaves frozen, the next one starts without it.
    yield
    gc.unfreeze()


def config(target: Path, draft: Path | None = None) -> EngineConfig:
    return EngineConfig(target=target, draft=draft, load=LoadOptions(n_ctx=512, n_threads=2))


def test_what_was_alive_when_an_engine_loaded_is_left_out_of_later_collections(tiny_target: Path) -> None:
    before = Cycle()
    with Engine(config(tiny_target)) as engine:
        engine.wait_ready()
        assert gc.is_tracked(before) and gc.get_freeze_count() > 0
        assert not any(o is before for o in gc.get_objects())
        after = Cycle()
        assert any(o is after for o in gc.get_objects())


def test_a_closed_engine_is_freed_though_what_it_loaded_was_frozen(
    tiny_target: Path, tiny_perfect_draft: Path
) -> None:
    # Its close freezes it again while its caller still holds it: what it loaded must then go by
    # reference counting or by collections that skip frozen objects, not stay for the process's life.
    engine = Engine(config(tiny_target, tiny_perfect_draft))
    engine.wait_ready()
    for method in ("auto", "draft", "ngram"):
        request = GenerationRequest(
            (), prompt="one two three", max_tokens=8, speculative=SpecParams(method=method)
        )
        engine.generate(request)
    alive = weakref.ref(engine), weakref.ref(engine._target), weakref.ref(engine._model_drafter())
    engine.close()
    assert gc.get_freeze_count() > 0
    del engine
    gc.collect()
    assert [ref() is None for ref in alive] == [True, True, True]


def test_garbage_frozen_at_a_load_is_collected_when_an_engine_closes(tiny_target: Path) -> None:
    cycle = Cycle()
    gone = weakref.ref(cycle)
    engine = Engine(config(tiny_target))
    engine.wait_ready()
    del cycle
    gc.collect()
    assert gone() is not None  # frozen: no collection walks it
    engine.close()
    assert gone() is None
