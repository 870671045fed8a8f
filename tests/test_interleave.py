"""A long reply pauses for a short request queued behind it, and goes on as if it had not.

The engine against real llama.cpp on the tiny endless target (replies run to their limit), in
exact loading, where any change to the long reply's cache would show as other tokens.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from test_engine import TINY, make_engine

from localspec.engine import interleave, worker
from localspec.engine.config import EXACT_POSITIONS, EngineConfig, LoadOptions
from localspec.engine.drafters.base import Drafter, common_prefix
from localspec.engine.handle import Event, Handle
from localspec.engine.interleave import (
    SHORT_MAX_TOKENS,
    SHORT_PROMPT_CHARS,
    Turns,
    is_short,
    take_first,
    waiting,
)
from localspec.engine.llama import LlamaModel
from localspec.engine.speculative import FixedPolicy, Generation, StepContext
from localspec.engine.worker import Engine
from localspec.errors import LocalspecError
from localspec.types import (
    ChatMessage,
    FileChunk,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    SpecParams,
    TokenChunk,
)

LONG = 900


@pytest.fixture
def endless(tiny_endless: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    """The endless target with itself as the draft (every draft right); replies may pause at once."""
    monkeypatch.setattr(interleave, "MIN_RUN_S", 0.0)
    with make_engine(tiny_endless, tiny_endless) as engine:
        yield engine


def long_request(method: str = "none") -> GenerationRequest:
    return GenerationRequest(prompt="the model is", max_tokens=LONG, speculative=SpecParams(method, 4))  # type: ignore[arg-type]


def short_request(method: str = "none") -> GenerationRequest:
    """A completion of a few tokens, as an editor asks for (the tiny model has no FIM tokens)."""
    return GenerationRequest(prompt="def f(a):\n    ", max_tokens=24, speculative=SpecParams(method, 4))  # type: ignore[arg-type]


def finished_at(handle: Handle, when: dict[str, float], name: str) -> threading.Thread:
    def wait() -> None:
        handle.wait()
        when[name] = time.monotonic()

    thread = threading.Thread(target=wait)
    thread.start()
    return thread


@pytest.mark.parametrize("method", ["none", "draft", "auto"])
def test_a_short_request_runs_while_a_long_reply_pauses_and_nothing_changes(
    endless: Engine, method: str
) -> None:
    alone_long = endless.generate(long_request(method))
    alone_short = endless.generate(short_request(method))
    assert alone_long.stats.tokens == LONG  # long enough for the short one to arrive while it runs

    when: dict[str, float] = {"submitted": time.monotonic()}
    long = endless.submit(long_request(method))
    long.next_event()  # the long reply runs: its first chunk is out
    short = endless.submit(short_request(method))
    waiter = finished_at(short, when, "short")
    list(long)
    when["long"] = time.monotonic()
    waiter.join(60)
    assert long.result is not None and short.result is not None
    assert when["short"] < when["long"]  # without the pause it would have waited for the whole reply
    # The long reply is the one it wrote alone, token for token; so is the short one.
    assert long.result.token_ids == alone_long.token_ids
    assert short.result.token_ids == alone_short.token_ids
    # The pause, the short request's whole run within it, is not counted as the long reply's time.
    assert long.result.stats.elapsed_s + short.result.stats.elapsed_s <= when["long"] - when["submitted"]


def other_long(method: str = "none") -> GenerationRequest:
    """A second long reply, to another prompt (another conversation, another client)."""
    return GenerationRequest(prompt="a value of the", max_tokens=LONG, speculative=SpecParams(method, 4))  # type: ignore[arg-type]


@pytest.fixture
def put_order(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Handle, Event]]:
    """Every event the engine puts on any handle, in the order it puts them."""
    order: list[tuple[Handle, Event]] = []
    put = Handle.put

    def recorded(handle: Handle, event: Event) -> None:
        order.append((handle, event))
        put(handle, event)

    monkeypatch.setattr(Handle, "put", recorded)
    return order


def first_chunk(order: list[tuple[Handle, Event]], handle: Handle) -> int:
    return next(i for i, (h, e) in enumerate(order) if h is handle and isinstance(e, TokenChunk))


def end(order: list[tuple[Handle, Event]], handle: Handle) -> int:
    return next(i for i, (h, e) in enumerate(order) if h is handle and not isinstance(e, TokenChunk))


@pytest.mark.parametrize("method", ["none", "draft", "auto"])
def test_two_long_replies_take_turns_and_each_is_the_one_written_alone(
    endless: Engine, monkeypatch: pytest.MonkeyPatch, put_order: list[tuple[Handle, Event]], method: str
) -> None:
    """A chat's reply no longer waits for an agent's whole edit: the two take turns, each one's
    caches saved and loaded back between them, and each writes what it writes alone."""
    monkeypatch.setattr(interleave, "LONG_TURN_S", 0.0)
    alone_first, alone_second = endless.generate(long_request(method)), endless.generate(other_long(method))
    put_order.clear()
    first = endless.submit(long_request(method))
    first.next_event()
    second = endless.submit(other_long(method))
    first.wait()
    second.wait()
    assert first.result is not None and second.result is not None
    assert first.result.token_ids == alone_first.token_ids
    assert second.result.token_ids == alone_second.token_ids
    # The second streamed before the first ended, and the first went on after the second began.
    assert first_chunk(put_order, second) < end(put_order, first)
    later = [i for i, (h, e) in enumerate(put_order) if h is first and isinstance(e, TokenChunk)]
    assert later[-1] > first_chunk(put_order, second)


def test_at_most_max_tasks_replies_are_part_way(
    endless: Engine, monkeypatch: pytest.MonkeyPatch, put_order: list[tuple[Handle, Event]]
) -> None:
    """Each reply part-way holds its saved caches in memory: past MAX_TASKS, a reply waits its turn
    in the queue until one ends."""
    monkeypatch.setattr(interleave, "LONG_TURN_S", 0.0)
    monkeypatch.setattr(interleave, "MAX_TASKS", 2)
    a = endless.submit(long_request())
    a.next_event()
    b, c = endless.submit(other_long()), endless.submit(long_request())
    for handle in (a, b, c):
        handle.wait()
    assert first_chunk(put_order, b) < end(put_order, a)  # two at once
    assert first_chunk(put_order, c) > min(end(put_order, a), end(put_order, b))  # not three
    assert a.result is not None and c.result is not None and c.result.token_ids == a.result.token_ids


def test_a_reply_cancelled_while_parked_ends_and_the_other_goes_on(
    endless: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(interleave, "LONG_TURN_S", 0.0)
    alone = endless.generate(long_request())
    first = endless.submit(long_request())
    first.next_event()
    second = endless.submit(other_long())
    second.next_event()  # it runs (and so the first is parked, or soon will be)
    second.cancel()
    ended = second.wait()
    assert ended.finish_reason == "cancelled" and ended.stats.tokens < LONG
    assert first.wait().token_ids == alone.token_ids


def test_closing_the_engine_ends_every_reply_part_way(
    tiny_endless: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(interleave, "MIN_RUN_S", 0.0)
    monkeypatch.setattr(interleave, "LONG_TURN_S", 0.0)
    engine = make_engine(tiny_endless)
    first = engine.submit(long_request())
    first.next_event()
    second = engine.submit(other_long())
    second.next_event()
    engine.close()  # returns once both have ended: nothing left parked
    assert first.wait().stats.tokens == LONG and second.wait().stats.tokens == LONG


def test_short_requests_come_in_turns_with_the_long_reply(endless: Engine) -> None:
    """A stream of short requests never starves the long reply: it runs as long as each pause."""
    alone = endless.generate(long_request())
    long = endless.submit(long_request())
    long.next_event()
    shorts = [endless.submit(short_request()) for _ in range(6)]
    chunks = list(long)
    assert long.result is not None and long.result.token_ids == alone.token_ids
    for handle in shorts:
        result = handle.wait()
        assert result.stats.tokens > 0
    assert chunks


READ_BATCH = 32  # llama.cpp's chunk in the read tests: a long prompt is many of them
LONG_PROMPT = " ".join(f"line {i} of the file" for i in range(80))  # a few hundred tokens


def slow_reads(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Each chunk of a prompt read takes 50 ms more, as a long prompt's do on a CPU; the event is
    set once one is read (steps, of a few tokens, are left alone)."""
    reading = threading.Event()
    fill = LlamaModel._fill_batch

    def slowly(model: LlamaModel, chunk: Sequence[int], offset: int, first_logit: int) -> None:
        if len(chunk) >= READ_BATCH:
            reading.set()
            time.sleep(0.05)
        fill(model, chunk, offset, first_logit)

    monkeypatch.setattr(LlamaModel, "_fill_batch", slowly)
    return reading


