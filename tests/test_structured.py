"""Structured output in the engine, on tiny models through real llama.cpp and llguidance.

A JSON schema masks the target at every position: greedy output must be token-identical
for every method (speculation stays lossless under the grammar), every output must be
valid against its schema, and sampled output must keep the constrained distribution.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from test_engine import TINY, _same_distribution, make_engine

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
