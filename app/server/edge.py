"""The server's edge: the bounds a connection meets before the application sees a request.

uvicorn's httptools protocol reads a request head of any size for as long as a client cares to
send it, and holds any number of connections: one client streaming a header value can grow the
process without bound, and slow connections each sending a header byte a second can take every
file descriptor, ``/healthz`` with them. The protocol here is uvicorn's, with per connection:

- a bounded head: at most ``max_header_bytes`` (request line and headers) and ``max_headers``
  header lines, else 431 and the connection closed. httptools buffers a header until its end, so
  the bytes are counted as they arrive rather than when the parser hands a header over;
- a head deadline: a request head not complete ``header_timeout_s`` after the connection opened
  (or after its first byte, on a kept-alive connection) is answered 408 and closed (slowloris);
- a bounded number of connections per process, below its open-file limit: at the bound the
  connection idle longest (no request in progress: a keep-alive wait or an incomplete head) is
  closed to make room, so a crowd of slow or idle connections cannot lock a real request out; when
  every connection is serving a request, the newcomer gets 503 and is closed;
- bounded keep-alive: ``keep_alive_s`` idle between requests (uvicorn's own timer), and at most
  ``max_requests_per_connection`` requests, the last answered with ``connection: close``.

The parsing and everything else is uvicorn's; per request the additions cost a few attribute
updates and one timer, as uvicorn's keep-alive timer does. Refusals are counted and logged at most
once a minute (an attack must not flood the log).

:func:`raise_open_file_limit` raises the process's soft limit of open files to its hard limit at
start (servers commonly start with a soft limit of 1,024), and :func:`connection_cap` keeps the
connection bound below it, with room left for the database, the upstream pools and the journal.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from asyncio.events import TimerHandle
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from app.config import ServerConfig
from app.server import wire

log = logging.getLogger(__name__)

MIN_CONNECTIONS = 16
NO_LIMIT_TARGET = 1 << 20  # a soft limit to ask for when the hard one is "unlimited" (Linux's nr_open)
REFUSAL_LOG_EVERY_S = 60.0


@dataclass(frozen=True)
class EdgeLimits:
    """What one connection may hold (see the module docstring); defaults as in :class:`ServerConfig`."""

    max_header_bytes: int = 64 * 1024
    max_headers: int = 128
    header_timeout_s: float = 10.0
    max_connections: int = 8192
    keep_alive_s: float = 15.0
    max_requests_per_connection: int = 1000  # 0: no bound

    @classmethod
    def from_config(cls, server: ServerConfig, *, open_files: int) -> EdgeLimits:
        return cls(
            max_header_bytes=server.max_header_bytes,
            max_headers=server.max_headers,
            header_timeout_s=server.header_timeout_s,
            max_connections=connection_cap(server.max_connections, open_files),
            keep_alive_s=server.keep_alive_s,
            max_requests_per_connection=server.max_requests_per_connection,
        )


def connection_cap(configured: int, open_files: int) -> int:
    """Connections one process may hold: ``configured``, but below its open-file limit by a reserve
    (a quarter of the limit, 64 to 1,024 descriptors) for the database, upstream connections, the
    journal and the interpreter's own files. Running out of descriptors fails every ``accept``, the
    health checks' included; refusing one connection more at the cap fails only that one."""
    reserve = min(1024, max(64, open_files // 4))
    return max(MIN_CONNECTIONS, min(configured, open_files - reserve))


def raise_open_file_limit() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (workers forked later inherit it);
    the soft limit (before, after). A limit the system refuses to raise stays as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NO_LIMIT_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class _Refusals:
    """Counts of what the edge refused, logged at most once a minute (on the next refusal)."""

    def __init__(self, clock: Any = time.monotonic):
        self.clock = clock
        self.counts: Counter[str] = Counter()
        self.since = clock()

    def count(self, what: str) -> None:
        self.counts[what] += 1
        now = self.clock()
        if now - self.since >= REFUSAL_LOG_EVERY_S:
            shown = ", ".join(f"{n} {w}" for w, n in sorted(self.counts.items()))
            log.warning("connections refused in the last %.0f s: %s", now - self.since, shown)
            self.counts.clear()
            self.since = now


def _error_response(status: int, message: str, code: str, type_: str = "invalid_request_error") -> bytes:
    """A whole HTTP/1.1 response with an OpenAI error object, closing the connection."""
    body = wire.WireError(status, message, type=type_, code=code).to_json()
    head = STATUS_LINE[status] + (
        b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    )
    return head + body


class CoalescingTransport:
    """A connection's transport that sends a response's head together with the first write after
    it: uvicorn writes the head and the body separately, which is two ``send()`` calls and, with
    ``TCP_NODELAY``, two packets; together they are one (the proxy path's commonest answer is a
    small head plus a small body). Only the head waits, and only until the next write or the end
    of this event-loop step (a stream's first event is never held back behind later ones); every
    other write goes straight out. Closing sends what is pending first."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport = transport
        self._loop = loop
        self._pending: bytes | None = None

    def write(self, data: bytes) -> None:
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._transport.write(pending + data)
        elif data[:9] == b"HTTP/1.1 ":  # a response head: wait for its body
            self._pending = bytes(data)
            self._loop.call_soon(self._flush)
        else:
            self._transport.write(data)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def _flush(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None and not self._transport.is_closing():
            self._transport.write(pending)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._pending or b"")

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds of the module docstring. Use
    :func:`protocol_class`: each server gets a subclass holding its limits and its idle set."""

    limits: ClassVar[EdgeLimits] = EdgeLimits()
    # Connections with no request in progress, the one idle longest first (dicts keep order):
    # the ones to close when the process is at its connection bound. One per server (per class).
    idle: ClassVar[dict[BoundedHttpToolsProtocol, None]] = {}
    refusals: ClassVar[_Refusals] = _Refusals()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.keep_alive_s  # type: ignore[assignment]  # call_later takes floats
        self._head_timer: TimerHandle | None = None
        self._in_head = True  # reading a request head (or waiting for one)
        self._head_bytes = 0  # bytes received of the head not complete yet
        self._heads = 0  # request heads completed on this connection
        self._refused = False  # answered by the edge itself; the parser's further callbacks are ignored
        self._fits = True  # the head so far plus the chunk being parsed are within max_header_bytes

    # ------------------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Every write of this connection (heads, bodies, refusals) goes through it; flow control
        # (pause/resume reading) stays on the transport itself.
        self.transport = CoalescingTransport(transport, self.loop)  # type: ignore[assignment]
        self._arm_head_timer()
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            self._refuse(
                503,
                f"The gateway is at its limit of {self.limits.max_connections:,} connections; retry shortly.",
                wire.OVERLOADED,
                "connection_limit",
                type_="service_unavailable",
            )
            return
        self.idle[self] = None

    def _make_room(self) -> bool:
        """Close the connection idle longest; False when every connection is serving a request."""
        for oldest in self.idle:
            del self.idle[oldest]
            oldest._close("idle_closed_at_connection_limit")
            return True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self.idle.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        in_head, heads = self._in_head, self._heads
        # A head that fits with this chunk whole fits: the exact measure is then not needed.
        self._fits = self._head_bytes + len(data) <= self.limits.max_header_bytes
        super().data_received(data)
        if self._refused or self.transport.is_closing():
            return
        if in_head and self._in_head and heads == self._heads:
            # No head completed in this chunk: all of it belongs to the head still incomplete.
            self._head_bytes += len(data)
            if not self._fits or len(self.headers) > self.limits.max_headers:
                self._refuse_head_too_large()
                return
        cycle = self.cycle
        if self._head_timer is None and (cycle is None or cycle.response_complete):
            # Bytes, and no request in progress (a head begun, or a body still arriving after its
            # answer): the next head has its deadline. A head complete in one chunk never needs it.
            self._arm_head_timer()

    # ------------------------------------------------------------------------ parser callbacks
    # on_url and on_header stay uvicorn's (called per header, they are the parser's hot path):
    # the head's bytes and lines are checked per chunk above and once more, cheaply, here.

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        if len(self.headers) > self.limits.max_headers or (
            not self._fits and self._head_size() > self.limits.max_header_bytes
        ):
            self._refuse_head_too_large()
            return
        if self._head_timer is not None:
            self._cancel_head_timer()
        self._in_head = False
        self._head_bytes = 0
        self._heads += 1
        self.idle.pop(self, None)
        super().on_headers_complete()
        limit = self.limits.max_requests_per_connection
        if limit and self._heads >= limit and self.cycle is not None and self.cycle.scope is self.scope:
            self.cycle.keep_alive = False  # answered with "connection: close", then closed

    def _head_size(self) -> int:
        return len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)  # "name: value\r\n"

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        self._in_head = True

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self.idle.pop(self, None)
            self.idle[self] = None  # idle again, now the most recent

    def send_400_response(self, msg: str) -> None:
        if not self._refused:
            super().send_400_response(msg)

    def handle_websocket_upgrade(self) -> None:
        if not self._refused:
            super().handle_websocket_upgrade()

    # ------------------------------------------------------------------------ the bounds

    def _serving_nothing(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._refused or self.transport.is_closing():
            return
        if not self._serving_nothing():
            # A pipelined head started while a response is still going out: that response is not cut.
            self._arm_head_timer()
            return
        if self._head_bytes:
            self._refuse(
                408,
                f"The request head was not complete within {self.limits.header_timeout_s:g} s.",
                "request_timeout",
                "header_timeout",
            )
        else:
            self._close("idle_without_request")  # nothing sent: nothing to answer

    def _refuse_head_too_large(self) -> None:
        self._refuse(
            431,
            f"The request head is larger than this gateway's limit of {self.limits.max_header_bytes:,} bytes "
            f"or {self.limits.max_headers:,} header lines.",
            "request_header_fields_too_large",
            "header_too_large",
        )

    def _refuse(self, status: int, message: str, code: str, what: str, *, type_: str = "invalid_request_error") -> None:
        self._refused = True
        if not self.transport.is_closing():
            self.transport.write(_error_response(status, message, code, type_))
        self._close(what)

    def _close(self, what: str) -> None:
        self._refused = True
        self._cancel_head_timer()
        self._unset_keepalive_if_required()
        self.idle.pop(self, None)
        # Out of the server's count at once: several newcomers in one loop turn must not each see
        # the same closing connection as still open and close one more.
        self.connections.discard(self)
        self.refusals.count(what)
        if not self.transport.is_closing():
            self.transport.close()


def protocol_class(limits: EdgeLimits) -> type[BoundedHttpToolsProtocol]:
    """The protocol class for one server (uvicorn's ``http=``): its limits, its own idle set."""
    return type(
        "BoundedHttpToolsProtocol",
        (BoundedHttpToolsProtocol,),
        {"limits": limits, "idle": {}, "refusals": _Refusals()},
    )
