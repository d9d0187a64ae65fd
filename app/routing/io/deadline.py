"""Deadlines enforced at the transport: an attempt ends when its time is up, however the upstream
trickles or stalls.

A per-read timeout alone (what the SDK's ``timeout`` is) never bounds an upstream that sends one
byte every second. :class:`DeadlineTransport` wraps each provider's transport and, for a request
sent while an :class:`AttemptDeadline` is current (a context variable the router sets around the
send), does three things:

- caps the connect/write/pool/read timeouts of the request at the time left, so a hang before the
  response headers ends at the deadline;
- after the headers, caps the body's read timeout again (streams: also at the first-token deadline
  and the idle gap between chunks), so a body that stalls ends there too;
- checks the clock after every body chunk and raises :class:`DeadlineExceeded` (an
  ``httpx2.ReadTimeout``, so the SDK and the router see an ordinary timeout) once the deadline or
  the first-token deadline has passed, which is what ends a trickle.

Bound: connect + headers end by the deadline; a body read that starts before the deadline waits at
most the read timeout set when the headers arrived (itself at most the time then left), so a body
that stalls after sending part of itself ends at most that long after the deadline.

The deadline is captured when the request is sent, so a stream read later from another thread
(the server's workers) keeps its own.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator

import httpx2

from app.routing.policy import AttemptDeadline

__all__ = ["AttemptDeadline", "DeadlineExceeded", "DeadlineTransport", "activate", "check", "deactivate"]

_current: contextvars.ContextVar[AttemptDeadline | None] = contextvars.ContextVar("gateway_deadline", default=None)


class DeadlineExceeded(httpx2.ReadTimeout):
    """An attempt's deadline (total, first token, or idle gap) passed."""


def check(deadline: AttemptDeadline, request: httpx2.Request | None = None) -> None:
    """Raise :class:`DeadlineExceeded` once one of the attempt's deadlines has passed."""
    why = deadline.overdue(deadline.clock())
    if why is not None:
        raise DeadlineExceeded(why, request=request)


def current() -> AttemptDeadline | None:
    return _current.get()


def activate(deadline: AttemptDeadline | None) -> contextvars.Token[AttemptDeadline | None]:
    return _current.set(deadline)


def deactivate(token: contextvars.Token[AttemptDeadline | None]) -> None:
    _current.reset(token)


def _cap(request: httpx2.Request, seconds: float, keys: tuple[str, ...]) -> None:
    timeout = request.extensions.get("timeout")
    if not isinstance(timeout, dict):
        timeout = {}
        request.extensions["timeout"] = timeout
    seconds = max(seconds, 0.001)
    for key in keys:
        value = timeout.get(key)
        timeout[key] = seconds if value is None else min(value, seconds)


class _DeadlineStream(httpx2.SyncByteStream):
    def __init__(self, inner: httpx2.SyncByteStream, deadline: AttemptDeadline, request: httpx2.Request):
        self._inner = inner
        self._deadline = deadline
        self._request = request

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            check(self._deadline, self._request)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class DeadlineTransport(httpx2.BaseTransport):
    """Wraps a provider's transport; a no-op for requests sent with no deadline current."""

    def __init__(self, inner: httpx2.BaseTransport):
        self.inner = inner

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        deadline = _current.get()
        if deadline is None:
            return self.inner.handle_request(request)
        check(deadline, request)
        _cap(request, deadline.time_left(deadline.clock()), ("connect", "read", "write", "pool"))
        response = self.inner.handle_request(request)
        # The body is read after this returns: its reads get what is left now.
        _cap(request, deadline.time_left(deadline.clock(), body=True), ("read",))
        stream = response.stream
        if isinstance(stream, httpx2.SyncByteStream) and not isinstance(stream, httpx2.ByteStream):  # not in memory
            response.stream = _DeadlineStream(stream, deadline, request)
        return response

    def close(self) -> None:
        self.inner.close()
