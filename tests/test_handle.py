"""A request's Handle between the engine's thread and its reader: who wakes the reader, and when."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import pytest

from localspec.engine.handle import Event, Handle
from localspec.errors import LocalspecError
from localspec.types import GenerationRequest, GenerationResult, GenerationStats, TokenChunk

WAIT_S = 10.0  # how long a test waits for something that must happen: far past any scheduling delay


def _handle() -> Handle:
    return Handle(GenerationRequest(prompt="hi"))


def _result() -> GenerationResult:
    return GenerationResult("ab", (1, 2), "stop", GenerationStats(method="none"))


def _in_thread(work: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    thread.start()
    return thread, out


def test_take_hands_over_every_event_so_far_in_order() -> None:
    handle = _handle()
    sent: list[Event] = [TokenChunk("a", (1,)), TokenChunk("b", (2,)), _result()]
    for event in sent:
        handle.put(event)
    assert handle.take() == sent


def test_a_reader_waiting_for_anything_is_woken_by_the_first_chunk() -> None:
    handle = _handle()
    thread, out = _in_thread(handle.take)
    time.sleep(0.05)  # let it wait
    assert thread.is_alive()
    handle.put(TokenChunk("a", (1,)))
    thread.join(WAIT_S)
    assert not thread.is_alive() and out == [[TokenChunk("a", (1,))]]


def test_chunks_do_not_cut_a_gather_short_and_the_end_does() -> None:
    handle = _handle()
    thread, _ = _in_thread(lambda: handle.gather(60.0))
    time.sleep(0.05)
    for i in range(5):
        handle.put(TokenChunk(str(i), (i,)))
    time.sleep(0.1)
    assert thread.is_alive(), "a chunk woke the gathering reader"
    handle.put(_result())
    thread.join(WAIT_S)
    assert not thread.is_alive(), "the result did not end the gather"
    events = handle.take()
    assert [e.text for e in events if isinstance(e, TokenChunk)] == ["0", "1", "2", "3", "4"]
    assert isinstance(events[-1], GenerationResult)


@pytest.mark.parametrize("end", [_result(), LocalspecError("the draft failed")], ids=["result", "error"])
def test_a_gather_ends_at_once_when_the_end_is_already_there(end: Event) -> None:
    handle = _handle()
    handle.put(TokenChunk("a", (1,)))
    handle.put(end)
    thread, _ = _in_thread(lambda: handle.gather(60.0))
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_a_gather_with_nothing_coming_ends_after_its_interval() -> None:
    handle = _handle()
    thread, _ = _in_thread(lambda: handle.gather(0.05))
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_next_event_reads_one_at_a_time_and_times_out() -> None:
    handle = _handle()
    with pytest.raises(queue.Empty):
        handle.next_event(timeout=0.01)
    handle.put(TokenChunk("a", (1,)))
    handle.put(_result())
    assert handle.next_event() == TokenChunk("a", (1,))
    assert isinstance(handle.next_event(), GenerationResult)


def test_iterating_yields_the_chunks_and_keeps_the_result() -> None:
    handle = _handle()
    thread, out = _in_thread(lambda: list(handle))
    handle.put(TokenChunk("a", (1,)))
    handle.put(TokenChunk("b", (2,)))
    handle.put(_result())
    thread.join(WAIT_S)
    assert out == [[TokenChunk("a", (1,)), TokenChunk("b", (2,))]]
    assert handle.result is not None and handle.result.text == "ab"
