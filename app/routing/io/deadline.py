"""How the async driver enforces an attempt's deadlines, on the event loop.

A per-read timeout alone (what an HTTP client's ``timeout`` is) never bounds an upstream that sends
one byte every second, so the deadline is the driver's, on the loop's clock: a non-streamed
attempt, and a stream up to its response headers, run under one ``asyncio.timeout`` of the time
left; each read of a stream's body is bounded by a :class:`ReadWatch`. A passed deadline raises
:class:`DeadlineExceeded` (an ``httpx2.ReadTimeout``, so the classifier sees an ordinary timeout)
naming the deadline that passed (the attempt's, the first token's, the idle gap's or the
request's). The sync client runs the same driver (:mod:`app.routing.io.portal`), so this is the
one deadline mechanism.

:class:`ReadWatch` is one timer per stream rather than one per read (a chunk comes every few tens
of milliseconds, a timer's set-up and cancel cost more than the rest of a chunk's accounting). The
timer fires at the earliest time a read could be overdue; a read that began since then moves it on
instead of failing, and time the caller spends not reading (backpressure) never counts.
"""

from __future__ import annotations

import asyncio

import httpx2

from app.routing.policy import AttemptDeadline

__all__ = ["AttemptDeadline", "DeadlineExceeded", "ReadWatch", "check"]


class DeadlineExceeded(httpx2.ReadTimeout):
    """An attempt's deadline (total, first token, or idle gap) passed."""


def check(deadline: AttemptDeadline, request: httpx2.Request | None = None) -> None:
    """Raise :class:`DeadlineExceeded` once one of the attempt's deadlines has passed."""
    why = deadline.overdue(deadline.clock())
    if why is not None:
        raise DeadlineExceeded(why, request=request)


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
