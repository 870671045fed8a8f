"""localspec's methods alone through one daemon, in turns request by request: no llama-server running.

    .venv/bin/python scripts/daemon_pairs.py --prompts scripts/bench_set.json \\
        --names translate_fr_zen,chat_explain_sky --methods none,auto --repeat 3 --json pairs.json

Where head_to_head.py's round reads `auto` against `none` with three llama-servers beside them, this
asks whether a gap between two methods is theirs: the same daemon (started as head_to_head starts
it), the same prompt, one method after the other, each pair minutes apart at most. Prints each
reply's decode tok/s and the target's llama.cpp time a step, and the pairs' ratios to the first
method.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import head_to_head as h2h

from localspec.engine.benchset import load_selected


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=h2h.MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--draft", type=Path, default=h2h.MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--prompts", type=Path, default=h2h.ROOT / "scripts" / "bench_set.json")
    ap.add_argument("--names", default="", help="comma-separated prompt names (default: all)")
    ap.add_argument("--methods", default="none,auto", help="comma-separated; ratios are to the first")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    names = [n for n in args.names.split(",") if n]
    prompts = [p for p in load_selected(args.prompts, "") if not names or p.name in names]
    if not prompts:
        sys.exit(f"no prompt of {args.prompts} is named {args.names}")
    methods = [m for m in args.methods.split(",") if m]
    args.logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pairs-home-") as home:
        proc, client = h2h.start_localspec(args, Path(home))
        try:
            model = h2h.served_name(client, args.target)
            extra = [{"model": model, "speculative": {"method": m}} for m in methods]
            contestants = [h2h.Contestant(m, client, e) for m, e in zip(methods, extra, strict=True)]
            h2h.warm_up(contestants, prompts[0])
            runs = h2h.run(contestants, prompts, args.max_tokens, max(1, args.repeat))
        finally:
            proc.terminate()
            proc.wait(30)
    rows: dict[str, dict[str, object]] = {}
    for name, samples in runs.items():
        first = samples[methods[0]]
        row: dict[str, object] = {}
        for method, got in samples.items():
            row[method] = {
                "decode_tps": [s.decode_tps for s in got],
                "target_ms_a_step": [
                    round(s.llama_s * 1e3 / s.steps, 1) if s.llama_s is not None and s.steps else None
                    for s in got
                ],
                "python_s": [s.python_s for s in got],
                "drafted": [s.drafted for s in got],
            }
            if method != methods[0]:
                paired = [round(s.decode_tps / f.decode_tps, 3) for s, f in zip(got, first, strict=True)]
                row[f"{method}_vs_{methods[0]}"] = paired
                print(f"{name:<28} {method}/{methods[0]} paired {paired} median {statistics.median(paired)}")
        rows[name] = row
    if args.json is not None:
        args.json.write_text(json.dumps({"methods": methods, "prompts": rows}, indent=1), encoding="utf-8")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
