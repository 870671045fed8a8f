"""Serving many models while one loads, with the machine's memory changing underneath.

The daemon's own app, pool and engines run in this process, served by uvicorn on a
unix socket and asked over it with httpx. Two things are the test's: a gate in each
engine's load-progress callback, so a load (or a request's lazy layerskip-draft load)
lasts until the test lets it go, which makes "while it loads" certain rather than
a race; and the machine's free memory (a fake probe), the one thing a test may fake.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import tinymodels
import uvicorn

from localspec.engine import prefill
from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.worker import Engine
from localspec.paths import Paths
from localspec.pickdraft.devices import GIB, DeviceMemory, cpu_only
from localspec.pickdraft.memplan import HOST_RESERVE, MemoryPlanError
from localspec.server.app import make_app
from localspec.server.budget import footprint
from localspec.server.config import ApiConfig
from localspec.server.serving import Served, ServeOptions, build
from localspec.settings import load_settings

CTX = 512
NAMES = ("alpha", "beta", "gamma")
CHAT = [{"role": "user", "content": "hello world"}]
WAIT_S = 60.0


class Gates:
    """Holds the loads the test names: an engine's progress callback waits on its model's gate."""

    def __init__(self) -> None:
        self._gates: dict[tuple[str, str], threading.Event] = {}
        self.entered: dict[tuple[str, str], threading.Event] = {}
        self.loads: list[str] = []

    def hold(self, model: str, what: str = "target") -> None:
        self._gates[(model, what)] = threading.Event()
        self.entered[(model, what)] = threading.Event()

    def release(self, model: str, what: str = "target") -> None:
        self._gates.pop((model, what)).set()

    def make_engine(self, config: EngineConfig) -> Engine:
        model = config.target.stem
        self.loads.append(model)

        def progress(what: str, _fraction: float) -> None:
            gate = self._gates.get((model, what))
            if gate is not None:
                self.entered[(model, what)].set()
                assert gate.wait(WAIT_S), f"the test never released {model}'s {what}"

        return Engine(config, progress=progress)


@dataclass
class Machine:
    """A fake memory probe: free RAM is what the test gives, less what the loaded models take."""

    room: int
    others: int = 0  # what other processes took since (negative: freed)
    served: Served | None = None
    reads: list[int] = field(default_factory=list)

    def probe(self) -> DeviceMemory:
        held = self.served.pool.used().total if self.served is not None else 0
        free = max(0, HOST_RESERVE + self.room - held - self.others)
        self.reads.append(free)
        return cpu_only(64 * GIB, free)


@dataclass
class Server:
    socket_path: Path
    served: Served
    gates: Gates

    def http(self) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=str(self.socket_path))
        return httpx.Client(transport=transport, base_url="http://localhost", timeout=WAIT_S)


@pytest.fixture
def folder(isolated: Path) -> Path:
    for seed, name in enumerate(NAMES):
        tinymodels.write_tiny_model(isolated / f"{name}.gguf", seed=seed, name=name)
    return isolated


def model_bytes(path: Path) -> int:
    return footprint(EngineConfig(target=path, load=LoadOptions(n_ctx=CTX)), cpu_only(64 * GIB)).total


ServerFactory = Callable[..., Server]


@pytest.fixture
def serve(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerFactory]:
    """Start the daemon's app on alpha (held while loading when the test says so)."""
    monkeypatch.setenv("LOCALSPEC_METHOD", "ngram")  # no calibration at load: tiny models, plain loads
    running: list[tuple[uvicorn.Server, threading.Thread, Served]] = []

    def start(gates: Gates, machine: Machine | None = None, **options: Any) -> Server:
        paths = Paths.from_env()
        settings = load_settings(n_ctx=CTX, threads=1)
        pins = {name: "none" for name in NAMES}
        serve_options = ServeOptions(settings, pins=pins, **options)
        engine = EngineConfig(
            target=folder / "alpha.gguf",
            method="ngram",
            load=LoadOptions(n_ctx=CTX, n_threads=1),
            cache_dir=paths.cache_dir,
        )
        machine = machine or Machine(room=64 * GIB)
        served = build(engine, None, serve_options, gates.make_engine, "localspec", probe=machine.probe)
        machine.served = served
        socket_path = tmp_path / "d.sock"
        app = make_app(served.catalog, served.pool, ApiConfig(n_ctx=CTX, n_threads=1))
        config = uvicorn.Config(app, uds=str(socket_path), lifespan="off", log_config=None, ws="none")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        running.append((server, thread, served))
        assert until(lambda: server.started), "uvicorn did not start"
        return Server(socket_path, served, gates)

    yield start
    for server, thread, served in running:
        server.should_exit = True
        thread.join(WAIT_S)
        served.pool.close()


