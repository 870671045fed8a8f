"""Find where greedy speculative output stops being identical to the target alone, by k.

Runs `none` and then each METHOD:K on each prompt of the bench set (fresh evaluation,
greedy) and prints, per run, "identical" or the first token where the outputs differ.
This is how EXACT_VERIFY_BATCH (localspec/engine/config.py) was found; the engine clamps k to
EXACT_VERIFY_BATCH - 1, so pass --no-cap to see what larger verify batches do.

    .venv/bin/python scripts/verify_batch_limit.py add_docstrings,prose_explain ngram:6 ngram:7 --no-cap
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from localspec.engine import llama as backend
from localspec.engine.config import EngineConfig
from localspec.engine.worker import Engine
from localspec.types import ChatMessage, GenerationRequest, GenerationResult, SpecParams

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "scripts" / "bench_prompts.json"
MODELS = ROOT / "models"


def first_difference(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prompts", help="Comma-separated names from scripts/bench_prompts.json.")
    parser.add_argument("runs", nargs="+", help="METHOD:K, e.g. ngram:7 (auto: with K as its cap).")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--no-cap", action="store_true", help="Let verify batches exceed EXACT_VERIFY_BATCH.")
    parser.add_argument("--target", type=Path, default=MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    parser.add_argument("--draft", type=Path, default=MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    args = parser.parse_args()
    if args.no_cap:
        backend.EXACT_VERIFY_BATCH = 512  # read when a model is loaded
    texts: dict[str, str] = json.loads(PROMPTS.read_text())

    def generate(engine: Engine, name: str, method: str, k: int | None) -> GenerationResult:
        spec = SpecParams(method=method, k=k)  # type: ignore[arg-type]
        messages = (ChatMessage("user", texts[name]),)
        request = GenerationRequest(
            messages, max_tokens=args.max_tokens, speculative=spec, cache_prompt=False
        )
        return engine.generate(request)

    with Engine(EngineConfig(target=args.target, draft=args.draft)) as engine:
        engine.wait_ready()
        for name in args.prompts.split(","):
            base = generate(engine, name, "none", None).token_ids
            for run in args.runs:
                method, _, k_text = run.partition(":")
                result = generate(engine, name, method, int(k_text) if k_text else None)
                at = first_difference(base, result.token_ids)
                st = result.stats
                verdict = "identical" if at is None else f"differs from token {at}"
                print(
                    f"{name} {run}: {verdict}; k {st.k}, mean k {st.mean_k:.2f}, "
                    f"re-decides {st.redecided}, {st.tokens_per_second:.2f} tok/s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
