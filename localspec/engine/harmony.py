"""OpenAI's harmony format (gpt-oss): a reply's channels told apart, its calls read, and forced.

gpt-oss writes each part of a reply as a message with a channel: `analysis` is its reasoning,
`final` its answer, `commentary` a preamble to the user or, with a recipient, a tool call:

    <|channel|>analysis<|message|>The user asks...<|end|><|start|>assistant<|channel|>final<|message|>4

or, for a call (the reply ends at `<|call|>`, an end-of-generation token):

    <|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}

The prompt ends with `<|start|>assistant`, so the first message has no role. llama.cpp renders
`<|channel|>`, `<|message|>`, `<|start|>` and `<|constrain|>` as text and `<|end|>` as nothing,
so a message ends where the next one starts; both are read. The split streams as
engine.reasoning's does (the same `push`/`finish`), and writes each call into the answer in a
form of its own (CALL_START, CALL_END around `{"name": ..., "arguments": ...}`), which
toolcalls.HARMONY then reads as it reads any family's calls. A reply with no channel at all
(written under a grammar that did not ask for one) is all answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from localspec.engine.reasoning import ANSWER_RULE, StreamSplit, bounded_thought, partial_tail, thinks

CHANNEL, MESSAGE, START, END, CONSTRAIN = (
    "<|channel|>",
    "<|message|>",
    "<|start|>",
    "<|end|>",
    "<|constrain|>",
)
# Where a call is written into the answer. `<|call|>` ends a reply (end of generation), so a
# model's text never holds it; `<|end|>` renders as nothing.
CALL_START, CALL_END = "<|call|>", "<|end|>"
# The longest header read before the text is taken for an answer written without one.
_MAX_HEADER = 256
# A body ends where another message begins: `<|end|>` where it renders, else the next header.
_BODY_ENDS = (END, START, CHANNEL)
_RECIPIENT = re.compile(r"\bto=(\S+?)(?=\s|<\||$)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"(\w+)")
# lazy_calls' text: a body's is free; a header's (HEAD) may not name a function, or it is a
# call's (CALL_HEAD, up to its first `to=functions.`); after the name, a space opens the rest.
# Under a budget, a header after the first analysis may not open another, nor call from one (a
# model that wanted more analysis would be pushed into a call): LATER_HEAD, LATER_CALL_HEAD.
_LAZY_TERMINALS = r"""TEXT: /(.|\n)+/
HEAD: /(.|\n)+/ & ~/(.|\n)*to=functions(.|\n)*/
CALL_HEAD: /(.|\n)*to=functions\./ & ~/(.|\n)*to=functions\.(.|\n)+/
NAME_TAIL: /\s(.|\n)*/ & ~/(.|\n)*to=functions(.|\n)*/
LATER_HEAD: /(.|\n)+/ & ~/(.|\n)*(to=functions|analysis)(.|\n)*/
LATER_CALL_HEAD: CALL_HEAD & ~/(.|\n)*analysis(.|\n)*/
"""


def harmony(template: str | None) -> bool:
    """Whether a chat template writes the harmony format (gpt-oss's)."""
    return template is not None and CHANNEL in template and MESSAGE in template


def reasons(template: str | None) -> bool:
    """Whether a model with this chat template gives its reasoning apart from its answer: in
    `<think>` tags (engine.reasoning), or in harmony's analysis channel."""
    return thinks(template) or harmony(template)


@dataclass
class _Message:
    channel: str
    recipient: str | None

    @property
    def call(self) -> str | None:
        """The function a call message calls, or None where it is none."""
        if self.recipient is None or not self.recipient.startswith("functions."):
            return None
        return self.recipient.removeprefix("functions.")


class HarmonySplit(StreamSplit):
    """Splits a harmony reply into reasoning and answer (with its calls) as it arrives.

    `reasoning`: where False (a client asked for the reasoning unsplit), analysis goes to the
    answer as the model wrote it, a blank line after it. `stream_calls`: a call's body goes to
    the answer as it comes, inside its call's JSON (a grammar holds the body to JSON; the call's
    arguments then stream as any family's do), where else it waits for its end."""

    def __init__(self, reasoning: bool = True, stream_calls: bool = False) -> None:
        super().__init__()
        self._split = reasoning
        self._stream_calls = stream_calls
        self._message: _Message | None = None  # the message whose body is being read
        self._plain = False  # no header came: everything is answer
        self._opened = False  # the streaming call's head went to the answer
        self._body = ""  # the streaming call's body so far

    def finish(self) -> tuple[str, str]:
        """The reply ended: a message's rest is its body; a header cut short is dropped."""
        held, self._held = self._held, ""
        if self._plain or (self._message is None and not _may_be_header(held)):
            return self._given("", held)
        if self._message is None:
            return "", ""
        return self._given(*self._close(held))

    def _step(self) -> tuple[str, str] | None:
        held = self._held
        if not held:
            return None
        if self._plain:
            self._held = ""
            return "", held
        if self._message is None:
            return self._header(held)
        end = _first_end(held)
        if end >= 0:
            rest = held[end:].removeprefix(END)
            self._held = rest
            return self._close(held[:end])
        call = self._message.call
        if call is not None and not self._stream_calls:  # a call's arguments wait for its end
            return None
        keep = max(partial_tail(held, tag) for tag in _BODY_ENDS)
        if keep == len(held):
            return None
        self._held = held[len(held) - keep :]
        if call is not None:
            self._body += held[: len(held) - keep]
            return "", self._call_head(call) + held[: len(held) - keep]
        return self._route(self._message, held[: len(held) - keep])

    def _call_head(self, call: str) -> str:
        """The streaming call's opening, once: its marker, its name, then its arguments follow."""
        if self._opened:
            return ""
        self._opened = True
        return CALL_START + '{"name": ' + json.dumps(call, ensure_ascii=False) + ', "arguments": '

    def _header(self, held: str) -> tuple[str, str] | None:
        """Read a message's header, up to `<|message|>`."""
        at = held.find(MESSAGE)
        if at < 0:
            if _may_be_header(held) and len(held) <= _MAX_HEADER:
                return None
            self._plain = True  # no harmony here: an answer written without a channel
            return "", ""
        header, self._held = held[:at], held[at + len(MESSAGE) :]
        if not _may_be_header(header):
            self._plain, self._held = True, held
            return "", ""
        # The last channel named counts: gpt-oss-20b sometimes writes a stray `<|channel|>commentary`
        # before its analysis (llama.cpp skips it too).
        channels = _CHANNEL_NAME.findall(header)
        recipient = _RECIPIENT.search(header)
        self._message = _Message(
            channels[-1] if channels else "final", recipient.group(1) if recipient else None
        )
        return "", ""

    def _route(self, message: _Message, text: str) -> tuple[str, str]:
        """Where a part of `message`'s body goes."""
        if message.channel == "analysis" and self._split:
            return text, ""
        return "", text

    def _close(self, text: str) -> tuple[str, str]:
        """The current message ends with `text` (a call's whole body: it is held until its end):
        a call is written out whole; a blank line goes
        between unsplit analysis and what follows it."""
        message = self._message
        assert message is not None
        self._message = None
        if message.call is None:
            reasoning, answer = self._route(message, text)
            if not self._split and message.channel == "analysis":
                answer += "\n\n"
            return reasoning, answer
        if self._stream_calls:
            # Closed where its arguments are whole: a call the token limit cut stays open (cut).
            head, self._body = self._call_head(message.call), self._body + text
            return "", head + text + ("}" + CALL_END if _is_json(self._body) else "")
        return "", f"{CALL_START}{call_json(message.call, text)}{CALL_END}"


# Token id of a marker when it is one special token (a grammar must name those), else None.
SpecialFn = Callable[[str], int | None]


def forced_reply(last: str, special: SpecialFn, rules: str = "", budget: int | None = None) -> str:
    """A grammar (llguidance's Lark) for a reply whose last message, from its channel's name on,
    is `last` (a Lark expression; `rules` its rules), after the analysis the model may write first,
    as llama.cpp constrains gpt-oss; within `budget` tokens where there is one (0: no analysis)."""
    channel = marker(CHANNEL, special)
    if budget == 0:
        return f"start: {channel} {last}\n{rules}"
    return f"start: analysis? {channel} {last}\n{_analysis(special, budget)}{rules}"


def _analysis(special: SpecialFn, budget: int | None) -> str:
    """The rule `analysis`: the analysis message and the next one's role, within `budget` tokens
    where there is one (not 0), with the rule for its text."""
    channel, message, end, start = (marker(t, special) for t in (CHANNEL, MESSAGE, END, START))
    thought, rule = bounded_thought(budget)
    return f'analysis: {channel} "analysis" {message} {thought} {end} {start} "assistant"\n{rule}'


def budget_reply(budget: int, special: SpecialFn) -> str:
    """A grammar for a reply whose analysis stays within `budget` tokens (Anthropic's
    budget_tokens), its final answer free: past the budget the analysis is closed for the model."""
    last = f"{message_opening('final', special)} ANSWER?"
    return forced_reply(last, special, ANSWER_RULE, budget)


def lazy_calls(arguments: Mapping[str, str], special: SpecialFn, budget: int | None = None) -> str | None:
    """A grammar for tool_choice auto: the reply free, until a header names a function
    (`to=functions.`, in the channel's header or the role's); from there the name is one of the
    tools' and the body that tool's arguments (`arguments`: each tool's name to its Lark expression),
    as llama.cpp's lazy grammar for gpt-oss holds a reply from the same point. Only the headers'
    text is watched: a body may say `to=functions.` freely; another recipient (a built-in tool) is
    free. None where a marker is not one token (text could not be told from a header then).

    With a `budget` (Anthropic's budget_tokens), one analysis at most, first, within it (none for
    0): no later header may open another."""
    ids = [special(t) for t in (CHANNEL, MESSAGE, START, END, CONSTRAIN)]
    if None in ids:
        return None
    channel, message, start, end, constrain = (f"<[{i}]>" for i in ids)
    opening, analysis, head, call_head = "", "", "HEAD", "CALL_HEAD"
    if budget is not None:
        head, call_head = "LATER_HEAD", "LATER_CALL_HEAD"
        if budget > 0:
            opening, analysis = "analysis? ", _analysis(special, budget)
    # What may come between a call's name and its body: ` <|constrain|>json`, ` json` or nothing.
    rest = f"({constrain} HEAD?)? {message}"
    tools = arguments.items()
    in_channel = " | ".join(f"{json.dumps(name)} NAME_TAIL? {rest} {args}" for name, args in tools)
    in_role = " | ".join(f"{json.dumps(name)} {channel} HEAD? {rest} {args}" for name, args in tools)
    return (
        f"start: {opening}TEXT? part* call?\n"
        f"part: {channel} {head}? | {start} {head}? | {constrain} {head}? | {message} TEXT? | {end} TEXT?\n"
        f"call: {channel} {call_head} in_channel | {start} {call_head} in_role\n"
        f"in_channel: {in_channel}\n"
        f"in_role: {in_role}\n{analysis}" + _LAZY_TERMINALS
    )


def message_opening(channel: str, special: SpecialFn) -> str:
    """A Lark expression for a header's rest, from the channel's name to `<|message|>`: with the
    `<|constrain|>json` gpt-oss may write before a JSON body."""
    constrain = marker(CONSTRAIN, special)
    return f'{json.dumps(channel)} (" "? {constrain} "json")? {marker(MESSAGE, special)}'


def marker(text: str, special: SpecialFn) -> str:
    """A marker in a grammar: its token where it is one, else its text."""
    token = special(text)
    return f"<[{token}]>" if token is not None else json.dumps(text)


def call_json(name: str, arguments: str) -> str:
    """A call as the hermes-style JSON toolcalls reads; arguments that are no JSON stay text."""
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        args = arguments
    return json.dumps({"name": name, "arguments": args}, ensure_ascii=False)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _may_be_header(text: str) -> bool:
    """Whether `text` is, or begins, a message header (what precedes `<|message|>`)."""
    head = text.lstrip()
    for opening in (START, CHANNEL, " to=", "to="):
        if head.startswith(opening) or opening.startswith(head):
            return True
    return False


def _first_end(text: str) -> int:
    found = [at for at in (text.find(tag) for tag in _BODY_ENDS) if at >= 0]
    return min(found) if found else -1
