"""The engine on a GPU: curves, rounding by batch size, every method's path, written as one JSON.

Run by scripts/gpu_run on the GPU machine (any machine works: with no GPU it measures the CPU).
Each stage is saved to --out as soon as it ends, so a run cut short still reports what it did.

    python3 scripts/gpu_measure.py --target T.gguf --draft D.gguf --out /tmp/gpu.json

Stages:
- system: llama.cpp's build and devices, offload support.
- curves: V(n) of the target (n = 1..16 and auto's wide verifies) and of the draft, for the
  default loading, --exact, and the default with flash attention off; prompt speed (512 tokens).
- rounding: per verify width, whether a batched verify's logits equal one-token decoding's
  bit for bit, and if not how far they and the top token's gaps to its rivals moved and how often
  the argmax flipped, for each loading.
- paths: the engine with every layer offloaded: each method's greedy output against `none`'s
  (identical, or a divergence explained by the measured rounding margin), cancel mid-request,
  and --exact's output against `none`'s.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402

from localspec.auto.calibrate import DRAFT_SIZES, SIZES, backend_id, measure, usable_sizes  # noqa: E402
from localspec.engine.config import EngineConfig, LoadOptions  # noqa: E402
from localspec.engine.llama import LlamaModel, gpu_offload_supported  # noqa: E402
from localspec.engine.lossless import RIVALS, explain, rounding_margin  # noqa: E402
from localspec.engine.prompting import prompt_tokens  # noqa: E402
from localspec.engine.templating import TemplateRenderer  # noqa: E402
from localspec.engine.worker import Engine  # noqa: E402
from localspec.types import ChatMessage, GenerationRequest, GenerationResult, SpecParams  # noqa: E402

PROMPTS = ROOT / "scripts" / "bench_prompts.json"
PROMPT_NAME = "add_docstrings"
WIDTHS = (*range(1, 17), 24, 32, 48, 64)
METHODS = ("ngram", "draft", "layerskip", "auto")
Report = dict[str, Any]


class NoFlashAttention(LlamaModel):
    """The default loading with flash attention off (llama.cpp's choice is 'auto')."""

    def _context_params(self) -> llama_cpp.llama_context_params:
        params = super()._context_params()
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        return params


LOADINGS: dict[str, tuple[type[LlamaModel], bool]] = {
    "default": (LlamaModel, False),
    "exact": (LlamaModel, True),
    "no_flash_attn": (NoFlashAttention, False),
}


def stage(report: Report, out: Path, name: str, run: Callable[[], Any]) -> None:
    """Run one stage, keep its result or its error, and save the report so far."""
    started = time.perf_counter()
    print(f"[gpu_measure] {name}", file=sys.stderr, flush=True)
    try:
        report[name] = run()
    except Exception:
        report[name] = {"error": traceback.format_exc()}
        print(report[name]["error"], file=sys.stderr, flush=True)
    report.setdefault("stage_seconds", {})[name] = round(time.perf_counter() - started, 2)
    out.write_text(json.dumps(report, indent=1))


def system() -> Report:
    return {
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "offload": gpu_offload_supported(),
        "backend": backend_id(),
    }


def load(path: Path, loading: str, n_ctx: int = 4096) -> LlamaModel:
    cls, exact = LOADINGS[loading]
    return cls(path, LoadOptions(n_ctx=n_ctx, gpu_layers=-1, batch_invariant=exact))


def sample_tokens(model: LlamaModel) -> list[int]:
    text = json.loads(PROMPTS.read_text())[PROMPT_NAME]
    return model.tokenize(text)


def prompt_speed(model: LlamaModel, n: int = 512, passes: int = 3) -> float:
    """Prompt tokens a second, reading `n` tokens in one batch (the fastest of a few passes)."""
    tokens = (sample_tokens(model) * (n // 50 + 1))[:n]
    best = float("inf")
    for _ in range(passes):
        model.reset()
        best = min(best, model.decode(tokens, 1))
    model.reset()
    return n / best


def curves(target: Path, draft: Path, loadings: Sequence[str] = tuple(LOADINGS)) -> Report:
    found: Report = {}
    for loading in loadings:
        for role, path, sizes in (("target", target, SIZES), ("draft", draft, DRAFT_SIZES)):
            model = load(path, loading)
            try:
                curve = measure(model, sizes=usable_sizes(model, sizes))
                seconds = list(curve.seconds)
                found[f"{role}/{loading}"] = {
                    "model": path.name,
                    "size_bytes": model.size_bytes,
                    "seconds": seconds,
                    "v1_ms": seconds[0] * 1e3,
                    "ratio": [round(s / seconds[0], 4) for s in seconds],
                    "prompt_tok_s": prompt_speed(model),
                }
            finally:
                model.close()
    return found


def batch_shift(model: LlamaModel, prompt: list[int], n_tokens: int, width: int) -> Report:
    """How a greedy continuation's logits change when its tokens are decoded `width` at a time
    instead of one at a time, from the same prompt (the prompt's last token decoded alone on both
    sides, so width 1 must come out bit-identical).

    The KV history of the batched side is batched too, as after verifies that accepted all.
    """
    model.reset()
    model.decode(prompt[:-1])
    single, generated, token = [], [], prompt[-1]
    for _ in range(n_tokens):
        model.decode([token])
        single.append(model.logits(-1).copy())
        token = int(single[-1].argmax())
        generated.append(token)
    model.truncate(len(prompt) - 1)
    feed = [prompt[-1], *generated[:-1]]
    identical, flips, diff, shift = True, 0, 0.0, 0.0
    for s in range(0, n_tokens, width):
        chunk = feed[s : s + width]
        model.decode(chunk, len(chunk))
        for j in range(len(chunk)):
            ref, got = single[s + j], model.logits(j)
            identical &= bool(np.array_equal(ref, got))
            diff = max(diff, float(np.abs(ref - got).max()))
            order = np.argsort(ref)[-(RIVALS + 1) :]
            best, rivals = order[-1], order[:-1]
            shift = max(shift, float(np.abs((got[best] - got[rivals]) - (ref[best] - ref[rivals])).max()))
            flips += int(got.argmax() != best)
    model.reset()
    return {"identical": identical, "max_abs_diff": diff, "max_gap_shift": round(shift, 6), "flips": flips}


def rounding(target: Path, n_tokens: int = 64) -> Report:
    found: Report = {}
    for loading in LOADINGS:
        model = load(target, loading)
        try:
            prompt = sample_tokens(model)
            found[loading] = {
                str(w): batch_shift(model, prompt, n_tokens, w) for w in WIDTHS if w <= n_tokens
            }
        finally:
            model.close()
    return found


def _request(text: str, method: str, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(
        (ChatMessage("user", text),),
        max_tokens=max_tokens,
        speculative=SpecParams(method=method),  # type: ignore[arg-type]
        cache_prompt=False,
    )


def _run_summary(result: GenerationResult) -> Report:
    st = result.stats
    decode = (st.tokens - 1) / max(st.elapsed_s - st.ttft_s, 1e-9) if st.tokens > 1 else 0.0
    return {
        "tokens": st.tokens,
        "finish": result.finish_reason,
        "decode_tok_s": round(decode, 2),
        "ttft_ms": round(st.ttft_s * 1e3, 2),
        "steps": st.steps,
        "drafted": st.drafted,
        "accepted": st.accepted,
        "method_steps": st.method_steps,
        "exact": st.exact,
        "fallback": st.fallback_reason,
        "target_s": round(st.target_s, 4),
        "draft_s": round(st.draft_s, 4),
        "python_s": round(st.python_s, 4),
        "python_per_step_ms": round(st.python_s / max(1, st.steps) * 1e3, 4),
    }


def paths(target: Path, draft: Path, max_tokens: int = 128) -> Report:
    text = json.loads(PROMPTS.read_text())[PROMPT_NAME]
    found: Report = {}
    for exact in (False, True):
        config = EngineConfig(
            target=target,
            draft=draft,
            load=LoadOptions(n_ctx=4096, gpu_layers=-1, batch_invariant=exact),
            draft_gpu_layers=-1,
            ngram_memory_tokens=0,
        )
        runs: Report = {}
        with Engine(config) as engine:
            info = engine.wait_ready()
            runs["methods_loaded"] = info.methods
            alone = engine.generate(_request(text, "none", max_tokens))
            runs["none"] = _run_summary(alone)
            outputs = {}
            for method in METHODS:
                result = engine.generate(_request(text, method, max_tokens))
                runs[method] = _run_summary(result)
                outputs[method] = result.token_ids
            handle = engine.submit(_request(text, "auto", 2000))
            got = 0
            for _chunk in handle:
                got += 1
                if got == 8:
                    handle.cancel()
            after = engine.generate(_request(text, "none", 16))
            runs["cancel"] = {
                "finish": handle.result.finish_reason if handle.result else None,
                "chunks_before_end": got,
                "next_request_tokens": after.stats.tokens,
            }
        runs["divergences"] = _divergences(target, exact, text, alone.token_ids, outputs)
        found["exact" if exact else "default"] = runs
    return found


def _divergences(
    target: Path, exact: bool, text: str, alone: tuple[int, ...], outputs: dict[str, tuple[int, ...]]
) -> Report:
    """Each method's first divergence from `none`, judged against this loading's rounding margin."""
    model = LlamaModel(target, LoadOptions(n_ctx=4096, gpu_layers=-1, batch_invariant=exact))
    try:
        with TemplateRenderer() as renderer:
            prompt = prompt_tokens(model, _request(text, "none", 1), renderer)
        margin = max(rounding_margin(model, prompt, 48, w) for w in (2, 4, 8, 16))
        judged: Report = {"margin": round(margin, 6)}
        for method, got in outputs.items():
            d = explain(model, prompt, alone, got, margin)
            judged[method] = "identical" if d is None else d.to_dict()
        return judged
    finally:
        model.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stages", default="system,curves,rounding,paths")
    parser.add_argument(
        "--loadings",
        default=",".join(LOADINGS),
        help="The curves stage's loadings (for a large target: default).",
    )
    args = parser.parse_args()
    report: Report = {"target": args.target.name, "draft": args.draft.name}
    runs: dict[str, Callable[[], Any]] = {
        "system": system,
        "curves": lambda: curves(args.target, args.draft, args.loadings.split(",")),
        "rounding": lambda: rounding(args.target),
        "paths": lambda: paths(args.target, args.draft),
    }
    for name in args.stages.split(","):
        stage(report, args.out, name, runs[name])


if __name__ == "__main__":
    main()
