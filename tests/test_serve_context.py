"""`localspec serve` given no context loads the target's training context where memory allows
(pickdraft.context), reports it where clients read it, and answers prompts past 4,096 tokens.

A real daemon on a tiny model trained for 16,384 tokens (its cache is a few MB at any size).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tinymodels
from daemonproc import Daemon, start_daemon

pytestmark = pytest.mark.timeout(120)

TRAINED = 16384


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[Daemon]:
    target = tinymodels.write_tiny_model(tiny_dir / "tiny-long.gguf", n_ctx=TRAINED, name="tiny-long")
    d = start_daemon(tmp_path_factory.mktemp("context-home"), target, ctx=None)
    yield d
    assert d.stop() == 0, d.log()


def test_the_context_is_the_models_own_and_clients_are_told(daemon: Daemon) -> None:
    with daemon.http() as http:
        assert http.get("/health").json()["n_ctx"] == TRAINED
        show = http.post("/api/show", json={"model": "tiny-long"}).json()
        assert show["model_info"]["llama.context_length"] == TRAINED  # what Ollama's clients size prompts by
        lmstudio = http.get("/api/v0/models/tiny-long").json()
        assert lmstudio["max_context_length"] == lmstudio["loaded_context_length"] == TRAINED
    assert f"context {TRAINED}" in daemon.log()


def test_a_prompt_past_4096_tokens_is_answered(daemon: Daemon) -> None:
    long = " ".join(["hello world"] * 2500)
    with daemon.openai() as client:
        out = client.chat.completions.create(
            model="tiny-long", messages=[{"role": "user", "content": long}], max_tokens=4, temperature=0
        )
    assert out.usage is not None and 4096 < out.usage.prompt_tokens < TRAINED
    assert out.usage.completion_tokens >= 1
