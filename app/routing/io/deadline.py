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

The async driver bounds each read of a stream with a :class:`ReadWatch`: one timer per stream
rather than one per read (a chunk comes every few tens of milliseconds, a timer's set-up and
cancel cost more than the rest of a chunk's accounting). The timer fires at the earliest time a
read could be overdue; a read that began since then moves it on instead of failing, and time the
caller spends not reading (backpressure) never counts.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Iterator

import httpx2

from app.routing.policy import AttemptDeadline

__all__ = ["AttemptDeadline", "DeadlineExceeded", "DeadlineTransport", "ReadWatch", "activate", "check", "deactivate"]

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


SLACK_S = 0.005  # how much later than its deadline a read may be cut


class ReadWatch:
    """The deadline of each read of one stream, on one timer (see the module docstring).

    ``async with watch.read():`` around each read: it may wait at most the time the deadline
    leaves a body read (the first-token deadline, the idle gap, the request's deadline), counted
    from when it starts. A read past it is cancelled and :class:`DeadlineExceeded` raised, naming
    the deadline that passed. ``close()`` when the stream ends."""

    __slots__ = ("_cancelling", "_deadline", "_expired", "_handle", "_loop", "_reading", "_task", "_until")

    def __init__(self, deadline: AttemptDeadline):
        self._deadline = deadline
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._until = 0.0  # on the loop's clock: when the read in progress is overdue
        self._reading = False
        self._expired = False
        self._cancelling = 0

    def read(self) -> _Read:
        return _Read(self)

    def begin(self) -> None:
        """A read starts now (what ``async with read()`` does on entry)."""
        self._start()

    def ended(self) -> bool:
        """The read gave its value: True when that is all there is to it (the usual case), False
        when the timer fired at the same instant and :meth:`settle` must take its cancellation back."""
        self._reading = False
        return not self._expired

    async def settle(self, exc: BaseException | None) -> None:
        """What ``async with read()`` does on exit: after a failed read (``exc``), or after
        :meth:`ended` said False."""
        await self._end(exc)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _start(self) -> None:
        task = asyncio.current_task(self._loop)
        assert task is not None
        self._task = task  # the task reading now (a stream may be read by another than its opener's)
        left = max(self._deadline.time_left(self._deadline.clock(), body=True), 0.001)
        self._until = self._loop.time() + left
        self._reading = True
        handle = self._handle
        # The armed timer stays if it fires no later than this read's deadline (it moves on then),
        # or so little later that re-arming costs more than it gives: a deadline that is the same
        # instant read again through two clocks differs by microseconds.
        if handle is None or handle.when() > self._until + SLACK_S:
            if handle is not None:
                handle.cancel()
            self._handle = self._loop.call_at(self._until, self._fire)

    def _fire(self) -> None:
        self._handle = None
        if not self._reading:
            return  # armed again by the next read
        if self._loop.time() < self._until:
            self._handle = self._loop.call_at(self._until, self._fire)
            return
        assert self._task is not None
        self._expired = True
        self._cancelling = self._task.cancelling()
        self._task.cancel()

    async def _end(self, exc: BaseException | None) -> None:
        self._reading = False
        if not self._expired:
            if isinstance(exc, httpx2.TimeoutException):
                check(self._deadline)  # the client's own timeout, due at the same instant: named as ours
            return
        self._expired = False
        assert self._task is not None
        if not isinstance(exc, asyncio.CancelledError):
            # The read ended (with its value, its end or its own error) as the timer fired: it
            # made it, and the cancellation still on its way is taken back.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                pass
            self._task.uncancel()
            return
        if self._task.uncancel() > self._cancelling:
            return  # someone else cancelled the task too: their cancellation goes on
        check(self._deadline)  # the first-token or request deadline, by name
        raise DeadlineExceeded("no chunk within the stream's idle timeout")


class _Read:
    __slots__ = ("_watch",)

    def __init__(self, watch: ReadWatch):
        self._watch = watch

    async def __aenter__(self) -> None:
        self._watch._start()

    async def __aexit__(self, exc_type: object, exc: BaseException | None, tb: object) -> bool:
        await self._watch._end(exc)
        return False
