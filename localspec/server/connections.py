"""What uvicorn does not limit: how long a client may take to send a request, and how many connect.

uvicorn (0.54) closes a keep-alive connection idle for `timeout_keep_alive`, but any
byte restarts that clock, so a client sending its headers a byte at a time holds a
connection for ever; and `limit_concurrency` answers 503 without closing anything,
so a thousand idle connections still use up the process's file descriptors, and then
no listener can accept at all. This module is uvicorn's h11 protocol plus:

- a header timeout: a request's head must be complete within `header_timeout_s` of
  the connection opening (or of the previous response ending), whatever trickles in;
- a body timeout: its body must be complete within `body_timeout_s` of the head;
- a cap per listener, derived from RLIMIT_NOFILE so that connections never take more
  than a third of the descriptors: at the cap, a new connection closes the one that
  has been idle longest (no request in progress), or is refused when none is idle;
- a small accept batch: asyncio accepts up to `backlog` sockets per wakeup before any
  of them reaches the protocol, and on EMFILE keeps looping (logging each failure and
  pausing the listener for a second). Batches of a quarter of the cap keep what is
  accepted but not yet counted within the descriptors left; the kernel's own queue
  stays long (`KERNEL_BACKLOG`), so a burst of connects is delayed, not dropped.

The unix socket (0600: the owner's) and the TCP port keep separate counts, so a flood
on TCP never takes the owner's socket; and eviction of idle connections means a real
client on a flooded listener still gets in, as its request starts at once.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("localspec.connections")

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
# Descriptors kept for everything else: the models, logs, the template renderer's pipes.
RESERVED_FDS = 64
MAX_CAP = 1024
MIN_CAP = 8
KERNEL_BACKLOG = 2048  # uvicorn's default


@dataclass(frozen=True)
class ConnectionPolicy:
    """Per-listener limits for the daemon's HTTP connections."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    max_per_listener: int | None = None  # None: from RLIMIT_NOFILE (default_cap)

    @property
    def cap(self) -> int:
        return self.max_per_listener if self.max_per_listener is not None else default_cap()

    @property
    def accept_batch(self) -> int:
        """Sockets asyncio may accept in one wakeup (its `backlog` argument)."""
        return max(4, self.cap // 4)


def default_cap() -> int:
    """Connections per listener: two listeners' connections, held and in flight, within the open-file limit.

    Held: 2 x cap; accepted but not yet counted: a few accept batches per listener, about 2 x cap more.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 16
    return max(MIN_CAP, min(MAX_CAP, (soft - RESERVED_FDS) // 6))


def guarded_protocol(policy: ConnectionPolicy) -> type[H11Protocol]:
    """An H11Protocol class enforcing `policy`; each call has its own connection counts."""
    cap = policy.cap
    listeners: dict[str, set[Guarded]] = {"unix": set(), "tcp": set()}

    class Guarded(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.peers: set[Guarded] | None = None
            self.idle_since = 0.0
            self.timer: asyncio.TimerHandle | None = None
            self.timer_for: str | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            peers = listeners["unix" if sock is not None and sock.family == socket.AF_UNIX else "tcp"]
            if len(peers) >= cap and not _evict_one(peers):
                transport.close()  # every connection here has a request in progress: refuse this one
                return
            self.peers = peers
            peers.add(self)
            super().connection_made(transport)  # type: ignore[arg-type]
            self.watch()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.peers is None:
                return  # refused at connect: uvicorn never saw it
            self.peers.discard(self)
            self.arm(None)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self.watch()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.watch()

        def idle(self) -> bool:
            """No request in progress: waiting for (the rest of) a request's head."""
            waiting = self.conn.their_state is h11.IDLE
            return waiting and (self.cycle is None or self.cycle.response_complete)

        def watch(self) -> None:
            """Keep the one timer that fits the request's state; a timer already running goes on."""
            state = self.conn.their_state
            if state is h11.IDLE and self.idle():
                if self.timer_for != "header":
                    self.idle_since = self.loop.time()
                    self.arm("header")
            elif state is h11.SEND_BODY:
                if self.timer_for != "body":
                    self.arm("body")
            else:
                self.arm(None)

        def arm(self, what: str | None) -> None:
            if self.timer is not None:
                self.timer.cancel()
            self.timer, self.timer_for = None, what
            if what is not None:
                delay = policy.header_timeout_s if what == "header" else policy.body_timeout_s
                self.timer = self.loop.call_later(delay, self.expire, what)

        def expire(self, what: str) -> None:
            self.timer, self.timer_for = None, None
            if self.transport is not None and not self.transport.is_closing():
                log.info("closing a connection: its request %s took too long", what)
                self.transport.close()

    return Guarded


def _evict_one(peers: set[Any]) -> bool:
    """Close the connection idle longest; False when every one has a request in progress."""
    idle = [p for p in peers if p.idle()]
    if not idle:
        return False
    oldest = min(idle, key=lambda p: p.idle_since)
    peers.discard(oldest)
    oldest.arm(None)
    oldest.transport.close()
    return True
