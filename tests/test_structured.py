"""Structured output in the engine, on tiny models through real llama.cpp and llguidance.

A JSON schema masks the target at every position: greedy output must be token-identical
for every method (speculation stays lossless under the grammar), every output must be
valid against its schema, and sampled output must keep the constrained distribution.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from test_engine import TINY, _same_distribution, make_engine

from localspec.engine.constraint import choice_lark, gbnf_lark, regex_lark
from localspec.engine.worker import Engine
from localspec.errors import UserInputError
from localspec.types import GenerationRequest, GenerationResult, Method, SamplingParams, SpecParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["code", "test", "data"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
WORDS = {"type": "array", "items": {"enum": ["the cat", "the dog", "a cat", "hello world", "one two"]}}
SCHEMAS: list[dict[str, Any]] = [
    PERSON,
    WORDS,
    {"type": "object"},
    {"enum": ["yes", "no", "maybe"]},
    {
        "type": "array",
        "items": {"type": "integer", "minimum": -50, "maximum": 50},
        "minItems": 2,
        "maxItems": 4,
    },
]
PROMPTS = ["the cat sat on", "def add(a, b):\n    return", "one two three one two", "hello world"]


@pytest.fixture(scope="module")
def engine(tiny_target: Path, tiny_related_draft: Path) -> Iterator[Engine]:
    with make_engine(tiny_target, tiny_related_draft, TINY) as e:
        yield e


def run(engine: Engine, prompt: str, schema: dict[str, Any], method: Method, **kw: Any) -> GenerationResult:
    kw.setdefault("max_tokens", 96)
    request = GenerationRequest(
        prompt=prompt, json_schema=schema, speculative=SpecParams(method, 4), cache_prompt=False, **kw
    )
    return engine.generate(request)


@pytest.mark.parametrize("schema", SCHEMAS, ids=["person", "words", "object", "enum", "numbers"])
def test_greedy_under_a_schema_is_identical_for_every_method_and_valid(
    engine: Engine, schema: dict[str, Any]
) -> None:
    validator = jsonschema_rs.validator_for(schema)
    for prompt in PROMPTS:
        base = run(engine, prompt, schema, "none")
        if base.finish_reason == "stop":  # a cut-off answer (max_tokens) is not yet valid JSON
            validator.validate(json.loads(base.text))
        for method in ("ngram", "draft", "layerskip", "auto"):
            out = run(engine, prompt, schema, method)
            assert out.token_ids == base.token_ids, (prompt, method)


def test_the_grammar_drafts_what_it_forces(engine: Engine) -> None:
    out = run(engine, "hello world", PERSON, "none")
    steps = out.stats.method_steps
    # `{"name": "` is forced from the start: one step drafts it, and the target accepts it.
    assert steps.get("grammar", 0) >= 1 and out.stats.accepted >= 2
    json.loads(out.text)


def test_sampled_output_is_always_valid(engine: Engine) -> None:
    validator = jsonschema_rs.validator_for(PERSON)
    valid = drafted = accepted = 0
    for seed in range(40):
        params = SamplingParams(temperature=1.0, seed=seed)
        out = run(engine, "the cat sat on", PERSON, "draft", sampling=params, max_tokens=200)
        drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
        if out.finish_reason == "stop":
            validator.validate(json.loads(out.text))
            valid += 1
    assert valid >= 30
    assert 0 < accepted < drafted  # drafts were really verified under the grammar, some rejected


def _answers(engine: Engine, method: Method, n: int) -> Counter[int]:
    seen: Counter[int] = Counter()
    schema = {
        "type": "array",
        "items": {"enum": ["the cat", "the dog", "a cat", "hello world"]},
        "minItems": 2,
        "maxItems": 2,
    }
    for seed in range(n):
        params = SamplingParams(temperature=1.0, seed=seed + (0 if method == "none" else 10**6))
        out = run(engine, "the cat sat on", schema, method, sampling=params, max_tokens=40)
        seen[hash(out.token_ids)] += 1  # one category per distinct answer
    return seen


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_sampled_answers_under_a_grammar_follow_the_target_distribution(
    engine: Engine, method: Method
) -> None:
    base = _answers(engine, "none", 1500)
    spec = _answers(engine, method, 1500)
    assert len(base) > 3  # the grammar leaves real choices
    assert _same_distribution(base, spec) > 1e-3


def test_an_invalid_schema_is_a_user_error(engine: Engine) -> None:
    with pytest.raises(UserInputError, match="strin"):
        run(engine, "hello", {"type": "strin"}, "none")
    # The engine is still fine.
    assert run(engine, "hello", {"enum": ["a", "b"]}, "none").text in ('"a"', '"b"')


# --- a grammar of the request's own: GBNF, a regular expression, a list of choices ----------------

# llama.cpp's GBNF: `root` the start, character classes, repetition (bounded, so a reply ends).
PAIRS_GBNF = r"""root ::= pair (", " pair)?
pair ::= word "=" [0-9] [0-9]?
word ::= "cat" | "dog" | "hello"
"""
PAIRS = re.compile(r"(cat|dog|hello)=[0-9][0-9]?(, (cat|dog|hello)=[0-9][0-9]?)?")
GRAMMARS = [
    (gbnf_lark(PAIRS_GBNF, "grammar"), PAIRS),
    (regex_lark(r"[a-z]{2,5}-[0-9]{3}", "guided_regex"), re.compile(r"[a-z]{2,5}-[0-9]{3}")),
    (choice_lark(["the cat", "the dog", "a cat"], "guided_choice"), re.compile(r"the cat|the dog|a cat")),
]


@pytest.mark.parametrize(("lark", "whole"), GRAMMARS, ids=["gbnf", "regex", "choice"])
def test_greedy_under_a_grammar_is_identical_for_every_method_and_follows_it(
    engine: Engine, lark: str, whole: re.Pattern[str]
) -> None:
    for prompt in PROMPTS:
        request = GenerationRequest(prompt=prompt, grammar=lark, max_tokens=40, cache_prompt=False)
        base = engine.generate(request)
        assert base.finish_reason == "stop" and whole.fullmatch(base.text), (prompt, base.text)
        for method in ("ngram", "draft", "layerskip", "auto"):
            out = engine.generate(replace(request, speculative=SpecParams(method, 4)))
            assert out.token_ids == base.token_ids, (prompt, method)


def test_a_grammar_comes_alone(engine: Engine) -> None:
    lark = choice_lark(["a", "b"], "guided_choice")
    with pytest.raises(UserInputError, match="a grammar holds the whole reply"):
        engine.generate(GenerationRequest(prompt="hello", grammar=lark, json_schema={"type": "object"}))
    assert engine.generate(GenerationRequest(prompt="hello", grammar=lark)).text in ("a", "b")


@pytest.mark.parametrize(
    ("convert", "text", "says"),
    [
        (gbnf_lark, 'root ::= "a" missing', "Rule 'missing' not found"),
        (gbnf_lark, 'start: "a" | missing', 'unknown name: "missing"'),
        (regex_lark, "[a-", "unclosed character class"),
    ],
)
def test_a_grammar_that_cannot_be_used_is_one_line_naming_its_field(
    convert: Callable[[str, str], str], text: str, says: str
) -> None:
    with pytest.raises(UserInputError) as err:
        convert(text, "guided_grammar")
    assert says in err.value.message and "\n" not in err.value.message
    assert err.value.param == "guided_grammar"
