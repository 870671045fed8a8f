"""A cost-model simulator: predict tokens/s for any policy from V(n), the draft's cost and recorded traces.

    # 1. record: greedy traces of the bench prompts, the curves, and measured runs to check against
    .venv/bin/python scripts/simulate.py record --threads 2 --out traces.json
    # 2. predict: replay every policy on the traces with the measured curves; compare with the runs
    .venv/bin/python scripts/simulate.py predict traces.json
    # 3. the same traces on a GPU-like machine (flat verify curve), on paper
    .venv/bin/python scripts/simulate.py predict traces.json --gpu --draft-ratio 0.3
    # 4. ... or with --fast's curves (repacked weights, no verify cap)
    .venv/bin/localspec calibrate --fast --draft DRAFT.gguf --json > fast.json
    .venv/bin/python scripts/simulate.py predict traces.json --calibration fast.json

Every report has a ceiling beside auto: the fastest any per-step choice of method and
k decodes the trace with, in hindsight (localspec.oracle).

Greedy decoding is lossless, so the target's tokens do not depend on the policy; a
trace (the target's tokens; the draft's guess and confidence at each position; the
target's top-two logit gap there, for near-ties re-decided alone) fixes every step's
outcome, and the machine's curves fix its time (localspec.replay). Speeds are
decode-phase speeds, (tokens - 1) / (time after the first token), as 1 / mean
inter-token latency in the stats: prefill is the same for every policy.

The cost model's Python share is measured, not fitted: the per-step overhead from
the `none` runs, the per-position and per-draft-token costs by timing the numpy
work on a vocabulary-sized row. A shared CPU's speed drifts over minutes, so each
prompt's machine is the calibrated one scaled to that prompt's own `none` runs;
nothing is fitted to the speculative runs the predictions are checked against.

With --gpu the verify curve is V(n) = V(1) (1 + slope (n - 1)) (default slope 0.02),
a draft token costs --draft-ratio of a target token, and Python costs
--overhead-ratio of V(1) per step: assumptions, printed with the results.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import mean
from typing import Any

import numpy as np

from localspec.auto.costmodel import K_MAX, Curve
from localspec.auto.oracle import ceiling
from localspec.auto.policy import AutoPolicy, OnlineCosts
from localspec.auto.replay import Machine, Replayed, SimClock, Trace, TraceDrafter, replay
from localspec.engine.config import EXACT_VERIFY_BATCH
from localspec.engine.drafters.ngram import NgramDrafter
from localspec.engine.speculative import FixedPolicy, Policy

PROMPTS = Path(__file__).resolve().parent / "bench_prompts.json"
# `none` again at the end shows how much the machine's speed drifted while a prompt ran.
MEASURED = ("none", "ngram:2", "ngram:3", "ngram:4", "draft:2", "draft:3", "auto", "none:end")
FIXED_K = range(1, 9)


# --- record -------------------------------------------------------------------------------------------


def record(args: argparse.Namespace) -> None:
    from localspec.auto.calibrate import DRAFT_SIZES, calibrate
    from localspec.engine.bench import load_prompts
    from localspec.engine.config import LoadOptions
    from localspec.engine.llama import LlamaModel
    from localspec.paths import Paths

    options = LoadOptions(n_ctx=2048, n_threads=args.threads)
    target, draft = LlamaModel(args.target, options), LlamaModel(args.draft, options)
    cache = Paths.from_env().cache_dir
    verify = calibrate(target, cache).curve
    draft_curve = calibrate(draft, cache, sizes=DRAFT_SIZES).curve
    costs = OnlineCosts(verify, draft_curve)  # shared by the auto runs, as the engine shares it
    prompts = load_prompts(args.prompts)
    traces, runs = [], {}
    for name, text in prompts.items():
        print(f"[{name}]", file=sys.stderr, flush=True)
        runs[name] = {m: _measure(target, draft, costs, text, m, args.max_tokens) for m in MEASURED}
        output = runs[name]["none"].pop("tokens")
        for row in runs[name].values():
            row.pop("tokens", None)
        traces.append(_trace(target, draft, name, text, output).to_dict())
        _write(args.out, verify, draft_curve, target.n_vocab, traces, runs, args)
    print(f"wrote {args.out}", file=sys.stderr)


def _write(
    out: str,
    verify: Curve,
    draft_curve: Curve,
    n_vocab: int,
    traces: list[dict[str, Any]],
    runs: dict[str, Any],
    args: argparse.Namespace,
) -> None:
    """Everything so far, rewritten after each prompt: a long recording is never lost to a crash."""
    payload = {
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "verify": list(verify.seconds),
        "draft": list(draft_curve.seconds),
        "max_verify_batch": EXACT_VERIFY_BATCH,  # the engine's cap on this CPU, which replays honour
        "position_overhead": _numpy_cost(n_vocab, confidence=False),
        "draft_token_overhead": _numpy_cost(n_vocab, confidence=True),
        "traces": traces,
        "measured": runs,
    }
    Path(out).write_text(json.dumps(payload), encoding="utf-8")


def _measure(
    target: Any, draft: Any, costs: OnlineCosts, text: str, method: str, max_tokens: int
) -> dict[str, Any]:
    from localspec.engine.drafters.model import ModelDrafter
    from localspec.engine.prompting import prompt_tokens
    from localspec.engine.speculative import Generation
    from localspec.types import ChatMessage, GenerationRequest, SamplingParams

    name, _, k_text = method.partition(":")
    k = int(k_text) if k_text.isdigit() else 0
    policy: Policy
    if name == "auto":
        # As the engine builds it: "auto:N" caps k at N, as a request's k does, and no plan
        # drafts past the target's largest exact verify batch.
        k = min(k or K_MAX, K_MAX, target.max_verify_batch - 1)
        policy = AutoPolicy(costs, NgramDrafter.for_auto(), ModelDrafter(draft), k_max=k)
    elif name == "ngram":
        policy = FixedPolicy(NgramDrafter(), k)
    elif name == "draft":
        policy = FixedPolicy(ModelDrafter(draft), k)
    else:
        policy = FixedPolicy(None, 0)
    prompt = prompt_tokens(target, GenerationRequest(messages=(ChatMessage("user", text),)))
    gen = Generation(
        target,
        prompt,
        max_tokens=max_tokens,
        params=SamplingParams(),
        stop=(),
        policy=policy,
        method=name,
        k=k,
    )
    list(gen.run())
    st = gen.stats
    assert gen.result is not None
    return {
        "tokens": list(gen.result.token_ids),
        "decode_tps": 1.0 / st.mean_itl_s if st.mean_itl_s else 0.0,
        "tokens_per_second": st.tokens_per_second,
        "steps": st.steps,
        "target_s": st.target_s,
        "draft_s": st.draft_s,
        "python_s": st.python_s,
        "ttft_s": st.ttft_s,
        "method_steps": st.method_steps,
        "redecided": st.redecided,
        "mean_k": st.mean_k,
    }


def _trace(target: Any, draft: Any, name: str, text: str, output: Sequence[int]) -> Trace:
    """The draft's guess and confidence at each output position given the true prefix, and the
    target's top-two logit gap there (a near-tie costs a verify one more decode)."""
    from localspec.engine.prompting import prompt_tokens
    from localspec.types import ChatMessage, GenerationRequest

    prompt = prompt_tokens(target, GenerationRequest(messages=(ChatMessage("user", text),)))
    guesses, confidences = [], []
    for row in _forced_rows(draft, prompt, output):
        best = int(row.argmax())
        guesses.append(best)
        confidences.append(float(1.0 / np.exp(row - row[best]).sum()))
    gaps = []
    for row in _forced_rows(target, prompt, output):
        top2 = np.partition(row, -2)[-2:]
        gaps.append(float(top2[1] - top2[0]))
    return Trace(name, tuple(prompt), tuple(output), tuple(guesses), tuple(confidences), tuple(gaps))


