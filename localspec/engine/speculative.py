"""The speculative decoding loop: draft, verify in one batch, keep the accepted prefix, roll back.

Every method runs through this loop; `none` is simply a step that drafts nothing,
so the baseline and the speculative methods share one code path and one set of
stop rules. Lossless by construction: greedy keeps only tokens that equal the
target's argmax, sampling keeps only tokens that equal the target's own draws
(localspec.engine.sampling.Draws).

Float rounding in llama.cpp depends on the batch size, so a batched verify can
flip an argmax where the top two logits nearly tie. Where the verify shows such
a near-tie, that position is decided again with a single-token decode, the way
the target alone computes it (see `NEAR_TIE`).

A `Constraint` (structured output, forced tool calls) masks the target at every position
it decides, the first included; it advances only on accepted tokens, so speculation stays
lossless under it. Where the grammar leaves no choice, its forced tokens are the draft.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from localspec.engine.constraint import Constraint
from localspec.engine.drafters.base import Draft, Drafter, Preparing
from localspec.engine.llama import LlamaModel, ReadPaused
from localspec.engine.sampling import (
    Draws,
    adjusted,
    distribution,
    greedy_accept,
    sample_at,
    token_entry,
    token_logprob,
)
from localspec.engine.textstream import TextStream
from localspec.errors import ContextOverflowError, RequestCancelledError, UserInputError
from localspec.types import (
    FinishReason,
    GenerationResult,
    GenerationStats,
    PromptProgress,
    SamplingParams,
    TokenChunk,
    TokenLogprob,
)

# Logit gap under which a batched verify's argmax is re-decided by a single-token decode.
# Measured on Qwen2.5-Coder-1.5B Q4_K_M (CPU): batching moves the gap between the top two
# logits by up to 0.59 (0.34 with weight repacking off); see docs/benchmarks.md.
NEAR_TIE = 1.0
# Positions a scored prompt's decodes read at a time (Generation._score_prompt): as wide as the widest
# verify, whose output rows llama.cpp already keeps room for.
SCORE_CHUNK = 64


@dataclass(frozen=True)
class StepContext:
    """What a policy sees when it chooses the drafter and k for the next step."""

    tokens: Sequence[int]
    room: int
    step: int
    # Where the reply begins in tokens (after the prompt).
    prompt_len: int = 0


@dataclass(frozen=True)
class StepOutcome:
    """What one step did, for policies that learn (acceptance by position, costs)."""

    drafter: str | None
    k: int
    drafted: int
    accepted: int
    evidence: int
    draft_s: float
    target_s: float
    # Positions re-decided by a one-token decode for a near-tie (the step ends at the first),
    # and that decode's seconds, which target_s includes.
    redecided: int
    redecide_s: float
    # Drafted tokens judged (all of them, unless a near-tie ended the step first), and verify
    # positions whose logits were looked at (up to the first rejection or near-tie, bonus included).
    judged: int
    examined: int


class Policy(Protocol):
    """Chooses, before each step, which drafter runs and how many tokens it may draft."""

    def prepare(self, prompt: Sequence[int]) -> None:
        """Work on the prompt alone (indexing it for lookups), done while the target reads it."""
        ...

    def choose(self, ctx: StepContext) -> tuple[Drafter | None, int]: ...

    def observe(self, outcome: StepOutcome) -> None: ...

    def pause(self, tokens: Sequence[int]) -> None:
        """A step the policy did not choose (the grammar's forced tokens) follows: close the last one."""
        ...


class FixedPolicy:
    """Always draft k tokens with the same drafter (or never, for None)."""

    def __init__(self, drafter: Drafter | None, k: int) -> None:
        self.drafter = drafter
        self.k = k if drafter is not None else 0

    def prepare(self, prompt: Sequence[int]) -> None:
        if isinstance(self.drafter, Preparing):
            self.drafter.prepare(prompt)

    def choose(self, ctx: StepContext) -> tuple[Drafter | None, int]:
        return self.drafter, self.k

    def observe(self, outcome: StepOutcome) -> None:
        pass

    def pause(self, tokens: Sequence[int]) -> None:
        pass


@dataclass
class _Step:
    new_tokens: list[int]
    from_draft: int
    judged: int = 0
    examined: int = 1
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per new token, where asked


@dataclass(frozen=True)
class _Judgement:
    """A verify's outcome: keep `keep` drafted tokens, then `next`; `judged` drafts were decided on,
    `examined` verify positions looked at."""

    keep: int
    next: int
    judged: int
    accepted: int
    examined: int


class Generation:
    """One request's decoding state. Iterate `run()` for chunks; `result` holds the outcome after."""

    def __init__(
        self,
        target: LlamaModel,
        prompt: Sequence[int],
        *,
        max_tokens: int,
        params: SamplingParams,
        stop: Sequence[str],
        policy: Policy,
        method: str,
        k: int,
        cancel: threading.Event | None = None,
        reuse: int = 0,
        time_limit_s: float | None = None,
        min_indent: int = 0,
        constraint: Constraint | None = None,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        scored: Sequence[TokenLogprob] = (),
        turn_due: Callable[[], bool] | None = None,
        progress: Callable[[PromptProgress], None] | None = None,
    ) -> None:
        """`reuse`: leading prompt tokens whose KV the target still holds from the last request.

        `time_limit_s`: stop at the first newline past this many seconds of generation (or at
        once, past it, when a newline was already written), as llama-server's t_max_predict_ms.
        `constraint`: a grammar every generated token must follow.
        `logprobs`: report each token's log-probability with this many alternatives (None: none).
        `prompt_logprobs`: the same for every prompt token (GenerationRequest's); `scored`: the
        entries, with as many alternatives, of a prefix of this prompt scored by the last request,
        kept where the target still holds that prefix.
        `turn_due`: asked after each chunk, and between two of llama.cpp's chunks of the prompt's
        read, whether to hand the model to another request (engine.interleave): where it says so,
        `run()` yields None, and the caller serves others before it asks for the next chunk (the
        time not counted as this reply's: `paused`).
        `progress` hears how far the prompt's read has got: as it begins, between two of its
        chunks, and once it is read.
        """
        if len(prompt) >= target.n_ctx:
            raise ContextOverflowError(len(prompt), target.n_ctx)
        if not prompt:  # no logits to continue from (llama.cpp would hand back a stale row)
            raise UserInputError("the prompt is empty: send some text to continue", param="prompt")
        self.target = target
        self.prompt = list(prompt)
        self.tokens = list(prompt)
        self.max_tokens = max_tokens
        self.time_limit_s = time_limit_s
        self._newline = False
        self.params = params
        self.policy = policy
        self.constraint = constraint
        self.logprobs = logprobs
        self._decided: list[TokenLogprob] = []  # this step's tokens' log-probabilities, as decided
        self._all_logprobs: list[TokenLogprob] = []
        self.prompt_logprobs = prompt_logprobs
        self._scored: tuple[TokenLogprob, ...] = ()  # the prompt's tokens' log-probabilities, where asked
        self.cancel = cancel or threading.Event()
        # One uniform per position, from the seed: the target's draw and a draft model's guess there.
        self.draws = Draws(params.seed if params.seed is not None else secrets.randbits(63))
        self.stream = TextStream(stop, min_indent)
        # The last prompt token is always decoded again: its logits choose the first token. A scored
        # prompt's cached prefix has no logits left: it is kept as far as the last request scored it,
        # and decoded again from there (the row of the first position read scores the next token).
        if prompt_logprobs is not None:
            reuse = min(reuse, len(scored) - 1)
        self.reuse = max(0, min(reuse, len(prompt) - 1))
        self._known = tuple(scored[: self.reuse + 1]) if self.reuse else ()
        self.stats = GenerationStats(
            method=method, k=k, prompt_tokens=len(prompt), cached_tokens=self.reuse, exact=target.exact
        )
        self.generated: list[int] = []
        self.finish: FinishReason | None = None
        self.result: GenerationResult | None = None
        self._drafters_started: set[int] = set()
        self._drafted_total = 0  # tokens drafted over all steps, for mean_k
        self._redecide_s = 0.0  # this step's near-tie decodes
        self._paused_s = 0.0  # spent on other requests between steps (engine.interleave): not this one's
        self.turn_due = turn_due
        self.progress = progress

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Between two chunks, the model serves other requests (engine.interleave): the policy
        closes its last step first, so the pause is not learnt as that step's cost, and the time is
        not counted as this reply's (its tokens/s, its time limit), though its client waited."""
        self.policy.pause(self.tokens)
        start = time.perf_counter()
        try:
            yield
        finally:
            self._paused_s += time.perf_counter() - start

    # --- driving ------------------------------------------------------------

    def run(self) -> Iterator[TokenChunk | None]:
        t0 = time.perf_counter()
        if self.reuse:
            self.target.truncate(self.reuse)
        else:
            self.target.reset()
        try:
            if self.prompt_logprobs is not None:
                self._score_prompt()
            else:
                # What the policy does with the prompt alone it does while the target reads the
                # prompt: on a GPU at the same time; on the CPU in the time to first token.
                self.stats.target_s += yield from self._read(self.prompt[self.reuse :])
        except RequestCancelledError:  # stopped while the prompt was read: no tokens, the cache intact
            self.finish = "cancelled"
            self._close(t0)
            return
        if self._scored:
            yield TokenChunk("", tuple(self.prompt), 0, self._scored, prompt=True)
        if self.max_tokens <= 0:  # a warm-up: the prompt is in the cache, nothing to generate
            self.finish = "length"
            self.stats.ttft_s = time.perf_counter() - t0 - self._paused_s
            self._close(t0)
            return
        raw = self.target.logits(-1)
        first = self._pick(self._shaped(raw), len(self.tokens))
        self._note(raw, first)
        if self.constraint is not None:
            self.constraint.accept(first)
        yield from self._emit(_Step([first], 0, logprobs=self._taken()), t0)
        while self.finish is None:
            if self.turn_due is not None and self.turn_due():
                with self.paused():
                    yield None
            if self.cancel.is_set():
                self.finish = "cancelled"
                break
            step = self._step()
            yield from self._emit(step, t0)
        tail = self.stream.finish()
        if tail:
            yield TokenChunk(tail, ())
        self._close(t0)

    def end(self) -> None:
        """End the reply after the chunk just yielded, as a stop string would (a caller's stop rule:
        a tool call repeated)."""
        if self.finish is None:
            self.finish = "stop"

    def _read(self, prompt: Sequence[int]) -> Generator[None, None, float]:
        """Decode the prompt's uncached tokens; between two chunks, say how far it got and, where
        `turn_due` says so, yield None for the caller to serve another request. Returns llama.cpp's
        seconds on it."""
        start, seconds = self.target.n_past, 0.0
        began, paused = time.perf_counter(), self._paused_s
        offset = start  # where the decode running now began

        def report(processed: int) -> None:
            if self.progress is not None:
                spent = time.perf_counter() - began - (self._paused_s - paused)
                self.progress(PromptProgress(len(self.prompt), self.reuse, processed, spent))

        def between(done: int) -> bool:
            report(offset + done)
            return self.turn_due is not None and self.turn_due()

        report(start)
        while True:
            offset = self.target.n_past
            rest = prompt[offset - start :]
            try:
                seconds += self.target.decode(rest, 1, self.cancel, self._prepare, between)
                break
            except ReadPaused as stop:
                seconds += stop.seconds
                with self.paused():
                    yield None
        report(self.target.n_past)
        return seconds

    def _score_prompt(self) -> None:
        """Read the prompt with every position's logits, each prompt token scored by the logits of the
        position before it, SCORE_CHUNK positions a decode: llama.cpp keeps room for as many output
        rows as a decode asks for (600 KB each for a 152k vocabulary) for as long as it runs."""
        self._prepare()
        assert self.prompt_logprobs is not None
        prompt, piece = self.prompt, self.target.shown_piece
        # The cached prefix's entries as the last request scored them; else the first token's, which
        # nothing before it predicts.
        scored = list(self._known) or [token_entry(prompt[0], piece(prompt[0]), None)]
        size = min(SCORE_CHUNK, self.target.options.n_batch)  # one llama_decode each: its rows all read
        for start in range(self.reuse, len(prompt), size):
            chunk = prompt[start : start + size]
            self.stats.target_s += self.target.decode(chunk, len(chunk), self.cancel)
            for i, token in enumerate(prompt[start + 1 : start + 1 + len(chunk)]):
                scored.append(token_logprob(self.target.logits(i), token, self.prompt_logprobs, piece))
        self._scored = tuple(scored)

    def _prepare(self) -> None:
        try:
            self.policy.prepare(self.prompt)
        except Exception as exc:  # a failing lookup must never lose the request: decode plainly
            self.stats.fallback_reason = f"preparing the drafts failed: {exc}"
            self.policy = FixedPolicy(None, 0)

    def _step(self) -> _Step:
        room = self.target.n_ctx - self.target.n_past  # free positions; the pending token needs one
        if room < 1:
            self.finish = "length"
            return _Step([], 0)
        # Never draft past the context, past what max_tokens lets through (the step adds one more) or
        # past the largest verify batch that rounds like one-token decoding here.
        limit = min(room - 1, self.max_tokens - len(self.generated) - 1, self.target.verify_limit() - 1)
        forced = self.constraint.forced()[:limit] if self.constraint is not None and limit > 0 else []
        if forced:
            self.policy.pause(self.tokens)
            return self._forced_step(forced)
        drafter, k = self.policy.choose(StepContext(self.tokens, room, self.stats.steps, len(self.prompt)))
        k = min(k, limit)
        draft = self._draft(drafter, k) if drafter is not None and k > 0 else Draft()
        self.stats.steps += 1
        name = drafter.name if drafter is not None and draft.tokens else "none"
        self.stats.method_steps[name] = self.stats.method_steps.get(name, 0) + 1
        self._drafted_total += len(draft.tokens)
        target_before, redecided_before = self.stats.target_s, self.stats.redecided
        self._redecide_s = 0.0
        step = self._verify(draft)
        self.policy.observe(
            StepOutcome(
                drafter.name if drafter is not None else None,
                k,
                len(draft.tokens),
                step.from_draft,
                draft.evidence,
                draft.seconds,
                self.stats.target_s - target_before,
                self.stats.redecided - redecided_before,
                self._redecide_s,
                step.judged,
                step.examined,
            )
        )
        return step

    def _forced_step(self, forced: list[int]) -> _Step:
        """Draft what the grammar forces: always right unless the target spells it otherwise.

        Not the policy's step, so the policy neither chooses nor learns from it."""
        self.stats.steps += 1
        self.stats.method_steps["grammar"] = self.stats.method_steps.get("grammar", 0) + 1
        self._drafted_total += len(forced)
        return self._verify(Draft(forced))

    def _draft(self, drafter: Drafter, k: int) -> Draft:
        if id(drafter) not in self._drafters_started:
            drafter.start(self.prompt, fresh=not self.reuse)
            self._drafters_started.add(id(drafter))
        try:
            draft = drafter.propose(self.tokens, k, self.params, self.draws)
        except Exception as exc:  # a failing draft must never lose the request
            self.stats.fallback_reason = f"{drafter.name} failed: {exc}"
            self.policy = FixedPolicy(None, 0)
            return Draft()
        self.stats.draft_s += draft.seconds
        return self._within_grammar(draft)

    def _within_grammar(self, draft: Draft) -> Draft:
        """Cut a draft at its first token the grammar forbids: the verify would reject it anyway
        (the target's draw there is never that token), so the output is the same without it.

        Cut it too where the grammar starts forcing tokens: the grammar drafts those itself at the
        next step, always right. What is left is the model's own choices (a city, a unit), the
        uncertain tokens, and a miss among them no longer loses the forced run's verify with them:
        in a forced tool call, n-gram copies through the call's forced keys drafted 15 tokens where
        1 was right (auto 0.90x of none)."""
        if self.constraint is None:
            return draft
        valid = draft.tokens[: self.constraint.valid_prefix(draft.tokens)]
        draft.tokens = valid[: self.constraint.free_prefix(valid)]
        return draft

    # --- verification -----------------------------------------------------------

    def _verify(self, draft: Draft) -> _Step:
        base = self.target.n_past
        batch = [self.tokens[-1], *draft.tokens]
        self.stats.target_s += self.target.decode(batch, len(batch))
        verdict = self._verify_greedy(batch, base) if self.params.greedy else self._verify_sampled(draft)
        if self.constraint is not None:  # it holds the kept draft tokens; the step adds `next`
            self.constraint.accept(verdict.next)
        # The target's cache holds the last accepted token plus the draft; keep what was accepted.
        self.target.truncate(base + 1 + verdict.keep)
        self._count(verdict.judged, verdict.accepted)
        new_tokens = [*draft.tokens[: verdict.keep], verdict.next]
        return _Step(new_tokens, verdict.accepted, verdict.judged, verdict.examined, self._taken())

    def _verify_sampled(self, draft: Draft) -> _Judgement:
        # Each position's distribution is computed when its token is judged: after a rejection the
        # rest of the batch's rows are never read. Every drafted token is one the grammar allows
        # (_within_grammar cut the draft; forced tokens are the grammar's own), as in greedy.
        tokens, base = draft.tokens, len(self.tokens)
        for i, token in enumerate(tokens):
            # Kept where it is the token the target draws here (Draws: exactly the target's samples).
            raw = self.target.logits(i)
            drawn = self._pick(self._shaped(raw, tokens[:i]), base + i)
            self._note(raw, drawn)
            if drawn != token:
                return _Judgement(i, drawn, len(tokens), i, i + 1)
            if self.constraint is not None:  # the grammar follows the accepted prefix
                self.constraint.accept(token)
        n = len(tokens)
        raw = self.target.logits(n)
        last = self._pick(self._shaped(raw, tokens), base + n)
        self._note(raw, last)
        return _Judgement(n, last, n, n, n + 1)

    def _verify_greedy(self, batch: Sequence[int], base: int) -> _Judgement:
        draft = batch[1:]
        choices: list[int] = []
        for i in range(len(batch)):
            raw = self.target.logits(i)
            row = self._shaped(raw, draft[:i])
            choice = int(row.argmax())
            # Fast loading makes no batch round like one-token decoding: a re-decide would cost a
            # decode and still not make the output exact, so near-ties are re-decided only when exact.
            if len(batch) > 1 and self.target.exact and _near_tie(row, choice):
                return self._redecide(batch, base, i)
            choices.append(choice)
            self._note(raw, choice)
            if i < len(draft) and draft[i] != choice:
                break
            if i < len(draft) and self.constraint is not None:
                self.constraint.accept(choice)  # the grammar follows the accepted prefix
        n_acc = greedy_accept(draft, choices)
        return _Judgement(n_acc, choices[n_acc], len(draft), n_acc, len(choices))

    def _redecide(self, batch: Sequence[int], base: int, i: int) -> _Judgement:
        """Decide position i as the target alone would, with a one-token decode; the step ends there."""
        self.target.truncate(base + i)
        seconds = self.target.decode([batch[i]], 1)
        self.stats.target_s += seconds
        self._redecide_s += seconds
        self.stats.redecided += 1
        draft = batch[1:]
        raw = self.target.logits(-1)
        choice = int(self._shaped(raw, draft[:i]).argmax())
        self._note(raw, choice)
        judged = min(i + 1, len(draft))
        return _Judgement(i, choice, judged, i + int(i < len(draft) and draft[i] == choice), i + 1)

    def _shaped(self, logits: npt.NDArray[np.float32], ahead: Sequence[int] = ()) -> npt.NDArray[np.float32]:
        """The target's logits for the position after the tokens so far and `ahead` (the draft before
        it), as its sampler sees them: biased, penalised for what came before, masked by the grammar."""
        logits = adjusted(logits, self.params, self.tokens, ahead)
        return logits if self.constraint is None else self.constraint.mask(logits)

    def _note(self, raw: npt.NDArray[np.float32], token: int) -> None:
        """Where asked, the log-probability of `token`, decided from the target's `raw` logits (read
        now: the next decode overwrites them)."""
        if self.logprobs is not None:
            self._decided.append(token_logprob(raw, token, self.logprobs, self.target.shown_piece))

    def _taken(self) -> list[TokenLogprob]:
        """The log-probabilities noted since the last step, in the order its tokens were decided."""
        taken, self._decided = self._decided, []
        return taken

    def _pick(self, logits: npt.NDArray[np.float32], position: int) -> int:
        if self.params.greedy:
            return int(logits.argmax())
        return sample_at(distribution(logits, self.params), self.draws.at(position))

    def _count(self, judged: int, n_acc: int) -> None:
        st = self.stats
        st.drafted += judged
        st.accepted += n_acc
        for pos in range(judged):
            if pos >= len(st.drafted_by_position):
                st.drafted_by_position.append(0)
                st.accepted_by_position.append(0)
            st.drafted_by_position[pos] += 1
            st.accepted_by_position[pos] += int(pos < n_acc)

    # --- output -------------------------------------------------------------------

    def _emit(self, step: _Step, t0: float) -> Iterator[TokenChunk]:
        """Apply EOS, stop strings and max_tokens to a step's tokens, in order, and yield the final text."""
        kept: list[int] = []
        text = ""
        for token in step.new_tokens:
            if self.target.is_eog(token):
                self.finish = "stop"
                break
            kept.append(token)
            if step.logprobs:
                self._all_logprobs.append(step.logprobs[len(kept) - 1])
            self.generated.append(token)
            self.tokens.append(token)
            text += self.stream.push(self.target.piece(token))
            if self.stream.stopped:
                self.finish = "stop"
                break
            if len(self.generated) >= self.max_tokens or self._out_of_time(text, t0):
                self.finish = "length"
                break
        if self.finish is None and self.constraint is not None and self.constraint.finished:
            self.finish = "stop"  # the grammar allows nothing but the end: no decode to learn it
        if kept and self.stats.ttft_s == 0.0:
            self.stats.ttft_s = time.perf_counter() - t0 - self._paused_s
        if kept or text:
            noted = tuple(step.logprobs[: len(kept)])
            yield TokenChunk(text, tuple(kept), min(step.from_draft, len(kept)), noted)

    def _out_of_time(self, text: str, t0: float) -> bool:
        if self.time_limit_s is None or not self.stats.ttft_s:
            return False
        self._newline = self._newline or "\n" in text
        spent = time.perf_counter() - t0 - self._paused_s - self.stats.ttft_s
        return self._newline and spent > self.time_limit_s

    def _close(self, t0: float) -> None:
        st = self.stats
        st.elapsed_s = time.perf_counter() - t0 - self._paused_s
        st.tokens = len(self.generated)
        st.tokens_per_second = st.tokens / st.elapsed_s if st.elapsed_s > 0 else 0.0
        st.mean_itl_s = (st.elapsed_s - st.ttft_s) / (st.tokens - 1) if st.tokens > 1 else 0.0
        st.acceptance_rate = st.accepted / st.drafted if st.drafted else 0.0
        drafted_steps = sum(v for m, v in st.method_steps.items() if m != "none")
        st.mean_accepted_length = st.accepted / drafted_steps if drafted_steps else 0.0
        st.mean_k = self._drafted_total / drafted_steps if drafted_steps else 0.0
        st.python_s = max(0.0, st.elapsed_s - st.target_s - st.draft_s)
        self.result = GenerationResult(
            self.stream.text,
            tuple(self.generated),
            self.finish or "stop",
            st,
            self.stream.matched,
            logprobs=tuple(self._all_logprobs),
            prompt_logprobs=self._scored,
            prompt_ids=tuple(self.prompt),
        )


def _near_tie(row: npt.NDArray[np.float32], choice: int) -> bool:
    # Second-best without a sort: mask the winner for one max() (row is llama.cpp's buffer; restored).
    best = float(row[choice])
    row[choice] = -np.inf
    second = float(row.max())
    row[choice] = best
    return best - second < NEAR_TIE
