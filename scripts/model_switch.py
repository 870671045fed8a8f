"""Load time, cold and warm time to first token, and memory per model against the plan, on a running daemon.

    localspec serve &                       # any target; the daemon serves every model it finds
    python scripts/model_switch.py [NAME ...] [--socket PATH] [--json]

For each model (default: every model `/v1/models` lists): unload it (Ollama's empty request with
keep_alive 0), then one streamed chat of 8 tokens (cold: the request waits for the load), then the
same again (warm). Reports the load time the daemon measured (/api/ps), the time to the first
streamed token both ways, the memory the plan counts for the model (/api/ps `size`) and how much
the daemon's resident memory grew while it loaded (psutil). Other models may be unloaded to make
room: the budget decides, as it would for any client. Prints a Markdown table (or JSON) on stdout,
and each step as it goes on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from localspec.paths import Paths
from localspec.process.pidfile import daemon_pid, pid_file_for

CHAT = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
MIB = 1 << 20
WAIT_S = 600.0  # for the daemon's first load, and for an unload to show in /api/ps


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def wait_ready(http: httpx.Client) -> None:
    """The daemon may still be loading its own model (run right after `localspec serve &`)."""
    deadline = time.monotonic() + WAIT_S
    while (health := http.get("/health").json())["status"] != "ready":
        if health["status"] == "failed" or time.monotonic() > deadline:
            raise SystemExit(f"the daemon is not ready: {health}")
        time.sleep(0.2)


def loaded(http: httpx.Client) -> dict[str, dict[str, Any]]:
    return {m["name"].removesuffix(":latest"): m for m in http.get("/api/ps").json()["models"]}


def unload(http: httpx.Client, model: str) -> None:
    http.post("/api/generate", json={"model": model, "prompt": "", "keep_alive": 0}).raise_for_status()
    deadline = time.monotonic() + WAIT_S
    while model in loaded(http):
        if time.monotonic() > deadline:
            raise SystemExit(f"{model} was asked to unload (keep_alive 0) and is still in /api/ps")
        time.sleep(0.05)


def first_token_s(http: httpx.Client, model: str) -> float:
    body = {"model": model, "messages": CHAT, "max_tokens": 8, "temperature": 0, "stream": True}
    started = time.perf_counter()
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content":"' in line.replace(" ", ""):
                return time.perf_counter() - started
    return time.perf_counter() - started


def measure(http: httpx.Client, daemon: psutil.Process, model: str) -> dict[str, Any]:
    say(f"{model}: unloading it")
    unload(http, model)
    rss_before, pss_before = _memory(daemon)
    say(f"{model}: cold request (waits for the load)")
    cold = first_token_s(http, model)
    rss_after, pss_after = _memory(daemon)
    say(f"{model}: first token after {cold:.2f}s; warm request")
    warm = first_token_s(http, model)
    ps = loaded(http).get(model)
    if ps is None:
        raise SystemExit(f"{model} answered but is not in /api/ps: name it as /v1/models does")
    say(f"{model}: first token after {warm:.2f}s; loaded in {ps.get('load_seconds')}s")
    return {
        "model": model,
        "draft": ps.get("draft") or ps.get("method"),
        "load_s": ps.get("load_seconds"),
        "ttft_cold_s": round(cold, 3),
        "ttft_warm_s": round(warm, 3),
        "plan_mib": round(ps["size"] / MIB, 1),
        "rss_growth_mib": round((rss_after - rss_before) / MIB, 1),
        "pss_growth_mib": round((pss_after - pss_before) / MIB, 1) if pss_after else None,
    }


def _memory(daemon: psutil.Process) -> tuple[int, int]:
    """RSS, and PSS where the system reports it (Linux): RSS counts a file page once per mapping,
    and a model with a plain prefill copy maps its file twice; PSS counts each page once."""
    info = daemon.memory_full_info()
    return info.rss, getattr(info, "pss", 0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="*")
    parser.add_argument("--socket", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    socket_path = args.socket or Paths.from_env().socket_path
    daemon = psutil.Process(daemon_pid(pid_file_for(socket_path)) or 0)
    transport = httpx.HTTPTransport(uds=str(socket_path))
    with httpx.Client(transport=transport, base_url="http://localhost", timeout=600) as http:
        wait_ready(http)
        names = args.models or [m["id"] for m in http.get("/v1/models").json()["data"]]
        say(f"{len(names)} models: {', '.join(names)}")
        rows = [measure(http, daemon, name) for name in names]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    columns = ["model", "draft or method", "load s", "TTFT cold s", "TTFT warm s", "plan MiB"]
    print("| " + " | ".join([*columns, "RSS growth MiB", "PSS growth MiB"]) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r["model"], r["draft"], r["load_s"], r["ttft_cold_s"], r["ttft_warm_s"], r["plan_mib"]]
        print("| " + " | ".join(str(c) for c in [*cells, r["rss_growth_mib"], r["pss_growth_mib"]]) + " |")


if __name__ == "__main__":
    main()
