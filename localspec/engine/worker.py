"""The engine: one worker thread owns the llama.cpp models; everyone else talks to it through a queue.

`Engine.submit()` returns a `Handle` (engine.handle) at once; its events (text chunks, then the
result or an error) arrive as the worker produces them. Requests run in arrival order, a short one
taking a turn while a long reply pauses (engine.interleave); which drafter each runs with, and why,
is engine.methods'. A full queue is refused with OverloadedError rather than letting latency grow
without bound. No request can take the worker down: each failure is delivered to that request's
handle only.
"""

from __future__ import annotations

import functools
import logging
import queue
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from localspec.engine import heap, interleave
from localspec.engine.config import EngineConfig
from localspec.engine.drafters.base import common_prefix
from localspec.engine.drafters.model import ModelDrafter
from localspec.engine.drafters.ngram import NgramMemory
from localspec.engine.handle import Handle
from localspec.engine.interleave import Turns, is_short, take_first, waiting
from localspec.engine.llama import LlamaModel, check_gguf_file, gpu_offload_supported
from localspec.engine.methods import Methods
from localspec.engine.prefill import attach_plain_prefill
from localspec.engine.promptcache import PromptCache, Saved, draft_holding, state_bytes
from localspec.engine.prompting import (
    chat_template,
    checked_ids,
    cut_to_context,
    prediction_matched,
    prompt_tokens,
    rendered_chat,
)
from localspec.engine.reasoning import StreamSplit
from localspec.engine.shaping import Shaping
from localspec.engine.speculative import Generation
from localspec.engine.templating import ChatTemplate, TemplateRenderer
from localspec.engine.tooluse import ToolCallFilter, request_tool_format
from localspec.errors import ContextOverflowError, LocalspecError, OverloadedError
from localspec.process.memory import room_for
from localspec.types import (
    GenerationRequest,
    GenerationResult,
    TokenChunk,
    TokenLogprob,
    callable_names,
)

log = logging.getLogger("localspec.engine")

Status = Literal["loading", "ready", "failed", "closed"]
ProgressFn = Callable[[str, float], None]


@dataclass
class EngineInfo:
    status: Status = "loading"
    target: str = ""
    draft: str | None = None
    n_ctx: int = 0
    gpu_offload: bool = False
    # Whether prompts are read by a plain (not repacked) copy of the weights (engine.prefill).
    plain_prefill: bool = False
    methods: list[str] = field(default_factory=list)
    # Saved conversations' caches (engine.promptcache): how many, and the bytes they take.
    saved_prompts: int = 0
    saved_prompt_bytes: int = 0
    # What the plain prefill copy's context grew by past the memory plan's count (read longer prompts).
    prefill_grown_bytes: int = 0
    draft_error: str | None = None
    error: str | None = None


@dataclass
class _Task:
    """A request the worker runs in turns with others (engine.interleave): its steps, a generator
    that stops where it may hand the model over, and its caches while another request runs."""

    job: Handle
    short: bool  # pauses only for another short request (interleave.is_short)
    started: float = field(default_factory=time.monotonic)
    turns: Turns = field(default_factory=Turns)
    steps: Iterator[None] = field(default_factory=lambda: iter(()))
    gen: Generation | None = None
    parked_at: float = 0.0  # when its caches were saved for another's turn; 0: running or not started
    n_past: int = 0
    state: object = None
    draft: ModelDrafter | None = None  # the draft model whose cache was saved with it
    drafted: Saved | None = None


_ENDED = object()


def _any(job: Handle) -> bool:
    """Any request waiting (take_first and waiting skip the queue's closing None themselves)."""
    return True


def _read_ahead(task: _Task, live: Sequence[int]) -> int:
    """Where `task`, paused while it read its prompt, may go on from the live cache (holding `live`)
    instead of its own: the positions of its prompt `live` holds, where they are all it had read or
    more (its last token always read, for its logits); 0 where its own cache must come back."""
    gen = task.gen
    if gen is None or not task.job.request.cache_prompt or task.n_past >= len(gen.prompt):
        return 0
    shared = min(common_prefix(live, gen.prompt), len(gen.prompt) - 1)
    return shared if shared >= task.n_past else 0