def _forced_rows(model: Any, prompt: Sequence[int], output: Sequence[int]) -> list[Any]:
    """The model's logits at each output position, fed the true tokens (teacher forcing)."""
    model.reset()
    model.decode(list(prompt), 1)
    rows = [model.logits(-1).astype(np.float64)]
    if len(output) > 1:
        model.decode(list(output[:-1]), len(output) - 1)
        rows += [model.logits(i).astype(np.float64) for i in range(len(output) - 1)]
    model.reset()
    return rows


def _numpy_cost(n_vocab: int, *, confidence: bool) -> float:
    """Seconds of numpy per verified position (argmax, near-tie check) or per drafted token."""
    row = np.random.default_rng(0).standard_normal(n_vocab).astype(np.float32)

    def work() -> None:
        best = int(row.argmax())
        if confidence:
            float(np.exp(row - row[best]).sum())
        else:
            keep = float(row[best])
            row[best] = -np.inf
            float(row.max())
            row[best] = keep

    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        work()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


# --- predict ------------------------------------------------------------------------------------------


def machine_from(data: dict[str, Any], args: argparse.Namespace) -> Machine:
    verify, draft = Curve(tuple(data["verify"])), Curve(tuple(data["draft"]))
    cap = args.max_verify_batch or data.get("max_verify_batch")
    if args.calibration:
        # Another loading's curves (`localspec calibrate --fast --json`) on the same traces: the
        # tokens are the exact target's, which --fast matches up to rounding.
        curves = json.loads(Path(args.calibration).read_text(encoding="utf-8"))
        verify, draft = Curve(tuple(curves["target"]["seconds"])), Curve(tuple(curves["draft"]["seconds"]))
        if not args.max_verify_batch:
            cap = EXACT_VERIFY_BATCH if curves.get("exact", True) else None
    if args.gpu:
        flat = Curve(tuple(verify(1) * (1 + args.gpu_slope * (n - 1)) for n in range(1, K_MAX + 2)))
        return Machine(flat, flat.scaled(args.draft_ratio), args.overhead_ratio * verify(1), 0.0, 0.0)
    nones = [row["none"] for row in data["measured"].values()]
    step = mean(r["python_s"] / r["steps"] for r in nones)
    if args.calibration and args.step_overhead_ms is not None:
        step = args.step_overhead_ms / 1e3
    if args.draft_ratio:
        draft = Curve(tuple(s / draft(1) * verify(1) * args.draft_ratio for s in draft.seconds))
    return Machine(
        verify,
        draft,
        step,
        data["position_overhead"],
        data["draft_token_overhead"],
        cap,
    )


