"""What holds a request's reply to a form, and how the reply is read apart, for one target.

Once a request: the grammar over the reply (a forced call, calls within free text, a JSON schema,
the request's own grammar, or a thinking budget alone), after the reasoning a thinking model or
gpt-oss writes first; the sampling it runs with (ignore_eos bans the end of generation); and the
split of its text into reasoning and answer. The worker hands the result to the generation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from localspec.engine import harmony
from localspec.engine.constraint import (
    HARMONY_JSON_OPTIONS,
    USER_GRAMMAR,
    Constraint,
    GrammarTokenizer,
    json_schema_grammar,
    json_schema_lark,
    lark_grammar,
    with_user_grammar,
)
from localspec.engine.harmony import HarmonySplit
from localspec.engine.llama import LlamaModel
from localspec.engine.reasoning import (
    CLOSE,
    FREE_ANSWER,
    OPEN,
    ReasoningSplit,
    StreamSplit,
    ThinkTokens,
    opens_inside,
    thinking_first,
    thinks,
)
from localspec.engine.templating import ChatTemplate
from localspec.engine.toolcalls import ToolFormat
from localspec.engine.tooluse import call_grammar_for, single_token
from localspec.errors import UserInputError
from localspec.types import GenerationRequest, SamplingParams, calls_optional


@dataclass(frozen=True)
class Shape:
    """What holds and reads one request's reply."""

    constraint: Constraint | None  # the grammar over the reply, if any
    held: bool  # a schema, a grammar or calls hold it (not a thinking budget alone)
    params: SamplingParams  # the request's own, with the end of generation banned where it asked
    split: StreamSplit | None  # its reasoning told from its answer, where the model writes one
    # Its calls held by their grammar (name first, JSON arguments): they stream as written
    # (engine.callstream), and are followed without a stream too, so a call cut short ends the same.
    calls_held: bool = False