@pytest.mark.parametrize(
    ("load", "short_prompt"),
    [
        (replace(TINY, n_batch=READ_BATCH), "def f(a):\n    "),
        # Fast loading with the plain copy reading prompts, and a short request long enough to be
        # read by the copy too: the paused read's positions must come back from the model's cache.
        (LoadOptions(n_ctx=1024, n_threads=1, n_batch=READ_BATCH, plain_prefill=True), LONG_PROMPT[:300]),
    ],
    ids=["exact", "plain copy"],
)
# A short request with a long prompt (a chat front end's title for a long conversation) pauses for
# another short one too.
@pytest.mark.parametrize("long_tokens", [SHORT_MAX_TOKENS + 1, 64], ids=["long", "short"])
def test_a_short_request_runs_while_a_long_prompt_is_read(
    tiny_endless: Path,
    monkeypatch: pytest.MonkeyPatch,
    load: LoadOptions,
    short_prompt: str,
    long_tokens: int,
) -> None:
    """An agent's long prompt takes a minute to read on a CPU: a completion sent meanwhile runs
    between two of its chunks, not after the whole read, and the long reply is unchanged."""
    monkeypatch.setattr(interleave, "MIN_RUN_S", 0.0)
    long_req = GenerationRequest(prompt=LONG_PROMPT, max_tokens=long_tokens, cache_prompt=False)
    short_req = GenerationRequest(prompt=short_prompt, max_tokens=8, cache_prompt=False)
    with make_engine(tiny_endless, load=load) as engine:
        alone_long, alone_short = engine.generate(long_req), engine.generate(short_req)
        assert alone_long.stats.prompt_tokens > 8 * READ_BATCH
        reading = slow_reads(monkeypatch)
        submitted = time.monotonic()
        long = engine.submit(long_req)
        assert reading.wait(30)
        short = engine.submit(short_req)
        first = long.next_event()
        first_at = time.monotonic()
        # By the long reply's first token, the short request has run to its end.
        short_result = short.take()[-1]
        assert isinstance(first, TokenChunk) and isinstance(short_result, GenerationResult)
        list(long)
    assert long.result is not None and long.result.token_ids == alone_long.token_ids
    assert short_result.token_ids == alone_short.token_ids
    # The pause is not the long reply's time to first token, though its client waited.
    assert long.result.stats.ttft_s + short_result.stats.elapsed_s <= first_at - submitted


