"""A request's tools on the engine thread: the model's support, the forcing grammar, the stream.

`ToolCallFilter` holds back a call's text while it is written (a client must not see
`<tool_call>{...` as content) and, at the end, splits the answer into content and calls.
"""

from __future__ import annotations

import functools
import re
from dataclasses import replace

from localspec.engine.callstream import CallStreams
from localspec.engine.constraint import lark_grammar
from localspec.engine.llama import LlamaModel
from localspec.engine.reasoning import ThinkTokens, thinking_first
from localspec.engine.toolcalls import (
    ToolFormat,
    call_grammar,
    callable_tools,
    lazy_call_grammar,
    named_tool_missing,
    parse_tool_calls,
    tool_format,
)
from localspec.errors import UnsupportedModelError, UserInputError
from localspec.types import (
    AllowedTools,
    CallDelta,
    GenerationRequest,
    GenerationResult,
    ToolCall,
    calls_optional,
)


def request_tool_format(model: LlamaModel, req: GenerationRequest) -> ToolFormat | None:
    """The model's call syntax when the request offers tools it may call; refuses a model without."""
    if not req.tools or req.tool_choice == "none":
        return None
    fmt = tool_format(model.meta("tokenizer.chat_template"))
    if fmt is None:
        raise UnsupportedModelError(
            f"{model.path.name}'s chat template has no tool support; send the request without tools",
            param="tools",
        )
    missing = named_tool_missing(req.tools, req.tool_choice)
    if missing is not None:
        raise UserInputError(
            f"tool_choice names {missing!r}, which is not among the tools", param="tool_choice"
        )
    if isinstance(req.tool_choice, AllowedTools) and not req.tool_choice.names:
        raise UserInputError(
            "tool_choice allows no tools: name at least one, or send tool_choice none", param="tool_choice"
        )
    return fmt


def call_grammar_for(
    model: LlamaModel, fmt: ToolFormat, req: GenerationRequest, think: ThinkTokens | None = None
) -> str | None:
    """The grammar for a request's calls: the answer is calls only (tool_choice required or named),
    or free text whose calls, once opened, must be valid (auto, where the model's markers allow);
    with `think`, after the thinking model's reasoning."""
    special = functools.partial(single_token, model)
    parallel = req.parallel_calls
    if calls_optional(req.tool_choice):
        tools = callable_tools(req.tools, req.tool_choice)
        lazy = lazy_call_grammar(fmt, tools, parallel, special, req.thinking_budget)
        if lazy is None:
            return None
        return lark_grammar(lazy if think is None else thinking_first(lazy, think), param="tools")
    lark = call_grammar(fmt, req.tools, req.tool_choice, parallel, special, req.thinking_budget)
    return lark_grammar(lark if think is None else thinking_first(lark, think), param="tools")


def single_token(model: LlamaModel, marker: str) -> int | None:
    """The token `marker` is, where it is one (a call marker, a thinking tag)."""
    ids = model.tokenize(marker, add_special=False, parse_special=True)
    return ids[0] if len(ids) == 1 else None


# An answer that opens with JSON, bare or in a code fence, may be a call in any family (Qwen2.5-Coder
# often writes its call as fenced JSON, without <tool_call>); a fence of code in another language is not.
_CALL_OPENING = re.compile(r"(```(json)?\s*)?\{")
_ARRAY_OPENING = re.compile(r"(```(json)?\s*)?[\[{]")
_MAYBE_OPENING = re.compile(r"`{1,3}(j|js|jso|json)?\s*")


def _opening(head: str, array: bool) -> bool | None:
    """Whether an answer's start opens a call: True, False, or None while it cannot be told."""
    if (_ARRAY_OPENING if array else _CALL_OPENING).match(head):
        return True
    return None if _MAYBE_OPENING.fullmatch(head) or not head else False


