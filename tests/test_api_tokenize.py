"""llama-server's /tokenize, /detokenize and /props, over a real socket, against the model's own tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from daemonproc import Daemon, start_daemon

from localspec.engine.llama import LlamaModel

pytestmark = pytest.mark.timeout(120)

TEXT = "def add(a, b):\n    return a + b  # é"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("tokenize-home"), tiny_target, ctx=512)
    yield d
    assert d.stop() == 0, d.log()


def test_tokenize_and_detokenize_are_the_models_own(daemon: Daemon, tiny: LlamaModel) -> None:
    plain = tiny.tokenize(TEXT, add_special=False)
    special = tiny.tokenize(TEXT, add_special=True)
    # The pieces joined, as llama-server's /detokenize answers (this SentencePiece vocabulary
    # gives the text a leading space).
    text = tiny.detokenize(plain)
    eos = tiny.eog_tokens()[0]
    eos_name = tiny.token_text(eos)
    assert tiny.piece(eos) == b"" and eos_name
    with daemon.http() as http:
        assert http.post("/tokenize", json={"content": TEXT}).json() == {"tokens": plain}
        assert http.post("/tokenize", json={"content": TEXT, "add_special": True}).json()["tokens"] == special
        pieces = http.post("/tokenize", json={"content": TEXT, "with_pieces": True}).json()["tokens"]
        assert [p["id"] for p in pieces] == plain
        # A piece is text, or its bytes where it holds part of a character.
        raw = b"".join(
            p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces
        )
        assert raw.decode() == text and text.strip() == TEXT
        assert http.post("/detokenize", json={"tokens": plain}).json() == {"content": text}
        # A special token renders as nothing; a list of tokens shows its name.
        assert http.post("/detokenize", json={"tokens": [eos]}).json() == {"content": eos_name}
        bad = http.post("/detokenize", json={"tokens": [plain[0], 10**7]})
        assert bad.status_code == 400 and "10000000" in bad.json()["error"]["message"]


def test_props_describe_the_served_model(daemon: Daemon) -> None:
    with daemon.http() as http:
        props = http.get("/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 512
    assert props["default_generation_settings"]["params"]["temperature"] == 0.8  # /completion's default
    assert props["model_alias"] == "tiny-target" and props["total_slots"] == 1
    assert props["model_path"].endswith("tiny-target.gguf")
    assert isinstance(props["chat_template"], str)
