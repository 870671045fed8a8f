"""The daemon as a process: socket and pidfile, one daemon per socket, signals, queue bound, cancellation."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemonproc import (
    LONG_CHAT,
    Daemon,
    daemon_env,
    listening,
    metric,
    run_cli,
    start_daemon,
    wait_for_metric,
    wait_ready,
)

from localspec.models.catalog import load_catalog
from localspec.paths import Paths
from localspec.process.hugepages import glibc_version, huge_pages, thp_mode, tunables_with_huge_pages

pytestmark = pytest.mark.timeout(180)

CANCELLED = 'localspec_generations_total{finish="cancelled"}'


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path) -> Iterator[Daemon]:
    """A long context and a queue of one: long generations, and a full queue after two requests."""
    d = start_daemon(tmp_path_factory.mktemp("daemon-home"), tiny_target, "--queue-size", "1", ctx=8192)
    yield d
    assert d.stop() == 0, d.log()


def _long_body(stream: bool = True) -> dict[str, object]:
    # method none: the plain loop is the fastest way for the tiny model to fill 8k of context.
    return {
        "model": "tiny-target",
        "messages": LONG_CHAT,
        "temperature": 0,
        "stream": stream,
        "speculative": {"method": "none"},
    }


def test_socket_is_private_and_the_pidfile_names_the_process(daemon: Daemon) -> None:
    assert stat.S_ISSOCK(daemon.socket_path.stat().st_mode)
    assert stat.S_IMODE(daemon.socket_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(daemon.socket_path.parent.stat().st_mode) == 0o700
    pid_file = daemon.socket_path.with_suffix(".pid")
    assert int(pid_file.read_text()) == daemon.proc.pid


def test_a_second_daemon_on_the_same_socket_is_refused(daemon: Daemon, tiny_target: Path) -> None:
    second = start_daemon(daemon.home, tiny_target, wait=False)
    assert second.proc.wait(60) == 2
    assert "already running" in second.log()
    assert f"pid {daemon.proc.pid}" in second.log()
    assert daemon.proc.poll() is None


def test_status_reports_the_running_daemon(daemon: Daemon) -> None:
    out = run_cli(daemon.home, "status")
    assert out.returncode == 0, out.stderr
    assert "ready" in out.stdout
    assert f"pid {daemon.proc.pid}" in out.stdout
    assert "tiny-target" in out.stdout
    as_json = run_cli(daemon.home, "status", "--json")
    assert '"status": "ready"' in as_json.stdout
    assert '"plain_prefill": ' in as_json.stdout  # whether prompts are read with plain weights
    assert "pick: draft none, method " in out.stdout  # started with no draft: pick-draft's choice
    assert "loading: fast (llama.cpp's own; identical to the target alone up to rounding)" in out.stdout


def test_started_without_a_draft_health_says_what_pick_draft_chose(daemon: Daemon) -> None:
    with daemon.http() as http:
        health = http.get("/health").json()
    pick = health["pick"]
    assert pick.startswith("draft none, method ") and "— pick-draft chose " in pick
    assert "(expected " in pick  # then the choice's own reason
    assert health["draft"] is None
    assert health["exact"] is False  # llama.cpp's own loading unless started with --exact
    # The daemon restarted itself with huge pages where the kernel gives them only on request.
    env = daemon_env(daemon.home)
    restarted = tunables_with_huge_pages(env, thp_mode(), sys.platform, glibc_version())
    assert health["huge_pages"] is huge_pages(
        {**env, "GLIBC_TUNABLES": restarted or env.get("GLIBC_TUNABLES", "")}
    )


def test_status_without_a_daemon_says_how_to_start_one(tmp_path: Path) -> None:
    out = run_cli(tmp_path, "status")
    assert out.returncode == 2
    assert "no localspec daemon at" in out.stderr and "localspec serve" in out.stderr


def test_disconnect_mid_stream_cancels_the_generation(daemon: Daemon) -> None:
    with daemon.http() as http:
        before = metric(http.get("/metrics").text, CANCELLED)
        with http.stream("POST", "/v1/chat/completions", json=_long_body()) as response:
            assert response.status_code == 200
            next(response.iter_lines())
        # The connection is closed: the engine must stop that generation within one step.
        assert wait_for_metric(daemon, CANCELLED, before + 1) == before + 1
        start = time.monotonic()
        quick = http.post(
            "/v1/chat/completions",
            json={"model": "tiny-target", "messages": LONG_CHAT, "max_tokens": 4, "temperature": 0},
        )
        assert quick.status_code == 200
        assert time.monotonic() - start < 5.0
    assert metric(http_metrics(daemon), "localspec_in_flight") == 0


def http_metrics(daemon: Daemon) -> str:
    with daemon.http() as http:
        return http.get("/metrics").text


def test_a_full_queue_answers_503_with_retry_after(daemon: Daemon) -> None:
    with daemon.http() as running_http, daemon.http() as waiting_http, daemon.http() as http:
        with running_http.stream("POST", "/v1/chat/completions", json=_long_body()) as running:
            # Keep the iterator: dropping it would close the stream, and the daemon would cancel the request.
            lines = running.iter_lines()
            next(lines)  # the first request is on the engine now
            waiting_status: list[int] = []

            def wait_in_queue() -> None:
                body = _long_body(stream=False) | {"max_tokens": 2}
                waiting_status.append(waiting_http.post("/v1/chat/completions", json=body).status_code)

            waiter = threading.Thread(target=wait_in_queue)
            waiter.start()
            deadline = time.monotonic() + 10
            while http.get("/health").json()["queue_depth"] < 1:
                assert time.monotonic() < deadline, "the second request never reached the queue"
                time.sleep(0.01)
            refused = http.post("/v1/chat/completions", json=_long_body(stream=False))
            assert refused.status_code == 503
            assert refused.headers["retry-after"].isdigit()
            assert refused.json()["error"]["code"] == "overloaded"
            ollama_refused = http.post("/api/chat", json=_long_body(stream=False))
            assert ollama_refused.status_code == 503
            assert "waiting" in ollama_refused.json()["error"]
        waiter.join(60)
    assert waiting_status == [200]


def test_no_request_kills_the_daemon(daemon: Daemon) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.connect(str(daemon.socket_path))
        raw.sendall(b"\x00\xff garbage that is not HTTP\r\n\r\n")
        raw.recv(1024)
    with daemon.http() as http:
        assert http.get("/health").json()["status"] == "ready"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["sigterm", "sighup"])
def test_sigterm_mid_stream_exits_0_and_cleans_up(tmp_path: Path, tiny_target: Path, sig: int) -> None:
    """SIGTERM (`localspec stop`, a service manager) and SIGHUP (its terminal closed) alike."""
    d = start_daemon(tmp_path / "home", tiny_target, ctx=8192)
    with d.http() as http, http.stream("POST", "/v1/chat/completions", json=_long_body()) as response:
        lines = response.iter_lines()
        next(lines)
        start = time.monotonic()
        d.proc.send_signal(sig)
        rest = list(lines)  # the stream ends: the generation was cancelled
    assert d.proc.wait(30) == 0, d.log()
    assert time.monotonic() - start < 15
    assert any("shutting down" in line for line in rest)
    assert not d.socket_path.exists()
    assert not d.socket_path.with_suffix(".pid").exists()


def test_stop_command_stops_the_daemon(tmp_path: Path, tiny_target: Path) -> None:
    d = start_daemon(tmp_path / "home", tiny_target)
    # A bad value written since the start (as an older pick-draft --save did) must not keep the
    # daemon out of reach: status and stop read the socket alone.
    config = Paths.from_env(daemon_env(d.home)).config_file
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("k = 0\n")
    assert run_cli(d.home, "generate", "hi").returncode == 2
    assert run_cli(d.home, "status").returncode == 0
    out = run_cli(d.home, "stop")
    assert out.returncode == 0, out.stderr
    assert f"pid {d.proc.pid}" in out.stdout
    assert d.proc.wait(10) == 0
    assert not d.socket_path.exists()
    assert run_cli(d.home, "stop").returncode == 2


def test_a_stale_socket_is_replaced(tmp_path: Path, tiny_target: Path) -> None:
    sock_path = tmp_path / "home" / "run" / "localspec.sock"
    sock_path.parent.mkdir(parents=True, mode=0o700)
    crashed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    crashed.bind(str(sock_path))  # a socket file nobody listens on, as a killed daemon leaves it
    crashed.close()
    d = start_daemon(tmp_path / "home", tiny_target)
    try:
        assert "stale socket" in d.log()
    finally:
        assert d.stop() == 0


def test_a_live_socket_is_not_taken_over(tmp_path: Path, tiny_target: Path) -> None:
    sock_path = tmp_path / "custom.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(str(sock_path))
        other.listen()
        d = start_daemon(tmp_path / "home", tiny_target, "--socket", str(sock_path), wait=False)
        assert d.proc.wait(60) == 2
    assert "already listening" in d.log()
    assert sock_path.exists()


def test_the_socket_path_can_be_chosen(tmp_path: Path, tiny_target: Path) -> None:
    sock_path = tmp_path / "elsewhere" / "my.sock"
    d = start_daemon(tmp_path / "home", tiny_target, "--socket", str(sock_path), wait=False)
    d.socket_path = sock_path
    try:
        wait_ready(d)
        assert stat.S_IMODE(sock_path.stat().st_mode) == 0o600
        assert run_cli(d.home, "status", "--socket", str(sock_path)).returncode == 0
    finally:
        assert d.stop() == 0
    assert not sock_path.exists()


def test_non_loopback_tcp_without_a_token_is_refused(tmp_path: Path, tiny_target: Path) -> None:
    d = start_daemon(tmp_path, tiny_target, "--tcp", "0.0.0.0:8977", wait=False)
    assert d.proc.wait(60) == 2
    assert "set a token" in d.log()


def test_a_missing_target_fails_at_once(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, tmp_path / "nope.gguf", wait=False)
    assert d.proc.wait(60) == 2
    assert "model file not found" in d.log()
    assert not d.socket_path.exists()


def test_a_model_that_fails_to_load_stops_the_daemon(tmp_path: Path, tiny_target: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny_target.read_bytes()[:4096])  # GGUF magic, truncated tensors
    d = start_daemon(tmp_path / "home", broken, wait=False)
    assert d.proc.wait(60) == 2, d.log()
    assert "error:" in d.log()
    assert not d.socket_path.exists()
    assert not d.socket_path.with_suffix(".pid").exists()


def test_without_target_the_catalog_default_is_served(tmp_path: Path, tiny_target: Path) -> None:
    catalog = load_catalog()
    models = tmp_path / "models"
    models.mkdir()
    default = models / catalog.get(catalog.default_target).file
    shutil.copy(tiny_target, default)  # the tiny model under the default model's file name
    d = start_daemon(tmp_path / "home", None, env={"LOCALSPEC_MODELS": str(models)})
    try:
        with d.http() as http:
            assert http.get("/health").json()["model"] == default.stem
    finally:
        assert d.stop() == 0


def test_unix_socket_requests_need_no_token(tmp_path: Path, tiny_target: Path) -> None:
    d = start_daemon(tmp_path / "home", tiny_target, tcp=True, token="t0k")
    try:
        with d.http() as http:
            assert http.get("/v1/models").status_code == 200
        with d.tcp_http() as http:
            assert http.get("/v1/models").status_code == 401
        with d.tcp_http(token="t0k") as http:
            assert http.get("/v1/models").status_code == 200
    finally:
        assert d.stop() == 0


def test_loading_is_reported_then_ready(tmp_path: Path, tiny_target: Path) -> None:
    d = start_daemon(tmp_path / "home", tiny_target, wait=False)
    try:
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while "ready" not in seen and time.monotonic() < deadline:
            if listening(d.socket_path):
                with d.http() as http:
                    response = http.get("/health")
                seen.add(response.json()["status"])
                assert response.status_code == (200 if response.json()["status"] == "ready" else 503)
            time.sleep(0.01)
        assert "ready" in seen
        assert seen <= {"loading", "ready"}
        assert "loading target" in d.log()
        with d.http() as http:
            pick = http.get("/health").json()["pick"]
        assert f"localspec.daemon: {pick}\n" in d.log()  # what it chose, one line at startup
    finally:
        assert d.stop() == 0


def test_env_is_not_leaking(localspec_home: Path) -> None:
    # The helper gives each daemon its own home; this test's home stays empty.
    assert not (localspec_home / "run").exists()
    assert os.environ["LOCALSPEC_HOME"] == str(localspec_home)
