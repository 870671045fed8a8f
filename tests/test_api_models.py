"""One daemon for many models: listing, load on demand, LRU eviction within the memory budget, keep_alive.

A real daemon serves a models folder of tiny models written here: three that load,
one whose header reads but llama.cpp refuses (its feed-forward size disagrees with
its tensors), and one too big for the budget, which fits two of the others. Clients
are the real `openai` and `ollama` packages and httpx over the unix socket.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
import tinymodels
from daemonproc import Daemon, run_cli, start_daemon

from localspec.engine.config import EngineConfig, LoadOptions
from localspec.pickdraft.devices import detect_memory
from localspec.server.budget import footprint

CTX = 1024
CHAT = [{"role": "user", "content": "hello world"}]


def write_broken(path: Path) -> Path:
    """A tiny model whose header says 96 feed-forward units beside tensors of 128: llama.cpp refuses it."""
    tinymodels.write_tiny_model(path, seed=9, name="broken")
    data = bytearray(path.read_bytes())
    at = data.index(b"llama.feed_forward_length") + len(b"llama.feed_forward_length")
    assert struct.unpack_from("<II", data, at) == (4, 128)  # u32 type, then the value
    struct.pack_into("<I", data, at + 4, 96)
    path.write_bytes(bytes(data))
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    models = tmp_path_factory.mktemp("models")
    tinymodels.write_tiny_model(
        models / "alpha.gguf", seed=0, name="alpha", basename="Alpha", size_label="3M"
    )
    tinymodels.write_tiny_model(models / "beta.gguf", seed=5, name="beta")
    tinymodels.write_tiny_model(models / "gamma.gguf", seed=7, name="gamma")
    tinymodels.write_tiny_model(models / "huge.gguf", seed=2, n_embd=256, n_ff=512, n_layers=8, name="huge")
    write_broken(models / "broken.gguf")
    return models


def one_model_bytes(path: Path) -> int:
    """What one tiny model takes by the daemon's memory plan, on this machine, as the daemon loads it."""
    config = EngineConfig(target=path, load=LoadOptions(n_ctx=CTX))
    return footprint(config, detect_memory()).total


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, folder: Path) -> Iterator[Daemon]:
    """alpha by default; room for two tiny models; no draft models, so each footprint is one model's."""
    cap = one_model_bytes(folder / "alpha.gguf") * 5 // 2
    pins = {name: "none" for name in ("alpha", "beta", "gamma", "huge", "broken")}
    env = {
        "LOCALSPEC_MODELS": str(folder),
        "LOCALSPEC_MAX_RESIDENT": str(cap),
        "LOCALSPEC_DRAFTS": json.dumps(pins),
        "LOCALSPEC_METHOD": "ngram",
    }
    d = start_daemon(tmp_path_factory.mktemp("models-home"), folder / "alpha.gguf", ctx=CTX, env=env)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with daemon.http() as client:
        yield client


@pytest.fixture
def oai(daemon: Daemon) -> Iterator[openai.OpenAI]:
    with daemon.openai(max_retries=0) as client:
        yield client


@pytest.fixture
def oll(daemon: Daemon) -> Iterator[ollama.Client]:
    with daemon.ollama() as client:
        yield client


def loaded(http: httpx.Client) -> dict[str, dict[str, Any]]:
    return {m["name"].removesuffix(":latest"): m for m in http.get("/api/ps").json()["models"]}