def _read_again(target: LlamaModel, tokens: Sequence[int], prompt_len: int) -> None:
    """Decode a paused reply's `tokens` into the emptied cache (the pause's cost, not the reply's):
    its prompt in a batch, as it was read; exact, its reply one token at a time, as its verifies
    round (a batch past EXACT_POSITIONS rounds otherwise, and the reply would go on differently)."""
    target.reset()
    target.decode(tokens[:prompt_len], 1)
    reply = tokens[prompt_len:]
    if not target.exact:
        if reply:
            target.decode(reply, 1)
        return
    for token in reply:
        target.decode([token], 1)


def _short(job: Handle) -> bool:
    """Whether `job` may run while a long reply pauses for it (engine.interleave)."""
    return is_short(job.request)


def _on_a_thread_of_its_own(work: Callable[[], None]) -> None:
    """Run `work` on a new thread that ends with it; re-raise what it raised.

    llama.cpp's CPU backend here is built with OpenMP, and libgomp keeps a team of threads for each
    thread that has run parallel work until that thread ends. Once the teams outnumber the CPUs,
    every team's threads stop spinning at each barrier and sleep: a 1.5B's one-token steps took 88
    ms instead of 60-62 on 2 vCPUs while a second engine, idle, was loaded in the same process
    (docs/benchmarks.md, session 27). An engine waiting for its next request must hold no team.
    """
    raised: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the caller's thread
            raised.append(exc)

    thread = threading.Thread(target=run, name="localspec-engine-run", daemon=True)
    thread.start()
    thread.join()
    if raised:
        raise raised[0]


