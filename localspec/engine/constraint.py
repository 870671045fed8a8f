"""Constrained decoding: a grammar masks the target's logits at every position it decides.

The grammar engine is llguidance (pip `llguidance`), chosen over llama.cpp's own grammar
sampler by measuring both on this project's 2-core CPU with the real Qwen2.5-Coder 1.5B
vocabulary (151,936 tokens), a JSON schema of 3 fields and a 31-token answer:

    llguidance mask        0.03 ms a position (max 0.16 ms), + 0.14 ms to apply it with numpy
    llguidance rollback    0.03 ms (rollback(1) + consume_token); a copy of the matcher 0.002 ms
    llama.cpp grammar      18.3 ms a position (max 49.8 ms) through llama_sampler_apply on
                           151,936 candidates; clone for rollback 0.004 ms

A 1.5B decode step costs ~60 ms here, so llama.cpp's sampler would add a third to every token
(and more to a verify batch, which masks each of its positions); llguidance adds well under 1%.
Building llguidance's tokenizer from the vocabulary costs ~0.9 s, once per model.

Lossless with speculation: the constraint advances only on tokens the target accepted, so at
every verified position it masks the target's distribution in the state that position sees;
a drafted token the grammar forbids has probability 0 there and is always rejected. The
constraint never needs to be told about rejected tokens: a verify consumes a drafted token only
once it is judged and kept.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from localspec.errors import LocalspecError, UserInputError

if TYPE_CHECKING:
    import llguidance
    from llguidance._lib import JsonCompileOptions

    from localspec.engine.llama import LlamaModel

# JSON as json.dumps writes it ({"a": 1, "b": [2, 3]}): one spelling, so the grammar forces every
# separator (free drafts) and a small model cannot loop on whitespace; tool calls are trained on it.
JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "key_separator": ": ",
    "item_separator": ", ",
    # Keywords llguidance does not implement (rare) are ignored rather than refusing the request.
    "lenient": True,
}
# gpt-oss writes its calls' JSON compact ({"city":"Paris"}, the harmony format's own examples) as
# often as spaced, so there one space may stand or not at each place JSON allows whitespace, as
# llama.cpp's grammar for it takes either; bounded, so a small model still cannot loop on it.
HARMONY_JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": True,
    "whitespace_pattern": "[ ]?",
    "key_separator": ":",
    "item_separator": ",",
    "lenient": True,
}


# A call a model writes as a bare JSON answer, outside its format's markers, it spaces its own way
# (Qwen2.5-Coder indents it in a code fence): any spacing JSON allows, a little at each place, so a
# small model still cannot loop on whitespace.
SPACED_JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": True,
    "whitespace_pattern": "[ \\t\\n]{0,12}",
    "key_separator": ":",
    "item_separator": ",",
    "lenient": True,
}


def json_schema_grammar(schema: Mapping[str, Any], param: str = "json_schema") -> str:
    """llguidance's grammar for JSON valid against `schema`; UserInputError names `param` if invalid."""
    import llguidance

    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as exc:
        raise UserInputError(f"{param}: invalid JSON schema: {exc}", param=param) from None
    check_grammar(grammar, param)
    return grammar


def json_schema_lark(
    schema: Mapping[str, Any], rule: str = "start", options: JsonCompileOptions = JSON_OPTIONS
) -> str:
    """The grammar of `json_schema_grammar` (check the schema with it first) as a Lark rule `rule`,
    for grammars that put something before the JSON (a thinking model's reasoning)."""
    return f"{rule}: %json " + json.dumps({**schema, "x-guidance": options}) + "\n"


def lark_grammar(lark: str, param: str, what: str = "schema") -> str:
    """llguidance's grammar for a Lark text, checked: UserInputError names `param` (and `what`)."""
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    check_grammar(grammar, param, what)
    return grammar


def check_grammar(grammar: str, param: str, what: str = "schema") -> None:
    """Validate a grammar without a tokenizer (no model needed), so the API can refuse it up front."""
    import llguidance

    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        why = _one_line(messages[0]) if messages else "invalid"
        raise UserInputError(f"{param}: the {what} cannot be used: {why}", param=param)


def _one_line(message: str) -> str:
    """llguidance's message in one line: it may go on to show the grammar's text with a caret
    under the fault, and a regex's own `error: ...` below that."""
    first, *rest = [line.strip() for line in message.strip().splitlines()] or ["invalid"]
    return " ".join([first, *(line for line in rest if line.startswith("error:"))])


# --- a request's own grammar (GenerationRequest.grammar) ----------------------------------------
# Clients ask for one in three forms: llama.cpp's GBNF (llama-server's `grammar`, vLLM's
# guided_grammar), a regular expression (vLLM's guided_regex) and a list of choices (guided_choice).
# Each becomes a Lark grammar in llguidance's syntax here, checked, so the engine takes one form.
# Where something must come before it (a thinking model's reasoning, gpt-oss's analysis) it is a
# grammar of its own that the outer one names (USER_GRAMMAR): its rules cannot clash with theirs.
USER_GRAMMAR = "@user"