def wait_until_unloaded(http: httpx.Client, name: str, timeout: float = 30.0) -> bool:
    """Unloading follows the response (the engine closes off the event loop): poll /api/ps for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if name not in loaded(http):
            return True
        time.sleep(0.02)
    return False


def chat(oai: openai.OpenAI, model: str) -> str:
    reply = oai.chat.completions.create(model=model, messages=CHAT, max_tokens=4, temperature=0)  # type: ignore[arg-type]
    assert reply.model == model
    return reply.choices[0].message.content or ""


def test_every_model_in_the_folder_is_listed_the_default_first(
    oai: openai.OpenAI, http: httpx.Client
) -> None:
    assert [m.id for m in oai.models.list()] == ["alpha", "beta", "broken", "gamma", "huge"]
    tags = [m["name"] for m in http.get("/api/tags").json()["models"]]
    assert tags == ["alpha:latest", "beta:latest", "broken:latest", "gamma:latest", "huge:latest"]
    assert oai.models.retrieve("alpha:3m").id == "alpha"  # the Ollama-style alias from its header
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("delta")


def test_switching_models_loads_on_demand_and_evicts_the_least_recently_used(
    oai: openai.OpenAI, oll: ollama.Client, http: httpx.Client
) -> None:
    chat(oai, "alpha")
    chat(oai, "beta")
    assert set(loaded(http)) == {"alpha", "beta"}
    # The daemon's own model is evicted like any other; the daemon stays ready, and loads it again.
    chat(oai, "gamma")
    assert set(loaded(http)) == {"beta", "gamma"}
    health = http.get("/health").json()
    assert health["status"] == "ready" and health["model"] == "alpha"
    chat(oai, "alpha")
    assert set(loaded(http)) == {"alpha", "gamma"}
    chat(oai, "alpha")  # alpha is now the more recently used
    reply = oll.chat(model="gamma", messages=CHAT, options={"num_predict": 4, "temperature": 0})
    assert reply.model == "gamma" and reply.done
    assert set(loaded(http)) == {"alpha", "gamma"}  # beta was idle and least recently used
    # The Ollama-style alias from alpha's header reaches alpha; then beta comes back, and gamma goes.
    assert oll.generate(model="alpha:3m", prompt="hello", options={"num_predict": 2}).done
    chat(oai, "beta")
    assert set(loaded(http)) == {"alpha", "beta"}


def test_ps_reports_memory_draft_and_expiry(oai: openai.OpenAI, http: httpx.Client, folder: Path) -> None:
    chat(oai, "beta")
    ps = loaded(http)
    beta = ps["beta"]
    assert beta["size"] == one_model_bytes(
        folder / "beta.gguf"
    )  # the plan's bytes, as the budget counts them
    assert beta["draft"] is None and "pinned" in beta["pick"]
    expires = datetime.fromisoformat(beta["expires_at"].replace("Z", "+00:00"))
    assert 200 < (expires - datetime.now(UTC)).total_seconds() <= 300  # the default keep_alive: 5m
    assert ps["alpha"]["expires_at"].startswith("9999")  # the daemon's own model stays
    health = http.get("/health").json()
    assert health["status"] == "ready" and {m["name"] for m in health["models"]} == set(ps)


def test_keep_alive_zero_unloads_after_the_request_and_minus_one_keeps_it(
    oll: ollama.Client, http: httpx.Client
) -> None:
    oll.generate(model="gamma", prompt="hello", options={"num_predict": 2}, keep_alive=-1)
    assert loaded(http)["gamma"]["expires_at"].startswith("9999")
    oll.generate(model="gamma", prompt="hello", options={"num_predict": 2}, keep_alive="1h")
    expires = datetime.fromisoformat(loaded(http)["gamma"]["expires_at"].replace("Z", "+00:00"))
    assert (expires - datetime.now(UTC)).total_seconds() > 3000
    oll.generate(model="gamma", prompt="hello", options={"num_predict": 2}, keep_alive=0)
    assert wait_until_unloaded(http, "gamma")
    # An empty request with keep_alive 0 is Ollama's way to unload a model.
    oll.generate(model="beta", prompt="")
    assert "beta" in loaded(http)
    unloaded = oll.generate(model="beta", prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert wait_until_unloaded(http, "beta")


def test_ollama_reports_the_time_a_request_waited_for_its_model_to_load(
    oll: ollama.Client, http: httpx.Client
) -> None:
    oll.generate(model="gamma", prompt="", keep_alive=0)
    assert wait_until_unloaded(http, "gamma")
    cold = oll.generate(model="gamma", prompt="hello", options={"num_predict": 2})
    load_s = loaded(http)["gamma"]["load_seconds"]
    warm = oll.chat(model="gamma", messages=CHAT, options={"num_predict": 2})
    assert cold.load_duration is not None and warm.load_duration is not None
    assert cold.load_duration >= load_s * 1e9 > warm.load_duration  # the load, then none
    for reply in (cold, warm):
        assert reply.total_duration is not None and reply.load_duration is not None
        assert reply.eval_duration is not None
        assert reply.total_duration >= reply.load_duration + reply.eval_duration


def test_a_model_that_fails_to_load_is_this_requests_error(
    oai: openai.OpenAI, http: httpx.Client, daemon: Daemon
) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        chat(oai, "broken")
    body: Any = info.value.body
    assert body["code"] == "model_load_failed" and "broken" in body["message"]
    assert "broken" not in loaded(http)
    assert chat(oai, "alpha") is not None  # the daemon and its other models carry on
    assert daemon.proc.poll() is None


def test_a_model_too_big_for_the_budget_is_refused_with_the_numbers(http: httpx.Client) -> None:
    before = set(loaded(http))
    response = http.post("/v1/chat/completions", json={"model": "huge", "messages": CHAT, "max_tokens": 2})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "insufficient_memory"
    assert (
        "huge needs" in error["message"] and "max_resident" in error["message"] and "MiB" in error["message"]
    )
    assert set(loaded(http)) == before  # nothing was unloaded for a model that could never fit


def test_concurrent_requests_to_two_models(daemon: Daemon, http: httpx.Client) -> None:
    results: dict[str, str] = {}

    def ask(model: str) -> None:
        with daemon.http() as own:
            body = {"model": model, "messages": CHAT, "max_tokens": 64, "temperature": 0}
            response = own.post("/v1/chat/completions", json=body)
            results[model] = response.json()["model"] if response.status_code == 200 else response.text

    threads = [threading.Thread(target=ask, args=(m,)) for m in ("alpha", "beta", "alpha", "beta")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {"alpha": "alpha", "beta": "beta"}
    assert {"alpha", "beta"} <= set(loaded(http))


def test_requests_for_a_loading_model_wait_for_the_one_load(daemon: Daemon, http: httpx.Client) -> None:
    http.post("/api/generate", json={"model": "gamma", "prompt": "", "keep_alive": 0})
    assert wait_until_unloaded(http, "gamma")
    loads_before = daemon.log().count("loading gamma (")
    statuses: list[int] = []

    def ask(stream: bool) -> None:
        # A stream's first byte comes once the model has loaded: its status is 200, not an error later.
        with daemon.http() as own:
            body = {"model": "gamma", "prompt": "hello", "stream": stream, "options": {"num_predict": 2}}
            response = own.post("/api/generate", json=body)
            last = json.loads(response.text.strip().splitlines()[-1])
            statuses.append(response.status_code if last.get("done") else -1)

    threads = [threading.Thread(target=ask, args=(s,)) for s in (True, False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200, 200, 200]
    assert daemon.log().count("loading gamma (") == loads_before + 1


def test_localspec_ps_lists_what_is_loaded(daemon: Daemon, oai: openai.OpenAI, http: httpx.Client) -> None:
    # A long conversation, then another: the first one's cache is kept in memory beside the plan's.
    long = [{"role": "user", "content": " ".join(["hello world"] * 200)}]
    oai.chat.completions.create(model="beta", messages=long, max_tokens=2)  # type: ignore[arg-type]
    chat(oai, "beta")
    saved = loaded(http)["beta"]
    assert saved["saved_prompts"] == 1 and saved["saved_prompt_bytes"] > 0
    done = run_cli(daemon.home, "ps")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:4] == ["NAME", "SIZE", "SAVED", "PROMPTS"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == set(loaded(http))
    assert rows["beta"][3:5] == [f"{saved['saved_prompt_bytes'] / (1 << 20):.0f}", "MiB"]


def test_each_model_gets_its_own_draft_pick_or_its_pin_and_the_idle_timeout(
    tmp_path: Path, folder: Path
) -> None:
    """No pins but beta's: pick-draft chooses for gamma on this machine; beta loads its pinned draft.

    keep_alive 1s in the settings: an on-demand model goes once idle that long, the daemon's own stays.
    """
    env = {
        "LOCALSPEC_MODELS": str(folder),
        "LOCALSPEC_DRAFTS": json.dumps({"beta": str(folder / "alpha.gguf")}),
        "LOCALSPEC_KEEP_ALIVE": "1s",
    }
    d = start_daemon(tmp_path / "home", folder / "alpha.gguf", ctx=CTX, env=env)
    try:
        with d.http() as http:
            for model in ("beta", "gamma"):
                body = {"model": model, "messages": CHAT, "max_tokens": 2}
                assert http.post("/v1/chat/completions", json=body).status_code == 200
            ps = loaded(http)
            assert ps["beta"]["draft"] == "alpha.gguf" and "pinned" in ps["beta"]["pick"]
            assert "pick-draft chose" in ps["gamma"]["pick"]
            assert wait_until_unloaded(http, "beta") and wait_until_unloaded(http, "gamma")
            assert set(loaded(http)) == {"alpha"}
    finally:
        assert d.stop() == 0, d.log()
