"""RPC without llama.cpp: endpoints, loopback, the layer split, the worker plan, the worker's host rule."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from localspec.engine.rpc import check_reachable, is_loopback, layer_split, parse_endpoints
from localspec.engine.rpc_worker import check_host, check_port
from localspec.errors import RpcWorkerError, UserInputError
from localspec.pickdraft.memplan import ModelShape
from localspec.pickdraft.rpcplan import describe_workers, plan_workers
from localspec.settings import load_settings

GIB = 2**30


def test_endpoints_are_parsed_and_checked() -> None:
    assert parse_endpoints(" 10.0.0.2:50052, box:6000 ") == ("10.0.0.2:50052", "box:6000")
    assert parse_endpoints(["a:1,b:2", "c:3"]) == ("a:1", "b:2", "c:3")
    for bad in ("nohost", "host:", ":50052", "host:0", "host:70000", "host:port", "[::1]:50052"):
        with pytest.raises(UserInputError, match="RPC endpoint"):
            parse_endpoints(bad)
    with pytest.raises(UserInputError, match="given twice"):
        parse_endpoints("a:1,a:1")


def test_the_setting_is_validated_and_normalised(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(rpc="127.0.0.1:1, 127.0.0.1:2").rpc == "127.0.0.1:1,127.0.0.1:2"
    monkeypatch.setenv("LOCALSPEC_RPC", "127.0.0.1")
    with pytest.raises(UserInputError, match="not HOST:PORT"):
        load_settings()


def test_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.1.2.3") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2") and not is_loopback("box")


def test_a_non_loopback_worker_needs_the_flag_and_then_warns() -> None:
    assert check_host("127.0.0.1", allow_remote=False) is None
    with pytest.raises(UserInputError, match="--allow-remote"):
        check_host("0.0.0.0", allow_remote=False)
    warning = check_host("0.0.0.0", allow_remote=True)
    assert warning is not None and "no authentication" in warning


def test_a_port_in_use_is_one_clear_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UserInputError, match=f"port {port} on 127.0.0.1 is in use"):
            check_port("127.0.0.1", port)


def test_a_refused_connection_names_the_endpoint() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(RpcWorkerError, match=f"cannot reach the RPC worker at 127.0.0.1:{port}"):
            check_reachable(f"127.0.0.1:{port}")


def test_layers_split_by_free_memory_as_llama_cpp_does() -> None:
    # 24 repeating layers + the output layer = 25 offloaded layers.
    assert layer_split(24, [GIB, GIB]) == [13, 12]
    assert sum(layer_split(24, [GIB, 3 * GIB])) == 25
    assert layer_split(24, [GIB, 3 * GIB])[0] < layer_split(24, [GIB, 3 * GIB])[1]
    assert layer_split(24, [5 * GIB]) == [25]
    assert layer_split(4, [0, 0]) == [3, 2]  # no figures: an even split
    assert layer_split(4, []) == []


def _shape(n_layers: int, layer: int) -> ModelShape:
    return ModelShape(
        name="t",
        layer_bytes=(layer,) * n_layers,
        embd_bytes=100,
        head_bytes=1000,
        tied_head=False,
        other_bytes=10,
        n_vocab=1000,
        n_embd=64,
        n_head_kv=2,
        head_dim_k=32,
        head_dim_v=32,
        n_ctx_train=4096,
        bpe=True,
    )


def test_the_worker_plan_counts_layers_kv_and_the_output_on_the_last() -> None:
    shape = _shape(4, 10_000)
    kv = shape.kv_bytes_per_layer(256, "f16")
    shares = plan_workers(shape, ["a:1", "b:2"], [(GIB, GIB), (GIB, GIB)], 256, "f16")
    assert [(s.first_layer, s.n_layers) for s in shares] == [(0, 3), (3, 2)]
    assert shares[0].need == 3 * (10_000 + kv)
    assert shares[1].need == 10_000 + kv + 1000 + 10  # one layer, then the output layer
    assert all(s.fits for s in shares)
    line = describe_workers(shares)
    assert "a:1: layers 0-2" in line and "b:2: layers 3-4" in line and "does not fit" not in line
    tight = plan_workers(shape, ["a:1", "b:2"], [(1, GIB), (GIB, GIB)], 256, "f16")
    assert "does not fit on a:1" in describe_workers(tight)


def test_the_worker_line_says_why_when_a_worker_is_down(tmp_path: Path) -> None:
    from localspec.pickdraft.rpcplan import worker_line

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        line = worker_line(tmp_path / "unused.gguf", [f"127.0.0.1:{port}"], 256, "f16", None)
    assert f"cannot reach the RPC worker at 127.0.0.1:{port}" in line