class ToolCallFilter:
    """Streams content, holds back what may be a call, and parses the calls at the end."""

    def __init__(
        self,
        fmt: ToolFormat,
        parallel: bool,
        names: tuple[str, ...] | None = None,
        stream_calls: bool = False,
    ) -> None:
        """`names`: the tools a call may name (None: any). A grammar holds the calls to them where
        the format allows one; where not, an answer calling another tool stays text.
        `stream_calls`: the calls' arguments stream as written (`call_deltas`), where a grammar
        holds the calls (their JSON then begins with the name, and every call closes)."""
        self.fmt = fmt
        self._streams = CallStreams(fmt.start, fmt.args_key, fmt.array, parallel) if stream_calls else None
        self._deltas: list[CallDelta] = []
        self.parallel = parallel
        self.names = names
        self._text = ""
        self._released = 0  # characters of _text already streamed
        self._holding = False  # a call (maybe) began: nothing more streams until the end
        self._decided = False  # the answer's opening was read: it is not a call
        self._closed = 0  # calls closed (end markers) when `repeated` last looked

    def push(self, text: str) -> str:
        """Add newly final text; return the part that is surely content."""
        self._text += text
        if self._holding:
            self._follow()
            return ""
        if not self._decided and self.fmt.bare:
            opening = _opening(self._text.lstrip(), self.fmt.array)
            if opening is None:
                return ""  # too little text to tell yet
            self._decided = True
            if opening:
                self._holding = True
                self._follow()
                return ""
        end = self._marker_start() if self.fmt.end else len(self._text)
        out = self._text[self._released : end]
        self._released = max(self._released, end)
        if self._holding:
            self._follow()
        return out

    def _follow(self) -> None:
        """The calls' new pieces, where they stream; a call's pieces since the last look as one."""
        if self._streams is None:
            return
        for delta in self._streams.update(self._text):
            last = self._deltas[-1] if self._deltas else None
            if last is not None and last.index == delta.index:
                merged = last.arguments + delta.arguments
                self._deltas[-1] = CallDelta(delta.index, last.name, merged, delta.done)
            else:
                self._deltas.append(delta)

    def call_deltas(self) -> tuple[CallDelta, ...]:
        """What is new of the calls being written since the last look."""
        deltas, self._deltas = tuple(self._deltas), []
        return deltas

    def _marker_start(self) -> int:
        """Where streaming must stop: before the call marker, or a tail that may begin it."""
        start = self.fmt.start
        found = self._text.find(start, self._released)
        if found >= 0:
            self._holding = True
            return found
        for keep in range(min(len(start) - 1, len(self._text)), 0, -1):
            if start.startswith(self._text[-keep:]):
                return len(self._text) - keep
        return len(self._text)

    def repeated(self) -> bool:
        """Whether the call just closed repeats an earlier one of this reply, word for word.

        A small model held to calls by a grammar that allows more than one (tool_choice required
        with parallel calls asked for) writes one after another until max_tokens: Qwen2.5-Coder 1.5B
        asked for the weather, offered get_weather and get_time, wrote get_weather, get_time,
        get_weather, get_time... and the reply ended at its length with the last call cut. The
        caller ends the reply at the first repeat; `finish` keeps each call once."""
        end = self.fmt.end
        closed = self._text.count(end) if self._holding and end else 0
        if closed <= self._closed:
            return False
        self._closed = closed
        _, calls = parse_tool_calls(self.fmt, self._text[: self._text.rindex(end) + len(end)])
        return len(calls) > 1 and _key(calls[-1]) in {_key(c) for c in calls[:-1]}

    def finish(self, result: GenerationResult) -> tuple[str, GenerationResult]:
        """The text still to stream, and the result with its calls split from its content. Where
        calls streamed, their arguments are the text streamed (the same values as parsed, so a
        client's joined deltas are each call's arguments); where the last was cut off
        (max_tokens), it is gone from the result as from the content: its pieces were all a
        client gets, and the calls before it stand."""
        content, calls = parse_tool_calls(self.fmt, result.text) if self._holding else (result.text, [])
        calls = _once(calls)
        if self.names is not None and any(c.name not in self.names for c in calls):
            content, calls = result.text, []
        shown = self._streams.shown() if self._streams is not None else []
        whole = [c for c in shown if c.arguments.done]
        if len(whole) < len(shown) or len(calls) < len(whole):  # cut short (an array's parse is lost)
            kept = tuple(ToolCall(c.name, c.arguments.text) for c in whole)
            cut = next((ToolCall(c.name, c.arguments.text) for c in shown if not c.arguments.done), None)
            text = self._text[: self._released].strip()
            return "", replace(result, text=text, tool_calls=kept, cut_call=cut)
        for i, written in enumerate(whole):
            if calls[i].name == written.name:
                calls[i] = replace(calls[i], arguments=written.arguments.text)
        if not calls:
            return self._text[self._released :], result
        if not self.parallel:
            calls = calls[:1]
        streamed = self._text[: self._released]
        tail = content[len(streamed) :] if content.startswith(streamed) else ""
        reason = "tool_calls" if result.finish_reason == "stop" else result.finish_reason
        return tail, replace(result, text=content, tool_calls=tuple(calls), finish_reason=reason)


def _key(call: ToolCall) -> tuple[str, str]:
    return call.name, call.arguments


def _once(calls: list[ToolCall]) -> list[ToolCall]:
    """Each call once, in the order first written (the same function with the same arguments again
    does nothing more; a small model under a grammar repeats itself, see `repeated`)."""
    seen: set[tuple[str, str]] = set()
    unique = []
    for call in calls:
        if _key(call) not in seen:
            seen.add(_key(call))
            unique.append(call)
    return unique
