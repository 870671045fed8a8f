"""pick-draft's choice is saved per target and machine, and used again only while nothing it rests on changed.

serve_config (what serve and each on-demand model load with) runs pick-draft's fast path
on real GGUF headers written by tinymodels; the machine's memory is the one fake.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from dataclasses import replace
from pathlib import Path

import pytest
import tinymodels

from localspec.paths import Paths
from localspec.pickdraft import devices
from localspec.pickdraft.devices import GIB, DeviceMemory, nvidia
from localspec.pickdraft.saved import FILE, VERSION
from localspec.resolve import serve_config
from localspec.settings import load_settings

# A GPU roomy enough that the tiny draft pays for the big target (as in test_resolve).
GPU = nvidia(24 * GIB, 8 * GIB)


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch, lean_gpu: None) -> list[DeviceMemory]:
    """This machine's memory, as the test says: the last device in the list."""
    seen = [GPU]
    monkeypatch.setattr(devices, "detect_memory", lambda vram=None, ram=None: seen[-1])
    return seen


@pytest.fixture
def target(isolated: Path, tmp_path: Path) -> Path:
    path = tmp_path / "targets" / "big-target.gguf"
    path.parent.mkdir()
    return tinymodels.write_tiny_model(path, n_layers=8, n_embd=256, n_ff=1024, name="big")


@pytest.fixture
def draft(isolated: Path, tiny_target: Path) -> Path:
    return Path(shutil.copy(tiny_target, isolated / "small.gguf"))


def saved_file() -> Path:
    return Paths.from_env().cache_dir / FILE


def pick(target: Path) -> str:
    _, line = serve_config(load_settings(target=target))
    assert line is not None
    return line


def saved(line: str) -> bool:
    return "; saved for this machine)" in line


def test_the_choice_is_saved_owner_only_and_used_again(
    machine: list[DeviceMemory], target: Path, draft: Path
) -> None:
    first = pick(target)
    assert "pick-draft chose small.gguf (expected " in first and not saved(first)
    assert stat.S_IMODE(saved_file().stat().st_mode) == 0o600
    again = pick(target)
    assert "pick-draft chose small.gguf (expected " in again and "; saved for this machine)" in again
    # It is read from the file, not worked out again: an edited reason comes back as written.
    data = json.loads(saved_file().read_text())
    (entry,) = data.values()
    entry["choice"]["reason"] = "the reason on disk"
    saved_file().write_text(json.dumps(data))
    assert pick(target).endswith("): the reason on disk")


def test_a_new_draft_a_changed_target_or_another_machine_means_a_fresh_pick(
    machine: list[DeviceMemory], target: Path, draft: Path, isolated: Path, tiny_perfect_draft: Path
) -> None:
    pick(target)
    assert saved(pick(target))
    shutil.copy(tiny_perfect_draft, isolated / "another.gguf")
    assert not saved(pick(target))  # a draft it never considered
    assert saved(pick(target))
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert not saved(pick(target))  # the target file changed
    assert saved(pick(target))
    machine.append(replace(GPU, gpu_free=GPU.gpu_free // 2))
    assert saved(pick(target))  # free memory changes all the time: not a new machine
    machine.append(nvidia(48 * GIB, 8 * GIB, name="a bigger GPU"))
    fresh = pick(target)
    assert not saved(fresh)


def test_a_pick_saved_by_an_older_version_is_made_again(
    machine: list[DeviceMemory], target: Path, draft: Path
) -> None:
    pick(target)
    data = json.loads(saved_file().read_text())
    (entry,) = data.values()
    entry["key"]["version"] = VERSION - 1  # saved before the estimates it rests on changed
    saved_file().write_text(json.dumps(data))
    assert not saved(pick(target))
    assert saved(pick(target))


def test_each_target_keeps_its_own_choice(machine: list[DeviceMemory], target: Path, draft: Path) -> None:
    other = tinymodels.write_tiny_model(target.with_name("other.gguf"), n_layers=8, n_embd=256, n_ff=1024)
    pick(target)
    pick(other)
    assert saved(pick(target)) and saved(pick(other))
    assert len(json.loads(saved_file().read_text())) == 2


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"x": {"key": 1}}', ""])
def test_a_corrupt_file_is_ignored_with_a_log_line_and_replaced(
    machine: list[DeviceMemory], target: Path, draft: Path, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    saved_file().parent.mkdir(parents=True, exist_ok=True)
    saved_file().write_text(text)
    with caplog.at_level(logging.WARNING, logger="localspec.pickdraft"):
        assert "pick-draft chose small.gguf (expected " in pick(target)
    if text in ("{not json", "[1, 2]", ""):
        assert any("ignoring the saved picks" in r.getMessage() for r in caplog.records)
    assert saved(pick(target))  # rewritten whole


def test_a_saved_choice_of_the_wrong_shape_is_ignored_with_a_log_line(
    machine: list[DeviceMemory], target: Path, draft: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pick(target)
    data = json.loads(saved_file().read_text())
    (entry,) = data.values()
    entry["choice"]["k"] = "many"
    saved_file().write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="localspec.pickdraft"):
        line = pick(target)
    assert not saved(line) and "pick-draft chose small.gguf" in line
    assert any("ignoring the saved pick for" in r.getMessage() for r in caplog.records)
