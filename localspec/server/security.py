"""The checks every request passes before any route sees it: Host, Origin, token, body size.

Why each exists:
- Host: a web page can make its own domain resolve to 127.0.0.1 (DNS rebinding,
  Ollama's CVE-2024-28224) and then talk to a loopback server as "same origin";
  the browser still sends the page's domain as Host, so only loopback names pass.
- Origin: a page on another site may send simple POSTs cross-origin; browsers
  always label them with Origin, which non-browser clients never send.
- Token: on TCP anyone on the machine (or the network, off loopback) can connect;
  the unix socket is guarded by its 0600 mode instead.
- Body size: a request must not be able to make the daemon buffer without bound.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localspec.errors import ForbiddenError, LocalspecError, PayloadTooLargeError, UnauthorizedError

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class SecurityPolicy:
    token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


ErrorRenderer = Callable[[Scope, LocalspecError], Response]


def is_loopback_host(name: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1 (brackets and a trailing dot allowed)."""
    name = name.strip("[]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(host: str) -> str:
    """The name part of a Host header value: `[::1]:80` -> `[::1]`, `localhost:80` -> `localhost`."""
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _headers(scope: Scope) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, value in scope.get("headers", []):
        out.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    return out


def over_tcp(scope: Scope) -> bool:
    """uvicorn reports a unix socket's server address as (path, None)."""
    server = scope.get("server")
    return server is not None and server[1] is not None


def _has_token(headers: dict[str, list[str]], token: str) -> bool:
    """The token as OpenAI clients send it (a bearer), or as Anthropic's do (`x-api-key`, Claude Code)."""
    bearer = headers.get("authorization", [""])[0]
    api_key = headers.get("x-api-key", [""])[0]
    # Both compared, whatever the first gives: the time taken says nothing about either.
    by_bearer = hmac.compare_digest(bearer.encode(), f"Bearer {token}".encode())
    by_key = hmac.compare_digest(api_key.encode(), token.encode())
    return by_bearer or by_key


def check_request(scope: Scope, policy: SecurityPolicy) -> None:
    """Raise the error a request earns, or return when it may go on."""
    headers = _headers(scope)
    for origin in headers.get("origin", []):
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not is_loopback_host(parts.hostname or ""):
            raise ForbiddenError(f"requests from origin {origin!r} are not allowed")
    authenticated = False
    if over_tcp(scope) and policy.token is not None:
        if not _has_token(headers, policy.token):
            raise UnauthorizedError(
                "a bearer token is required: send `Authorization: Bearer <token>` (or `x-api-key: <token>`)"
            )
        authenticated = True
    hosts = headers.get("host", [])
    if len(hosts) > 1:
        raise ForbiddenError("more than one Host header")
    host = hosts[0] if hosts else ""
    # A token proves the caller is no rebinding web page, so remote names may pass with one.
    if authenticated or (not host and not over_tcp(scope)):
        return
    if not is_loopback_host(_host_name(host)):
        raise ForbiddenError(f"Host {host!r} is not a loopback name; use localhost or 127.0.0.1")


def _content_length(scope: Scope) -> int | None:
    values = _headers(scope).get("content-length")
    if not values:
        return None
    try:
        return int(values[0])
    except ValueError:
        return None


class SecurityMiddleware:
    """Pure ASGI, so a refused request never reaches routing or reads its body."""

    def __init__(self, app: ASGIApp, policy: SecurityPolicy, render_error: ErrorRenderer) -> None:
        self.app = app
        self.policy = policy
        self.render_error = render_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            check_request(scope, self.policy)
            length = _content_length(scope)
            if length is not None and length > self.policy.max_body_bytes:
                raise self._too_large()
        except LocalspecError as exc:
            await self.render_error(scope, exc)(scope, receive, send)
            return
        await self.app(scope, self._limited(receive), send)

    def _too_large(self) -> PayloadTooLargeError:
        limit = self.policy.max_body_bytes
        return PayloadTooLargeError(f"the request body is over the {limit} byte limit", param=None)

    def _limited(self, receive: Receive) -> Receive:
        """A receive that fails once a body without Content-Length (chunked) grows past the limit."""
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.policy.max_body_bytes:
                    raise self._too_large()
            return message

        return limited
