"""Anthropic's Messages API, driven by the real `anthropic` package against a real daemon process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types import MessageParam, TextBlockParam
from daemonproc import TOKEN, Daemon, start_daemon

pytestmark = pytest.mark.timeout(120)

USER: list[MessageParam] = [{"role": "user", "content": "hello world"}]
# This anthropic SDK has no sampling arguments; Claude Code sends none. They are body fields still.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("anthropic-home"), tiny_target, tcp=True, token=TOKEN)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[anthropic.Anthropic]:
    with daemon.anthropic() as c:
        yield c


def _openai_chat(daemon: Daemon, messages: list[Any], max_tokens: int) -> Any:
    body = {"model": "tiny-target", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    with daemon.http() as http:
        return http.post("/v1/chat/completions", json=body).json()


def test_create_equals_openai_chat_of_the_same_messages(client: anthropic.Anthropic, daemon: Daemon) -> None:
    system: list[TextBlockParam] = [
        {"type": "text", "text": "be brief"},
        {"type": "text", "text": "the cat", "cache_control": {"type": "ephemeral"}},
    ]
    out = client.messages.create(
        model="tiny-target",
        max_tokens=16,
        extra_body=GREEDY,
        system=system,
        messages=USER,
    )
    chat = _openai_chat(daemon, [{"role": "system", "content": "be brief\n\nthe cat"}, *USER], 16)
    assert out.type == "message" and out.role == "assistant" and out.id.startswith("msg_")
    assert [b.type for b in out.content] == ["text"]
    assert out.content[0].text == chat["choices"][0]["message"]["content"]  # type: ignore[union-attr]
    assert out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0) == chat["usage"]["prompt_tokens"]
    assert out.usage.output_tokens == chat["usage"]["completion_tokens"]
    assert out.stop_reason == (
        "max_tokens" if chat["choices"][0]["finish_reason"] == "length" else "end_turn"
    )
    assert out.model == "tiny-target"


def test_stream_event_sequence_and_text(client: anthropic.Anthropic, daemon: Daemon) -> None:
    whole = client.messages.create(model="tiny-target", max_tokens=12, extra_body=GREEDY, messages=USER)
    with client.messages.stream(
        model="tiny-target", max_tokens=12, extra_body=GREEDY, messages=USER
    ) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == final.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    assert final.usage.output_tokens == whole.usage.output_tokens and final.stop_reason == whole.stop_reason
    body = {"model": "tiny-target", "max_tokens": 12, "temperature": 0, "messages": USER, "stream": True}
    with daemon.http() as http, http.stream("POST", "/v1/messages", json=body) as response:
        lines = [line for line in response.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    datas = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert [d["type"] for d in datas] == names
    n_deltas = names.count("content_block_delta")
    assert names == ["message_start", "content_block_start", "ping", *["content_block_delta"] * n_deltas,
                     "content_block_stop", "message_delta", "message_stop"]  # fmt: skip
    assert n_deltas >= 1 and all(
        d["delta"]["type"] == "text_delta" for d in datas if d["type"] == "content_block_delta"
    )
    # message_start counts the whole prompt as read; message_delta says how much the cache held.
    usage = datas[-2]["usage"]
    assert (
        datas[0]["message"]["usage"]["input_tokens"]
        == usage["input_tokens"] + usage["cache_read_input_tokens"]
    )
    assert usage["output_tokens"] == whole.usage.output_tokens


def test_usage_splits_the_prompt_into_read_and_cached_as_anthropic_does(client: anthropic.Anthropic) -> None:
    """A conversation's next turn reads only what is new: the earlier turns are cache_read_input_tokens."""
    system = "You review code. " * 20
    first = client.messages.create(
        model="tiny-target", max_tokens=8, extra_body=GREEDY, system=system, messages=USER
    )
    counted = client.messages.count_tokens(model="tiny-target", system="x", messages=USER)
    reply = first.content[0].text  # type: ignore[union-attr]
    turn: list[MessageParam] = [
        *USER,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "and then?"},
    ]
    second = client.messages.create(
        model="tiny-target", max_tokens=8, extra_body=GREEDY, system=system, messages=turn
    )
    with client.messages.stream(
        model="tiny-target", max_tokens=8, extra_body=GREEDY, system=system, messages=turn
    ) as stream:
        streamed = stream.get_final_message().usage
    prompt = client.messages.count_tokens(model="tiny-target", system=system, messages=turn).input_tokens
    read, cached = second.usage.input_tokens, second.usage.cache_read_input_tokens or 0
    assert read + cached == prompt and cached >= first.usage.input_tokens > counted.input_tokens
    assert read > 0 and second.usage.cache_creation_input_tokens == 0
    # The same prompt again: all but its last token from the cache (llama.cpp reads that one for its logits).
    assert (streamed.input_tokens, streamed.cache_read_input_tokens) == (1, prompt - 1)