def test_without_room_for_the_copies_nothing_takes_a_turn(
    endless: Engine, monkeypatch: pytest.MonkeyPatch, put_order: list[tuple[Handle, Event]]
) -> None:
    """A turn saves the running reply's caches in memory: where the machine has no room for them,
    the reply runs on and what waits behind it waits for its end."""
    monkeypatch.setattr(interleave, "LONG_TURN_S", 0.0)
    asked: list[int] = []

    def no_room(size: int) -> bool:
        asked.append(size)
        return False

    monkeypatch.setattr(worker, "room_for", no_room)
    long = endless.submit(long_request())
    long.next_event()
    short, other = endless.submit(short_request()), endless.submit(other_long())
    for handle in (long, short, other):
        handle.wait()
    assert asked and all(size > 0 for size in asked)  # asked with what the copies would take
    assert end(put_order, long) < min(first_chunk(put_order, short), first_chunk(put_order, other))


def test_a_short_request_does_not_pause_for_a_long_one(
    tiny_endless: Path, monkeypatch: pytest.MonkeyPatch, put_order: list[tuple[Handle, Event]]
) -> None:
    """A short request ends soon: a reply that comes while it reads its prompt waits for its end."""
    monkeypatch.setattr(interleave, "MIN_RUN_S", 0.0)
    monkeypatch.setattr(interleave, "LONG_TURN_S", 0.0)
    with make_engine(tiny_endless, load=replace(TINY, n_batch=READ_BATCH)) as engine:
        reading = slow_reads(monkeypatch)
        short = engine.submit(GenerationRequest(prompt=LONG_PROMPT, max_tokens=16, cache_prompt=False))
        assert reading.wait(30)
        long = engine.submit(other_long())
        short.wait()
        long.wait()
    assert end(put_order, short) < first_chunk(put_order, long)


