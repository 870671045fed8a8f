"""Download GGUF models from the Hugging Face Hub into the models folder.

A thin layer over `huggingface_hub`: choose a .gguf when none is named (Q4_K_M
first, the usual speed/quality balance for local use), download it into the models
folder with the hub's resumable downloader, and turn the hub's exception zoo into
one DownloadError line that says what to do. `HF_ENDPOINT` is read at call time, so
a mirror (or a test server) set after import still takes effect.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from localspec.errors import STORAGE_ERRNOS, DownloadError, StorageError, UserInputError
from localspec.models.split import is_first_part, part_names
from localspec.paths import Paths

DEFAULT_ENDPOINT = "https://huggingface.co"
# Tried in order when a repository holds several quantisations and none was named.
PREFERRED_QUANTS = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q4_0", "Q8_0", "Q6_K")
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
# Told of a download's progress: (file name, bytes so far, total bytes or None when unknown).
ProgressFn = Callable[[str, int, int | None], None]
# Tries of one hub call whose shared HTTP client another thread closed under it (_on_a_live_client).
CLOSED_CLIENT_TRIES = 3
# How long the check before a pull waits for the endpoint to accept a connection.
REACH_TIMEOUT_S = 10.0
T = TypeVar("T")
log = logging.getLogger(__name__)
# The hub warns, before it writes, where a folder's free space looks short of the file, then writes
# anyway (a filesystem may report less than it holds); where the write then fails, the error says
# so in one line (_storage_error). Its warning would add four lines of Python's warning format.
warnings.filterwarnings(
    "ignore", message="Not enough free disk space", category=UserWarning, module=r"huggingface_hub\."
)


def parse_spec(spec: str) -> tuple[str, str | None]:
    """Split `owner/name[:file.gguf]` into the repository id and the optional file name."""
    repo, sep, filename = spec.partition(":")
    if not _REPO_ID.match(repo):
        raise UserInputError(f"{spec!r} is not a Hugging Face repository id like 'owner/name[:file.gguf]'")
    if sep and not filename:
        raise UserInputError(f"{spec!r} names no file after ':'")
    return repo, (filename or None)


def choose_gguf(files: Iterable[str], repo: str = "the repository", quant: str | None = None) -> str:
    """The .gguf to fetch when none was named: `quant` if given, else a preferred one, else the only one."""
    candidates = sorted(f for f in files if _is_model_gguf(f))
    if not candidates:
        raise DownloadError(f"{repo} holds no .gguf model file; name one with REPO:FILE")
    if quant is not None:
        matches = [f for f in candidates if _has_quant(f, quant)]
        if not matches:
            listed = ", ".join(Path(f).name for f in candidates[:8])
            raise DownloadError(f"{repo} holds no {quant} .gguf (it has {listed})")
        return min(matches, key=len)
    for quant in PREFERRED_QUANTS:
        matches = [f for f in candidates if _has_quant(f, quant)]
        if matches:
            # The shortest name is the plain variant ("x-Q4_K_M.gguf" before "x-Q4_K_M-imat.gguf").
            return min(matches, key=len)
    if len(candidates) == 1:
        return candidates[0]
    listed = ", ".join(Path(f).name for f in candidates[:8])
    raise DownloadError(f"{repo} holds {len(candidates)} .gguf files ({listed}); choose one with REPO:FILE")


def _is_model_gguf(name: str) -> bool:
    base = Path(name).name.lower()
    if not base.endswith(".gguf") or base.startswith("mmproj"):
        return False
    # Only the first part of a split model is loadable by name; llama.cpp finds the rest.
    return is_first_part(base)


def _has_quant(name: str, quant: str) -> bool:
    stem = Path(name).name.lower().removesuffix(".gguf")
    return re.search(rf"(^|[-_.]){re.escape(quant.lower())}($|[-_.])", stem) is not None


def pull(
    repo: str,
    filename: str | None = None,
    dest_dir: Path | None = None,
    *,
    progress: bool = True,
    revision: str = "main",
    quant: str | None = None,
    on_progress: ProgressFn | None = None,
) -> Path:
    """Download `filename` (or the `quant`, else the best, .gguf) from `repo` into `dest_dir`.

    `dest_dir` defaults to the models folder. Returns the local path. A file already downloaded
    at the same revision is not fetched again. `on_progress`, when given, replaces the bar. A
    model split in parts is downloaded whole, part by part; the path returned is part 1's, which
    is the one llama.cpp opens.
    """
    from huggingface_hub import HfApi, hf_hub_download

    dest = dest_dir or Paths.from_env().models_dir
    endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    why = unreachable(endpoint)
    if why is not None:
        parts = part_names(filename) if filename is not None else []
        if parts and all((dest / part).is_file() for part in parts):
            # As the hub does offline: a file is only ever moved into place once complete.
            log.warning(
                "%s is unreachable (%s): using %s as downloaded before", endpoint, why, dest / parts[0]
            )
            return dest / parts[0]
        raise DownloadError(_unreachable_line(_what(repo, filename), endpoint, why))
    if filename is None:
        with _hub_errors(repo, None, endpoint, dest):
            api = HfApi(endpoint=endpoint)
            files = _on_a_live_client(lambda: api.list_repo_files(repo, revision=revision))
        filename = choose_gguf(files, repo, quant)
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if exc.errno in STORAGE_ERRNOS:
            raise _storage_error(exc, _what(repo, filename), dest) from None
        raise DownloadError(f"cannot write to {dest}: {exc.strerror or exc}") from None
    got = []
    for part in part_names(filename):
        kwargs: dict[str, Any] = {} if progress else {"tqdm_class": _quiet_bar()}
        if on_progress is not None:
            kwargs["tqdm_class"] = _reporting_bar(part, on_progress)
        with _hub_errors(repo, part, endpoint, dest):
            download = partial(
                hf_hub_download, repo, part, revision=revision, local_dir=dest, endpoint=endpoint, **kwargs
            )
            got.append(Path(str(_on_a_live_client(download))))
    return got[0]


def unreachable(endpoint: str, timeout: float = REACH_TIMEOUT_S) -> str | None:
    """Why `endpoint` cannot be connected to now, in a few words; None where a connection opens, or
    where it cannot be told here (a proxy between, offline mode, an endpoint that is not a URL).

    huggingface_hub retries a failed connection five times with backoff, whatever the failure: a
    host that does not resolve or a refused port took 23 s, five "Retrying in Ns" warnings, then
    the error. A name that does not resolve or a port that refuses will not answer a second later;
    one connection, opened and closed, tells at once. The hub's retries still cover what goes
    wrong after it (a connection dropped mid-download resumes).
    """
    parts = urllib.parse.urlsplit(endpoint)
    host = parts.hostname
    if not host or parts.scheme not in ("http", "https") or _offline():
        return None
    # With a proxy set for the scheme (the hub's client, httpx, reads them from the environment as
    # here), it connects to the proxy, which alone can tell, unless NO_PROXY sends the host past it.
    proxies = urllib.request.getproxies_environment()
    if (parts.scheme in proxies or "all" in proxies) and not bypasses_proxy(host, proxies.get("no", "")):
        return None
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except (OSError, ValueError) as exc:  # ValueError: a port out of range
        return str(exc) or type(exc).__name__


def bypasses_proxy(host: str, no_proxy: str) -> bool:
    """Whether `no_proxy` (NO_PROXY's value) sends `host` past the proxy as both httpx and urllib
    read it: `*`, the host itself, a domain it is in (`example.com`: the domain and its hosts), or a
    `.example.com` the host is below. Where the two differ (`.example.com` for example.com itself,
    address ranges, ports) it says no: the check is then left to the hub's client."""
    host = host.lower().rstrip(".")
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry == "*":
            return True
        if not entry or any(c in entry for c in "/:[]"):
            continue
        if entry.startswith("."):
            if host.endswith(entry):
                return True
        elif host == entry or host.endswith("." + entry):
            return True
    return False


def _offline() -> bool:
    """huggingface_hub's offline mode, set: it answers from its cache without connecting."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def _on_a_live_client(call: Callable[[], T]) -> T:
    """`call`, tried again (up to CLOSED_CLIENT_TRIES in all) when the hub's shared HTTP client was
    closed under it.

    huggingface_hub sends every request of a process through one shared client and closes it when
    any request fails to connect; a request another thread had just taken it for then fails with
    "Cannot send a request, as the client has been closed." (a RuntimeError, which its own retries
    do not cover). Two pulls at once in the daemon while the network is down met it: one answered
    "internal error" instead of "unreachable". The library makes a new client on the next call, and
    a download resumes from its partial file. A client left installed closed is reset first; a live
    one is not touched, as other threads may be using it.
    """
    from huggingface_hub import close_session, get_session

    for _ in range(CLOSED_CLIENT_TRIES - 1):
        try:
            return call()
        except RuntimeError as exc:
            if not _client_closed(exc):
                raise
            if get_session().is_closed:
                close_session()
    return call()


def _client_closed(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and "client has been closed" in str(exc)


def _quiet_bar() -> type[Any]:
    from huggingface_hub.utils import tqdm

    class QuietBar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return QuietBar


def _reporting_bar(filename: str, report: ProgressFn) -> type[Any]:
    """A silent bar that tells `report` of each update (the daemon streams it to Ollama clients)."""
    from huggingface_hub.utils import tqdm

    class ReportingBar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self._done = int(kwargs.get("initial") or 0)
            self._total = kwargs.get("total")
            report(filename, self._done, self._total)

        def update(self, n: float | None = 1) -> bool | None:
            self._done += int(n or 0)
            report(filename, self._done, self._total)
            return super().update(n)

    return ReportingBar


@contextmanager
def _hub_errors(repo: str, filename: str | None, endpoint: str, dest: Path) -> Iterator[None]:
    """Turn huggingface_hub and network exceptions into one DownloadError line, and a write the
    models folder refused (full, read-only) into one StorageError line."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
            raise _storage_error(exc, _what(repo, filename), dest) from exc
        message = _describe(exc, repo, filename, endpoint)
        if message is None:
            raise
        raise DownloadError(message) from exc


def _describe(exc: Exception, repo: str, filename: str | None, endpoint: str) -> str | None:
    """One line for a hub failure, or None for an exception that is a bug rather than a download problem."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        FileMetadataError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = _what(repo, filename)
    if isinstance(exc, LocalEntryNotFoundError) and isinstance(
        exc.__cause__, HfHubHTTPError | FileMetadataError
    ):
        exc = exc.__cause__  # the hub wraps the server's answer in "not in the local cache either"
    if isinstance(exc, GatedRepoError):
        return f"{repo} is gated: accept its terms on the Hub, then log in with `hf auth login`"
    if isinstance(exc, RepositoryNotFoundError):
        return f"{repo}: no such repository on {endpoint} (or it is private: log in with `hf auth login`)"
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo}: no such revision"
    if isinstance(exc, FileMetadataError):
        return (
            f"cannot download {what}: {endpoint} does not answer like the Hugging Face Hub; check HF_ENDPOINT"
        )
    if isinstance(exc, LocalEntryNotFoundError):
        cause = exc.__cause__ or exc.__context__
        detail = _first_line(cause) if cause is not None else "no connection"
        return _unreachable_line(what, endpoint, detail)
    if isinstance(exc, EntryNotFoundError):
        return f"{repo} has no file {filename!r}; run `localspec pull {repo}` to pick one"
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        return f"cannot download {what}: HTTP {status} from {endpoint}; retry later"
    if isinstance(exc, OSError) or _is_network_error(exc):
        return f"cannot download {what}: {_first_line(exc)}; check the network and retry"
    if _client_closed(exc):
        return f"cannot download {what}: {endpoint} kept dropping the connection; check the network and retry"
    return None


def _what(repo: str, filename: str | None) -> str:
    """What a download line names: the repository, and the file where one is known."""
    return f"{repo}:{filename}" if filename else repo


def _unreachable_line(what: str, endpoint: str, why: str) -> str:
    return f"cannot download {what}: {endpoint} is unreachable ({why}); check the network and retry"


def _storage_error(exc: OSError, what: str, dest: Path) -> StorageError:
    """A failed write into the models folder: the folder (the hub writes into a cache folder
    inside it first), why, and what to do."""
    why = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        hint = "free some space, or pull into another folder (--dest, or LOCALSPEC_MODELS)"
    else:
        hint = "make it writable, or pull into another folder (--dest, or LOCALSPEC_MODELS)"
    return StorageError(f"cannot download {what}: cannot write to {dest}: {why}; {hint}")


def _is_network_error(exc: BaseException) -> bool:
    # huggingface_hub talks through httpx (or its httpx2 fork); match their error bases by module
    # rather than importing a client this package does not otherwise need.
    return any(cls.__module__.split(".")[0] in ("httpx", "httpx2") for cls in type(exc).__mro__)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
