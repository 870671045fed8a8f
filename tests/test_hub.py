"""pull() against a local HTTP server that answers like the Hugging Face Hub, and the file choice rules.

The server speaks the few endpoints `huggingface_hub` uses for a download: the tree
listing (`/api/models/{repo}/tree/{rev}`) and HEAD/GET on `/{repo}/resolve/{rev}/{file}`
with the X-Repo-Commit, ETag and Content-Length headers the client checks.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import hostilegguf
import pytest
from click.testing import CliRunner
from faults import full_folder, limit_fsize, read_only_folder

from localspec.cli import cli
from localspec.cli.models import format_bytes, format_params
from localspec.errors import DownloadError, UserInputError
from localspec.models.gguf_info import read_gguf_info
from localspec.models.hub import bypasses_proxy, choose_gguf, parse_spec, pull, unreachable

COMMIT = "a" * 40
REPO = "acme/Tiny-GGUF"


@dataclass
class FakeHub:
    """What the server holds and what it was asked."""

    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    fail_with: int | None = None
    url: str = ""


class HubServer(ThreadingHTTPServer):
    """The fake hub's server: a client that hangs up mid-answer (httpx closing a kept-alive
    connection) is not an error here, and socketserver would print its traceback from the
    server's thread, which pytest's capture can miss."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def serving(hub: FakeHub) -> Iterator[FakeHub]:
    """The fake hub answering on a free local port (`hub.url`) until the block ends."""
    server = HubServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # keep pytest output clean
            pass

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append(f"{self.command} {path}")
            if hub.fail_with is not None:
                return self._send(hub.fail_with, b"server trouble", {})
            if path.startswith("/api/models/"):
                return self._tree(path.removeprefix("/api/models/"), body)
            repo, sep, rest = path.lstrip("/").partition("/resolve/")
            _revision, _, filename = rest.partition("/")
            if not sep or repo not in hub.repos:
                return self._send(404, b"", {"X-Error-Code": "RepoNotFound"}, body)
            content = hub.repos[repo].get(filename)
            if content is None:
                return self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}, body)
            etag = hashlib.sha256(content).hexdigest()
            self._send(200, content, {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"'}, body)

        def _tree(self, rest: str, body: bool) -> None:
            repo, _, _ = rest.partition("/tree/")
            if repo not in hub.repos:
                return self._send(404, b"", {"X-Error-Code": "RepoNotFound"}, body)
            entries = [
                {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                for name, data in hub.repos[repo].items()
            ]
            self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, body)

        def _send(self, status: int, content: bytes, headers: dict[str, str], body: bool = True) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            if body:
                self.wfile.write(content)

    return Handler


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_target: Path) -> Iterator[FakeHub]:
    state = FakeHub()
    state.repos[REPO] = {
        "README.md": b"# tiny\n",
        "tiny-Q8_0.gguf": b"GGUF-not-this-one",
        "tiny-Q4_K_M.gguf": tiny_target.read_bytes(),
        "mmproj-tiny-F16.gguf": b"GGUF-projector",
    }
    with serving(state):
        monkeypatch.setenv("HF_ENDPOINT", state.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield state


def test_pull_chooses_q4_k_m(hub: FakeHub, tmp_path: Path, tiny_target: Path) -> None:
    dest = tmp_path / "models"
    path = pull(REPO, None, dest, progress=False)
    assert path == dest / "tiny-Q4_K_M.gguf"
    assert path.read_bytes() == tiny_target.read_bytes()
    assert read_gguf_info(path).name == "tiny-target"
    assert f"GET /api/models/{REPO}/tree/main" in hub.requests


def test_pull_named_file_into_the_models_folder(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCALSPEC_MODELS", str(tmp_path / "m"))
    path = pull(REPO, "tiny-Q8_0.gguf", progress=False)
    assert path == tmp_path / "m" / "tiny-Q8_0.gguf"
    assert path.read_bytes() == b"GGUF-not-this-one"
    assert not any("/tree/" in r for r in hub.requests)


def test_pull_twice_downloads_once(hub: FakeHub, tmp_path: Path) -> None:
    pull(REPO, "tiny-Q4_K_M.gguf", tmp_path, progress=False)
    pull(REPO, "tiny-Q4_K_M.gguf", tmp_path, progress=False)
    assert sum(r.startswith("GET /acme") for r in hub.requests) == 1


def test_missing_file(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match=f"{REPO} has no file 'nope.gguf'"):
        pull(REPO, "nope.gguf", tmp_path, progress=False)
    assert not list(tmp_path.glob("*.gguf"))


def test_missing_repository(hub: FakeHub, tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match="acme/absent: no such repository"):
        pull("acme/absent", None, tmp_path, progress=False)
    with pytest.raises(DownloadError, match="acme/absent: no such repository"):
        pull("acme/absent", "x.gguf", tmp_path, progress=False)


def test_http_error(hub: FakeHub, tmp_path: Path) -> None:
    # 403 rather than 5xx: the hub client retries 5xx for ~20 s before giving up.
    hub.fail_with = 403
    with pytest.raises(DownloadError, match=f"cannot download {REPO}:tiny-Q4_K_M.gguf: HTTP 403 from"):
        pull(REPO, "tiny-Q4_K_M.gguf", tmp_path, progress=False)


def test_not_a_hub(hub: FakeHub, tmp_path: Path) -> None:
    hub.fail_with = 200  # answers, but without the hub's headers
    with pytest.raises(DownloadError, match="does not answer like the Hugging Face Hub"):
        pull(REPO, "tiny-Q4_K_M.gguf", tmp_path, progress=False)


def _closed_port() -> int:
    """A port that was free a moment ago: connections to it are refused at once."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()
    return int(port)


def test_unreachable_endpoint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    message = (
        rf"cannot download {REPO}:tiny-Q4_K_M.gguf: {endpoint} is unreachable \(.*Connection refused\); check"
    )
    with pytest.raises(DownloadError, match=message):
        pull(REPO, "tiny-Q4_K_M.gguf", tmp_path, progress=False)
    # Told by one refused connection: the hub's five retries with backoff (23 s) never began.
    assert not [r for r in caplog.records if "Retrying" in r.getMessage()]


def test_an_endpoint_whose_name_does_not_resolve(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.localspec-test.invalid")  # .invalid never resolves
    with pytest.raises(
        DownloadError,
        match=r"cannot download acme/Tiny-GGUF: https://hub\.localspec-test\.invalid is unreachable",
    ):
        pull(REPO, None, tmp_path, progress=False)


def test_a_file_pulled_before_is_used_while_the_hub_is_unreachable(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    first = pull(REPO, "tiny-Q4_K_M.gguf", tmp_path, progress=False)
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    asked = len(hub.requests)
    assert pull(REPO, "tiny-Q4_K_M.gguf", tmp_path, progress=False) == first
    assert len(hub.requests) == asked
    assert f"{endpoint} is unreachable" in caplog.text
    # A file never pulled is still an error, and so is choosing one (that needs the listing).
    with pytest.raises(DownloadError, match="is unreachable"):
        pull(REPO, "tiny-Q8_0.gguf", tmp_path, progress=False)
    with pytest.raises(DownloadError, match="is unreachable"):
        pull(REPO, None, tmp_path, progress=False)


def test_reachability_is_left_to_the_hub_behind_a_proxy_or_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
    ):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    assert "Connection refused" in (unreachable(endpoint) or "")
    # The hub's client connects to the proxy, not to the endpoint: only the proxy can tell.
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.localspec-test.invalid:3128")
    assert unreachable(endpoint) is None
    assert unreachable(endpoint.replace("http:", "https:")) is not None  # that proxy is for http only
    monkeypatch.delenv("HTTP_PROXY")
    monkeypatch.setenv("ALL_PROXY", "socks5://proxy.localspec-test.invalid:1080")
    assert unreachable(endpoint) is None
    # NO_PROXY sends the endpoint past the proxy: the hub's client connects to it, and so does the check.
    monkeypatch.setenv("NO_PROXY", "localhost, 127.0.0.1")
    assert "Connection refused" in (unreachable(endpoint) or "")
    monkeypatch.setenv("NO_PROXY", "hub.example")
    assert unreachable(endpoint) is None
    monkeypatch.delenv("ALL_PROXY")
    monkeypatch.delenv("NO_PROXY")
    # Offline, the hub answers from its cache without connecting, with its own error.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert unreachable(endpoint) is None
    assert unreachable("not a url") is None


@pytest.mark.parametrize(
    ("host", "no_proxy", "bypassed"),
    [
        ("huggingface.co", "*", True),
        ("huggingface.co", "localhost,huggingface.co", True),
        ("cdn.huggingface.co", "huggingface.co", True),
        ("cdn.huggingface.co", ".huggingface.co", True),
        ("huggingface.co", ".huggingface.co", False),  # httpx keeps the proxy for it, urllib not
        ("nothuggingface.co", "huggingface.co", False),
        ("10.1.2.3", "10.0.0.0/8", False),  # a range: read differently
        ("huggingface.co", "huggingface.co:443", False),
        ("huggingface.co", "", False),
    ],
)
def test_no_proxy_is_read_only_where_httpx_and_urllib_agree(host: str, no_proxy: str, bypassed: bool) -> None:
    assert bypasses_proxy(host, no_proxy) == bypassed


def _cli_pull(
    hub: FakeHub, spec: str, dest: Path, *, limited: bool = False
) -> subprocess.CompletedProcess[str]:
    """`localspec pull SPEC --dest DEST` in its own process, as a person runs it (Python's warning
    filters as in use, not pytest's); `limited`: under the file-size limit of a "rlimit" full folder."""
    argv = [sys.executable, "-c", "from localspec.cli import main; main()", "pull", spec, "--dest", str(dest)]
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(dest.parent / "hf-home")}
    preexec = limit_fsize if limited else None
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=120, check=False, preexec_fn=preexec
    )


@pytest.mark.parametrize("how", ["tmpfs", "rlimit"])
def test_cli_pull_onto_a_full_disk_is_one_line(hub: FakeHub, tmp_path: Path, how: str) -> None:
    # Past the rlimit folder's file-size limit (FSIZE_BYTES, 128 KiB).
    hub.repos[REPO]["big-Q4_K_M.gguf"] = b"GGUF" + bytes(1 << 20)
    with full_folder(tmp_path, how) as full:
        done = _cli_pull(hub, f"{REPO}:big-Q4_K_M.gguf", full.path, limited=full.how == "rlimit")
    assert done.returncode == 2, done.stderr
    # Not the network's fault, and without the hub's own warning about free space (four lines).
    assert done.stderr.startswith(
        f"error: cannot download {REPO}:big-Q4_K_M.gguf: cannot write to {full.path}: "
    ), done.stderr
    assert done.stderr.count("\n") == 1 and "free some space" in done.stderr, done.stderr
    assert not (full.path / "big-Q4_K_M.gguf").exists()


def test_cli_pull_into_a_read_only_folder_is_one_line(hub: FakeHub, tmp_path: Path) -> None:
    with read_only_folder(tmp_path) as folder:
        done = _cli_pull(hub, f"{REPO}:tiny-Q4_K_M.gguf", folder.path)
    assert done.returncode == 2
    assert done.stderr == (
        f"error: cannot download {REPO}:tiny-Q4_K_M.gguf: cannot write to {folder.path}: "
        f"{'Read-only file system' if folder.how == 'tmpfs' else 'Permission denied'}; "
        "make it writable, or pull into another folder (--dest, or LOCALSPEC_MODELS)\n"
    )


def test_cli_pull(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_MODELS", str(tmp_path / "m"))
    result = CliRunner().invoke(cli, ["pull", REPO, "--quiet"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "m" / "tiny-Q4_K_M.gguf"
    info = read_gguf_info(path)
    assert (
        result.stdout
        == f"{path}  (llama, {format_params(info.n_params)}, F32, {format_bytes(info.size_bytes)})\n"
    )


def test_cli_pull_errors_are_one_line(hub: FakeHub, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["pull", f"{REPO}:nope.gguf", "--dest", str(tmp_path)])
    assert result.exit_code == 2
    assert (
        result.stderr == f"error: {REPO} has no file 'nope.gguf'; run `localspec pull {REPO}` to pick one\n"
    )
    result = CliRunner().invoke(cli, ["pull", "not a repo"])
    assert (result.exit_code, result.stderr.count("\n")) == (2, 1)


# Choosing the file and reading the spec: pure rules.


@pytest.mark.parametrize(
    ("files", "chosen"),
    [
        (["a-Q8_0.gguf", "a-Q4_K_M.gguf", "a-f16.gguf"], "a-Q4_K_M.gguf"),
        (["a.Q4_K_M.gguf", "a.q4_k_m-imat.gguf"], "a.Q4_K_M.gguf"),
        (["sub/a-q4_k_m.gguf", "README.md"], "sub/a-q4_k_m.gguf"),
        (["a-Q8_0.gguf", "a-Q6_K.gguf"], "a-Q8_0.gguf"),
        (["only-F16.gguf", "mmproj-F16.gguf"], "only-F16.gguf"),
        (["a-Q4_K_M-00001-of-00002.gguf", "a-Q4_K_M-00002-of-00002.gguf"], "a-Q4_K_M-00001-of-00002.gguf"),
    ],
)
def test_choose_gguf(files: list[str], chosen: str) -> None:
    assert choose_gguf(files) == chosen


def test_choose_gguf_refuses_to_guess() -> None:
    with pytest.raises(DownloadError, match=r"holds no \.gguf"):
        choose_gguf(["README.md", "model.safetensors"], "acme/x")
    with pytest.raises(DownloadError, match=r"holds 2 \.gguf files"):
        choose_gguf(["a-F16.gguf", "a-BF16.gguf"], "acme/x")


def test_parse_spec() -> None:
    assert parse_spec("acme/x") == ("acme/x", None)
    assert parse_spec("acme/x-GGUF:sub/f.gguf") == ("acme/x-GGUF", "sub/f.gguf")
    for bad in ("acme", "acme/x:", "a b/c", "https://huggingface.co/acme/x"):
        with pytest.raises(UserInputError):
            parse_spec(bad)


def test_cli_pull_shows_hostile_file_names_escaped(hub: FakeHub, tmp_path: Path) -> None:
    hub.repos["evil/names"] = {"a\x1b[2J-IQ2_XS.gguf": b"GGUF", "b\x1b]0;title\x07-IQ1_S.gguf": b"GGUF"}
    result = CliRunner().invoke(cli, ["pull", "evil/names", "--quiet", "--dest", str(tmp_path)])
    assert result.exit_code == 2
    assert "choose one with REPO:FILE" in result.output
    assert "\x1b" not in result.output and "a\\x1b[2J-IQ2_XS.gguf" in result.output


def test_cli_pull_of_a_hostile_gguf_is_one_line(hub: FakeHub, tmp_path: Path) -> None:
    hub.repos["evil/nested"] = {"x-Q4_K_M.gguf": hostilegguf.HOSTILE["nested-arrays"]().to_bytes()}
    result = CliRunner().invoke(cli, ["pull", "evil/nested", "--quiet", "--dest", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and "corrupt GGUF" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@contextmanager
def hub_clients(closed_first: int) -> Iterator[list[Any]]:
    """huggingface_hub's shared HTTP clients made while the block runs (yielded as made), the first
    `closed_first` of them closed before use, as another thread's failed connection leaves one."""
    import huggingface_hub
    from huggingface_hub.utils._http import default_client_factory

    made: list[Any] = []

    def factory() -> Any:
        client = default_client_factory()
        if len(made) < closed_first:
            client.close()
        made.append(client)
        return client

    huggingface_hub.set_client_factory(factory)
    try:
        yield made
    finally:
        huggingface_hub.set_client_factory(default_client_factory)


def test_a_shared_client_closed_under_a_pull_is_replaced(
    hub: FakeHub, tmp_path: Path, tiny_target: Path
) -> None:
    # huggingface_hub shares one HTTP client per process and closes it when any request fails to
    # connect; a pull that had just taken it (a second pull in the daemon) then failed with a
    # RuntimeError, an "internal error" to the client. Here the first client it makes is closed.
    with hub_clients(closed_first=1) as made:
        path = pull(REPO, None, tmp_path, progress=False)
    assert path.read_bytes() == tiny_target.read_bytes()
    assert len(made) == 2 and made[0].is_closed

    # Closed on every try, it is one line, not a traceback.
    with (
        hub_clients(closed_first=1_000),
        pytest.raises(DownloadError, match="kept dropping the connection; check the network"),
    ):
        pull(REPO, "tiny-Q8_0.gguf", tmp_path / "again", progress=False)