def scaled(m: Machine, factor: float) -> Machine:
    """The same machine, `factor` times slower in everything (another load on a shared CPU)."""
    return Machine(
        m.verify.scaled(factor),
        m.draft.scaled(factor) if m.draft is not None else None,
        m.step_overhead * factor,
        m.position_overhead * factor,
        m.draft_token_overhead * factor,
        m.max_verify_batch,
    )


def measured_none(measured: dict[str, Any]) -> float:
    """Plain decoding's measured speed, averaged over the runs before and after the others."""
    return mean(measured[label]["decode_tps"] for label in ("none", "none:end") if label in measured)


def policies(trace: Trace, m: Machine, clock: SimClock) -> dict[str, Callable[[], Policy]]:
    out: dict[str, Callable[[], Policy]] = {"none": lambda: FixedPolicy(None, 0)}
    for k in FIXED_K:
        out[f"ngram:{k}"] = lambda k=k: FixedPolicy(NgramDrafter(), k)  # type: ignore[misc]
        out[f"draft:{k}"] = lambda k=k: FixedPolicy(TraceDrafter(trace, m), k)  # type: ignore[misc]
    # As the engine builds it: planning no further than its largest verify batch.
    out["auto"] = lambda: AutoPolicy(
        OnlineCosts(m.verify, m.draft),
        NgramDrafter.for_auto(),
        TraceDrafter(trace, m),
        k_max=m.draft_limit(K_MAX),
        clock=clock,
    )
    return out


def predict(args: argparse.Namespace) -> None:
    data = json.loads(Path(args.traces).read_text(encoding="utf-8"))
    m = machine_from(data, args)
    _describe(m)
    report: dict[str, Any] = {}
    # The measured runs are of the recorded loading: other curves are predictions only.
    compare = not (args.gpu or args.calibration)
    for raw in data["traces"]:
        trace = Trace.from_dict(raw)
        measured = data["measured"].get(trace.name, {})
        here = m
        if compare:
            # The machine's speed while this prompt ran, from its plain runs only (a shared CPU
            # drifts over minutes); the speculative runs being predicted are not consulted.
            plain = replay(trace, FixedPolicy(None, 0), m, charge_policy=False).tokens_per_second
            here = scaled(m, plain / measured_none(measured))
        results: dict[str, Replayed] = {}
        for label, make in policies(trace, here, clock := SimClock()).items():
            results[label] = replay(trace, make(), here, clock)
        results["ceiling"] = ceiling(trace, here).result
        report[trace.name] = _rows(results, measured, compare=compare)
    _print_report(report, compare=compare)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1), encoding="utf-8")


def _rows(results: dict[str, Replayed], measured: dict[str, Any], *, compare: bool) -> dict[str, Any]:
    base = results["none"].tokens_per_second
    fixed = {k: v for k, v in results.items() if k not in ("none", "auto", "ceiling")}
    best_label = max(fixed, key=lambda k: fixed[k].tokens_per_second)
    best = max(base, fixed[best_label].tokens_per_second)
    auto = results["auto"]
    rows: dict[str, Any] = {
        "none_tps": round(base, 2),
        "auto_speedup": round(auto.tokens_per_second / base, 3),
        "auto_vs_best_fixed": round(auto.tokens_per_second / best, 3),
        "best_fixed": best_label if fixed[best_label].tokens_per_second > base else "none",
        "best_fixed_speedup": round(best / base, 3),
        "ceiling_speedup": round(results["ceiling"].tokens_per_second / base, 3),
        "ceiling_steps": results["ceiling"].method_steps,
        "auto_steps": auto.method_steps,
        "auto_mean_drafted": round(auto.drafted / max(1, auto.steps - auto.method_steps.get("none", 0)), 2),
    }
    if compare:
        end = measured.get("none:end", measured["none"])
        rows["none_drift"] = round(end["decode_tps"] / measured["none"]["decode_tps"], 3)
        rows["check"] = {
            label: {
                "predicted": round(results[label].tokens_per_second, 2),
                "measured": round(run["decode_tps"], 2),
                "error": round(results[label].tokens_per_second / run["decode_tps"] - 1, 3),
            }
            for label, run in measured.items()
            if label in results and label not in ("none", "ceiling") and run["decode_tps"]
        }
    return rows


