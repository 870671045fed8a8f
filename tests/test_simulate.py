"""scripts/simulate.py predict, end to end on synthetic traces (no model): the report it writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from replaytraces import CPU, copy_trace, fresh_trace
from scriptmodules import load_script


@pytest.fixture(scope="module")
def simulate() -> ModuleType:
    return load_script("simulate")


def recording(tmp_path: Path) -> Path:
    """A recording as `simulate.py record` writes it: curves, traces, and the measured runs."""
    plain = {"decode_tps": 1 / CPU(1), "python_s": 0.01, "steps": 100}
    data: dict[str, Any] = {
        "verify": list(CPU.seconds),
        "draft": [s * 0.4 for s in CPU.seconds],
        "max_verify_batch": 7,
        "position_overhead": 2e-5,
        "draft_token_overhead": 1.5e-4,
        "traces": [copy_trace(80).to_dict(), fresh_trace(80, draft_hits=0.8).to_dict()],
        "measured": {"copy": {"none": plain, "auto": plain}, "fresh": {"none": plain, "auto": plain}},
    }
    path = tmp_path / "traces.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def predict(simulate: ModuleType, *argv: str, monkeypatch: pytest.MonkeyPatch, out: Path) -> Any:
    monkeypatch.setattr(sys, "argv", ["simulate.py", "predict", *argv, "--json", str(out)])
    simulate.main()
    return json.loads(out.read_text(encoding="utf-8"))


def test_the_report_puts_a_ceiling_above_auto_and_every_fixed_choice(
    simulate: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = predict(simulate, str(recording(tmp_path)), monkeypatch=monkeypatch, out=tmp_path / "r.json")
    assert set(report) == {"copy", "fresh"}
    for row in report.values():
        assert row["ceiling_speedup"] >= max(row["auto_speedup"], row["best_fixed_speedup"]) - 1e-3
    assert report["copy"]["ceiling_speedup"] > 1.3  # a copy is worth speculating on even on this CPU
    assert set(report["copy"]["check"]) == {"auto"}  # measured runs are compared, the ceiling is not


def test_other_curves_replace_the_recorded_ones_and_fast_ones_lift_the_cap(
    simulate: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    traces = str(recording(tmp_path))
    exact = predict(simulate, traces, monkeypatch=monkeypatch, out=tmp_path / "exact.json")
    # `localspec calibrate --fast --json`: a flat verify curve, no exact batch cap.
    flat = [CPU(1) * (1 + 0.02 * n) for n in range(16)]
    fast = {"exact": False, "target": {"seconds": flat}, "draft": {"seconds": [s * 0.3 for s in flat]}}
    (tmp_path / "fast.json").write_text(json.dumps(fast), encoding="utf-8")
    args = (traces, "--calibration", str(tmp_path / "fast.json"))
    faster = predict(simulate, *args, monkeypatch=monkeypatch, out=tmp_path / "fast_report.json")
    assert faster["copy"]["ceiling_speedup"] > exact["copy"]["ceiling_speedup"]
    assert "check" not in faster["copy"]  # the measured runs were of the exact loading
    # Past the exact cap of 7 positions: only a fast machine drafts 8 tokens in a step.
    assert faster["copy"]["auto_mean_drafted"] > 6 >= exact["copy"]["auto_mean_drafted"]
