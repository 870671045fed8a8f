"""pick-draft's choices, kept on disk per target and machine, so each daemon does not redo them.

One owner-only JSON file in the cache folder holds a choice per target. An entry is
used only while everything that went into it is unchanged: the target file, this
machine (its processor, total memory, accelerator and llama.cpp build), the draft
files discovery finds, the decode curves measured here, and the settings the pick
planned for. Anything else (a new draft, a file replaced, a curve measured since)
means a fresh pick, saved over the old one. Free memory is not part of the key: it
changes from minute to minute, and the daemon checks each load against it anyway.
A file that cannot be read is ignored with a log line and rewritten at the next pick.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from localspec.atomicfile import write_text_atomic
from localspec.models.discovery import find_candidates
from localspec.pickdraft.devices import DeviceMemory
from localspec.pickdraft.rank import Choice

log = logging.getLogger("localspec.pickdraft")

FILE = "picks.json"
# Raised when what a pick is worked out from changes in the code (2: the GPU prior refitted to
# 7B-32B targets), so a choice made on the old estimates is made again.
VERSION = 2
# Distinct targets kept: the file stays small, and a target not picked for in a long while goes.
MAX_ENTRIES = 64


def pick_key(target: Path, device: DeviceMemory, plan: dict[str, Any], cache_dir: Path) -> dict[str, Any]:
    """What a saved choice for `target` depends on; `plan` holds the pick's settings (n_ctx, kv_type…).

    Blocking: it stats the target, every draft file discovery would consider, and the curves.
    As JSON reads it back (lists, not tuples), so a saved key compares equal.
    """
    key = {
        "version": VERSION,
        "target": _identity(target),
        "machine": machine_identity(device),
        "drafts": sorted(_identity(c.path) for c in find_candidates() if c.path != target),
        "curves": _curves(cache_dir),
        "plan": plan,
    }
    loaded: dict[str, Any] = json.loads(json.dumps(key))
    return loaded


def machine_identity(device: DeviceMemory) -> dict[str, Any]:
    """What makes this machine pick differently: not its free memory, which changes all the time."""
    try:
        build = metadata.version("llama_cpp_python")
    except metadata.PackageNotFoundError:
        build = "unknown"
    return {
        "arch": platform.machine(),
        "cpus": os.cpu_count(),
        "cpu": _cpu_model(),
        "kind": device.kind,
        "device": device.name,
        "gpu_total": device.gpu_total,
        "ram_total": device.ram_total,
        "unified": device.unified,
        "llama_cpp": build,
    }


def load_choice(cache_dir: Path, key: dict[str, Any]) -> Choice | None:
    """The choice saved for exactly this key, or None."""
    entry = _read(cache_dir / FILE).get(_digest(key["target"]))
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    try:
        return _choice(entry["choice"])
    except (KeyError, TypeError, ValueError) as exc:
        log.warning("ignoring the saved pick for %s: %s", key["target"][0], exc)
        return None


def save_choice(cache_dir: Path, key: dict[str, Any], choice: Choice) -> None:
    """Keep `choice` for this key (one entry per target file); a folder that refuses it is logged."""
    path = cache_dir / FILE
    entries = _read(path)
    entries.pop(_digest(key["target"]), None)
    entries[_digest(key["target"])] = {"key": key, "choice": choice.to_dict()}
    kept = dict(list(entries.items())[-MAX_ENTRIES:])  # newest last: the oldest go first
    try:
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(kept, indent=1))
    except OSError as exc:
        # Info, not a warning: the fast pick is milliseconds to redo, and a folder that refuses it
        # refuses the calibration and the socket too, whose errors say what to do about it.
        log.info("pick-draft's choice is not saved (%s): %s", path, exc.strerror or exc)


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.warning("ignoring the saved picks in %s: %s", path, exc.strerror or exc)
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        log.warning("ignoring the saved picks in %s: not JSON (%s)", path, exc)
        return {}
    if not isinstance(data, dict):
        log.warning("ignoring the saved picks in %s: not a JSON object", path)
        return {}
    return data


def _choice(data: dict[str, Any]) -> Choice:
    draft = data["draft"]
    layers = data["draft_gpu_layers"]
    method = data["method"]
    if method not in ("draft", "ngram", "layerskip", "none"):
        raise ValueError(f"unknown method {method!r}")
    return Choice(
        method=method,
        draft=None if draft is None else Path(str(draft)),
        k=int(data["k"]),
        gpu_layers=int(data["gpu_layers"]),
        draft_gpu_layers=None if layers is None else int(layers),
        n_ctx=int(data["n_ctx"]),
        expected_speedup=float(data["expected_speedup"]),
        reason=str(data["reason"]),
    )


def _identity(path: Path) -> list[Any]:
    """[resolved path, size, mtime]; a file that cannot be read is its path alone."""
    try:
        st = path.stat()
    except OSError:
        return [str(path)]
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def _curves(cache_dir: Path) -> list[list[Any]]:
    """The decode curves measured here (calibration files): a new one may change the ranking."""
    try:
        files = sorted((cache_dir / "calibration").glob("*.json"))
    except OSError:
        return []
    return [_identity(f) for f in files]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def _digest(target: list[Any]) -> str:
    return hashlib.sha256(str(target[0]).encode()).hexdigest()[:16]
