"""`localspec serve` given no context loads the target's training context where memory allows
(pickdraft.context), reports it where clients read it, and answers prompts past 4,096 tokens.

A real daemon on a tiny model trained for 16,384 tokens (its cache is a few MB at any size), with
a models folder beside it: each model is served at a context of its own, reported before it loads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import tinymodels
from daemonproc import Daemon, start_daemon

pytestmark = pytest.mark.timeout(120)

TRAINED = 16384
OTHERS = {"tiny-mid": 8192, "tiny-pinned": 12288}  # the second one's draft is pinned in the settings


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("context-models")
    target = tinymodels.write_tiny_model(folder / "tiny-long.gguf", n_ctx=TRAINED, name="tiny-long")
    for name, trained in OTHERS.items():
        tinymodels.write_tiny_model(folder / f"{name}.gguf", n_ctx=trained, name=name)
    env = {"LOCALSPEC_MODELS": str(folder), "LOCALSPEC_DRAFTS": json.dumps({"tiny-pinned": "none"})}
    d = start_daemon(tmp_path_factory.mktemp("context-home"), target, ctx=None, env=env)
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


@pytest.mark.parametrize("name", list(OTHERS))
def test_a_model_not_loaded_yet_reports_the_context_it_then_loads(daemon: Daemon, name: str) -> None:
    """Clients size their prompts by /api/show before the first request loads a model: it reports that
    model's own context (once the daemon's), and the load then uses the same plan."""
    trained = OTHERS[name]
    with daemon.http() as http:
        before = http.get(f"/api/v0/models/{name}").json()
        assert before["state"] == "not-loaded" and before["max_context_length"] == trained
        show = http.post("/api/show", json={"model": name}).json()
        assert show["model_info"]["llama.context_length"] == trained
        assert f"num_ctx {trained}" in " ".join(show["parameters"].split())
        reply = http.post(
            "/v1/chat/completions",
            json={"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert reply.status_code == 200, reply.text
        after = http.get(f"/api/v0/models/{name}").json()
        assert after["state"] == "loaded" and after["loaded_context_length"] == trained
        running = {m["name"]: m for m in http.get("/api/ps").json()["models"]}
        assert running[f"{name}:latest"]["context_length"] == trained


def test_a_context_the_settings_hold_lower_is_loaded_and_said(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """An older `pick-draft --save` wrote n_ctx = 4096 to config.toml: serve loads it as given, and its
    log says what the model could hold here and how to get it."""
    folder = tmp_path_factory.mktemp("held-models")
    target = tinymodels.write_tiny_model(folder / "tiny-long.gguf", n_ctx=TRAINED, name="tiny-long")
    home = tmp_path_factory.mktemp("held-home")
    (home / "config.toml").write_text("n_ctx = 4096\n", encoding="utf-8")
    d = start_daemon(home, target, ctx=None, env={"LOCALSPEC_MODELS": str(folder)})
    try:
        with d.http() as http:
            assert http.get("/health").json()["n_ctx"] == 4096
        said = " ".join(d.log().split())
        asked = "context 4096 tokens, as --ctx or n_ctx in the settings ask"
        assert f"{asked} (tiny-long.gguf could hold {TRAINED} here)" in said
        assert "leave --ctx and n_ctx unset to size it by the model" in said
    finally:
        assert d.stop() == 0, d.log()
