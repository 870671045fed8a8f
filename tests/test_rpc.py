"""The target on real `localspec rpc-worker` processes (loopback, tiny models), the draft local.

Needs a llama.cpp built with RPC (scripts/bootstrap builds one); skipped, saying so, without.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from daemonproc import LONG_CHAT, Daemon, daemon_env, run_cli, start_daemon
from rpcworkers import Worker, start_worker, worker_command

from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.ggml_backend import rpc_supported
from localspec.engine.isolated import IsolatedEngine, open_engine
from localspec.engine.worker import Engine
from localspec.errors import ContextOverflowError, LocalspecError, UserInputError
from localspec.types import GenerationRequest, SamplingParams, SpecParams

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not rpc_supported(), reason="llama.cpp built without RPC (run scripts/bootstrap)"),
]

PROMPT = "the model is"


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Worker]]:
    folder = tmp_path_factory.mktemp("rpc-workers")
    started = [start_worker(folder), start_worker(folder)]
    yield started
    for worker in started:
        worker.stop()


def _config(target: Path, draft: Path | None, *, exact: bool, rpc: tuple[str, ...] = ()) -> EngineConfig:
    load = LoadOptions(n_ctx=512, n_threads=1, batch_invariant=exact, rpc=rpc)
    return EngineConfig(target=target, draft=draft, method="none", load=load)


def _vocabulary(engine: Engine) -> tuple[list[int], list[bytes], tuple[int, ...]]:
    """PROMPT's tokens, their pieces, and the first tokens' most probable alternatives."""
    tokens = engine.tokenize(PROMPT)
    result = engine.generate(GenerationRequest(prompt=PROMPT, max_tokens=4, logprobs=2))
    return tokens, engine.pieces(tokens), tuple(t.token for lp in result.logprobs for t in lp.top)


def _tokens(engine: Engine, method: str, n: int = 48) -> tuple[int, ...]:
    request = GenerationRequest(
        prompt=PROMPT,
        max_tokens=n,
        sampling=SamplingParams(temperature=0.0),
        speculative=SpecParams(method=method, k=4),  # type: ignore[arg-type]
    )
    result = engine.generate(request)
    assert result.stats.method == method
    return result.token_ids


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "fast"])
def test_generation_on_two_workers_is_the_local_generation(
    workers: list[Worker], tiny_target: Path, tiny_related_draft: Path, exact: bool
) -> None:
    endpoints = tuple(w.endpoint for w in workers)
    with Engine(_config(tiny_target, tiny_related_draft, exact=exact)) as local:
        local.wait_ready()
        want = {method: _tokens(local, method) for method in ("none", "draft")}
        vocab = _vocabulary(local)
    with open_engine(_config(tiny_target, tiny_related_draft, exact=exact, rpc=endpoints)) as remote:
        assert isinstance(remote, IsolatedEngine)
        info = remote.wait_ready(120)
        assert info.draft == tiny_related_draft.name and info.draft_error is None
        got = {method: _tokens(remote, method) for method in ("none", "draft")}
        # The vocabulary calls and log-probabilities cross the process as they are.
        assert _vocabulary(remote) == vocab
        with pytest.raises(UserInputError, match="outside this model's"):
            remote.pieces([10**7])
        # An error crosses back as itself: it named the child's __main__, which the parent could
        # not unpickle, and the request hung until its call timed out.
        with pytest.raises(ContextOverflowError):
            remote.generate(GenerationRequest(prompt=PROMPT + " x" * 1000, max_tokens=2))
        assert len(_tokens(remote, "none", 4)) == 4
    # The tiny models' weights are F32, which llama.cpp never repacks: greedy decoding on the
    # workers' CPU backend matches this machine's token for token, with and without --exact.
    assert got == want
    assert len(want["none"]) == 48


def test_cancel_reaches_the_engine_process_and_it_serves_on(workers: list[Worker], tiny_target: Path) -> None:
    endpoints = tuple(w.endpoint for w in workers)
    config = replace(
        _config(tiny_target, None, exact=False, rpc=endpoints),
        load=LoadOptions(n_ctx=4096, n_threads=1, rpc=endpoints),
    )
    with open_engine(config) as engine:
        engine.wait_ready(120)
        handle = engine.submit(GenerationRequest(prompt="if x > 0:\n    print(x)\nelse:", max_tokens=4000))
        chunks = iter(handle)
        next(chunks)
        handle.cancel()
        rest = list(chunks)
        assert handle.result is not None and handle.result.finish_reason == "cancelled"
        assert len(handle.result.token_ids) < 4000 and len(rest) < 3000
        assert len(_tokens(engine, "none", 4)) == 4


def test_a_refused_connection_fails_the_load_naming_the_worker(tiny_target: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
        with open_engine(_config(tiny_target, None, exact=False, rpc=(endpoint,))) as engine:
            with pytest.raises(LocalspecError, match=f"cannot reach the RPC worker at {endpoint}"):
                engine.wait_ready(120)
            assert engine.info.status == "failed"


def test_generate_with_a_refused_worker_is_one_line(tmp_path: Path, tiny_target: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{s.getsockname()[1]}"
        done = run_cli(tmp_path, "generate", "--target", str(tiny_target), "--rpc", endpoint, PROMPT)
    assert done.returncode == 2, done.stderr
    assert f"cannot reach the RPC worker at {endpoint}" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_the_worker_refuses_a_non_loopback_host_without_the_flag(tmp_path: Path) -> None:
    done = run_cli(tmp_path, "rpc-worker", "--host", "0.0.0.0", "--port", "1")
    assert done.returncode == 2
    assert "add --allow-remote" in done.stderr and "Traceback" not in done.stderr


def test_a_second_worker_on_a_port_in_use_says_so(tmp_path: Path, workers: list[Worker]) -> None:
    done = run_cli(tmp_path, "rpc-worker", "--port", str(workers[0].port))
    assert done.returncode == 2
    assert f"port {workers[0].port} on 127.0.0.1 is in use" in done.stderr


def test_pick_draft_plans_the_target_on_the_workers(
    tmp_path: Path, workers: list[Worker], tiny_target: Path
) -> None:
    from localspec.models.gguf_info import read_gguf_info

    rpc = ",".join(w.endpoint for w in workers)
    done = run_cli(tmp_path, "pick-draft", "--target", str(tiny_target), "--rpc", rpc)
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stdout.splitlines() if x.startswith("rpc: "))
    n_layers = read_gguf_info(tiny_target).n_layers
    # Both workers report the same free memory (one machine): the blocks and the output split evenly.
    assert f"(layer {n_layers} is the output layer)" in line
    assert f"{workers[0].endpoint}: layers 0-" in line and f"{workers[1].endpoint}: layers " in line
    assert "does not fit" not in line


def test_auto_calibrates_the_target_through_its_workers(
    tmp_path: Path, workers: list[Worker], tiny_target: Path, tiny_related_draft: Path
) -> None:
    import json

    endpoints = tuple(w.endpoint for w in workers)
    base = _config(tiny_target, tiny_related_draft, exact=False, rpc=endpoints)
    config = replace(base, method="auto", cache_dir=tmp_path)
    with open_engine(config) as engine:
        engine.wait_ready(120)  # auto calibrates at load, in the engine's process
        assert len(_tokens(engine, "auto", 8)) == 8
    keys = [json.loads(f.read_text())["key"] for f in (tmp_path / "calibration").glob("*.json")]
    target_keys = [k for k in keys if k["file"] == str(tiny_target.resolve())]
    draft_keys = [k for k in keys if k["file"] == str(tiny_related_draft.resolve())]
    assert [k.get("rpc") for k in target_keys] == [list(endpoints)]  # V(n) measured through the workers
    assert [k.get("rpc") for k in draft_keys] == [None]  # the draft's curve is this machine's


def test_this_machine_s_devices_are_read_from_the_wheel_s_libraries() -> None:
    from localspec.engine.ggml_backend import DEVICE_CPU, has_local_gpu, local_devices
    from localspec.engine.llama import gpu_offload_supported

    devices = local_devices()
    assert any(kind == DEVICE_CPU for _, kind in devices), devices
    # llama_supports_gpu_offload says yes for any build with RPC; localspec asks for a real GPU.
    assert gpu_offload_supported() == has_local_gpu()


def test_calibration_is_keyed_by_the_workers(tiny_target: Path) -> None:
    from localspec.auto.calibrate import calibration_key

    local = calibration_key(tiny_target, LoadOptions())
    remote = calibration_key(tiny_target, replace(LoadOptions(), rpc=("127.0.0.1:1",)))
    assert "rpc" not in local  # curves cached before RPC existed stay valid
    assert remote["rpc"] == ["127.0.0.1:1"] and {k: v for k, v in remote.items() if k != "rpc"} == local


def test_worker_command_is_the_cli(tmp_path: Path) -> None:
    # The helper starts exactly the documented command.
    assert worker_command("--port", "1")[-3:] == ["rpc-worker", "--port", "1"]
    assert daemon_env(tmp_path)["LOCALSPEC_HOME"] == str(tmp_path)


def _workers_health(daemon: Daemon) -> dict[str, bool]:
    with daemon.http() as http:
        body = http.get("/health").json()
    return {w["endpoint"]: w["up"] for w in body["rpc_workers"]}


def _chat(daemon: Daemon, max_tokens: int) -> httpx.Response:
    body = {"model": "tiny-target", "messages": LONG_CHAT, "temperature": 0, "max_tokens": max_tokens}
    with daemon.http() as http:
        return http.post("/v1/chat/completions", json=body | {"speculative": {"method": "none"}})


def test_a_worker_killed_mid_request_ends_that_request_and_the_daemon_carries_on(
    tmp_path: Path, tiny_target: Path
) -> None:
    first, second = start_worker(tmp_path), start_worker(tmp_path)
    rpc = f"{first.endpoint},{second.endpoint}"
    try:
        daemon = start_daemon(tmp_path / "home", tiny_target, "--rpc", rpc, "--method", "none", ctx=8192)
    except BaseException:
        first.stop()
        second.stop()
        raise
    try:
        assert _workers_health(daemon) == {first.endpoint: True, second.endpoint: True}
        body = {"model": "tiny-target", "messages": LONG_CHAT, "temperature": 0, "stream": True}
        lines = []
        with (
            daemon.http(timeout=120) as http,
            http.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            assert response.status_code == 200
            for line in response.iter_lines():
                lines.append(line)
                if len(lines) == 3:  # generating: chunks have arrived
                    second.stop()
        tail = "\n".join(lines[-3:])
        assert f"the RPC worker at {second.endpoint} is down" in tail and '"rpc_worker"' in tail, tail
        assert daemon.proc.poll() is None, daemon.log()
        assert _workers_health(daemon) == {first.endpoint: True, second.endpoint: False}
        status = run_cli(daemon.home, "status").stdout
        assert f"rpc worker {second.endpoint}: DOWN (cannot reach" in status, status
        refused = _chat(daemon, 4)  # the model reloads, and cannot while the worker is down
        assert refused.status_code >= 500
        assert f"cannot reach the RPC worker at {second.endpoint}" in refused.json()["error"]["message"]
        second = start_worker(tmp_path, second.port)
        served = _chat(daemon, 8)
        assert served.status_code == 200, served.text
        assert served.json()["usage"]["completion_tokens"] == 8
        assert _workers_health(daemon) == {first.endpoint: True, second.endpoint: True}
    finally:
        code = daemon.stop()
        first.stop()
        second.stop()
    assert code == 0, daemon.log()
