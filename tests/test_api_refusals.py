"""What the daemon cannot serve, refused clearly in each API's own shape, through the real clients."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ollama
import openai
import pytest
from daemonproc import Daemon

pytestmark = pytest.mark.timeout(120)

PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


@pytest.fixture
def oai(tiny_daemon: Daemon) -> Iterator[openai.OpenAI]:
    with tiny_daemon.openai(max_retries=0) as c:
        yield c


@pytest.fixture
def oll(tiny_daemon: Daemon) -> Iterator[ollama.Client]:
    with tiny_daemon.ollama() as c:
        yield c


def test_openai_embeddings_say_why_not(oai: openai.OpenAI, tiny_daemon: Daemon) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        oai.embeddings.create(model="tiny-target", input="hello")
    assert "generative model" in info.value.message and "embedding model" in info.value.message
    assert info.value.code == "embeddings_unsupported"
    with tiny_daemon.http() as http:  # llama-server's path, as llama.vscode calls it
        bare = http.post("/embeddings", json={"input": "hello", "model": "GPT-4", "encoding_format": "float"})
    assert bare.status_code == 400 and "generative model" in bare.json()["error"]["message"]


def test_ollama_embeddings_say_why_not(oll: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as embed:
        oll.embed(model="tiny-target", input="hello")
    assert embed.value.status_code == 400 and "generative model" in embed.value.error
    with pytest.raises(ollama.ResponseError) as older:
        oll.embeddings(model="tiny-target", prompt="hello")
    assert older.value.status_code == 400 and "embedding model" in older.value.error


def test_images_are_refused_naming_the_missing_projector(oai: openai.OpenAI, oll: ollama.Client) -> None:
    with pytest.raises(openai.BadRequestError) as chat:
        oai.chat.completions.create(
            model="tiny-target",
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
            ]}],
        )  # fmt: skip
    assert "no vision projector" in chat.value.message
    with pytest.raises(ollama.ResponseError) as ochat:
        oll.chat(
            model="tiny-target", messages=[{"role": "user", "content": "what is this", "images": [PIXEL]}]
        )
    assert ochat.value.status_code == 400 and "no vision projector" in ochat.value.error
    with pytest.raises(ollama.ResponseError) as generate:
        oll.generate(model="tiny-target", prompt="what is this", images=[PIXEL])
    assert generate.value.status_code == 400 and "no vision projector" in generate.value.error


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        (
            {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}},
            "audio",
            "text only",
        ),
        ({"modalities": ["audio"]}, "modalities", "text only"),
        ({"web_search_options": {}}, "web_search_options", "hosted tool"),
    ],
)
def test_audio_and_web_search_are_refused_not_ignored(
    oai: openai.OpenAI, extra: dict[str, Any], param: str, says: str
) -> None:
    """A client asking for a spoken reply or a searched one would take a plain reply for it."""
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(
            model="tiny-target", messages=[{"role": "user", "content": "hi"}], max_tokens=2, extra_body=extra
        )
    assert err.value.param == param and says in err.value.message
    plain = oai.chat.completions.create(
        model="tiny-target",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=2,
        extra_body={"modalities": ["text"]},
    )
    assert plain.choices[0].finish_reason in ("stop", "length")
