"""The bench set's greedy replies, replayed: what auto (or a change to it) makes of every prompt, in seconds.

    # 1. record the target's greedy replies once (the engine's default loading, plain prefill copy
    #    attached), with the curves measured after a short and a long prefix
    .venv/bin/python scripts/replay_bench.py record --out traces.json
    # 2. replay auto on them against plain decoding and the hindsight ceiling, per prompt
    .venv/bin/python scripts/replay_bench.py replay traces.json
    # ... a machine that charges each step for its context (attention over it), as the engine pays
    .venv/bin/python scripts/replay_bench.py replay traces.json --context-costs
    # ... and on 8 machines whose curves are each a few percent off: each prompt's mean, min and max
    .venv/bin/python scripts/replay_bench.py replay traces.json --context-costs --jitter 8
    # the agent set (files shown numbered), with and without the prompt's unnumbered form
    .venv/bin/python scripts/replay_bench.py record --prompts scripts/agent_set.json --out agent.json
    .venv/bin/python scripts/replay_bench.py replay agent.json --context-costs --jitter 8 [--no-views]
    # (the copy cursor reads the tokens' text, as in the engine, from the recorded target's file,
    #  or --tokenizer FILE for a recording made before it was kept)

A head-to-head run (`head_to_head.py`) takes half an hour and moves ±3% per prompt from one round
to the next; a replay takes a second and is exact under its cost model, so a policy change can be
judged on all 31 prompts before it is measured. The cost model is `localspec.auto.replay`'s: the
calibrated curve V(n) (measured here as the engine measures it, after 16 tokens of context), plus,
with --context-costs, what each token of context adds to a batch of n, from the same widths
measured again after --long-prefix tokens. Greedy decoding is lossless, so one recorded reply
fixes every step's outcome; a draft may run past a reply that ended before --max-tokens, as in
the engine. One replay is one path, though: a curve 3% off moves some prompts by 20% (--jitter).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localspec.auto.calibrate import SIZES, measure, usable_sizes
from localspec.auto.costmodel import NGRAM_K_MAX, VERIFY_MAX, Curve
from localspec.auto.oracle import ceiling
from localspec.auto.policy import AutoPolicy, OnlineCosts
from localspec.auto.replay import Machine, SimClock, Trace, replay
from localspec.engine.benchset import load_bench_set
from localspec.engine.config import LoadOptions
from localspec.engine.drafters.cursor import TokenText
from localspec.engine.drafters.ngram import NgramDrafter
from localspec.engine.drafters.views import PromptView
from localspec.engine.llama import LlamaModel
from localspec.engine.prefill import attach_plain_prefill
from localspec.engine.prompting import prompt_forms, prompt_tokens
from localspec.engine.speculative import FixedPolicy, Generation
from localspec.paths import Paths
from localspec.types import GenerationRequest, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
SHORT_PREFIX = 16
# A step's Python overhead in the engine (OnlineCosts learns it there; measured ~0.3 ms on 2 cores).
STEP_OVERHEAD_S = 0.3e-3
# How far off a calibration's timed point may be, one run to the next (a standard deviation): what
# --jitter perturbs each point by.
JITTER_SD = 0.03


def record(args: argparse.Namespace) -> None:
    model = LlamaModel(args.target, LoadOptions(n_ctx=args.ctx))
    attach_plain_prefill(model, Paths.from_env().cache_dir)
    prompts = load_bench_set(args.prompts)
    sizes = usable_sizes(model, SIZES)
    short = measure(model, sizes=sizes, prefix=SHORT_PREFIX)
    long = measure(model, sizes=sizes, prefix=args.long_prefix)
    traces: list[dict[str, Any]] = []
    for i, p in enumerate(prompts, 1):
        request = GenerationRequest(messages=tuple(p.messages))
        prompt = prompt_tokens(model, request)
        model.reset()
        gen = Generation(
            model, prompt, max_tokens=args.max_tokens, params=SamplingParams(), stop=(),
            policy=FixedPolicy(None, 0), method="none", k=0,
        )  # fmt: skip
        for _ in gen.run():
            pass
        assert gen.result is not None
        output = list(gen.result.token_ids)
        # The prompt's other forms, as the engine gives them to the n-gram drafter (chat replies here).
        forms = prompt_forms(model, request, prompt, json_reply=False)
        views = [{"tokens": list(v.tokens), "escaped": v.escaped} for v in forms.views]
        traces.append(
            {"name": p.name, "kind": p.kind, "prompt": list(prompt), "output": output, "views": views,
             "skipped": sorted(forms.skipped)}
        )  # fmt: skip
        print(
            f"[{i}/{len(prompts)}] {p.name}: {len(prompt)} prompt tokens, {len(output)} generated",
            file=sys.stderr,
        )
    model.close()
    curves = {"sizes": list(sizes), "short": list(short.seconds), "long": list(long.seconds)}
    data = {
        "target": str(args.target.resolve()),
        "max_tokens": args.max_tokens,
        "long_prefix": args.long_prefix,
        "curves": curves,
        "traces": traces,
    }
    args.out.write_text(json.dumps(data), encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)


def machine(data: dict[str, Any], context_costs: bool) -> Machine:
    curves = data["curves"]
    short = Curve(tuple(curves["short"]))
    if not context_costs:
        return Machine(short, None, step_overhead=STEP_OVERHEAD_S)
    long, span = Curve(tuple(curves["long"])), data["long_prefix"] - SHORT_PREFIX
    # Per token of context, from the measured widths only (an interpolated width is not measured).
    # Never below zero (a width timed faster after the long prefix is noise), nor at it (a Curve
    # holds positive seconds).
    points = {n: max(long(n) - short(n), 1e-9 * span) / span for n in curves["sizes"]}
    per_context = Curve.from_points(points, VERIFY_MAX)
    return Machine(
        short, None, step_overhead=STEP_OVERHEAD_S, per_context=per_context, measured_at=SHORT_PREFIX
    )


def jittered(data: dict[str, Any], seed: int, sd: float = JITTER_SD) -> dict[str, Any]:
    """The recording with every timed point of both curves off by its own few percent (seed 0: as recorded).

    A replay is one path: each step's choice moves the estimates the next step chooses by, so a
    curve a few percent off, as the next calibration may measure it, sends a prompt down another
    path (bisect's rename at 128 tokens: 1.27-1.56x under 3%). Replayed on several such machines a
    change is judged on where a prompt lands on average, not on one path's luck.
    """
    if seed == 0:
        return data
    rng = random.Random(seed)
    curves = dict(data["curves"])
    for name in ("short", "long"):
        curves[name] = [v * max(0.5, 1.0 + rng.gauss(0.0, sd)) for v in curves[name]]
    return {**data, "curves": curves}


def token_text(data: dict[str, Any], tokenizer: Path | None) -> tuple[TokenText | None, frozenset[int]]:
    """The tokens' text and the end-of-generation tokens from the target's file, as the engine
    hands them to the n-gram drafter (None and none without the file)."""
    path = tokenizer or (Path(data["target"]) if "target" in data else None)
    if path is None or not path.is_file():
        print("replaying without the tokens' text (no target file): pass --tokenizer", file=sys.stderr)
        return None, frozenset()
    model = LlamaModel(path, LoadOptions(n_ctx=256))
    return model.piece_text, frozenset(model.eog_tokens())


def recorded_forms(trace: dict[str, Any], views: bool) -> tuple[list[PromptView], list[int]]:
    """The prompt's other forms and the positions a copy skips, as recorded (none where `views` is
    off, or the recording predates them)."""
    if not views:
        return [], []
    return [PromptView(v["tokens"], v["escaped"]) for v in trace.get("views", [])], trace.get("skipped", [])


def ceiling_lookups(
    trace: dict[str, Any], views: bool, text: TokenText | None, ends: frozenset[int]
) -> Callable[[], tuple[NgramDrafter, NgramDrafter]]:
    """The ceiling's n-gram drafters (the fixed method's and auto's), looking up what auto's does."""
    forms, skipped = recorded_forms(trace, views)

    def make() -> tuple[NgramDrafter, NgramDrafter]:
        return (
            NgramDrafter(text=text, ends=ends, views=forms, skipped=skipped),
            NgramDrafter.for_auto(text=text, ends=ends, views=forms, skipped=skipped),
        )

    return make


def replay_ratios(
    data: dict[str, Any],
    context_costs: bool,
    text: TokenText | None = None,
    ends: frozenset[int] = frozenset(),
    views: bool = True,
) -> dict[str, float]:
    """auto / none per prompt on the recording's machine, its requests sharing one OnlineCosts.
    `views`: the n-gram drafter looks up the prompt's other forms the recording holds, as the engine's
    does."""
    m = machine(data, context_costs)
    costs = OnlineCosts(m.verify)  # shared by every request, as in the engine
    ratios: dict[str, float] = {}
    for t in data["traces"]:
        trace = Trace(t["name"], tuple(t["prompt"]), tuple(t["output"]))
        plain = replay(trace, FixedPolicy(None, 0), m, charge_policy=False).tokens_per_second
        clock = SimClock()
        forms, skipped = recorded_forms(t, views)
        ngram = NgramDrafter.for_auto(text=text, ends=ends, views=forms, skipped=skipped)
        policy = AutoPolicy(costs, ngram, None, near_tie_prior=0.0, clock=clock)
        auto = replay(trace, policy, m, clock, charge_policy=False, max_tokens=data["max_tokens"])
        ratios[t["name"]] = auto.tokens_per_second / plain
    return ratios


def replay_all(args: argparse.Namespace) -> None:
    data = json.loads(args.traces.read_text(encoding="utf-8"))
    text, ends = token_text(data, args.tokenizer)
    runs = [
        replay_ratios(jittered(data, seed), args.context_costs, text, ends, not args.no_views)
        for seed in range(args.jitter)
    ]
    m = machine(data, args.context_costs)
    by_kind: dict[str, list[float]] = defaultdict(list)
    spread = args.jitter > 1
    print(
        f"{'prompt':28} {'prompt tok':>10} {'reply tok':>9} {'auto/none':>9}"
        + (f" {'min':>6} {'max':>6}" if spread else "")
        + f" {'ceiling/none':>12}"
    )
    for t in data["traces"]:
        trace = Trace(t["name"], tuple(t["prompt"]), tuple(t["output"]))
        plain = replay(trace, FixedPolicy(None, 0), m, charge_policy=False).tokens_per_second
        lookups = ceiling_lookups(t, not args.no_views, text, ends)
        best = ceiling(trace, m, k_max=NGRAM_K_MAX, ngrams=lookups).result.tokens_per_second
        ratios = [run[t["name"]] for run in runs]
        ratio = statistics.mean(ratios)
        by_kind[t["kind"]].append(ratio)
        low_high = f" {min(ratios):5.2f}x {max(ratios):5.2f}x" if spread else ""
        print(
            f"{t['name']:28} {len(trace.prompt):10} {len(trace.output):9} {ratio:8.2f}x{low_high}"
            f" {best / plain:11.2f}x"
        )
    every = [r for ratios in by_kind.values() for r in ratios]
    print()
    if spread:
        print(f"auto / none: the mean over {args.jitter} machines (the recorded curves, then each point "
              f"off by N(0, {JITTER_SD:.0%})); min and max over them")  # fmt: skip
    for kind, ratios in by_kind.items():
        # The geometric mean beside the median: a kind's median hides its one bad prompt.
        median = statistics.median(ratios)
        print(f"{kind:12} auto / none median {median:.2f}x, geometric mean {_geomean(ratios):.3f}x")
    geo = _geomean([r for run in runs for r in run.values()])
    under = sum(r < 0.97 for r in every)
    print(f"all          geometric mean {geo:.3f}x; under 0.97x on {under} of {len(every)}")


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.mean(math.log(v) for v in values))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record the greedy replies and the curves")
    rec.add_argument(
        "--target", type=Path, default=ROOT / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    )
    rec.add_argument("--prompts", type=Path, default=ROOT / "scripts" / "bench_set.json")
    rec.add_argument("--max-tokens", type=int, default=128)
    rec.add_argument("--ctx", type=int, default=4096)
    rec.add_argument("--long-prefix", type=int, default=1200, help="context of the second curve")
    rec.add_argument("--out", type=Path, default=Path("traces.json"))
    rep = sub.add_parser("replay", help="replay auto on recorded replies")
    rep.add_argument("traces", type=Path)
    rep.add_argument("--context-costs", action="store_true", help="charge each step for its context")
    rep.add_argument(
        "--tokenizer", type=Path, help="the target's file, for the tokens' text (default: the recorded one)"
    )
    rep.add_argument(
        "--jitter", type=_positive, default=1, metavar="N",
        help=f"replay on N machines: the recorded one, then N - 1 with each timed point off by "
        f"N(0, {JITTER_SD * 100:.0f}%%)",
    )  # fmt: skip
    rep.add_argument(
        "--no-views", action="store_true", help="look up the context alone (not the prompt's other forms)"
    )
    args = ap.parse_args()
    if args.command == "record":
        record(args)
    else:
        replay_all(args)


if __name__ == "__main__":
    main()
