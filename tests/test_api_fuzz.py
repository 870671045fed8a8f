"""Fuzz the API from its own OpenAPI schema with schemathesis: no request earns a 5xx, the daemon lives on."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import schemathesis
from daemonproc import Daemon, metric, start_daemon
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.core.result import Ok

pytestmark = pytest.mark.timeout(300)

EXAMPLES = 60  # per operation and mode (valid and invalid bodies); 30 stopped reaching a chat 200 once
# the chat body grew tools and response_format, whose random values are mostly refused


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_target: Path) -> Iterator[Daemon]:
    # A small context bounds every generation the fuzzer asks for, whatever its max_tokens.
    d = start_daemon(
        tmp_path_factory.mktemp("fuzz-home"), tiny_target, "--max-body", "65536", tcp=True, ctx=256
    )
    yield d
    assert d.stop() == 0, d.log()


def test_no_request_earns_a_server_error(daemon: Daemon) -> None:
    # Driven by hand rather than schemathesis' pytest plugin, which does not run under pytest 9.
    api = schemathesis.openapi.from_url(f"{daemon.base_url}/openapi.json")
    results = list(api.get_all_operations())
    assert all(isinstance(r, Ok) for r in results), results
    operations = [r.ok() for r in results if isinstance(r, Ok)]
    assert len(operations) >= 10
    # Invalid data needs something to be invalid: only the routes with a body get negative cases.
    runs = [(op.label, "POSITIVE") for op in operations]
    runs += [(op.label, "NEGATIVE") for op in operations if op.method.upper() == "POST"]
    # Drawing the cases is most of the time (the daemon answers in a few seconds of ~100): the runs
    # are split between two processes, one per core.
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = [pool.submit(_fuzz, daemon.base_url, label, mode) for label, mode in runs]
        for future in futures:
            future.result()
    finally:
        pool.shutdown(cancel_futures=True)  # after a failure, the runs not begun are not run


def _fuzz(base_url: str, label: str, mode_name: str) -> None:
    """Fuzz one operation in one generation mode (POSITIVE or NEGATIVE); AssertionError on a 5xx."""
    operation = schemathesis.openapi.from_url(f"{base_url}/openapi.json").find_operation_by_label(label)
    assert operation is not None, label
    mode = schemathesis.GenerationMode[mode_name]

    @given(case=operation.as_strategy(mode), served=st.booleans())
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,  # the same cases every run: CI must not flake on a lucky draw
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: schemathesis.Case, served: bool) -> None:
        if served and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = "localspec"  # else nearly every body stops at 404 before generating
        response = case.call(timeout=60)
        assert response.status_code < 500, (
            f"{case.method} {case.path}: {response.status_code} {response.text}"
        )

    fuzz()


def test_the_daemon_is_alive_after_the_fuzzing(daemon: Daemon) -> None:
    with daemon.tcp_http() as http:
        assert http.get("/health").json()["status"] == "ready"
        metrics = http.get("/metrics").text
    for route in ("/v1/chat/completions", "/v1/completions", "/api/chat", "/api/generate"):
        # The fuzzer got past validation into real generations, and was refused too.
        assert metric(metrics, f'localspec_requests_total{{route="{route}",status="200"}}') > 0, route
        assert metric(metrics, f'localspec_requests_total{{route="{route}",status="400"}}') > 0, route
    assert daemon.proc.poll() is None
    assert "Traceback" not in daemon.log()