class Engine:
    """Owns the models; one thread runs its requests, in turns (engine.interleave). Use as a context
    manager or call close()."""

    def __init__(self, config: EngineConfig, progress: ProgressFn | None = None) -> None:
        self.config = config
        self.info = EngineInfo(target=config.target.name, draft=config.draft.name if config.draft else None)
        self._progress = progress
        self._jobs: queue.Queue[Handle | None] = queue.Queue(maxsize=config.queue_size)
        self._ready = threading.Event()
        self._target: LlamaModel | None = None
        self._kv_tokens: list[int] = []  # what the target's KV cache holds, position by position
        # The KV cache is a reply's that took a turn (engine.interleave), saved with it: a request
        # may read on from what it shares, but the prompt cache has nothing to save of it.
        self._kv_parked = False
        # Earlier conversations' caches, saved where a request dropped them (engine.promptcache).
        self._prompt_cache = PromptCache(config.prompt_cache_bytes)
        # The last scored prompt: its tokens, alternatives asked for, and entries (Generation's `scored`).
        self._scored: tuple[tuple[int, ...], int, tuple[TokenLogprob, ...]] | None = None
        self._methods: Methods | None = None  # the ways it drafts, once the target is loaded
        self._shaping: Shaping | None = None  # what holds and reads a reply, once the target is loaded
        self._scratch: tempfile.TemporaryDirectory[str] | None = None
        self._ngram_memory = NgramMemory(config.ngram_memory_tokens)
        # Chat templates run in the renderer's child process, never on the engine thread.
        self.renderer = TemplateRenderer()
        self._template: ChatTemplate | None = None
        # Replies part-way, their caches saved while another request runs (engine.interleave).
        self._parked: deque[_Task] = deque()
        self._short_s = 0.0  # how long the last short request ran (interleave.Turns)
        # Whether the plain prefill copy may grow by so many bytes (its owner's bound; the machine's
        # room is the model's own check): the pool's max_resident, handed to the model as it loads.
        self._may_grow: Callable[[int], bool] | None = None
        self._thread = threading.Thread(target=self._work, name="localspec-engine", daemon=True)
        self._thread.start()

    # --- public API (any thread) ---------------------------------------------------

    def limit_growth(self, may_grow: Callable[[int], bool]) -> None:
        """Bound the plain prefill copy's growth: `may_grow(extra)` says whether it may take `extra`
        bytes more. Not a closure over this engine: the model would hold its engine, a cycle that
        the frozen heap (engine.heap) never collects."""
        self._may_grow = may_grow
        if self._target is not None:
            self._target.may_grow = may_grow

    def wait_ready(self, timeout: float | None = None) -> EngineInfo:
        """Block until loading ends; raise the load error if it failed."""
        self._ready.wait(timeout)
        if self.info.status == "failed":
            raise LocalspecError(self.info.error or "loading failed")
        return self.info

    def submit(self, request: GenerationRequest, stream: bool = True) -> Handle:
        """Queue a request; its chunks (with `stream`) and then its result arrive on the handle."""
        handle = Handle(request, stream)
        try:
            self._jobs.put_nowait(handle)
        except queue.Full:
            raise OverloadedError(
                f"{self.config.queue_size} requests are already waiting; retry in a few seconds"
            ) from None
        return handle

    def prepare(self, request: GenerationRequest) -> GenerationRequest:
        """The request with its chat messages rendered to a prompt, in the calling thread.

        The server calls this before `submit`, so a template that fails or runs over its
        budget is the caller's 400 and never reaches the queue. Blocks up to the render
        budget. Before the model has loaded, the request is returned as it is (the engine
        thread renders it, through the same renderer).
        """
        template = self._template
        if not request.messages or request.suffix is not None or template is None:
            return request
        text = rendered_chat(self.renderer, template, request)
        return replace(request, messages=(), prompt=text, chat=True)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Submit and wait: the blocking convenience for scripts and tests (no chunks, the result)."""
        return self.submit(request, stream=False).wait()

    def count_prompt_tokens(self, request: GenerationRequest) -> int:
        """The request's prompt length in tokens, without queueing behind generations.

        Safe from any thread: it renders the chat template and tokenizes, which only read the
        model's vocabulary and metadata, never the context the worker thread decodes with.
        """
        return len(prompt_tokens(self._ready_target(), request, self.renderer))

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """`text` in the target's tokens (llama-server's /tokenize); safe from any thread, as above."""
        return self._ready_target().tokenize(text, add_special=add_special, parse_special=parse_special)

    def pieces(self, tokens: Sequence[int]) -> list[bytes]:
        """Each token's bytes, a special token's text where it renders as nothing (/detokenize);
        UserInputError naming the first id outside the vocabulary."""
        target = self._ready_target()
        return [target.shown_piece(t) for t in checked_ids(target, tokens, "tokens", what="")]

    def drop_saved_prompts(self) -> int:
        """Forget the conversations' saved caches (engine.promptcache) to free their memory; returns
        the bytes freed. Any thread: waits while a request is switching caches, never for a reply."""
        freed = self._prompt_cache.drop()
        self.info.saved_prompts, self.info.saved_prompt_bytes = 0, 0
        return freed

    def _ready_target(self) -> LlamaModel:
        if self.info.status != "ready" or self._target is None:
            raise LocalspecError(f"the model is not ready ({self.info.status}); retry once it is loaded")
        return self._target

    @property
    def queue_depth(self) -> int:
        return self._jobs.qsize()

    def close(self) -> None:
        self.renderer.close()  # a render in progress ends now: shutdown never waits on a template
        if self._thread.is_alive():
            self._drain()
            self._jobs.put(None)
            self._thread.join()
        if self._scratch is not None:
            self._scratch.cleanup()
        self.info.status = "closed"

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _folder(self, given: Path | None, name: str) -> Path:
        """A folder the config names, else one inside this engine's private temporary folder."""
        if given is not None:
            return given
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="localspec-engine-")
        return Path(self._scratch.name) / name

    def _drain(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.put(LocalspecError("the engine is shutting down; the request was not run"))

    # --- worker thread ---------------------------------------------------------------

    def _work(self) -> None:
        # This thread only waits and hands out work: what runs llama.cpp runs on a thread of its own.
        try:
            _on_a_thread_of_its_own(self._load)
        except Exception as exc:
            self.info.status = "failed"
            self.info.error = exc.message if isinstance(exc, LocalspecError) else f"loading failed: {exc}"
            self._ready.set()
            self._fail_all()
            return
        heap.settle()
        self.info.status = "ready"
        self._ready.set()
        while (job := self._jobs.get()) is not None:
            _on_a_thread_of_its_own(functools.partial(self._serve, job))
        _on_a_thread_of_its_own(self._unload)
        heap.refresh()

    def _fail_all(self) -> None:
        while (job := self._jobs.get()) is not None:
            job.put(LocalspecError(self.info.error or "the engine failed to load"))

    def _load(self) -> None:
        from localspec.models.gguf_info import check_model_file

        cfg = self.config
        # A corrupt header is one clear error here, before llama.cpp's own parser reads the file.
        check_gguf_file(cfg.target)
        cache = self._folder(cfg.cache_dir, "cache")
        check_model_file(cfg.target, cache_dir=cache)
        self._target = LlamaModel(cfg.target, cfg.load, self._report("target"))
        self.info.n_ctx = self._target.n_ctx
        # Measured once per machine and model: ~20 s on 2 slow cores, so it reports as loading does.
        prefill = attach_plain_prefill(self._target, cache, self._report("prompt-read check"))
        if prefill is not None:
            log.info("%s: %s", cfg.target.name, prefill)
        self.info.plain_prefill = self._target.plain_prefill
        if self._may_grow is not None:
            self._target.may_grow = self._may_grow
        self._template = chat_template(self._target)
        self._shaping = Shaping(self._target, self._template)
        self.renderer.start()
        self.info.gpu_offload = gpu_offload_supported()
        self._methods = methods = Methods(
            cfg, self._target, self._ngram_memory, self._folder, self._report, self._caches_emptied
        )
        if cfg.draft is not None:
            methods.load_draft(cfg.draft)
            self.info.draft_error = methods.draft_error
        self.info.methods = methods.names
        if cfg.method == "auto":
            methods.calibrated()  # at load, so the first request does not wait for it

    def _caches_emptied(self) -> None:
        self._kv_tokens, self._kv_parked = [], False

    def _report(self, what: str) -> Callable[[float], None] | None:
        progress = self._progress
        if progress is None:
            return None
        return lambda fraction: progress(what, fraction)

    def _unload(self) -> None:
        self._prompt_cache.drop()
        for model in self._methods.models() if self._methods is not None else []:
            model.close()
        # Methods holds this engine's bound methods: a cycle, which a frozen heap (engine.heap) would
        # keep for the process's life.
        self._methods = None
        if self._target is not None:
            self._target.close()

    def _model_drafter(self) -> ModelDrafter | None:
        """The draft model's drafter, where one is loaded (its cache goes with the target's)."""
        return self._methods.draft if self._methods is not None else None

    # --- requests in turns (engine.interleave) ---------------------------------------

    def _serve(self, first: Handle) -> None:
        """Run `first`, and the requests that come while it runs, in turns (engine.interleave): a
        short one as soon as the running reply reaches a turn's end, other replies in turns of
        LONG_TURN_S (MAX_TASKS at most part-way, each one's caches saved while another runs).
        Returns once none is left part-way."""
        task: _Task | None = self._task(first)
        while task is not None:
            ended = next(task.steps, _ENDED) is _ENDED  # else it stopped where it may hand over
            if ended and task.short:
                self._short_s = time.monotonic() - task.started
            task = self._after() if ended else self._switch(task)

    def _task(self, job: Handle) -> _Task:
        task = _Task(job, is_short(job.request))
        task.steps = self._steps(task)
        return task

    def _steps(self, task: _Task) -> Iterator[None]:
        """`task`'s request run to its end, its result or error put on its handle; yields where it
        hands the model over."""
        job = task.job
        if job.cancelled.is_set():
            job.put(LocalspecError("cancelled before it started"))
            return
        try:
            result = yield from self._generate(task)
        except LocalspecError as exc:
            job.put(exc)
        except Exception as exc:  # a bug must cost one request, not the daemon
            log.exception("generation failed")
            job.put(LocalspecError(f"internal error: {exc}; the request was dropped, the engine is fine"))
        else:
            job.put(result)
            # What it left in the n-gram memory is indexed now, after its reply, not by the next one.
            self._ngram_memory.index()
        finally:
            if self._target is not None:
                self.info.prefill_grown_bytes = self._target.prefill_grown_bytes

    def _turn_due(self, task: _Task) -> bool:
        """Whether `task`, running, hands the model over now: a short request waits and `task` has
        run its turn for one (interleave.Turns), or, `task` not short itself, another reply waits
        (part-way, or queued with room for one more) and `task` ran LONG_TURN_S."""
        if waiting(self._jobs, _short):
            return task.turns.due()
        if task.short:  # it ends soon: no other reply's turn comes before its end
            return False
        others = bool(self._parked) or (self._room_for_one_more() and waiting(self._jobs, _any))
        return others and task.turns.due(long=True)

    def _switch(self, task: _Task) -> _Task:
        """The task to run after `task`'s turn, `task`'s caches saved; `task` itself where none
        waits, or the machine has no room for the copies."""
        target = self._target
        assert target is not None and task.gen is not None
        draft = self._model_drafter()
        # The draft model's cache is kept where it holds much of this reply's conversation; else it
        # reads what it lacks at its next draft, as after any other request.
        kept = draft_holding(draft, task.gen.tokens)
        if not room_for(state_bytes(target, kept)):
            return task
        short = take_first(self._jobs, _short)
        if short is not None:
            following = self._task(short)
        elif task.short:
            return task
        elif self._parked:
            following = self._parked.popleft()
        elif self._room_for_one_more() and (job := take_first(self._jobs, _any)) is not None:
            following = self._task(job)
        else:
            return task
        task.n_past, task.state = target.n_past, target.save_state()
        task.draft, task.drafted = kept, kept.save() if kept is not None else None
        task.parked_at = time.monotonic()
        self._parked.append(task)
        # The cache still holds task's tokens: a request that shares their start reads only the rest
        # (parallel agents' requests share a system prompt and tools of thousands of tokens).
        self._kv_tokens, self._kv_parked = task.gen.tokens[: task.n_past], True
        if following.parked_at:
            self._resume(following)
        return following

    def _after(self) -> _Task | None:
        """The task to run after one ended: a short one parked, else the reply parked longest (it
        ran before the one that ended: a stream of short requests cannot starve it), else a short
        request waiting, else none (the queue's next request starts anew)."""
        if not self._parked:
            short = take_first(self._jobs, _short)
            return self._task(short) if short is not None else None
        following = next((t for t in self._parked if t.short), self._parked[0])
        self._parked.remove(following)
        # What the ended one left is kept as any conversation's cache (an editor's next completion
        # shares most of its prompt), before the parked reply's caches go back over it.
        assert self._target is not None
        if not self._kv_parked:  # (else it is a parked reply's, saved with it)
            self._prompt_cache.keep(self._target, self._kv_tokens, self._model_drafter())
        self._resume(following)
        return following

    def _resume(self, task: _Task) -> None:
        """`task`'s caches back as it left them: loaded, or where llama.cpp refuses, read again; or,
        where it paused reading its prompt and the live cache holds all it had read and more of
        that prompt (another request with the same start read on meanwhile), the live cache."""
        target = self._target
        assert target is not None and task.gen is not None
        ahead = _read_ahead(task, self._kv_tokens)
        self._kv_tokens, self._kv_parked = [], False  # unknown until a request ends cleanly
        try:
            if ahead:
                target.truncate(ahead)
                task.gen.stats.cached_tokens += ahead - task.n_past  # taken, not read
            elif task.state is None:
                raise LocalspecError("llama.cpp saved nothing")
            else:
                target.load_state(task.state, task.n_past)
        except LocalspecError as exc:
            log.warning("a paused reply's cache could not be loaded back (%s); it is read again", exc)
            _read_again(target, task.gen.tokens[: task.n_past], len(task.gen.prompt))
        if task.draft is not None and task.drafted is not None:
            task.draft.restore(task.drafted)
        task.state, task.draft, task.drafted = None, None, None
        task.turns.resumed(self._short_s)
        task.parked_at = 0.0

    def _room_for_one_more(self) -> bool:
        """Whether another reply may start part-way beside the running one and those parked."""
        return len(self._parked) + 2 <= interleave.MAX_TASKS

    def _generate(self, task: _Task) -> Generator[None, None, GenerationResult]:
        """Run `task`'s request; yields where it hands the model over (engine.interleave)."""
        gen, split, calls = self._start(task)
        job = task.job
        for chunk in gen.run():
            if chunk is None:  # another request's turn
                yield
                continue
            out = chunk
            if split is not None:
                reasoning, text = split.push(chunk.text)
                out = replace(chunk, text=text, reasoning=reasoning)
            if calls is not None:
                out = replace(out, text=calls.push(out.text), calls=calls.call_deltas())
                if calls.repeated():
                    gen.end()
            if job.stream:
                job.put(out)
        return self._finish(job, gen, split, calls)

    def _start(self, task: _Task) -> tuple[Generation, StreamSplit | None, ToolCallFilter | None]:
        """`task`'s generation set up: its prompt tokenized (cut to the context where asked), its
        reply's shape and policy chosen, the KV cache switched to what it shares; and what splits
        its reasoning from its answer and its tool calls from its text, where the request has them."""
        assert self._target is not None and self._shaping is not None and self._methods is not None
        job = task.job
        req = job.request
        checked_ids(self._target, [token for token, _ in req.sampling.logit_bias], "logit_bias")
        tool_format = request_tool_format(self._target, req)
        tokens = prompt_tokens(self._target, req, self.renderer)
        whole = len(tokens)
        n_ctx = min(self._target.n_ctx, req.context_limit or self._target.n_ctx)
        if req.truncate and req.suffix is None and req.prompt_logprobs is None:
            tokens = cut_to_context(tokens, n_ctx)
        elif req.context_limit is not None and len(tokens) >= n_ctx:  # (the served one: Generation's)
            raise ContextOverflowError(len(tokens), n_ctx)
        shape = self._shaping.shape(req, tokens, tool_format)
        policy, method, k, reason = self._methods.policy(req, tokens, json_reply=shape.held)
        reuse = self._prompt_cache.switch(
            self._target,
            self._kv_tokens,
            tokens,
            req.cache_prompt,
            self._model_drafter(),
            not self._kv_parked,
        )
        self._kv_parked = False
        self.info.saved_prompts, self.info.saved_prompt_bytes = self._prompt_cache.stats()
        self._kv_tokens = []  # unknown until this request ends cleanly
        scored = self._scored_prefix(req, tokens)
        # RPC workers' caches are not saved (as for prompt caches): their requests never take turns.
        turn_due = None if self.config.load.rpc else functools.partial(self._turn_due, task)
        task.gen = gen = Generation(
            self._target,
            tokens,
            max_tokens=req.max_tokens,
            params=shape.params,
            stop=req.stop,
            policy=policy,
            method=method,
            k=k,
            cancel=job.cancelled,
            reuse=reuse,
            time_limit_s=req.time_limit_s,
            min_indent=req.min_indent,
            constraint=shape.constraint,
            logprobs=req.logprobs,
            prompt_logprobs=req.prompt_logprobs,
            scored=scored,
            turn_due=turn_due,
            progress=job.tell if req.progress and job.stream else None,
        )
        gen.stats.fallback_reason = reason
        gen.stats.dropped_messages = req.dropped_messages
        gen.stats.dropped_tokens = whole - len(tokens)
        if gen.stats.dropped_tokens:
            log.info(
                "a %d-token prompt past the %d-token context: its middle left out (%d tokens)",
                whole,
                min(self._target.n_ctx, req.context_limit or self._target.n_ctx),
                gen.stats.dropped_tokens,
            )
        if tool_format is None:
            return gen, shape.split, None
        names = callable_names(req.tool_choice)
        return (
            gen,
            shape.split,
            ToolCallFilter(tool_format, req.parallel_calls, names, stream_calls=shape.calls_held),
        )

    def _finish(
        self, job: Handle, gen: Generation, split: StreamSplit | None, calls: ToolCallFilter | None
    ) -> GenerationResult:
        """The result of `gen`, run to its end: what the splits held back sent, the stats a reply's
        text gives counted, the KV cache's tokens and the n-gram memory kept for the next request."""
        assert self._target is not None and gen.result is not None
        req = job.request
        if split is not None:
            reasoning, text = split.finish()
            text = calls.push(text) if calls is not None else text
            deltas = calls.call_deltas() if calls is not None else ()
            if job.stream and (reasoning or text or deltas):
                job.put(TokenChunk(text, (), reasoning=reasoning, calls=deltas))
            gen.result = replace(gen.result, text=split.answer, reasoning=split.reasoning)
            if split.reasoning:
                thought = self._target.tokenize(split.reasoning, add_special=False, parse_special=False)
                gen.stats.reasoning_tokens = min(len(thought), gen.stats.tokens)
        if req.prediction:
            predicted = self._target.tokenize(req.prediction, add_special=False, parse_special=False)
            gen.stats.prediction_tokens = len(predicted)
            gen.stats.prediction_accepted = prediction_matched(predicted, gen.generated)
        self._kv_tokens = gen.tokens[: self._target.n_past]
        if req.prompt_logprobs is not None and gen.result.prompt_logprobs:
            self._scored = (tuple(gen.prompt), req.prompt_logprobs, gen.result.prompt_logprobs)
        self._ngram_memory.remember(gen.tokens)
        if calls is None:
            return gen.result
        tail, result = calls.finish(gen.result)
        if tail and job.stream:
            job.put(TokenChunk(tail, ()))
        return result

    def _scored_prefix(self, req: GenerationRequest, tokens: Sequence[int]) -> tuple[TokenLogprob, ...]:
        """The entries the last scored prompt has for this prompt's first tokens, scored with as many
        alternatives: lm-evaluation-harness scores each choice of a question after the same context,
        read once where the choices come one after another (it orders requests by length, so choices
        of one length do). Generation keeps them only as far as the KV cache holds them."""
        last, self._scored = self._scored, None
        if req.prompt_logprobs is None or last is None or last[1] != req.prompt_logprobs:
            return ()
        return last[2][: common_prefix(last[0], tokens)]
