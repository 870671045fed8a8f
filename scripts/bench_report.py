"""Hold `localspec bench --json` against llama_server_compare.py's JSON, prompt by prompt, with the goals.

    .venv/bin/python scripts/bench_report.py /tmp/localspec.json /tmp/llama-server.json [--json out.json]

Both files should come from the same window on the same machine, with the same prompts and max tokens
(the report warns where they do not). Per prompt it prints, each against its goal from issue #15:

    localspec none / llama-server plain, decode tok/s        >= 0.97
    localspec none / llama-server plain, time to first token <= 1.05
    localspec auto / localspec none, decode tok/s            >= 0.97
    localspec auto / best llama-server speculative mode      >= 1.00  (median over code edits >= 1.15)

then the medians per kind, and every goal missed. --strict exits 1 when any is missed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

PLAIN = "plain"
CODE_EDIT = "code_edit"
# Runs further apart than this are not "the same window": the machine may have changed under them.
WINDOW_GAP_S = 30 * 60


@dataclass(frozen=True)
class Goal:
    key: str
    label: str
    threshold: float
    at_least: bool = True

    def met(self, value: float) -> bool:
        return value >= self.threshold if self.at_least else value <= self.threshold

    def describe(self) -> str:
        return f"{self.label} {'>=' if self.at_least else '<='} {self.threshold:.2f}"


GOALS = (
    Goal("none_vs_plain", "localspec none / llama-server plain, decode tok/s", 0.97),
    Goal("ttft_vs_plain", "localspec none / llama-server plain, TTFT", 1.05, at_least=False),
    Goal("auto_vs_none", "localspec auto / localspec none, decode tok/s", 0.97),
    Goal("auto_vs_best_spec", "localspec auto / best llama-server speculative mode, decode tok/s", 1.0),
)
# Goals on a kind's median rather than on each prompt.
KIND_GOALS = {CODE_EDIT: Goal("auto_vs_best_spec", "median over code edits of auto / best speculative", 1.15)}


@dataclass
class PromptComparison:
    name: str
    kind: str
    ratios: dict[str, float | None]
    best_spec: str | None
    # localspec none's text against llama-server plain's: the same prompt, the same greedy output?
    same_text_as_plain: bool | None
    missed: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    prompts: list[PromptComparison]
    kinds: dict[str, dict[str, float]]
    missed: list[str]
    warnings: list[str]


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def compare_prompt(
    name: str, kind: str, ours: Mapping[str, Any], theirs: Mapping[str, Any]
) -> PromptComparison:
    """The four ratios for one prompt (None where a side lacks the run) and the goals they miss."""
    none, auto, plain = ours.get("none"), ours.get("auto"), theirs.get(PLAIN)
    spec = {mode: row for mode, row in theirs.items() if mode != PLAIN}
    best = max(spec, key=lambda m: spec[m]["decode_tps"]) if spec else None

    def decode(row: Mapping[str, Any] | None) -> float | None:
        return float(row["decode_tps"]) if row else None

    ratios = {
        "none_vs_plain": ratio(decode(none), decode(plain)),
        "ttft_vs_plain": ratio(none["ttft_s"] if none else None, plain["ttft_s"] if plain else None),
        "auto_vs_none": ratio(decode(auto), decode(none)),
        "auto_vs_best_spec": ratio(decode(auto), decode(spec[best]) if best else None),
    }
    same = none["text"] == plain["text"] if none and plain and "text" in none else None
    result = PromptComparison(name, kind, ratios, best, same)
    for goal in GOALS:
        value = ratios[goal.key]
        if value is not None and not goal.met(value):
            result.missed.append(f"{name}: {goal.describe()}: {value:.3f}")
    return result


def compare(ours: Mapping[str, Any], theirs: Mapping[str, Any]) -> Comparison:
    """Every prompt both files hold, the medians per kind (and `all`), and the goals missed."""
    names = [n for n in ours["prompts"] if n in theirs["prompts"]]
    warnings = _warnings(ours, theirs, names)
    prompts = []
    for n in names:
        entry = ours["prompts"][n]
        prompts.append(compare_prompt(n, entry["kind"], entry["methods"], theirs["prompts"][n]["modes"]))
    kinds = kind_medians(prompts)
    missed = [m for p in prompts for m in p.missed]
    for kind, goal in KIND_GOALS.items():
        value = kinds.get(kind, {}).get(goal.key)
        if value is not None and not goal.met(value):
            missed.append(f"{kind}: {goal.describe()}: {value:.3f}")
    return Comparison(prompts, kinds, missed, warnings)


def kind_medians(prompts: list[PromptComparison]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[PromptComparison]] = {}
    for p in prompts:
        groups.setdefault(p.kind, []).append(p)
    groups["all"] = list(prompts)
    medians: dict[str, dict[str, float]] = {}
    for kind, group in groups.items():
        medians[kind] = {}
        for goal in GOALS:
            values = [v for p in group if (v := p.ratios[goal.key]) is not None]
            if values:
                medians[kind][goal.key] = round(statistics.median(values), 3)
    return medians


def _warnings(ours: Mapping[str, Any], theirs: Mapping[str, Any], names: list[str]) -> list[str]:
    warnings = []
    for label, data, other in (("localspec", ours, theirs), ("llama-server", theirs, ours)):
        alone = [n for n in data["prompts"] if n not in other["prompts"]]
        if alone:
            warnings.append(f"only in {label}'s file, left out: {', '.join(alone)}")
    a, b = ours.get("settings", {}), theirs.get("settings", {})
    for key in ("max_tokens", "n_ctx", "threads"):
        if key in a and key in b and a[key] != b[key]:
            warnings.append(f"{key} differs: localspec {a[key]}, llama-server {b[key]}")
    gap = _gap_s(a, b)
    if gap is not None and gap > WINDOW_GAP_S:
        warnings.append(f"the runs are {gap / 60:.0f} minutes apart: not the same window")
    if not names:
        warnings.append("no prompt is in both files")
    return warnings


def _gap_s(a: Mapping[str, Any], b: Mapping[str, Any]) -> float | None:
    """Seconds between the end of the earlier run and the start of the later (0 if they overlap)."""
    try:
        spans = [(_time(s["started"]), _time(s["finished"])) for s in (a, b)]
    except (KeyError, ValueError):
        return None
    first, second = sorted(spans)
    return max(0.0, (second[0] - first[1]).total_seconds())


def _time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S%z")


def format_report(comparison: Comparison) -> list[str]:
    """The report as printed: a row per prompt, a row per kind, the goals, warnings and misses."""
    cols = " ".join(f"{g.key:>17}" for g in GOALS)
    lines = [f"{'prompt':<28} {'kind':<10} {cols}  {'best spec':<13} same"]
    for p in comparison.prompts:
        cells = " ".join(_cell(p.ratios[g.key], g) for g in GOALS)
        same = "-" if p.same_text_as_plain is None else ("yes" if p.same_text_as_plain else "no")
        lines.append(f"{p.name[:28]:<28} {p.kind[:10]:<10} {cells}  {p.best_spec or '-':<13} {same}")
    lines += ["", f"{'median per kind':<39} {cols}"]
    for kind, medians in comparison.kinds.items():
        kind_goal = KIND_GOALS.get(kind)
        cells = " ".join(
            _cell(medians.get(g.key), kind_goal if kind_goal and kind_goal.key == g.key else None)
            for g in GOALS
        )
        lines.append(f"{kind[:39]:<39} {cells}")
    lines += ["same: localspec none's text equals llama-server plain's (expected with the same loading)"]
    lines += ["", "goals:"] + [f"  {g.describe()}" for g in GOALS]
    lines += [f"  {k}: {g.describe()}" for k, g in KIND_GOALS.items()]
    lines += [f"warning: {w}" for w in comparison.warnings]
    if comparison.missed:
        lines += ["", f"{len(comparison.missed)} goal(s) missed:"]
        lines += [f"  MISSED {m}" for m in comparison.missed]
    else:
        lines += ["", "every goal met"]
    return lines


def _cell(value: float | None, goal: Goal | None) -> str:
    if value is None:
        return f"{'-':>17}"
    mark = " !" if goal is not None and not goal.met(value) else "  "
    return f"{value:>14.3f}x{mark}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("localspec_json", type=Path, help="localspec bench --json output")
    parser.add_argument("server_json", type=Path, help="llama_server_compare.py --json output")
    parser.add_argument("--json", type=Path, help="Also write the comparison here.")
    parser.add_argument("--strict", action="store_true", help="Exit 1 when any goal is missed.")
    args = parser.parse_args()
    try:
        ours = json.loads(args.localspec_json.read_text(encoding="utf-8"))
        theirs = json.loads(args.server_json.read_text(encoding="utf-8"))
        comparison = compare(ours, theirs)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sys.exit(f"cannot compare {args.localspec_json} with {args.server_json}: {exc!r}")
    print("\n".join(format_report(comparison)))
    if args.json:
        args.json.write_text(json.dumps(asdict(comparison), indent=1), encoding="utf-8")
    if args.strict and comparison.missed:
        sys.exit(1)


if __name__ == "__main__":
    main()
