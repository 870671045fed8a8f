"""Predicted Outputs: text the reply mostly repeats, drafted from; the output stays the target's alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from daemonproc import Daemon, start_daemon
from test_engine import PROMPTS, run

from localspec.engine.llama import LlamaModel
from localspec.engine.prompting import prediction_matched, prompt_forms
from localspec.engine.worker import Engine
from localspec.types import GenerationRequest

pytestmark = pytest.mark.timeout(120)


def test_prediction_matched_counts_the_predicted_tokens_the_reply_has_in_order() -> None:
    assert prediction_matched([1, 2, 3, 4, 5], [1, 2, 9, 4, 5, 6]) == 4
    assert prediction_matched([1, 2, 3], [3, 2, 1]) == 1
    assert prediction_matched([], [1]) == 0


@pytest.mark.parametrize("method", ["ngram", "auto"])
def test_a_prediction_is_drafted_from_from_the_first_token_and_changes_nothing(
    perfect: Engine, method: str
) -> None:
    drafted_plain = drafted_predicted = 0
    for prompt in PROMPTS[:5]:
        base = run(perfect, prompt, "none", max_tokens=40)
        plain = run(perfect, prompt, method, None, max_tokens=40)  # type: ignore[arg-type]
        predicted = run(perfect, prompt, method, None, max_tokens=40, prediction=base.text)  # type: ignore[arg-type]
        assert predicted.token_ids == base.token_ids == plain.token_ids
        assert predicted.stats.prediction_tokens > 0
        assert predicted.stats.prediction_accepted >= 0.8 * predicted.stats.prediction_tokens
        drafted_plain += plain.stats.accepted
        drafted_predicted += predicted.stats.accepted
        # A prediction the reply does not follow costs no token of the output.
        wrong = run(perfect, prompt, method, None, max_tokens=40, prediction="zebra " * 20)  # type: ignore[arg-type]
        assert wrong.token_ids == base.token_ids and wrong.stats.prediction_accepted <= 2
    if method == "ngram":  # auto's drafts follow its timings, which a loaded machine moves
        assert drafted_predicted > max(2 * drafted_plain, 40)


def test_a_prediction_the_prompt_holds_is_looked_up_there_alone(tiny: LlamaModel) -> None:
    # Looked up twice (the prompt and a view of the prediction), a file cost the code edits speed.
    prompt = "".join(f"def f{i}(a, b):\n    return a + {i}\n" for i in range(5))  # ten lines
    tokens = tiny.tokenize(prompt)

    def views(prediction: str) -> int:
        request = GenerationRequest(prompt=prompt, prediction=prediction)
        return len(prompt_forms(tiny, request, tokens, json_reply=False).views)

    assert views(prompt) == 0
    assert views(prompt.replace("a + 3", "a - 3")) == 0  # nine lines in ten held
    assert views(prompt.replace("a + 3", "a - 3").replace("a + 4", "a - 4")) == 1
    assert views("def mul(a, b):\n    return a * b\n") == 1


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("prediction-home"), tiny_target)
    yield d
    assert d.stop() == 0, d.log()


def test_the_openai_client_sends_a_prediction_and_reads_its_counts(daemon: Daemon) -> None:
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "one two"}]
    spec = {"speculative": {"method": "ngram"}}
    with daemon.openai() as client:
        plain = client.chat.completions.create(
            model="tiny-target", messages=messages, max_tokens=32, temperature=0, extra_body=spec
        )
        text = plain.choices[0].message.content or ""
        assert plain.usage is not None and plain.usage.completion_tokens_details is None
        out = client.chat.completions.create(
            model="tiny-target",
            messages=messages,
            max_tokens=32,
            temperature=0,
            prediction={"type": "content", "content": [{"type": "text", "text": text}]},
            extra_body=spec,
        )
    assert out.choices[0].message.content == text
    details = out.usage.completion_tokens_details if out.usage else None
    assert (
        details is not None and details.accepted_prediction_tokens and details.accepted_prediction_tokens > 10
    )
    assert details.rejected_prediction_tokens is not None and details.rejected_prediction_tokens <= 3
    assert _extra(out, "localspec")["accepted"] > 10


def _extra(obj: object, name: str) -> dict[str, int]:
    extra = getattr(obj, "model_extra", None) or {}
    value: dict[str, int] = extra[name]
    return value
