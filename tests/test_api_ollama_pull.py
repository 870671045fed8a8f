"""/api/pull downloading for real, from a local server that answers like the Hugging Face Hub."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest
from daemonproc import Daemon, start_daemon
from faults import full_folder, limit_fsize
from test_hub import REPO, FakeHub, serving

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def fake_hub(tiny_target: Path) -> Iterator[FakeHub]:
    state = FakeHub()
    state.repos[REPO] = {"tiny-Q8_0.gguf": b"GGUF-not-this-one", "tiny-Q4_K_M.gguf": tiny_target.read_bytes()}
    with serving(state):
        yield state


@pytest.fixture(scope="module")
def pulled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The daemon's models folder, where pulls land (never the checkout's models/)."""
    return tmp_path_factory.mktemp("pulled")


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, fake_hub: FakeHub, pulled: Path
) -> Iterator[Daemon]:
    env = {
        "HF_ENDPOINT": fake_hub.url,
        "HF_HOME": str(tmp_path_factory.mktemp("hf")),
        "LOCALSPEC_MODELS": str(pulled),
    }
    d = start_daemon(tmp_path_factory.mktemp("pull-home"), tiny_target, env=env, ctx=512)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[ollama.Client]:
    with daemon.ollama() as c:
        yield c


def test_pull_streams_progress_and_writes_the_file(
    client: ollama.Client, pulled: Path, tiny_target: Path
) -> None:
    events = list(client.pull(f"hf.co/{REPO}:Q8_0", stream=True))
    statuses = [e.status for e in events]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    progress = [e for e in events if e.status == "pulling tiny-Q8_0.gguf"]
    assert progress and progress[-1].completed == progress[-1].total == len(b"GGUF-not-this-one")
    assert (pulled / "tiny-Q8_0.gguf").read_bytes() == b"GGUF-not-this-one"
    # No tag: localspec pull's own choice, Q4_K_M.
    assert client.pull(REPO).status == "success"
    assert (pulled / "tiny-Q4_K_M.gguf").read_bytes() == tiny_target.read_bytes()


def test_pull_of_a_missing_quant_says_what_there_is(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        client.pull(f"hf.co/{REPO}:Q2_K")
    assert info.value.status_code == 502
    assert "no Q2_K .gguf" in info.value.error and "tiny-Q4_K_M.gguf" in info.value.error


@pytest.mark.parametrize("how", ["tmpfs", "rlimit"])
def test_pull_onto_a_full_models_folder_is_507_and_the_daemon_serves_on(
    tmp_path: Path, tiny_target: Path, fake_hub: FakeHub, how: str
) -> None:
    fake_hub.repos["acme/Big-GGUF"] = {"big-Q4_K_M.gguf": b"GGUF" + bytes(1 << 20)}  # past FSIZE_BYTES
    with full_folder(tmp_path, how) as models:
        env = {
            "HF_ENDPOINT": fake_hub.url,
            "HF_HOME": str(tmp_path / "hf"),
            "LOCALSPEC_MODELS": str(models.path),
        }
        preexec = limit_fsize if models.how == "rlimit" else None
        daemon = start_daemon(tmp_path / "home", tiny_target, env=env, ctx=512, preexec=preexec)
        try:
            with daemon.ollama() as client:
                with pytest.raises(ollama.ResponseError) as refused:
                    client.pull("hf.co/acme/Big-GGUF:Q4_K_M")
                assert refused.value.status_code == 507  # Insufficient Storage, not a bad gateway
                assert refused.value.error.startswith(
                    f"cannot download acme/Big-GGUF:big-Q4_K_M.gguf: cannot write to {models.path}: "
                ), refused.value.error
                assert "free some space" in refused.value.error
                assert [m.model for m in client.ps().models]  # still serving its model
        finally:
            assert daemon.stop() == 0, daemon.log()
