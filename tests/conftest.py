"""Shared fixtures: an isolated LOCALSPEC_HOME, the tiny models, the real models.

The tiny models are written once per session (a few hundred KB each, milliseconds
to write). The real models come from the models folder, where
`scripts/fetch-models` puts them; a missing one fails the test rather than
skipping it, because CI fetches them first and a skip would hide that it did not.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import tinymodels

from localspec.models.catalog import load_catalog
from localspec.paths import Paths

if TYPE_CHECKING:
    from daemonproc import Daemon

    from localspec.engine.llama import LlamaModel
    from localspec.engine.worker import Engine

# The environment as the session found it, before any test moves LOCALSPEC_HOME:
# outside a checkout the models folder lives under the home, and the temporary home
# of a test must not hide it.
_SESSION_ENV = dict(os.environ)


@pytest.fixture(autouse=True)
def localspec_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """A fresh LOCALSPEC_HOME per test, and no LOCALSPEC_* settings leaking in from the shell."""
    for name in list(os.environ):
        if name.startswith("LOCALSPEC_") and name != "LOCALSPEC_MODELS":
            monkeypatch.delenv(name)
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    yield home


# Tiny models, written by the tests (see tinymodels.py).


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A models folder and a HOME of this test's own, so no real HF, LM Studio or Ollama folder is scanned."""
    home = tmp_path / "home"
    home.mkdir()
    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("LOCALSPEC_MODELS", str(models))
    for var in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "OLLAMA_MODELS"):
        monkeypatch.delenv(var, raising=False)
    return models


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def tiny_target(tiny_dir: Path) -> Path:
    """The tiny target model."""
    return tinymodels.write_target(tiny_dir / "tiny-target.gguf")


@pytest.fixture(scope="session")
def tiny_endless(tiny_dir: Path) -> Path:
    """The tiny target without an end: its replies last until their limit."""
    return tinymodels.write_endless_target(tiny_dir / "tiny-endless.gguf")


@pytest.fixture(scope="session")
def tiny_perfect_draft(tiny_dir: Path) -> Path:
    """The target's weights in another file: drafts are always accepted."""
    return tinymodels.write_perfect_draft(tiny_dir / "tiny-perfect-draft.gguf")


@pytest.fixture(scope="module")
def tiny(tiny_target: Path) -> Iterator[LlamaModel]:
    """The tiny target alone, loaded as test_engine's engines load it (exact): for Generations of
    a test's own and for references decoded one token at a time."""
    from test_engine import TINY

    from localspec.engine.llama import LlamaModel

    model = LlamaModel(tiny_target, TINY)
    yield model
    model.close()


@pytest.fixture(scope="module")
def perfect(tiny_target: Path, tiny_perfect_draft: Path) -> Iterator[Engine]:
    """An engine on the tiny target with its perfect draft, as test_engine loads them (exact)."""
    from test_engine import make_engine

    with make_engine(tiny_target, tiny_perfect_draft) as engine:
        yield engine


@pytest.fixture(scope="module")
def tiny_daemon(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path) -> Iterator[Daemon]:
    """`localspec serve` on the tiny target alone, a 512-token context: one per module that asks."""
    from daemonproc import start_daemon

    d = start_daemon(tmp_path_factory.mktemp("tiny-daemon-home"), tiny_target, ctx=512)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture(scope="session")
def tiny_useless_draft(tiny_dir: Path) -> Path:
    """Same vocabulary, unrelated weights: drafts are almost never accepted (~1%)."""
    return tinymodels.write_useless_draft(tiny_dir / "tiny-useless-draft.gguf")


@pytest.fixture(scope="session")
def tiny_related_draft(tiny_dir: Path) -> Path:
    """The target plus noise: about two drafts in three are accepted."""
    return tinymodels.write_related_draft(tiny_dir / "tiny-related-draft.gguf")


@pytest.fixture(scope="session")
def tiny_other_vocab(tiny_dir: Path) -> Path:
    """A model whose vocabulary differs from the target's."""
    return tinymodels.write_other_vocab(tiny_dir / "tiny-other-vocab.gguf")


# Real models from the models folder.


@pytest.fixture(scope="session")
def models_dir() -> Path:
    """The models folder as the session's environment names it (LOCALSPEC_MODELS or the checkout's)."""
    return Paths.from_env(_SESSION_ENV).models_dir


def _real_model(models_dir: Path, name: str) -> Path:
    path = models_dir / load_catalog().get(name).file
    if not path.is_file():
        pytest.fail(f"{path} is missing: run scripts/fetch-models", pytrace=False)
    return path


@pytest.fixture(scope="session")
def daemon_curves(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The curves the real-model daemons measured, shared between them (daemonproc.share_cache)."""
    return tmp_path_factory.mktemp("daemon-curves")


@pytest.fixture(scope="session")
def qwen_target(models_dir: Path) -> Path:
    """Qwen2.5-Coder 1.5B Instruct, Q4_K_M: the default target."""
    return _real_model(models_dir, "qwen2.5-coder-1.5b-instruct-q4_k_m")


@pytest.fixture(scope="session")
def qwen_draft(models_dir: Path) -> Path:
    """Qwen2.5-Coder 0.5B Instruct, Q4_K_M: the default draft for qwen_target."""
    return _real_model(models_dir, "qwen2.5-coder-0.5b-instruct-q4_k_m")


@pytest.fixture(scope="session")
def gemma(models_dir: Path) -> Path:
    """Gemma 3 270M, Q4_K_M: a vocabulary unlike Qwen's."""
    return _real_model(models_dir, "gemma-3-270m-q4_k_m")


@pytest.fixture(scope="session")
def smollm(models_dir: Path) -> Path:
    """SmolLM2 135M Instruct, Q4_1: another vocabulary unlike Qwen's."""
    return _real_model(models_dir, "smollm2-135m-instruct-q4_1")


@pytest.fixture
def lean_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """pick-draft's GPU prior without its fixed costs (GPU_STEP_OVERHEAD_BYTES, fitted on an H200 as
    3 GB of streaming a decode, and GPU_DRAFT_TOKEN_S a drafted token): tiny test models then cost in
    proportion to their bytes, so a tiny draft pays under a "big" tiny target, as a 0.5B draft does
    under a 32B one."""
    from localspec.pickdraft import cost

    monkeypatch.setattr(cost, "GPU_STEP_OVERHEAD_BYTES", 0.0)
    monkeypatch.setattr(cost, "GPU_DRAFT_TOKEN_S", 0.0)
