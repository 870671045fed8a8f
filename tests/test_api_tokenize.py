"""llama-server's /tokenize, /detokenize and /props, over a real socket, against the model's own tokenizer."""

from __future__ import annotations

import pytest
from daemonproc import Daemon

from localspec.engine.llama import LlamaModel

pytestmark = pytest.mark.timeout(120)

TEXT = "def add(a, b):\n    return a + b  # é"


def test_tokenize_and_detokenize_are_the_models_own(tiny_daemon: Daemon, tiny: LlamaModel) -> None:
    plain = tiny.tokenize(TEXT, add_special=False)
    special = tiny.tokenize(TEXT, add_special=True)
    # The pieces joined, as llama-server's /detokenize answers (this SentencePiece vocabulary
    # gives the text a leading space).
    text = tiny.detokenize(plain)
    eos = tiny.eog_tokens()[0]
    eos_name = tiny.token_text(eos)
    assert tiny.piece(eos) == b"" and eos_name
    with tiny_daemon.http() as http:
        assert http.post("/tokenize", json={"content": TEXT}).json() == {"tokens": plain}
        assert http.post("/tokenize", json={"content": TEXT, "add_special": True}).json()["tokens"] == special
        pieces = http.post("/tokenize", json={"content": TEXT, "with_pieces": True}).json()["tokens"]
        assert [p["id"] for p in pieces] == plain
        # A piece is text, or its bytes where it holds part of a character.
        raw = b"".join(
            p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces
        )
        assert raw.decode() == text and text.strip() == TEXT
        # llama-server's key, and vLLM's beside it.
        assert http.post("/detokenize", json={"tokens": plain}).json() == {"content": text, "prompt": text}
        # A special token renders as nothing; a list of tokens shows its name.
        assert http.post("/detokenize", json={"tokens": [eos]}).json()["content"] == eos_name
        bad = http.post("/detokenize", json={"tokens": [plain[0], 10**7]})
        assert bad.status_code == 400 and "10000000" in bad.json()["error"]["message"]


def test_props_describe_the_served_model(tiny_daemon: Daemon) -> None:
    with tiny_daemon.http() as http:
        props = http.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 512
    assert props["default_generation_settings"]["params"]["temperature"] == 0.8  # /completion's default
    assert props["model_alias"] == "tiny-target" and props["total_slots"] == 1
    assert props["model_path"].endswith("tiny-target.gguf")
    assert isinstance(props["chat_template"], str)


def test_vllm_tokenizer_routes_as_lm_evaluation_harness_reads_them(
    tiny_daemon: Daemon, tiny: LlamaModel
) -> None:
    """lm-evaluation-harness's remote tokenizer (check_remote_tokenizer_support, RemoteTokenizer):
    GET /tokenizer_info with an eos_token, POST /tokenize {prompt, add_special_tokens} -> tokens,
    POST /detokenize {tokens} -> prompt; the EOS id is the first token of its text."""
    eos = int(tiny.meta("tokenizer.ggml.eos_token_id") or -1)
    with tiny_daemon.http() as http:
        info = http.get("/tokenizer_info").json()
        assert info["eos_token"] == tiny.token_text(eos) and info["model_max_length"] == 512
        assert isinstance(info["chat_template"], str) and info["add_bos_token"] == tiny.add_bos

        def encode(text: str, **more: object) -> list[int]:
            out = http.post("/tokenize", json={"prompt": text, **more}).json()
            assert out["count"] == len(out["tokens"]) and out["max_model_len"] == 512
            tokens: list[int] = out["tokens"]
            return tokens

        assert encode(TEXT, add_special_tokens=False) == tiny.tokenize(TEXT, add_special=False)
        assert encode(TEXT) == tiny.tokenize(TEXT, add_special=True)  # vLLM's default adds them
        assert encode(info["eos_token"], add_special_tokens=False)[0] == eos
        plain = tiny.tokenize(TEXT, add_special=False)
        assert http.post("/detokenize", json={"tokens": plain}).json()["prompt"] == tiny.detokenize(plain)
        missing = http.post("/tokenize", json={"add_special": True})
        assert missing.status_code == 400 and "content (or prompt)" in missing.json()["error"]["message"]


def test_apply_template_gives_the_prompt_a_chat_reads(tiny_daemon: Daemon) -> None:
    """llama-server's /apply-template: the rendered prompt, which /completion then continues exactly
    as the chat completion of the same messages does."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]
    with tiny_daemon.http() as http:
        rendered = http.post("/apply-template", json={"messages": messages})
        assert rendered.status_code == 200, rendered.text
        prompt = rendered.json()["prompt"]
        assert "hello world" in prompt and "be brief" in prompt
        chat = http.post(
            "/v1/chat/completions",
            json={"model": "tiny-target", "messages": messages, "max_tokens": 8, "temperature": 0},
        ).json()
        completion = http.post(
            "/completion", json={"prompt": prompt, "n_predict": 8, "temperature": 0, "cache_prompt": False}
        ).json()
        assert completion["content"] == chat["choices"][0]["message"]["content"]
        tokens = http.post("/tokenize", json={"content": prompt, "add_special": True}).json()["tokens"]
        assert len(tokens) == chat["usage"]["prompt_tokens"]
        bad = http.post("/apply-template", json={"messages": []})
        assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]
