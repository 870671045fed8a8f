"""Run llama.cpp's own server on the bench prompts, alone and with a draft, for comparison.

llama-server is not part of llama-cpp-python's wheel; build it from the same llama.cpp that
llama-cpp-python vendors, so both sides run identical kernels:

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d /tmp/lcp
    tar xf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp
    cmake -S /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/llbuild -G Ninja \\
        -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON
    cmake --build /tmp/llbuild -j2 --target llama-server

    .venv/bin/python scripts/llama_server_compare.py --server /tmp/llbuild/bin/llama-server --json out.json

For each configuration (target alone; target with the draft at each --draft-max) the script starts
the server, sends every prompt as a chat request (greedy, prompt cache off so each prompt is
evaluated fresh, as `localspec bench` does) and records end-to-end tokens/s (wall time of the
request, prompt evaluation included), the server's own decode-only tokens/s, draft acceptance and
whether the text equals the target-alone text.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "scripts" / "bench_prompts.json"
TARGET = ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


@dataclass
class Run:
    config: str
    prompt: str
    tokens: int
    wall_tps: float
    decode_tps: float
    drafted: int
    accepted: int
    identical: bool | None
    text: str


def start_server(server: Path, argv: list[str], port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [str(server), "--host", "127.0.0.1", "--port", str(port), "--no-webui", *argv]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"llama-server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit(f"llama-server did not become ready in 180 s; see {log}")


def ask(port: int, message: str, max_tokens: int) -> tuple[str, int, float, dict[str, float]]:
    body = {
        "messages": [{"role": "user", "content": message}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "cache_prompt": False,
        "seed": 0,
    }
    t0 = time.perf_counter()
    reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=600).json()
    wall = time.perf_counter() - t0
    text = reply["choices"][0]["message"]["content"]
    return text, int(reply["usage"]["completion_tokens"]), wall, reply.get("timings", {})


def run_config(args: argparse.Namespace, name: str, extra: list[str], reference: dict[str, str]) -> list[Run]:
    base = ["-m", str(args.target), "-c", str(args.ctx), "-t", str(args.threads), "-np", "1"]
    log = Path(f"/tmp/llama-server-{name}.log")
    proc = start_server(args.server, base + extra, args.port, log)
    runs = []
    try:
        prompts: dict[str, str] = json.loads(args.prompts.read_text())
        for prompt_name, message in prompts.items():
            text, tokens, wall, timings = ask(args.port, message, args.max_tokens)
            same = None if name == "none" else text == reference.get(prompt_name)
            run = Run(
                config=name,
                prompt=prompt_name,
                tokens=tokens,
                wall_tps=tokens / wall,
                decode_tps=float(timings.get("predicted_per_second", 0.0)),
                drafted=int(timings.get("draft_n", 0)),
                accepted=int(timings.get("draft_n_accepted", 0)),
                identical=same,
                text=text,
            )
            runs.append(run)
            print(
                f"{name:>10} {prompt_name:>16} {tokens:4d} tok  {run.wall_tps:6.2f} tok/s end to end  "
                f"{run.decode_tps:6.2f} decode  drafted {run.drafted:3d} accepted {run.accepted:3d}  "
                f"identical {same}",
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait(30)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", type=Path, default=Path("/tmp/llbuild/bin/llama-server"))
    parser.add_argument("--target", type=Path, default=TARGET)
    parser.add_argument("--draft", type=Path, default=DRAFT)
    parser.add_argument("--prompts", type=Path, default=PROMPTS)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--draft-max", type=int, nargs="*", default=[3], help="One run per value.")
    parser.add_argument("--ngram", action="store_true", help="Also run the server's ngram-simple drafting.")
    parser.add_argument("--no-draft", action="store_true", help="Skip the draft-model runs.")
    parser.add_argument("--port", type=int, default=8991)
    parser.add_argument("--json", type=Path, help="Write every run (with texts) here.")
    args = parser.parse_args()

    runs = run_config(args, "none", [], {})
    reference = {r.prompt: r.text for r in runs}
    for n in [] if args.no_draft else args.draft_max:
        extra = ["-md", str(args.draft), "--spec-type", "draft-simple", "--spec-draft-n-max", str(n)]
        runs += run_config(args, f"draft-k{n}", [*extra, "-td", str(args.threads)], reference)
    if args.ngram:
        runs += run_config(args, "ngram", ["--spec-type", "ngram-simple"], reference)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))


if __name__ == "__main__":
    main()
