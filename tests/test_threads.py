"""Thread counts: the default stays within the CPUs this process may use; more is warned of."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from localspec.engine.config import LoadOptions, default_threads, threads_warning, usable_cpus
from localspec.process import cgroup


def _self(tmp_path: Path) -> Path:
    """/proc/self/cgroup as a container with a cgroup namespace shows it: its own cgroup the root."""
    path = tmp_path / "self-cgroup"
    path.write_text("0::/\n")
    return path


def test_the_default_threads_stay_within_a_container_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "cgroup"
    root.mkdir()
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", root)
    monkeypatch.setattr(cgroup, "SELF_CGROUP", _self(tmp_path))
    unlimited = usable_cpus()  # no file: the affinity mask alone
    (root / "cpu.max").write_text("100000 100000\n")
    assert usable_cpus() == default_threads() == 1
    assert threads_warning(1) is None
    warning = threads_warning(unlimited + 1)
    assert warning is not None and "on 1 usable CPU:" in warning and "--threads 1" in warning
    (root / "cpu.max").write_text("max 100000\n")
    assert usable_cpus() == unlimited and default_threads() <= unlimited


def test_a_load_with_more_threads_than_cpus_warns_once(
    tiny_target: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from localspec.engine.llama import LlamaModel, _warn_threads

    _warn_threads.cache_clear()  # an earlier test of this process may have loaded with this count
    threads = usable_cpus() + 1
    with caplog.at_level(logging.WARNING, logger="localspec.engine"):
        for _ in range(2):
            LlamaModel(tiny_target, LoadOptions(n_ctx=256, n_threads=threads)).close()
    said = [r.getMessage() for r in caplog.records if "usable CPU" in r.getMessage()]
    assert said == [threads_warning(threads)]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="localspec.engine"):
        LlamaModel(tiny_target, LoadOptions(n_ctx=256, n_threads=usable_cpus())).close()
    assert not [r for r in caplog.records if "usable CPU" in r.getMessage()]
