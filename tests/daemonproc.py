"""A real `localspec serve` process for the API, daemon and client tests.

The daemon runs as a subprocess with its own LOCALSPEC_HOME and a tiny model,
listening on its unix socket (and TCP when asked); tests talk to it with real
HTTP clients. Its stderr goes to a file that failing tests print.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import ollama
import openai

from localspec.client import Client
from localspec.process.pidfile import listening

START_TIMEOUT_S = 90.0  # a busy 2-core CI machine imports llama.cpp slowly
# A greedy chat that the tiny target continues until the context is full (no EOS): a long generation.
LONG_CHAT = [{"role": "user", "content": "the model is"}]
TOKEN = "s3cret-token"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def daemon_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALSPEC_") or k == "LOCALSPEC_MODELS"}
    # One thread: on a shared CI machine llama.cpp's threads wait on each other's time slices, and a
    # tiny model's decode goes from 0.3 ms to tens of milliseconds.
    # The daemon serves every model discovery finds: the models folder only, not this machine's
    # Hugging Face cache, LM Studio folders or Ollama store, so listings are the same everywhere.
    elsewhere = {
        "HOME": str(home / "user"),
        "HF_HUB_CACHE": str(home / "user" / "hf"),
        "OLLAMA_MODELS": str(home / "user" / "ollama"),
    }
    base = {**env, **elsewhere, "LOCALSPEC_HOME": str(home), "LOCALSPEC_THREADS": "1"}
    return {**base, **(extra or {})}


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "from localspec.cli import main; main()", "serve", *args]


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    home: Path
    socket_path: Path
    log_path: Path
    port: int | None = None
    token: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def http(self, timeout: float = 60.0) -> httpx.Client:
        """httpx over the unix socket."""
        transport = httpx.HTTPTransport(uds=str(self.socket_path))
        return httpx.Client(transport=transport, base_url="http://localhost", timeout=timeout)

    def tcp_http(self, token: str | None = None, timeout: float = 60.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def client(self) -> Client:
        return Client(socket_path=self.socket_path, timeout=60.0)

    def openai(self, path: str = "/v1", **options: Any) -> openai.OpenAI:
        """The real openai package over the unix socket; `options` go to openai.OpenAI."""
        http = httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket_path)))
        # openai 3 types http_client as httpx2.Client and accepts httpx.Client too (checked at runtime).
        base = f"http://localhost{path}"
        return openai.OpenAI(base_url=base, api_key="on-the-socket", http_client=http, **options)  # type: ignore[arg-type]

    def anthropic(self, **options: Any) -> anthropic.Anthropic:
        """The real anthropic package over the unix socket; `options` go to anthropic.Anthropic."""
        # anthropic talks through httpx2, httpx's fork; the unix socket is its transport's too.
        http = httpx2.Client(transport=httpx2.HTTPTransport(uds=str(self.socket_path)))
        return anthropic.Anthropic(
            base_url="http://localhost", api_key="on-the-socket", http_client=http, **options
        )

    def ollama(self, **options: Any) -> ollama.Client:
        """The real ollama package over the unix socket; `options` go to ollama.Client (and httpx)."""
        transport = httpx.HTTPTransport(uds=str(self.socket_path))
        return ollama.Client(host="http://localhost", transport=transport, **options)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the daemon ignored signal {sig} for {timeout}s:\n{self.log()}") from None


def start_daemon(
    home: Path,
    target: Path | None,
    *args: str,
    tcp: bool = False,
    token: str | None = None,
    ctx: int | None = 2048,
    env: dict[str, str] | None = None,
    wait: bool = True,
    nofile: int | None = None,
    preexec: Callable[[], None] | None = None,
    socket_path: Path | None = None,
    shared_cache: Path | None = None,
) -> Daemon:
    """Start `localspec serve --target TARGET ...` and, with `wait`, return once /health says ready.

    `ctx` None leaves the context to the daemon (pickdraft.context).
    `nofile` sets the daemon's open-file limit (soft and hard), as a small machine's default would;
    `preexec` runs in the child before exec (after `nofile`); `socket_path` replaces the default socket.
    `shared_cache`: see share_cache.
    """
    home.mkdir(parents=True, exist_ok=True)
    if shared_cache is not None:
        share_cache(shared_cache, home / "cache")
    port = free_port() if tcp else None
    argv: list[str] = ["--target", str(target)] if target is not None else []
    argv += ["--ctx", str(ctx)] if ctx is not None else []  # None: the daemon sizes it
    argv += ["--no-access-log", *args]
    if socket_path is not None:
        argv += ["--socket", str(socket_path)]
    if port is not None:
        argv += ["--tcp", f"127.0.0.1:{port}"]
    extra = dict(env or {})
    if token is not None:
        extra["LOCALSPEC_TOKEN"] = token  # the environment, not argv, as the help advises
    log_path = home / "daemon.log"
    with open(log_path, "wb") as log:
        limit = functools.partial(_before_exec, nofile, preexec) if nofile or preexec else None
        proc = subprocess.Popen(
            serve_command(*argv),
            env=daemon_env(home, extra),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=limit,
        )
    daemon = Daemon(proc, home, socket_path or home / "run" / "localspec.sock", log_path, port, token)
    if wait:
        wait_ready(daemon)
        if shared_cache is not None:
            share_cache(home / "cache", shared_cache)
    return daemon


def start_real_daemon(home: Path, target: Path, *args: str, curves: Path, **kwargs: Any) -> Daemon:
    """start_daemon for a real model: two threads, as every real-model daemon, so that the curves
    they measure share one key and each starts from those the earlier ones left in `curves`."""
    return start_daemon(home, target, *args, env={"LOCALSPEC_THREADS": "2"}, shared_cache=curves, **kwargs)


def share_cache(source: Path, dest: Path) -> None:
    """Copy the measured curves and GGUF summaries from `source` into `dest`.

    The real-model daemons each have their own home; without a shared cache each measured the same
    curves again at start (the prompt-read choice ~23 s, auto's calibration more at one thread, on 2
    cores): the first one measures, the later ones start as a user's second `serve` does.
    """
    for part in ("calibration", "gguf"):
        if (source / part).is_dir():
            shutil.copytree(source / part, dest / part, dirs_exist_ok=True)


def _before_exec(nofile: int | None, preexec: Callable[[], None] | None) -> None:
    if nofile is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    if preexec is not None:
        preexec()


def wait_ready(daemon: Daemon, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.proc.poll() is not None:
            raise AssertionError(f"the daemon exited with {daemon.proc.returncode}:\n{daemon.log()}")
        if listening(daemon.socket_path):
            try:
                with daemon.http(timeout=5.0) as http:
                    if http.get("/health").json().get("status") == "ready":
                        return
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    daemon.stop(signal.SIGKILL)
    raise AssertionError(f"the daemon was not ready within {timeout}s:\n{daemon.log()}")


def run_cli(home: Path, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`localspec ARGS` in a subprocess with this home."""
    cmd: Sequence[str] = [sys.executable, "-c", "from localspec.cli import main; main()", *args]
    return subprocess.run(cmd, env=daemon_env(home), capture_output=True, text=True, timeout=timeout)


def metric(text: str, sample: str) -> float:
    """The value of one sample (`name` or `name{labels}`) in Prometheus text; 0 when absent."""
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    return 0.0


def wait_for_metric(daemon: Daemon, sample: str, at_least: float, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    with daemon.http() as http:
        while True:
            value = metric(http.get("/metrics").text, sample)
            if value >= at_least or time.monotonic() > deadline:
                return value
            time.sleep(0.02)
