"""Is the default (fast) loading lossless up to rounding on the real pair? Every divergence, explained.

Runs every method against the target alone (greedy, fresh prompt evaluation) on the bench prompts,
with llama.cpp's own loading, and judges the first divergence of each output with
`localspec.engine.lossless.explain`: it is explained when the target alone's logit for its own
token exceeds the method's token's logit by no more than the rounding margin measured here
(the most a batched verify of 2..8 positions moved a top-token gap, over the first prompts).

    .venv/bin/python scripts/lossless_check.py --methods draft,ngram,auto --max-tokens 128 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from localspec.engine.benchset import BenchPrompt, load_selected
from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.llama import LlamaModel
from localspec.engine.lossless import explain, rounding_margin
from localspec.engine.prompting import prompt_tokens
from localspec.engine.worker import Engine
from localspec.errors import UserInputError
from localspec.types import GenerationRequest, Method, SpecParams

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"


def request(prompt: BenchPrompt, method: Method, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(
        messages=prompt.messages,
        max_tokens=max_tokens,
        speculative=SpecParams(method),
        cache_prompt=False,
    )


def measure_margin(checker: LlamaModel, prompts: list[BenchPrompt], tokens: int) -> float:
    margins = []
    for prompt in prompts:
        ids = prompt_tokens(checker, request(prompt, "none", tokens))
        margins += [rounding_margin(checker, ids, tokens, batch) for batch in (2, 4, 8)]
    return max(margins)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--target", type=Path, default=ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    )
    parser.add_argument(
        "--draft", type=Path, default=ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    )
    parser.add_argument("--prompts", type=Path, default=ROOT / "scripts" / "bench_set.json")
    parser.add_argument("--kinds", default="", help="comma-separated kinds of prompt (default: all)")
    parser.add_argument("--methods", default="draft,ngram,auto")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--margin-prompts", type=int, default=3, help="prompts the margin is measured on")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    try:
        prompts = load_selected(args.prompts, args.kinds)
    except UserInputError as exc:
        sys.exit(str(exc))
    methods: list[Method] = [m for m in args.methods.split(",") if m]
    load = LoadOptions(n_ctx=4096)
    checker = LlamaModel(args.target, load)
    margin = measure_margin(checker, prompts[: args.margin_prompts], 32)
    print(f"rounding margin (largest gap shift, batches 2/4/8): {margin:.4f}", flush=True)
    rows: dict[str, dict[str, object]] = {}
    counts = {"runs": 0, "identical": 0, "explained": 0, "unexplained": 0}
    # No memory of earlier requests: each method would copy none's output of the same prompt.
    with Engine(EngineConfig(args.target, args.draft, load=load, ngram_memory_tokens=0)) as engine:
        engine.wait_ready()
        for prompt in prompts:
            name = prompt.name
            base = engine.generate(request(prompt, "none", args.max_tokens))
            ids = prompt_tokens(checker, request(prompt, "none", args.max_tokens))
            rows[name] = {}
            for method in methods:
                spec = engine.generate(request(prompt, method, args.max_tokens))
                div = explain(checker, ids, base.token_ids, spec.token_ids, margin)
                verdict = "identical" if div is None else ("explained" if div.explained else "unexplained")
                counts["runs"] += 1
                counts[verdict] += 1
                rows[name][method] = {"verdict": verdict, **(div.to_dict() if div else {})}
                where = "" if div is None else f" at token {div.position}: gap {div.gap:.4f}"
                print(f"{name:<24} {method:<6} {verdict}{where}", flush=True)
    checker.close()
    print(json.dumps(counts))
    if args.json:
        args.json.write_text(json.dumps({"margin": margin, "counts": counts, "rows": rows}, indent=2))
    return 1 if counts["unexplained"] else 0


if __name__ == "__main__":
    sys.exit(main())
