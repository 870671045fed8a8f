"""A thinking model's reasoning, told apart from its answer.

Models that think before they answer (Qwen3, QwQ, DeepSeek-R1's distills) write
`<think>...</think>` first, and their chat templates name both tags. Clients want the two
apart: OpenAI-style servers (llama-server, vLLM, DeepSeek's) send the reasoning as
`reasoning_content`, Ollama as `thinking`, Anthropic as thinking blocks. A template may open
the block itself (the prompt ends with `<think>`): the reply then starts inside it.

The split runs on the reply's final text as it streams: a tag cut across two chunks is held
back until it can be told from text, and the whitespace after each tag is dropped (Ollama's
parser does the same, so a reply splits alike on both servers).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

OPEN = "<think>"
CLOSE = "</think>"


@dataclass(frozen=True)
class ThinkTokens:
    """A thinking model's two tags as single tokens, and whether the prompt opened the block.

    Grammars need them: llguidance reads an added token that looks like `<...>` as a special
    token, which no free text of a grammar can hold, so a grammar must name them to let the model
    think (Qwen3's and DeepSeek-R1's tags are such tokens)."""

    open: int
    close: int
    inside: bool
    # The most tokens the reasoning may take (Anthropic's budget_tokens): past it the block is closed
    # for the model. None: no bound.
    budget: int | None = None


# Any text, as a Lark terminal's rule; a grammar whose answer is any such text, for a thinking
# budget where nothing else holds the reply.
ANSWER_RULE = "ANSWER: /(.|\\n)+/\n"
FREE_ANSWER = f"start: ANSWER?\n{ANSWER_RULE}"


def bounded_thought(budget: int | None) -> tuple[str, str]:
    """The reasoning's text as a Lark expression and its rule: any text, or within `budget` tokens
    (llguidance's max_tokens); ("", "") for a budget of 0."""
    if budget is None:
        return "THOUGHT?", "THOUGHT: /(.|\\n)+/\n"
    if budget > 0:
        return "thought_text?", f"thought_text[max_tokens={budget}]: /(.|\\n)+/\n"
    return "", ""


def thinking_first(lark: str, think: ThinkTokens) -> str:
    """`lark` (a grammar whose `start` is the answer) with the model's thinking block before it:
    optional where the reply may open one, required to close where the prompt opened it; within
    `think.budget` tokens where there is one (0: none, the block closed at once)."""
    answer = lark.replace("start:", "answer:", 1)
    text, rule = bounded_thought(think.budget)
    closed = f"{text} <[{think.close}]>".strip()
    if think.inside:
        return f"start: {closed} answer\n{answer}{rule}"
    if think.budget == 0:
        return f"start: answer\n{answer}"
    return f"start: thought? answer\nthought: <[{think.open}]> {closed}\n{answer}{rule}"


def thinks(template: str | None) -> bool:
    """Whether a chat template is a thinking model's: it writes (or reads back) both tags."""
    return template is not None and OPEN in template and CLOSE in template


def opens_inside(prompt_tail: str) -> bool:
    """Whether a rendered prompt ends inside the thinking block (its template opened it)."""
    return prompt_tail.rstrip().endswith(OPEN)


class _State(enum.Enum):
    BEFORE = enum.auto()  # nothing but whitespace yet: the reply may still open the block
    OPENED = enum.auto()  # the block is open; its leading whitespace is dropped
    THINKING = enum.auto()
    CLOSED = enum.auto()  # the block is closed; the answer's leading whitespace is dropped
    ANSWER = enum.auto()


class StreamSplit:
    """A reply's text split into reasoning and answer as it streams: text that cannot be told yet
    (a marker cut across two chunks) is held until it can. Subclasses move over the held text."""

    def __init__(self) -> None:
        self._held = ""
        self.reasoning = ""  # everything given out as reasoning so far
        self.answer = ""  # and as the answer

    def push(self, text: str) -> tuple[str, str]:
        """Add the reply's next final text; returns (reasoning, answer) that became certain."""
        self._held += text
        thought, said = [], []
        while (got := self._step()) is not None:
            thought.append(got[0])
            said.append(got[1])
        return self._given("".join(thought), "".join(said))

    def finish(self) -> tuple[str, str]:
        """The reply ended: whatever is held goes out as what it was inside of."""
        raise NotImplementedError

    def _given(self, reasoning: str, answer: str) -> tuple[str, str]:
        self.reasoning += reasoning
        self.answer += answer
        return reasoning, answer

    def _step(self) -> tuple[str, str] | None:
        """One move over the held text; None when it must wait for more."""
        raise NotImplementedError


class ReasoningSplit(StreamSplit):
    """Splits a reply's text into reasoning and answer as it arrives."""

    def __init__(self, inside: bool) -> None:
        """`inside`: the prompt opened the block, so the reply starts in it."""
        super().__init__()
        self._state = _State.OPENED if inside else _State.BEFORE

    def finish(self) -> tuple[str, str]:
        """The reply ended: whatever is held goes out as what it was inside of."""
        held, self._held = self._held, ""
        if self._state is _State.THINKING:
            return self._given(held, "")
        if self._state is _State.BEFORE and held.strip():
            return self._given("", held)  # a tag's beginning, and no more: text after all
        return "", ""

    def _step(self) -> tuple[str, str] | None:
        """One move of the state machine over the held text; None when it must wait for more."""
        held = self._held
        if self._state is _State.BEFORE:
            start = held.lstrip()
            if start.startswith(OPEN):
                self._held, self._state = start[len(OPEN) :], _State.OPENED
                return "", ""
            if not start or OPEN.startswith(start):
                return None  # whitespace, or the tag's beginning: wait
            # No block: the reply is the answer, its whitespace as written.
            self._held, self._state = "", _State.ANSWER
            return "", held
        if self._state in (_State.OPENED, _State.CLOSED):
            rest = held.lstrip()
            if not rest:
                self._held = ""
                return None
            self._held = rest
            self._state = _State.THINKING if self._state is _State.OPENED else _State.ANSWER
            return "", ""
        if self._state is _State.THINKING:
            end = held.find(CLOSE)
            if end >= 0:
                self._held, self._state = held[end + len(CLOSE) :], _State.CLOSED
                return held[:end], ""
            keep = partial_tail(held, CLOSE)
            self._held = held[len(held) - keep :]
            out = held[: len(held) - keep]
            return (out, "") if out else None
        if not held:
            return None
        self._held = ""
        return "", held


def partial_tail(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag` (held: the tag may follow)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0
