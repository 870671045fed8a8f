"""localspec.client against a real daemon: typed results equal to the engine's own, errors as types."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from daemonproc import TOKEN, Daemon, start_daemon, wait_for_metric

from localspec.client import Client
from localspec.engine.config import EngineConfig, LoadOptions
from localspec.engine.worker import Engine
from localspec.errors import DaemonError, ModelNotFoundError, UserInputError
from localspec.types import (
    ChatMessage,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    SpecParams,
    TokenChunk,
)

pytestmark = pytest.mark.timeout(120)

HELLO = (ChatMessage("user", "hello world"),)


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_target: Path, tiny_perfect_draft: Path
) -> Iterator[Daemon]:
    home = tmp_path_factory.mktemp("client-home")
    d = start_daemon(home, tiny_target, "--draft", str(tiny_perfect_draft), tcp=True, token=TOKEN, ctx=1024)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture
def client(daemon: Daemon) -> Iterator[Client]:
    with daemon.client() as c:
        yield c


@pytest.fixture(scope="module")
def engine(tiny_target: Path) -> Iterator[Engine]:
    with Engine(EngineConfig(target=tiny_target, load=LoadOptions(n_ctx=1024, n_threads=1))) as e:
        yield e


def test_health_and_models(client: Client) -> None:
    health = client.health()
    assert health.ready
    assert health.model == "tiny-target"
    assert health.draft == "tiny-perfect-draft.gguf"
    assert "draft" in health.methods
    assert health.n_ctx == 1024
    assert client.models()[0] == "tiny-target"  # the daemon's own model first, then the models folder


def test_chat_stream_yields_chunks_then_the_result(client: Client) -> None:
    events = list(client.chat_stream(HELLO, max_tokens=20, speculative=SpecParams("draft", 3)))
    chunks = [e for e in events if isinstance(e, TokenChunk)]
    result = events[-1]
    assert isinstance(result, GenerationResult)
    assert all(isinstance(e, TokenChunk) for e in events[:-1])
    assert result.text == "".join(c.text for c in chunks)
    assert result.token_ids == tuple(t for c in chunks for t in c.token_ids)
    assert result.stats.tokens == len(result.token_ids)
    assert result.stats.method == "draft" and result.stats.k == 3
    assert sum(c.from_draft for c in chunks) == result.stats.accepted


def test_results_equal_the_engine_in_process(client: Client, engine: Engine) -> None:
    for request in (
        GenerationRequest(messages=HELLO, max_tokens=40),
        GenerationRequest(prompt="def main(self):", max_tokens=30, stop=(" return",)),
        GenerationRequest(
            messages=HELLO,
            max_tokens=30,
            sampling=SamplingParams(temperature=0.9, top_p=0.9, seed=5),
            speculative=SpecParams("ngram"),  # a seed reproduces a sample for a fixed method, not for auto
        ),
    ):
        local = engine.generate(request)
        remote = client.generate(request)
        assert (remote.text, remote.token_ids, remote.finish_reason) == (
            local.text,
            local.token_ids,
            local.finish_reason,
        )


def test_complete_and_chat_helpers(client: Client) -> None:
    done = client.complete("the model is", max_tokens=5)
    assert done.finish_reason == "length" and len(done.token_ids) == 5
    reply = client.chat(HELLO, max_tokens=5, speculative=SpecParams("none"))
    assert reply.stats.method == "none" and reply.stats.drafted == 0


def test_closing_a_stream_cancels_it(client: Client, daemon: Daemon) -> None:
    cancelled = 'localspec_generations_total{finish="cancelled"}'
    before = wait_for_metric(daemon, cancelled, 0)
    stream = client.chat_stream((ChatMessage("user", "the model is"),), max_tokens=100_000)
    assert isinstance(next(stream), TokenChunk)
    stream.close()  # what the TUI does on Esc
    assert wait_for_metric(daemon, cancelled, before + 1) == before + 1


def test_errors_come_back_as_types(daemon: Daemon, client: Client) -> None:
    with (
        Client(socket_path=daemon.socket_path, model="not-loaded") as other,
        pytest.raises(ModelNotFoundError),
    ):
        other.chat(HELLO, max_tokens=2)
    with pytest.raises(UserInputError) as info:
        client.chat((ChatMessage("user", "hello " * 2000),), max_tokens=2)
    assert info.value.code == "context_length_exceeded" and info.value.http_status == 400
    with pytest.raises(UserInputError) as info:
        client.complete("x", suffix="y")  # the tiny target has no fill-in-the-middle tokens
    assert info.value.param == "suffix"


def test_over_tcp_with_the_token(daemon: Daemon) -> None:
    with Client(base_url=daemon.base_url, token=TOKEN) as tcp:
        assert tcp.health().ready
        assert tcp.complete("the model is", max_tokens=3).stats.tokens == 3
    with Client(base_url=daemon.base_url) as anonymous, pytest.raises(DaemonError) as info:
        anonymous.models()
    assert info.value.http_status == 401
    assert "bearer token" in info.value.message


def test_no_daemon_is_a_clear_daemon_error(tmp_path: Path) -> None:
    with Client(socket_path=tmp_path / "none.sock") as client, pytest.raises(DaemonError) as info:
        client.health()
    assert str(tmp_path / "none.sock") in info.value.message
    assert "localspec serve" in info.value.message
    with Client(base_url="http://127.0.0.1:9") as tcp, pytest.raises(DaemonError):
        tcp.health()


def test_from_env_uses_the_home_socket(localspec_home: Path) -> None:
    with Client.from_env() as client, pytest.raises(DaemonError) as info:
        list(client.chat_stream(HELLO))
    assert str(localspec_home / "run" / "localspec.sock") in info.value.message