def test_stop_sequences_and_sampling_fields(client: anthropic.Anthropic) -> None:
    full = client.messages.create(model="tiny-target", max_tokens=30, extra_body=GREEDY, messages=USER)
    text = full.content[0].text  # type: ignore[union-attr]
    words = text.split()
    assert len(words) > 3
    stop = f" {words[2]}"
    cut = client.messages.create(
        model="tiny-target",
        max_tokens=30,
        extra_body=GREEDY,
        stop_sequences=[stop, "never-there"],
        messages=USER,
    )
    assert cut.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    sampled = client.messages.create(
        model="tiny-target",
        max_tokens=8,
        extra_body={"temperature": 0.7, "top_p": 0.9, "top_k": 20},
        messages=USER,
    )
    assert sampled.usage.output_tokens >= 1


def test_count_tokens_matches_the_prompt_usage(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model="tiny-target", system="be brief", messages=USER)
    made = client.messages.create(model="tiny-target", max_tokens=2, system="be brief", messages=USER)
    assert counted.input_tokens == made.usage.input_tokens + (made.usage.cache_read_input_tokens or 0) > 0


def test_claude_model_names_mean_the_served_model(client: anthropic.Anthropic) -> None:
    out = client.messages.create(model="claude-sonnet-5-5", max_tokens=4, messages=USER)
    assert out.model == "tiny-target"
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="llama3", max_tokens=4, messages=USER)
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_unsupported_content_is_a_clear_anthropic_error(client: anthropic.Anthropic, daemon: Daemon) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as vision:
        client.messages.create(
            model="tiny-target",
            max_tokens=4,
            messages=[{"role": "user", "content": [image]}],  # type: ignore[misc, list-item]
        )
    assert "no vision projector" in vision.value.message
    assert vision.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    tool = {
        "name": "get_time",
        "description": "the time",
        "input_schema": {"type": "object", "properties": {}},
    }
    with pytest.raises(anthropic.BadRequestError) as tools:
        client.messages.create(model="tiny-target", max_tokens=4, messages=USER, tools=[tool])  # type: ignore[list-item]
    assert "has no tool support" in tools.value.message  # this model's template takes no tools
    with daemon.http() as http:
        missing = http.post("/v1/messages", json={"model": "tiny-target", "messages": USER})
    assert missing.status_code == 400 and missing.json()["type"] == "error"
    assert "max_tokens" in missing.json()["error"]["message"]


def test_x_api_key_is_the_token_over_tcp(daemon: Daemon) -> None:
    with anthropic.Anthropic(base_url=daemon.base_url, api_key=TOKEN) as ok:
        assert ok.messages.create(model="tiny-target", max_tokens=2, messages=USER).usage.output_tokens >= 1
    bad = anthropic.Anthropic(base_url=daemon.base_url, api_key="wrong", max_retries=0)
    with bad, pytest.raises(anthropic.AuthenticationError) as info:
        bad.messages.create(model="tiny-target", max_tokens=2, messages=USER)
    assert info.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert "x-api-key" in info.value.message