def _describe(m: Machine) -> None:
    v = m.verify
    print(f"V(1) = {v(1) * 1e3:.1f} ms; V(n)/V(1) for n = 1..16: {[round(x, 2) for x in v.relative()]}")
    if m.draft is not None:
        print(f"draft token = {m.draft(1) / v(1):.2f} of a target token")
    print(
        f"python per step {m.step_overhead * 1e3:.2f} ms, per verified position "
        f"{m.position_overhead * 1e3:.3f} ms, per drafted token {m.draft_token_overhead * 1e3:.3f} ms"
    )


def _print_report(report: dict[str, Any], *, compare: bool) -> None:
    print("speedups over plain decoding; ceiling: the best any per-step choice gives, in hindsight")
    header = f"{'prompt':16} {'none t/s':>8} {'auto':>6} {'best fixed':>14} {'auto/best':>9} {'ceiling':>7}"
    print(f"{header}  auto steps")
    for name, r in report.items():
        best = f"{r['best_fixed']} {r['best_fixed_speedup']:.2f}"
        print(
            f"{name:16} {r['none_tps']:8.2f} {r['auto_speedup']:6.2f} {best:>14} "
            f"{r['auto_vs_best_fixed']:9.2f} {r['ceiling_speedup']:7.2f}  {r['auto_steps']}"
        )
    if not compare:
        return
    print("\npredicted vs measured decode tokens/s (error = predicted / measured - 1); `none` drift is")
    print("plain decoding's speed after the other runs over before (the noise floor of this check):")
    errors = []
    for name, r in report.items():
        cells = [f"drift {r['none_drift']:.2f}"]
        for label, c in r["check"].items():
            errors.append(abs(c["error"]))
            cells.append(f"{label} {c['predicted']:.1f}/{c['measured']:.1f} ({c['error']:+.0%})")
        print(f"{name:16} " + "  ".join(cells))
    if errors:
        print(
            f"mean |error| {mean(errors):.1%}, max {max(errors):.1%}, within 10%: "
            f"{sum(e <= 0.10 for e in errors)}/{len(errors)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record traces, curves and measured runs")
    models = Path(__file__).resolve().parent.parent / "models"
    rec.add_argument("--target", type=Path, default=models / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    rec.add_argument("--draft", type=Path, default=models / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    rec.add_argument("--prompts", type=Path, default=PROMPTS)
    rec.add_argument("--max-tokens", type=int, default=128)
    rec.add_argument("--threads", type=int, default=None)
    rec.add_argument("--out", default="traces.json")
    pre = sub.add_parser("predict", help="replay every policy on recorded traces")
    pre.add_argument("traces")
    pre.add_argument(
        "--gpu", action="store_true", help="a GPU-like flat verify curve instead of the measured one"
    )
    pre.add_argument("--gpu-slope", type=float, default=0.02, help="GPU: V(n)/V(1) = 1 + slope (n - 1)")
    pre.add_argument(
        "--draft-ratio", type=float, default=0.0, help="draft token / target token (0: measured)"
    )
    pre.add_argument("--overhead-ratio", type=float, default=0.05, help="GPU: Python per step / V(1)")
    pre.add_argument("--json", help="also write the report here")
    pre.add_argument(
        "--calibration",
        help="CPU: verify and draft curves from `localspec calibrate --draft D --json` instead of the "
        "recorded ones (with --fast: what the repacked loading would do on these traces)",
    )
    pre.add_argument(
        "--step-overhead-ms",
        type=float,
        help="with --calibration: the engine's Python per step measured on that machine (a GPU's, from "
        "scripts/gpu_measure.py) instead of the recorded CPU's",
    )
    pre.add_argument(
        "--max-verify-batch",
        type=int,
        help="CPU: the engine's largest verify batch (default: as recorded; traces recorded before the "
        "cap have none: pass 7, engine.config.EXACT_VERIFY_BATCH)",
    )
    args = parser.parse_args()
    if args.command == "record":
        record(args)
    else:
        if args.gpu and not args.draft_ratio:
            parser.error("--gpu needs --draft-ratio (a draft token's cost relative to a target token)")
        predict(args)


if __name__ == "__main__":
    main()
