"""Read-only and full state folders: one clear line naming the folder, or a daemon that serves without them.

`faults.py` makes the folders (a tmpfs where this machine allows the mount, else chmod
or a file-size limit) and each test prints which it used.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from daemonproc import daemon_env, start_daemon
from faults import full_folder, limit_fsize, read_only_folder

pytestmark = pytest.mark.timeout(240)


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", "from localspec.cli import main; main()", *args]
    env = daemon_env(home)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def _private(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    return folder


def test_serve_in_a_read_only_home_is_one_line_naming_the_folder(tmp_path: Path, tiny_target: Path) -> None:
    with read_only_folder(tmp_path) as home:
        print(f"read-only folder by {home.how}")
        done = _cli(home.path, "serve", "--target", str(tiny_target))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    # EROFS on a read-only mount says "write to"; EACCES on a 0555 folder says "use".
    assert re.match(rf"error: cannot (write to|use) {re.escape(str(home.path))}/run: ", done.stderr)


def test_calibrate_in_a_read_only_home_measures_and_warns(tmp_path: Path, tiny_target: Path) -> None:
    with read_only_folder(tmp_path) as home:
        done = _cli(home.path, "calibrate", "--target", str(tiny_target), "--json")
    assert done.returncode == 0, done.stderr
    assert re.search(rf"warning: cannot (write to|use) {re.escape(str(home.path))}/cache", done.stderr)
    assert '"seconds"' in done.stdout


def test_the_daemon_serves_from_a_read_only_home(tmp_path: Path, tiny_target: Path) -> None:
    socket_path = _private(tmp_path) / "d.sock"
    with read_only_folder(tmp_path) as home:
        env = {"LOCALSPEC_HOME": str(home.path)}
        daemon = start_daemon(
            tmp_path / "logs", tiny_target, "--method", "auto", env=env, socket_path=socket_path
        )
        try:
            with daemon.http() as http:
                # Greedy: a sampled reply may meet EOS before 8 tokens.
                body = {"model": "localspec", "prompt": "the model is", "max_tokens": 8, "temperature": 0}
                reply = http.post("/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] == 8
        finally:
            assert daemon.stop() == 0
    assert "calibration not saved" in daemon.log()  # auto still runs, on a curve measured now


@pytest.mark.parametrize("how", ["tmpfs", "rlimit"])
def test_layerskip_on_a_full_disk_falls_back_with_the_reason(
    tmp_path: Path, tiny_target: Path, how: str
) -> None:
    socket_path = _private(tmp_path) / "d.sock"
    with full_folder(tmp_path, how) as home:
        print(f"full disk by {home.how}")
        preexec = limit_fsize if home.how == "rlimit" else None
        env = {"LOCALSPEC_HOME": str(home.path)}
        daemon = start_daemon(
            tmp_path / "logs",
            tiny_target,
            "--method",
            "none",
            env=env,
            socket_path=socket_path,
            preexec=preexec,
        )
        try:
            body = {
                "model": "localspec",
                "prompt": "the model is",
                "max_tokens": 8,
                "speculative": {"method": "layerskip"},
            }
            with daemon.http() as http:
                replies = [http.post("/v1/completions", json=body) for _ in range(2)]
        finally:
            assert daemon.stop() == 0
    for reply in replies:
        assert reply.status_code == 200, reply.text
        stats = reply.json()["localspec"]
        assert stats["method"] == "none"
        reason = stats["fallback_reason"]
        assert reason.startswith(f"layerskip unavailable: cannot write to {home.path}/")
        # ENOSPC on a full tmpfs; EFBIG or a short write under the file-size limit.
        assert any(why in reason for why in ("No space left", "File too large", "stopped short"))
        assert "free some space" in reason
    assert not list(home.path.rglob("*.gguf"))  # no half-written draft left behind