def test_is_short() -> None:
    assert is_short(GenerationRequest(prompt="x", max_tokens=SHORT_MAX_TOKENS))
    assert not is_short(GenerationRequest(prompt="x", max_tokens=SHORT_MAX_TOKENS + 1))
    # Fill-in-the-middle is short whatever it asks for; a long text is not, whatever it asks for.
    assert is_short(GenerationRequest(prompt="x", suffix="y", max_tokens=4096))
    big = "x" * (SHORT_PROMPT_CHARS + 1)
    assert not is_short(GenerationRequest(prompt=big, max_tokens=8))
    assert not is_short(GenerationRequest(messages=(ChatMessage("user", big),), max_tokens=8))
    chunk = FileChunk(filename="a.py", text=big)
    assert not is_short(GenerationRequest(prompt="x", suffix="y", extra=(chunk,), max_tokens=8))
    assert not is_short(GenerationRequest(prompt_ids=tuple(range(SHORT_PROMPT_CHARS // 4 + 1)), max_tokens=8))


def test_turns_give_the_long_reply_as_long_as_the_last_short_request() -> None:
    now = [100.0]
    turns = Turns(clock=lambda: now[0])
    assert not turns.due()
    now[0] += interleave.MIN_RUN_S
    assert turns.due() and not turns.due(long=True)
    now[0] += interleave.LONG_TURN_S
    assert turns.due(long=True)
    turns.resumed(last_short=5.0)  # a short request ran 5 s: the reply runs as long before the next
    now[0] += 4.9
    assert not turns.due()
    now[0] += 0.1
    assert turns.due()
    turns.resumed(last_short=5.0)  # another reply's turn does not grow with the short one's
    now[0] += interleave.LONG_TURN_S
    assert turns.due(long=True) and not turns.due()


def test_take_first_takes_the_first_wanted_and_keeps_the_order() -> None:
    jobs: queue.Queue[int | None] = queue.Queue(maxsize=4)
    for job in (1, 2, 3, None):
        jobs.put(job)
    assert waiting(jobs, lambda job: job == 2) and not waiting(jobs, lambda job: job > 3)
    assert jobs.qsize() == 4  # only read
    assert take_first(jobs, lambda j: j % 2 == 0) == 2
    assert take_first(jobs, lambda j: j > 5) is None
    assert [jobs.get() for _ in range(3)] == [1, 3, None]


class _Recording(FixedPolicy):
    """Plain decoding that records the calls a policy gets."""

    def __init__(self) -> None:
        super().__init__(None, 0)
        self.calls: list[str] = []

    def choose(self, ctx: StepContext) -> tuple[Drafter | None, int]:
        self.calls.append("choose")
        return super().choose(ctx)

    def pause(self, tokens: Sequence[int]) -> None:
        self.calls.append("pause")


def test_a_pause_closes_the_policys_step_and_is_not_the_replys_time(tiny: LlamaModel) -> None:
    """auto learns a step's cost from its wall time, up to the next choice: a pause left inside it
    would be learnt as a step seconds long, by the engine's costs, for every later request."""
    policy = _Recording()
    prompt = tiny.tokenize("the model is")
    gen = Generation(
        tiny, prompt, max_tokens=40, params=SamplingParams(), stop=(), policy=policy, method="none", k=0
    )
    start = time.perf_counter()
    for i, _ in enumerate(gen.run()):
        if i == 5:
            with gen.paused():
                assert policy.calls[-1] == "pause"  # closed before the pause, not after it
                time.sleep(0.3)
    wall = time.perf_counter() - start
    assert policy.calls.count("pause") == 1 and policy.calls[-1] == "choose"
    assert gen.result is not None
    assert gen.result.stats.elapsed_s <= wall - 0.3


def test_a_short_requests_cache_is_kept_for_the_next_one(
    tiny_endless: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The long reply's cache goes back over the short request's: the short one's is saved first, so
    an editor's next completion (most of its prompt the same) reads only what changed."""
    monkeypatch.setattr(interleave, "MIN_RUN_S", 0.0)
    config = EngineConfig(target=tiny_endless, load=TINY, ngram_memory_tokens=0, prompt_cache_bytes=64 << 20)
    context = " ".join(f"line {i} of the file" for i in range(80))  # a few hundred tokens
    with Engine(config) as engine:
        engine.wait_ready()
        when: dict[str, float] = {}
        long = engine.submit(long_request())
        long.next_event()
        first = engine.submit(GenerationRequest(prompt=context + " one", max_tokens=8))
        waiter = finished_at(first, when, "first")
        waiter.join(60)
        second = engine.generate(GenerationRequest(prompt=context + " two", max_tokens=8))
        list(long)
        when["long"] = time.monotonic()
    assert first.result is not None and when["first"] < when["long"]  # it ran in a pause
    read = first.result.stats.prompt_tokens
    assert read > 256 and second.stats.cached_tokens >= read - 2


def test_a_cache_llama_cpp_will_not_load_back_is_read_again(
    endless: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone = endless.generate(long_request())
    target = endless._target
    assert target is not None

    refused: list[int] = []

    def refuse(state: object, n_past: int) -> None:
        refused.append(n_past)
        raise LocalspecError("llama.cpp could not load a saved prompt cache")

    monkeypatch.setattr(target, "load_state", refuse)
    long = endless.submit(long_request())
    written = 0
    while written <= EXACT_POSITIONS + 64:  # past where exact batches round otherwise: read again
        event = long.next_event()  # exactly as written, one token at a time
        assert isinstance(event, TokenChunk)
        written += len(event.token_ids)
    short = endless.submit(short_request())
    list(long)
    assert short.wait().stats.tokens > 0
    assert refused  # the reply paused, and its cache was read again instead
    assert long.result is not None and long.result.token_ids == alone.token_ids


@pytest.mark.parametrize(
    "load",
    [
        replace(TINY, n_batch=READ_BATCH),
        # The plain copy reads the prompts: what one read is taken over by the other from the model.
        LoadOptions(n_ctx=1024, n_threads=1, n_batch=READ_BATCH, plain_prefill=True),
    ],
    ids=["exact", "plain copy"],
)
def test_replies_whose_prompts_share_their_start_read_it_once(
    tiny_endless: Path, monkeypatch: pytest.MonkeyPatch, load: LoadOptions
) -> None:
    """Parallel agents' requests share a system prompt and tools of thousands of tokens: where two
    take turns while their prompts are read, each reads on from what the other read of their
    common start, and each reply is the one written alone."""
    monkeypatch.setattr(interleave, "MIN_RUN_S", 0.0)
    monkeypatch.setattr(interleave, "LONG_TURN_S", 0.0)
    reqs = [
        GenerationRequest(prompt=LONG_PROMPT + ending, max_tokens=SHORT_MAX_TOKENS + 1)
        for ending in (" the model is", " a value of the")
    ]
    with make_engine(tiny_endless, load=load) as engine:
        alone = [engine.generate(replace(req, cache_prompt=False)) for req in reqs]
        engine.generate(GenerationRequest(prompt="x", max_tokens=1))  # the cache shares nothing now
        reading = slow_reads(monkeypatch)
        first = engine.submit(reqs[0])
        assert reading.wait(30)
        second = engine.submit(reqs[1])
        results = [first.wait(), second.wait()]
    assert [r.token_ids for r in results] == [r.token_ids for r in alone]
    prompts = [r.prompt_ids for r in alone]
    shared = common_prefix(*prompts)
    assert shared > 8 * READ_BATCH
    read = sum(r.stats.prompt_tokens - r.stats.cached_tokens for r in results)
    # The common start read once (give or take a chunk each), then each its own ending.
    assert read <= sum(len(p) for p in prompts) - shared + 2 * READ_BATCH, (read, shared)
    assert all(r.stats.cached_tokens > 0 for r in results)  # each took some of the other's reading
