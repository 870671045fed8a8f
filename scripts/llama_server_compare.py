"""Run llama.cpp's own server on the bench set: plain, ngram-mod, ngram-simple and a draft model.

llama-server is not part of llama-cpp-python's wheel; build it from the same llama.cpp that
llama-cpp-python vendors, so both sides run identical kernels (outside the checkout; 10-20 minutes
on 2 cores; add -DGGML_CUDA=ON for an NVIDIA GPU, then pass --server-args "-ngl 99"):

    mkdir -p /tmp/lcp && cd /tmp/lcp
    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d /tmp/lcp
    tar xf llama_cpp_python-0.3.36.tar.gz
    cmake -S /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/llbuild \\
        -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON
    nice -n 15 cmake --build /tmp/llbuild -j2 --target llama-server

Then, in one window on a quiet machine (same prompts, same max tokens, same threads):

    .venv/bin/python scripts/llama_server_compare.py --max-tokens 256 --json /tmp/llama-server.json
    .venv/bin/localspec bench --methods none,auto --max-tokens 256 --json > /tmp/localspec.json
    .venv/bin/python scripts/bench_report.py /tmp/localspec.json /tmp/llama-server.json

One server per mode is started at once (each on its own port, the model file shared through the page
cache), and the modes take turns on each prompt, as `localspec bench`'s methods do, so drift on a
shared machine is shared too. Every request is a greedy chat request with the prompt cache off, so
each prompt is evaluated fresh. Per prompt and mode it records decode tok/s (the server's
`timings.predicted_per_second`: tokens after the first over the time after the first), end-to-end
tok/s (completion tokens over the request's wall time), time to first token (`timings.prompt_ms`),
draft acceptance, and whether the text equals the server's own plain (target-alone) text.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_runs import (
    PLAIN,
    Sample,
    ServerProcess,
    ServerReplyError,
    mode_args,
    parse_reply,
    report_json,
    request_body,
)

from localspec.engine.benchset import BenchPrompt, load_selected
from localspec.errors import UserInputError

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "scripts" / "bench_set.json"
TARGET = ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def parse_args() -> argparse.Namespace:
    from localspec.engine.config import default_threads

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--server", type=Path, default=Path("/tmp/llbuild/bin/llama-server"))
    parser.add_argument("--target", type=Path, default=TARGET)
    parser.add_argument("--draft", type=Path, default=DRAFT)
    parser.add_argument("--prompts", type=Path, default=PROMPTS, help="A bench set, or name -> text.")
    parser.add_argument("--kinds", default="", help="Comma-separated kinds of prompt to run (default: all).")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=default_threads(), help="Default: physical cores.")
    parser.add_argument(
        "--modes",
        default="plain,ngram-mod,ngram-simple,draft",
        help="Comma-separated: plain, ngram-mod, ngram-simple, draft (plain always runs).",
    )
    parser.add_argument(
        "--draft-max", type=int, nargs="*", default=[3], help="One draft mode per value (llama.cpp: 3)."
    )
    parser.add_argument("--repeat", type=int, default=1, help="Keep the fastest of N turns per mode.")
    parser.add_argument("--server-args", default="", help='Passed to every server, e.g. "-ngl 99".')
    parser.add_argument("--port", type=int, default=8991, help="First port; one per mode.")
    parser.add_argument("--logs", type=Path, default=Path("/tmp"), help="Where each server's log goes.")
    parser.add_argument("--json", type=Path, help="Write settings, every run (with texts) and medians here.")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    try:
        prompts = load_selected(args.prompts, args.kinds)
        names = [m.strip() for m in args.modes.split(",") if m.strip()]
        modes = mode_args(names, args.draft, args.draft_max, args.threads)
    except (UserInputError, ValueError) as exc:
        sys.exit(str(exc))
    base = ["-m", str(args.target), "-c", str(args.ctx), "-t", str(args.threads), "-np", "1", "--no-webui"]
    base += shlex.split(args.server_args)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    servers: dict[str, ServerProcess] = {}
    try:
        for i, (mode, extra) in enumerate(modes.items()):
            servers[mode] = ServerProcess.start(
                args.server, [*base, *extra], args.port + i, args.logs / f"llama-server-{mode}.log"
            )
        runs = run_all(servers, prompts, args.max_tokens, max(1, args.repeat))
    except ServerReplyError as exc:
        sys.exit(str(exc))
    finally:
        for server in servers.values():
            server.stop()
    settings = {
        "server": str(args.server),
        "target": str(args.target),
        "draft": str(args.draft),
        "prompts_file": str(args.prompts),
        "kinds": args.kinds or "all",
        "modes": {mode: [*base, *extra] for mode, extra in modes.items()},
        "max_tokens": args.max_tokens,
        "repeat": args.repeat,
        "threads": args.threads,
        "n_ctx": args.ctx,
        "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    data = report_json(prompts, runs, settings)
    _print_medians(data["kinds"])
    if args.json:
        args.json.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
        print(f"wrote {args.json}")


def run_all(
    servers: dict[str, ServerProcess], prompts: list[BenchPrompt], max_tokens: int, repeat: int
) -> dict[str, dict[str, list[Sample]]]:
    """{prompt: {mode: [one sample per turn]}}, the modes taking turns on each prompt."""
    runs: dict[str, dict[str, list[Sample]]] = {}
    for prompt in prompts:
        body = request_body(prompt, max_tokens)
        samples: dict[str, list[Sample]] = {mode: [] for mode in servers}
        for _ in range(repeat):
            for mode, server in servers.items():
                t0 = time.perf_counter()
                reply = server.chat(body)
                sample = parse_reply(reply, time.perf_counter() - t0)
                samples[mode].append(sample)
                _print_sample(prompt.name, mode, sample, samples[PLAIN][0])
        runs[prompt.name] = samples
    return runs


def _print_sample(name: str, mode: str, sample: Sample, plain: Sample) -> None:
    same = "-" if mode == PLAIN else ("same" if sample.text == plain.text else "DIFF")
    print(
        f"{name[:28]:<28} {mode:<13} {sample.tokens:>4} tok  decode {sample.decode_tps:>7.2f}  "
        f"e2e {sample.e2e_tps:>7.2f}  ttft {sample.ttft_s * 1000:>6.0f} ms  "
        f"drafted {sample.drafted:>4} accepted {sample.accepted:>4}  {same}",
        flush=True,
    )


def _print_medians(kinds: dict[str, dict[str, dict[str, float]]]) -> None:
    print(f"\n{'median per kind':<28} {'mode':<13} {'prompts':>7} {'decode':>7} {'e2e':>7} {'ttft ms':>8}")
    for kind, modes in kinds.items():
        for mode, m in modes.items():
            print(
                f"{kind[:28]:<28} {mode:<13} {m['prompts']:>7.0f} {m['decode_tps']:>7.2f} "
                f"{m['e2e_tps']:>7.2f} {m['ttft_s'] * 1000:>8.0f}"
            )


if __name__ == "__main__":
    main()