class Shaping:
    """One target's replies: its chat template and the grammars' view of its vocabulary."""

    def __init__(self, target: LlamaModel, template: ChatTemplate) -> None:
        self.target = target
        self.template = template
        self._grammars: GrammarTokenizer | None = None  # built at the first constrained request

    def shape(self, req: GenerationRequest, tokens: Sequence[int], tool_format: ToolFormat | None) -> Shape:
        """`req`'s reply after its prompt `tokens`, calling in `tool_format` where it offers tools."""
        source = self.template.source if req.messages or req.chat else None
        talks = harmony.harmony(source)
        inside = self._thinking(source, tokens)
        think = self._think_tokens(req, inside)
        constraint = self._constraint(req, tool_format, think, talks)
        if req.ignore_eos and constraint is not None:
            raise UserInputError(
                "ignore_eos cannot go with a JSON schema, a grammar or tools: they end the reply "
                "where it is complete",
                param="ignore_eos",
            )
        params = self._eos_banned(req.sampling) if req.ignore_eos else req.sampling
        held = constraint is not None
        if constraint is None:
            constraint = self._budget_alone(req, think, talks and tool_format is None)
        calls_held = held and tool_format is not None and req.json_schema is None
        split: StreamSplit | None = (
            HarmonySplit(req.split_reasoning, stream_calls=calls_held)
            if talks
            else _reasoning_split(req, inside, tool_format, think)
        )
        return Shape(constraint, held, params, split, calls_held)

    def special(self, marker: str) -> int | None:
        """The token `marker` is in the target, where it is one (a grammar names those)."""
        return single_token(self.target, marker)

    def grammars(self) -> GrammarTokenizer:
        if self._grammars is None:
            self._grammars = GrammarTokenizer(self.target)
        return self._grammars

    def _thinking(self, source: str | None, tokens: Sequence[int]) -> bool | None:
        """Whether a chat reply (its template's `source`; None for no chat) starts inside a thinking
        model's block (its prompt opened it); None where the model does not think."""
        if not thinks(source):
            return None
        tail = b"".join(self.target.shown_piece(t) for t in tokens[-4:])
        return opens_inside(tail.decode("utf-8", errors="replace"))

    def _think_tokens(self, req: GenerationRequest, inside: bool | None) -> ThinkTokens | None:
        """A thinking model's tags as single tokens, for a grammar to let it think before its
        answer (engine.reasoning); None where it does not think (`inside`, as `_thinking` says) or
        its tags are not single tokens."""
        if inside is None:
            return None
        opening, closing = single_token(self.target, OPEN), single_token(self.target, CLOSE)
        if opening is None or closing is None:
            return None
        return ThinkTokens(opening, closing, inside, req.thinking_budget)

    def _constraint(
        self, req: GenerationRequest, tool_format: ToolFormat | None, think: ThinkTokens | None, talks: bool
    ) -> Constraint | None:
        """The grammar a request's output must follow, if any: a forced tool call, a JSON schema (which
        then leaves no room for calls), the request's own grammar, or valid calls within free text
        (tool_choice auto); with `think`, after the thinking model's reasoning, as Ollama constrains
        only what follows it; where the model `talks` harmony, in a final message after its analysis."""
        if req.grammar is not None:
            if req.json_schema is not None or tool_format is not None:
                raise UserInputError(
                    "a grammar holds the whole reply: send it without a JSON schema, and without tools "
                    "(or with tool_choice none)",
                    param="grammar",
                )
            return self.grammars().constraint(
                self._own_grammar(req.grammar, think, talks, req.thinking_budget)
            )
        if req.json_schema is not None and (tool_format is None or calls_optional(req.tool_choice)):
            grammar: str | None = json_schema_grammar(req.json_schema)
            if talks:
                answer = json_schema_lark(req.json_schema, rule="answer", options=HARMONY_JSON_OPTIONS)
                opening = harmony.message_opening("final", self.special)
                grammar = lark_grammar(
                    harmony.forced_reply(f"{opening} answer", self.special, answer, req.thinking_budget),
                    "json_schema",
                )
            elif think is not None:
                grammar = lark_grammar(
                    thinking_first(json_schema_lark(req.json_schema), think), "json_schema"
                )
        elif tool_format is not None:
            grammar = call_grammar_for(self.target, tool_format, req, think)
        else:
            grammar = None
        return self.grammars().constraint(grammar) if grammar is not None else None

    def _own_grammar(self, lark: str, think: ThinkTokens | None, talks: bool, budget: int | None) -> str:
        """A request's own grammar, after the reasoning a thinking model or gpt-oss writes first."""
        if talks:
            opening = harmony.message_opening("final", self.special)
            outer = harmony.forced_reply(
                f"{opening} answer", self.special, f"answer: {USER_GRAMMAR}\n", budget
            )
        elif think is not None:
            outer = thinking_first(f"start: {USER_GRAMMAR}\n", think)
        else:
            return lark_grammar(lark, "grammar", "grammar")
        return with_user_grammar(outer, lark)

    def _budget_alone(
        self, req: GenerationRequest, think: ThinkTokens | None, talks: bool
    ) -> Constraint | None:
        """A thinking budget where nothing else holds the reply: a grammar that closes the model's
        reasoning past it, its answer free. `talks`: the model talks harmony and was offered no
        tools (the grammar would leave it no way to call one; with tools, the call's grammar
        bounds the analysis)."""
        if req.thinking_budget is None:
            return None
        if think is not None:
            return self.grammars().constraint(lark_grammar(thinking_first(FREE_ANSWER, think), "thinking"))
        if talks:
            budget = harmony.budget_reply(req.thinking_budget, self.special)
            return self.grammars().constraint(lark_grammar(budget, "thinking"))
        return None

    def _eos_banned(self, params: SamplingParams) -> SamplingParams:
        """`params` with every end-of-generation token banned (ignore_eos), as llama-server bans them."""
        banned = tuple((token, -math.inf) for token in self.target.eog_tokens())
        return replace(params, logit_bias=params.logit_bias + banned)


def _reasoning_split(
    req: GenerationRequest, inside: bool | None, tool_format: ToolFormat | None, think: ThinkTokens | None
) -> ReasoningSplit | None:
    """The split of a thinking model's chat reply into reasoning and content, where it applies
    (`inside`: None, the model does not think or this is no chat).

    Where a grammar holds the reply from its first token (a JSON schema, a grammar of its own, a
    forced call) and does not let the model think first (its tags are no single tokens), its text
    is the answer, even where the template opened a thinking block."""
    forced = (
        req.json_schema is not None
        or req.grammar is not None
        or (tool_format is not None and not calls_optional(req.tool_choice))
    )
    if inside is None or not req.split_reasoning or (forced and think is None):
        return None
    return ReasoningSplit(inside)
