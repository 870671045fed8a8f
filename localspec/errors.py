"""The errors localspec reports to people: one type per kind of failure.

Every error carries a one-line message that says what is wrong and what to do.
The CLI turns them into `error: ...` on stderr with exit code 2; the API turns
them into OpenAI- or Ollama-shaped bodies using `http_status` and `error_type`.
Interfaces map these types, never message text.
"""

from __future__ import annotations

import errno
from pathlib import Path


class LocalspecError(Exception):
    """Base of every error meant for a person rather than a developer."""

    http_status: int = 500
    error_type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class UserInputError(LocalspecError):
    """The request or command line itself is wrong."""

    http_status = 400
    error_type = "invalid_request_error"


class ModelFileError(UserInputError):
    """A GGUF path is missing, not a file, not GGUF, or truncated."""

    code = "model_file"


class UnsupportedModelError(UserInputError):
    """A GGUF that llama.cpp (or localspec) cannot run."""

    code = "unsupported_model"


class TemplateError(UserInputError):
    """A model's chat template that fails on the messages, or runs over its time or size budget."""

    code = "chat_template"


class TokenizerMismatchError(UserInputError):
    """A draft whose tokenizer does not match the target's."""

    code = "tokenizer_mismatch"


class ContextOverflowError(UserInputError):
    """A prompt (plus requested tokens) longer than the context window."""

    code = "context_length_exceeded"
    hint = "shorten the prompt or raise the context size (--ctx)"

    def __init__(self, n_prompt: int, n_ctx: int) -> None:
        super().__init__(
            f"prompt is {n_prompt} tokens but the context holds {n_ctx}; {self.hint}", param="messages"
        )
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx

    def in_words_of(self, api: str) -> str:
        """The message as `api`'s own servers word it, which its clients look for: agents on
        Anthropic's API (Claude Code among them) recognise a full context by "prompt is too long:
        N tokens > M maximum", LiteLLM and the agents on it by OpenAI's "maximum context length is"."""
        if api == "anthropic":
            return f"prompt is too long: {self.n_prompt} tokens > {self.n_ctx} maximum; {self.hint}"
        if api == "openai":
            return (
                f"This model's maximum context length is {self.n_ctx} tokens. However, your prompt "
                f"resulted in {self.n_prompt} tokens; {self.hint}"
            )
        return self.message


class ModelNotFoundError(LocalspecError):
    """A model name that names no loaded or known model."""

    http_status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class ChecksumError(LocalspecError):
    """An assembled or downloaded file whose size or sha256 is not the expected one."""

    error_type = "server_error"
    code = "checksum_mismatch"


class DownloadError(LocalspecError):
    """Fetching a model (hub or package registry) failed."""

    http_status = 502
    code = "download_failed"


class ConfigError(UserInputError):
    """A settings file or environment variable holds a value that cannot be used."""

    code = "config"


class OverloadedError(LocalspecError):
    """The request queue is full; the client should retry later."""

    http_status = 503
    error_type = "server_error"
    code = "overloaded"


class ModelLoadError(LocalspecError):
    """A model the request named could not be loaded; the daemon and its other models carry on."""

    http_status = 500
    code = "model_load_failed"


class RpcWorkerError(LocalspecError):
    """An RPC worker (`localspec rpc-worker`) that cannot be reached, or stopped mid-request."""

    http_status = 503
    error_type = "server_error"
    code = "rpc_worker"


class RpcUnsupportedError(LocalspecError):
    """A llama.cpp build without its RPC backend, asked to use or serve RPC workers."""

    code = "rpc_unsupported"


class DaemonError(LocalspecError):
    """The daemon is unreachable, already running, or answered with an error."""

    http_status = 503
    code = "daemon"


class NotSupportedError(LocalspecError):
    """A route of another server's API that localspec answers with what to do instead."""

    http_status = 501
    error_type = "invalid_request_error"
    code = "not_supported"


class ForbiddenError(LocalspecError):
    """A request from a place the daemon does not serve (foreign Host or Origin)."""

    http_status = 403
    error_type = "permission_error"
    code = "forbidden"


class UnauthorizedError(LocalspecError):
    """A TCP request without the configured bearer token."""

    http_status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class PayloadTooLargeError(LocalspecError):
    """A request body over the size limit."""

    http_status = 413
    error_type = "invalid_request_error"
    code = "body_too_large"


class RequestCancelledError(LocalspecError):
    """A generation stopped because it was cancelled (its client left); no one is told it failed."""

    http_status = 499  # nginx's "client closed request": by then nobody reads the answer
    code = "cancelled"


class StorageError(LocalspecError):
    """A state folder (caches, derived drafts, the runtime folder) that is read-only or full."""

    http_status = 507  # Insufficient Storage
    code = "storage"


# What a read-only, full or foreign folder answers to a write (EFBIG: a file-size limit).
STORAGE_ERRNOS = frozenset([errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EFBIG])


def storage_error(exc: OSError, folder: Path | str | None = None) -> StorageError:
    """One line for a failed write: which folder, why, and what the person can do."""
    where = folder if folder is not None else exc.filename or "a state folder"
    why = exc.strerror or str(exc)
    if exc.errno is None:  # a short write (numpy's tofile says "N requested and M written")
        why = f"the write stopped short ({why}): the disk may be full"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, None):
        hint = "free some space, or point LOCALSPEC_HOME at another disk"
    else:
        hint = "make it writable, or point LOCALSPEC_HOME at a folder you can write"
    # EACCES and EPERM can come from a read as well: only the others say for sure it was a write.
    verb = "use" if exc.errno in (errno.EACCES, errno.EPERM) else "write to"
    return StorageError(f"cannot {verb} {where}: {why}; {hint}")
