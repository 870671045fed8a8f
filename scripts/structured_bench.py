"""How fast tool calls and JSON answers come out, per method, on the real pair (issue 20).

Five kinds of constrained reply on Qwen2.5-Coder 1.5B with its 0.5B draft, greedy, fresh prompt
evaluation, each method after `none` on the same request with no memory of earlier requests:
a JSON answer to a schema, a forced (`tool_choice: required`) call, a call the model chooses
to make (`tool_choice: auto`), and two JSON answers that copy code from the prompt into a string
(a function's source verbatim from a real file, a whole file rewritten with type hints). Prints
decode tokens/s (the best round), its ratio to `none`'s best and the median of the ratios round by
round (`paired`), target steps, the steps the grammar drafted, and whether the output equals
`none`'s.

    .venv/bin/python scripts/structured_bench.py --repeat 2 --json out.json
"""

from __future__ import annotations

import argparse
import colorsys
import inspect
import json
import nturl2path
import statistics
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.worker import Engine
from localspec.types import (
    ChatMessage,
    GenerationRequest,
    GenerationResult,
    Method,
    SpecParams,
    ToolChoice,
    ToolSpec,
)

MODELS = Path(__file__).resolve().parents[1] / "models"
WEATHER = ToolSpec(
    "get_weather",
    "Current weather for a city.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
    },
)
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "born": {"type": "integer"},
        "languages": {"type": "array", "items": {"type": "string"}},
        "field": {"type": "string"},
    },
    "required": ["name", "born", "languages", "field"],
}


def requests() -> dict[str, GenerationRequest]:
    def chat(text: str, max_tokens: int = 96, **kw: Any) -> GenerationRequest:
        return GenerationRequest(
            messages=(ChatMessage("user", text),), max_tokens=max_tokens, cache_prompt=False, **kw
        )

    def fenced(module: ModuleType) -> str:
        return f"```python\n{inspect.getsource(module)}\n```"

    required: ToolChoice = "required"
    return {
        "json_schema": chat("Describe Ada Lovelace as JSON.", json_schema=PERSON),
        "tool_required": chat(
            "What is the weather in Paris, in celsius?", tools=(WEATHER,), tool_choice=required
        ),
        "tool_auto": chat("What's the weather like in Tokyo right now? Use celsius.", tools=(WEATHER,)),
        # The JSON string holds the code's line breaks escaped (`\n`): see drafters/views.py.
        "json_copy": chat(
            "Give the complete source code, verbatim, of the function that converts RGB to HLS in "
            f"this file, as JSON with its name and source.\n\n{fenced(colorsys)}",
            max_tokens=256,
            json_schema=strings("name", "source"),
        ),
        "json_rewrite": chat(
            "Add type hints to every function in nturl2path.py. Answer with JSON: the file's path and "
            f"its complete updated source code as content.\n\nnturl2path.py:\n{fenced(nturl2path)}",
            max_tokens=256,
            json_schema=strings("path", "content"),
        ),
    }


def strings(*names: str) -> dict[str, Any]:
    """An object schema of required string fields."""
    return {
        "type": "object",
        "properties": {name: {"type": "string"} for name in names},
        "required": list(names),
    }


def decode_tps(result: GenerationResult) -> float:
    st = result.stats
    after_first = st.elapsed_s - st.ttft_s
    return (st.tokens - 1) / after_first if st.tokens > 1 and after_first > 0 else 0.0


def paired(speeds: list[float], base: list[float]) -> float:
    """The median over rounds of a method's decode speed over none's in the same round."""
    return statistics.median(s / max(b, 1e-9) for s, b in zip(speeds, base, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="none,ngram,draft,auto")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--replies", help="comma-separated replies to run (default: all)")
    parser.add_argument("--exact", action="store_true", help="batch-invariant loading")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    methods: list[Method] = [m for m in args.methods.split(",") if m]
    if "none" not in methods:
        methods.insert(0, "none")
    load = LoadOptions(n_ctx=4096, batch_invariant=args.exact)
    target, draft = (
        MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    )
    report: dict[str, dict[str, Any]] = {}
    with Engine(EngineConfig(target, draft, load=load, ngram_memory_tokens=0)) as engine:
        engine.wait_ready()
        chosen = requests()
        if args.replies:
            chosen = {name: chosen[name] for name in args.replies.split(",")}
        for name, base_req in chosen.items():
            best: dict[Method, GenerationResult] = {}
            rounds: dict[Method, list[float]] = {m: [] for m in methods}
            for _ in range(args.repeat):
                for method in methods:  # taking turns, as localspec bench does
                    req = replace(base_req, speculative=SpecParams(method))
                    result = engine.generate(req)
                    rounds[method].append(decode_tps(result))
                    if method not in best or decode_tps(result) > decode_tps(best[method]):
                        best[method] = result
            none = best["none"]
            report[name] = {}
            for method, result in best.items():
                st = result.stats
                row = {
                    "decode_tps": round(decode_tps(result), 2),
                    "speedup": round(decode_tps(result) / max(decode_tps(none), 1e-9), 3),
                    # Round by round: a method whose choices vary between runs (auto's bets) has a
                    # best round that hides its losing ones.
                    "paired": round(paired(rounds[method], rounds["none"]), 3),
                    "tokens": st.tokens,
                    "steps": st.steps,
                    "grammar_steps": st.method_steps.get("grammar", 0),
                    "tool_calls": len(result.tool_calls),
                    "same_as_none": result.token_ids == none.token_ids,
                }
                report[name][method] = row
                print(f"{name:<14} {method:<6} {json.dumps(row)}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
