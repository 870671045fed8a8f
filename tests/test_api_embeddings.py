"""Embeddings from a daemon started with --embed-model, through the real `openai` and `ollama` packages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from daemonproc import Daemon, start_daemon

from localspec.engine.embedding import EmbeddingModel

pytestmark = pytest.mark.timeout(120)

TEXTS = ["the cat is on the mat", "a dog", "the cat is on the mat"]


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, tiny_related_draft: Path
) -> Iterator[Daemon]:
    # A tiny llama-architecture GGUF as the embedding model: mean-pooled, as llama-server pools one.
    home = tmp_path_factory.mktemp("embed-home")
    d = start_daemon(home, tiny_target, "--embed-model", str(tiny_related_draft), ctx=512)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture(scope="module")
def expected(tiny_related_draft: Path) -> list[list[float]]:
    model = EmbeddingModel(tiny_related_draft, n_threads=1)
    try:
        return model.embed(TEXTS)[0]
    finally:
        model.close()


def test_openai_embeddings_base64_and_float(daemon: Daemon, expected: list[list[float]]) -> None:
    with daemon.openai() as client:
        # The SDK asks for base64 (float32) unless told otherwise, and decodes it.
        packed = client.embeddings.create(model="text-embedding-3-small", input=TEXTS)
        floats = client.embeddings.create(model="GPT-4", input=TEXTS[1], encoding_format="float")
    assert [d.index for d in packed.data] == [0, 1, 2] and packed.model == "tiny-related-draft"
    got = np.array([d.embedding for d in packed.data])
    assert np.allclose(got, np.array(expected), atol=1e-6)
    assert floats.data[0].embedding == expected[1]
    assert packed.usage.prompt_tokens > floats.usage.prompt_tokens > 0
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0)
    assert got[0] @ got[2] == pytest.approx(1.0) and got[0] @ got[1] < 0.999


def test_ollama_embed_and_embeddings(daemon: Daemon, expected: list[list[float]]) -> None:
    with daemon.ollama() as c:
        out = c.embed(model="nomic-embed-text", input=TEXTS)
        old = c.embeddings(model="nomic-embed-text", prompt=TEXTS[1])
    assert [list(v) for v in out.embeddings] == expected
    assert list(old.embedding) == expected[1]
    assert out.prompt_eval_count is not None and out.prompt_eval_count > 0


def test_embedding_errors_are_clear(daemon: Daemon) -> None:
    with daemon.http() as http:
        empty = http.post("/v1/embeddings", json={"model": "m", "input": [""]})
        none = http.post("/api/embed", json={"model": "m", "input": []})
        dims = http.post("/v1/embeddings", json={"model": "m", "input": "x", "dimensions": 3})
        long = http.post("/v1/embeddings", json={"model": "m", "input": "the cat " * 2000})
    assert empty.status_code == 400 and "empty" in empty.json()["error"]["message"]
    assert none.status_code == 400 and "between 1 and" in none.json()["error"]
    assert dims.status_code == 400 and "dimensions" in dims.json()["error"]["message"]
    assert long.status_code == 400 and "at most 2048" in long.json()["error"]["message"]