def until(predicate: Callable[[], object], timeout: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def ps(http: httpx.Client) -> dict[str, dict[str, Any]]:
    return {m["name"].removesuffix(":latest"): m for m in http.get("/api/ps").json()["models"]}


def chat(http: httpx.Client, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": CHAT, "max_tokens": 4, "temperature": 0, **extra}
    return http.post("/v1/chat/completions", json=body)


class Background:
    """A request in a thread of its own (its own connection), its response kept."""

    def __init__(self, server: Server, ask: Callable[[httpx.Client], httpx.Response]) -> None:
        self.response: httpx.Response | None = None
        self._thread = threading.Thread(target=self._run, args=(server, ask), daemon=True)
        self._thread.start()

    def _run(self, server: Server, ask: Callable[[httpx.Client], httpx.Response]) -> None:
        with server.http() as http:
            self.response = ask(http)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> httpx.Response:
        self._thread.join(WAIT_S)
        assert self.response is not None, "the request did not finish"
        return self.response


def test_keep_alive_zero_for_the_default_model_while_it_loads_unloads_it_once_loaded(
    serve: ServerFactory,
) -> None:
    """Sent right after `localspec serve &` (as scripts/model_switch.py did), it left the model forever."""
    gates = Gates()
    gates.hold("alpha")
    server = serve(gates)
    with server.http() as http:
        assert gates.entered[("alpha", "target")].wait(WAIT_S)
        unload = Background(server, lambda h: h.post("/api/generate", json=_unload_body("alpha")))
        health = http.get("/health").json()
        assert health["status"] == "loading" and health["loading"] == "alpha"
        assert ps(http)["alpha"]["status"] == "loading"
        gates.release("alpha")
        assert unload.result().json()["done_reason"] == "unload"
        assert until(lambda: "alpha" not in ps(http)), "alpha was asked to unload and stayed"
        # The daemon stays ready, and a request loads its model again.
        assert http.get("/health").json()["status"] == "ready"
        assert chat(http, "alpha").status_code == 200
        assert gates.loads == ["alpha", "alpha"]


def _unload_body(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": "", "keep_alive": 0}


def test_health_and_ps_show_an_on_demand_load_and_its_requests_wait_then_succeed(
    serve: ServerFactory,
) -> None:
    gates = Gates()
    server = serve(gates)
    with server.http() as http:
        assert until(lambda: http.get("/health").json()["status"] == "ready")
        gates.hold("beta")
        whole = Background(server, lambda h: chat(h, "beta"))
        streamed = Background(server, lambda h: chat(h, "beta", stream=True))
        ollama = Background(server, lambda h: h.post("/api/chat", json=_ollama_chat("beta")))
        assert gates.entered[("beta", "target")].wait(WAIT_S)
        health = http.get("/health").json()
        assert health["status"] == "ready" and health["loading"] == "beta"
        assert {m["name"]: m["status"] for m in health["models"]}["beta"] == "loading"
        assert ps(http)["beta"]["status"] == "loading" and ps(http)["alpha"]["status"] == "ready"
        # The other model answers meanwhile; beta's requests are still waiting for its load.
        assert chat(http, "alpha").status_code == 200
        assert not (whole.done() or streamed.done() or ollama.done())
        gates.release("beta")
        assert whole.result().status_code == 200 and whole.result().json()["model"] == "beta"
        stream = streamed.result()
        assert stream.status_code == 200 and stream.text.rstrip().endswith("data: [DONE]")
        assert json.loads(ollama.result().text)["done"] is True
        assert gates.loads == ["alpha", "beta"]  # one load for the three requests
        assert http.get("/health").json()["loading"] is None
        assert ps(http)["beta"]["status"] == "ready"


def _ollama_chat(model: str) -> dict[str, Any]:
    return {"model": model, "messages": CHAT, "stream": False, "options": {"num_predict": 4}}


def test_a_request_to_one_resident_model_does_not_wait_for_another_models_request(
    serve: ServerFactory,
) -> None:
    """alpha's request holds alpha's worker (it loads its layerskip draft, held here) while beta answers."""
    gates = Gates()
    server = serve(gates)
    with server.http() as http:
        assert chat(http, "alpha").status_code == 200 and chat(http, "beta").status_code == 200
        gates.hold("alpha", "layerskip draft")
        slow = Background(server, lambda h: chat(h, "alpha", speculative={"method": "layerskip"}))
        assert gates.entered[("alpha", "layerskip draft")].wait(WAIT_S)
        for _ in range(3):
            reply = chat(http, "beta")
            assert reply.status_code == 200 and reply.json()["model"] == "beta"
        assert not slow.done()  # alpha's request was in alpha's engine all along
        gates.release("alpha", "layerskip draft")
        assert slow.result().status_code == 200


def test_a_load_plans_with_the_memory_free_now_others_took_some(serve: ServerFactory, folder: Path) -> None:
    """Room for three at start; another process takes two models' worth: beta's load evicts idle alpha."""
    one = max(model_bytes(folder / f"{name}.gguf") for name in NAMES)
    machine = Machine(room=one * 7 // 2)
    server = serve(Gates(), machine)
    with server.http() as http:
        assert chat(http, "alpha").status_code == 200
        machine.others = 2 * one
        assert chat(http, "beta").status_code == 200
        assert set(ps(http)) == {"beta"}


def test_a_load_plans_with_the_memory_free_now_others_freed_some(serve: ServerFactory, folder: Path) -> None:
    """Room for one and a half at start; another process frees two models' worth: beta loads beside alpha."""
    one = max(model_bytes(folder / f"{name}.gguf") for name in NAMES)
    machine = Machine(room=one * 3 // 2)
    server = serve(Gates(), machine)
    with server.http() as http:
        assert chat(http, "alpha").status_code == 200
        machine.others = -2 * one
        assert chat(http, "beta").status_code == 200
        assert set(ps(http)) == {"alpha", "beta"}
        # Half a model's worth free now: gamma's load evicts the least recently used (alpha) and no more.
        machine.others = -one
        assert chat(http, "gamma").status_code == 200
        assert set(ps(http)) == {"beta", "gamma"}


def test_a_model_that_cannot_fit_in_the_memory_free_now_is_refused_with_the_numbers(
    serve: ServerFactory, folder: Path
) -> None:
    """Room for alpha and a bigger model at start; others take the bigger one's worth: it is refused."""
    big = tinymodels.write_tiny_model(
        folder / "big.gguf", seed=3, n_embd=256, n_ff=512, n_layers=6, name="big"
    )
    machine = Machine(room=model_bytes(folder / "alpha.gguf") + model_bytes(big))
    server = serve(Gates(), machine)
    with server.http() as http:
        assert chat(http, "alpha").status_code == 200
        machine.others = model_bytes(big)  # what is left, and alpha's own, are less than big needs
        refused = chat(http, "big")
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["code"] == "insufficient_memory" and error["message"].startswith("big")
        assert "need" in error["message"] and "GiB" in error["message"]  # with the numbers
        assert set(ps(http)) == {"alpha"}  # nothing unloaded for a model that could not fit
        machine.others = 0
        assert chat(http, "big").status_code == 200


def test_the_daemons_own_model_loads_where_the_plan_says_it_does_not_fit(
    serve: ServerFactory, folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As before many models: the plan is conservative, and the person chose this model; llama.cpp tries."""
    machine = Machine(room=model_bytes(folder / "alpha.gguf") // 2)
    with caplog.at_level("WARNING", logger="localspec.daemon"):
        server = serve(Gates(), machine)
    assert any("loading it anyway" in r.getMessage() for r in caplog.records)
    with server.http() as http:
        assert chat(http, "alpha").status_code == 200
        refused = chat(http, "beta")  # an on-demand model gets the plan's word
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "insufficient_memory"


def test_max_resident_below_the_daemons_own_model_is_refused_at_start_with_the_numbers(
    serve: ServerFactory, folder: Path
) -> None:
    with pytest.raises(MemoryPlanError, match=r"alpha needs .* MiB .*\(max_resident\)"):
        serve(Gates(), max_resident=model_bytes(folder / "alpha.gguf") // 2)


def test_a_plain_copy_grown_for_a_long_prompt_counts_in_ps_and_in_the_next_loads_plan(
    serve: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan counts the plain prefill copy at the context it loads with; what it grows by to read
    a longer prompt is held memory too: /api/ps reports it and the next load plans without it."""
    monkeypatch.setattr(prefill, "PLAIN_CONTEXT", 256)  # of the 512 served
    monkeypatch.setenv("LOCALSPEC_PLAIN_PREFILL", "true")
    server = serve(Gates())
    with server.http() as http:
        assert chat(http, "beta").status_code == 200
        before = ps(http)["beta"]["size"]
        res = server.served.pool.resident["beta"]
        assert res.engine.info.plain_prefill and res.footprint == res.loadout.footprint
        long = [{"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 10}]
        assert chat(http, "beta", messages=long).status_code == 200  # some 300 tokens: past 256
        grown = res.engine.info.prefill_grown_bytes
        assert grown > 0 and ps(http)["beta"]["size"] == before + grown
        planned = sum(r.loadout.footprint.host for r in server.served.pool.resident.values())
        assert server.served.pool.used().host == planned + grown


def test_a_plain_copy_does_not_grow_past_max_resident_and_the_prompt_is_read_all_the_same(
    serve: ServerFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """max_resident bounds what the loaded models take together, the copy's growth included: where
    the models are at it, a longer prompt is read by the repacked model and nothing grows."""
    monkeypatch.setattr(prefill, "PLAIN_CONTEXT", 256)  # of the 512 served
    monkeypatch.setenv("LOCALSPEC_PLAIN_PREFILL", "true")
    server = serve(Gates(), max_resident=64 * GIB)
    pool = server.served.pool
    with server.http() as http:
        assert chat(http, "beta").status_code == 200
        cap = pool.used().total  # at the bound now
        pool.room = dataclasses.replace(pool.room, cap=cap)
        long = [{"role": "user", "content": "the quick brown fox jumps over the lazy dog " * 10}]
        with caplog.at_level("WARNING", logger="localspec"):
            reply = chat(http, "beta", messages=long)
        assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] > 256
        assert pool.resident["beta"].engine.info.prefill_grown_bytes == 0
        assert pool.used().total <= cap
        assert "at their memory bound (max_resident)" in caplog.text