def gbnf_lark(text: str, param: str) -> str:
    """A GBNF grammar (llama.cpp's, `root` its start), or one already in Lark, as Lark; checked."""
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(text)
    except Exception as exc:  # the converter raises bare Exceptions (an unknown rule, a bad token)
        raise UserInputError(
            f"{param}: not a GBNF grammar llama.cpp would read: {exc}", param=param
        ) from None
    lark_grammar(lark, param, "grammar")
    return lark


def regex_lark(pattern: str, param: str) -> str:
    """A regular expression the whole reply must match, as Lark; checked."""
    import llguidance

    try:
        grammar = json.loads(llguidance.LLMatcher.grammar_from_regex(pattern))
    except (ValueError, TypeError) as exc:
        raise UserInputError(f"{param}: invalid regular expression: {exc}", param=param) from None
    lark = str(grammar["grammars"][0]["lark_grammar"])
    lark_grammar(lark, param, "regular expression")
    return lark


def choice_lark(choices: Sequence[str], param: str) -> str:
    """One of `choices`, exactly, as Lark."""
    if not choices or not all(choices):
        raise UserInputError(f"{param}: give one or more choices, none of them empty", param=param)
    return "start: " + " | ".join(json.dumps(c) for c in choices) + "\n"


def with_user_grammar(outer: str, user: str, param: str = "grammar") -> str:
    """One grammar of `outer` (Lark naming USER_GRAMMAR where the request's own goes) and the
    request's own Lark grammar `user`; checked."""
    name = USER_GRAMMAR.removeprefix("@")
    grammar = json.dumps({"grammars": [{"lark_grammar": outer}, {"name": name, "lark_grammar": user}]})
    check_grammar(grammar, param, "grammar")
    return grammar


class GrammarTokenizer:
    """llguidance's view of one model's vocabulary; build once per model (~0.9 s for 151k tokens)."""

    def __init__(self, model: LlamaModel) -> None:
        from llguidance.llamacpp import lltokenizer_from_vocab

        # Every end-of-generation token (EOS, EOT, <|im_end|>...) ends a finished grammar.
        eog = model.eog_tokens()
        self.n_vocab = model.n_vocab
        # llguidance reads token attributes through a llama-cpp-python alias that warns it is deprecated.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            self.tokenizer = lltokenizer_from_vocab(model.vocab_handle, eos_token=eog or None)

    def constraint(self, grammar: str) -> Constraint:
        import llguidance

        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise UserInputError(f"unusable grammar: {matcher.get_error()}", param="json_schema")
        return Constraint(matcher, self.n_vocab)


class Constraint:
    """One request's grammar state: which tokens may come next, advanced token by token."""

    def __init__(self, matcher: llguidance.LLMatcher, n_vocab: int) -> None:
        self._matcher = matcher
        self._n_vocab = n_vocab
        self._bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)

    def allowed(self) -> npt.NDArray[np.bool_]:
        """A boolean per token: may it come next?"""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[: self._n_vocab]
        return bits.view(np.bool_)

    def mask(self, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """A copy of `logits` with every token the grammar forbids next at -inf."""
        return np.where(self.allowed(), logits, np.float32(-np.inf)).astype(np.float32, copy=False)

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, from the first, the grammar would take now (nothing is consumed)."""
        return int(self._matcher.validate_tokens(list(tokens))) if tokens else 0

    def free_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, from the first, come before a position where the grammar forces its
        own token (`forced`), were they taken now (nothing is consumed; `tokens` must be a valid prefix)."""
        # Walked on a copy, not consumed and rolled back: llguidance 1.9's rollback of gpt-oss's
        # <|end|> (between its messages, in a budget's or the tools' grammar) left the matcher stopped,
        # allowing nothing but the end: an n-gram draft of <|end|> after the analysis' first word
        # ended the reply there, where plain decoding went on.
        probe = self._matcher.deep_copy()
        taken = 0
        for token in tokens:
            if taken and probe.compute_ff_tokens():
                break
            _consume(probe, token)
            taken += 1
        return taken

    def accept(self, token: int) -> None:
        _consume(self._matcher, token)

    def forced(self) -> list[int]:
        """The tokens the grammar allows no alternative to from here (a free, almost always right draft)."""
        return list(self._matcher.compute_ff_tokens())

    @property
    def finished(self) -> bool:
        """Only end-of-generation may follow."""
        return bool(self._matcher.is_stopped())


def _consume(matcher: llguidance.LLMatcher, token: int) -> None:
    """`token` into `matcher`; only tokens it allowed are given, so a refusal is a bug of ours."""
    if not matcher.consume_token(token):
        raise LocalspecError(f"internal error: the grammar refused token {token} it had allowed")
