"""Measure how much a batched verify's logits differ from one-token decoding on a real model.

Greedy speculative decoding is only lossless if the target's choice at every
verified position equals what decoding one token at a time would choose. llama.cpp
rounds differently for different batch sizes, so this script decodes a greedy
continuation one token at a time, re-scores it in batches of B, and reports the
largest change of the gap between the top logit and its nearest rivals, the
argmax flips, and how often the gap is below a given threshold (the re-decide cost).

    .venv/bin/python scripts/batch_rounding.py models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    # exact loading after long documents (past position 256 no batch rounds as one token does)
    .venv/bin/python scripts/batch_rounding.py models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --batch-invariant --prompts scripts/bench_set.json --only summarize_ref_raise,chat_explain_sky \
        --batch 2 4 7 --tokens 16
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from localspec.engine.bench import load_prompts
from localspec.engine.config import LoadOptions
from localspec.engine.llama import LlamaModel

PROMPTS = Path(__file__).resolve().parent / "bench_prompts.json"


def measure(model: LlamaModel, prompt: list[int], n_tokens: int, batch: int) -> dict[str, float]:
    model.reset()
    model.decode(prompt)
    single, generated = [], []
    for _ in range(n_tokens):
        row = model.logits(-1).copy()
        single.append(row)
        generated.append(int(row.argmax()))
        model.decode([generated[-1]])
    base = len(prompt)
    shifts, gaps, flips = [], [], 0
    # single[i] predicts generated[i]; re-score generated[s-1 : s-1+batch] as one batch.
    for s in range(1, n_tokens - batch + 1, batch):
        model.truncate(base + s - 1)
        model.decode(generated[s - 1 : s - 1 + batch], batch)
        for j in range(batch):
            ref, got = single[s + j], model.logits(j)
            top = np.argsort(ref)[-5:]
            best = top[-1]
            shifts += [abs((got[best] - got[c]) - (ref[best] - ref[c])) for c in top[:-1]]
            gaps.append(float(ref[best] - ref[top[-2]]))
            flips += int(got.argmax() != best)
    g = np.array(gaps)
    return {
        "max_gap_shift": float(max(shifts)),
        "flips": flips,
        "positions": len(gaps),
        "gap_below_0.5": float((g < 0.5).mean()),
        "gap_below_1.0": float((g < 1.0).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--batch", type=int, nargs="+", default=[4])
    parser.add_argument("--batch-invariant", action="store_true", help="no weight repacking, flash attention")
    parser.add_argument("--prompts", type=Path, default=PROMPTS, help="A file in either bench format.")
    parser.add_argument("--only", default="", help="Comma-separated prompt names (default: all).")
    args = parser.parse_args()
    only = {name for name in args.only.split(",") if name}
    model = LlamaModel(args.model, LoadOptions(n_ctx=4096, batch_invariant=args.batch_invariant))
    report = {}
    for name, text in load_prompts(args.prompts).items():
        if only and name not in only:
            continue
        prompt = model.tokenize(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
        report[name] = {b: measure(model, prompt, args.tokens, b) for b in args.batch}
        print(name, json.dumps(report[name]), flush=True)


if __name__ == "__main__":
    main()
