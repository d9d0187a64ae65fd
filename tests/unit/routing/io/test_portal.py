"""The blocking portal (:mod:`app.routing.io.portal`) with plain coroutines and async generators:
values and exceptions as raised, any thread, the read-ahead window, cancellation when the sync
reader stops, a fresh loop after a fork (``_forget`` is what the fork hook runs), and close."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.routing.errors import ClientClosedError
from app.routing.io.portal import Portal, PortalError

BOUND_S = 10.0  # a bound on each wait, never a timing assertion


@pytest.fixture
def portal():
    p = Portal(name="test-portal")
    yield p
    p.close()


class Boom(Exception):
    pass


async def value(x: int) -> tuple[int, str]:
    await asyncio.sleep(0)
    return x, threading.current_thread().name


def test_a_call_returns_the_value_from_the_loop_thread(portal):
    assert portal.generation == 0  # nothing started before the first use
    assert portal.call(value(7)) == (7, "test-portal")
    assert portal.generation == 1


def test_an_exception_reaches_the_caller_as_raised(portal):
    raised = Boom("no")

    async def fail() -> None:
        raise raised

    with pytest.raises(Boom) as caught:
        portal.call(fail())
    assert caught.value is raised


def test_calls_from_many_threads_share_one_loop(portal):
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: portal.call(value(i)), range(64)))
    assert [x for x, _ in got] == list(range(64))
    assert {name for _, name in got} == {"test-portal"}
    assert portal.generation == 1


def test_a_call_from_the_loop_thread_raises_instead_of_hanging(portal):
    async def inner() -> None:
        coro = value(1)
        with pytest.raises(PortalError):
            portal.call(coro)

    portal.call(inner())


async def counting(n: int, produced: list[int], closed: threading.Event) -> AsyncIterator[int]:
    try:
        for i in range(n):
            produced.append(i)
            yield i
    finally:
        closed.set()


def test_iterate_yields_every_item_in_order(portal):
    produced: list[int] = []
    closed = threading.Event()
    assert list(portal.iterate(lambda: counting(100, produced, closed), window=4)) == list(range(100))
    assert closed.is_set()


def test_the_pump_reads_no_more_than_the_window_ahead(portal):
    produced: list[int] = []
    closed = threading.Event()
    it = portal.iterate(lambda: counting(1000, produced, closed), window=8)
    assert next(it) == 0
    portal.call(asyncio.sleep(0.05))  # the pump has had every chance to run ahead
    assert len(produced) <= 8 + 1
    it.close()
    assert closed.is_set()  # closed on the loop before close() returned
    assert len(produced) < 1000


def test_closing_the_reader_cancels_the_async_iterator(portal):
    started = threading.Event()
    outcome: list[str] = []

    async def endless() -> AsyncIterator[int]:
        try:
            yield 1
            started.set()
            await asyncio.sleep(3600)  # an upstream that sends nothing more
            yield 2
        except (GeneratorExit, asyncio.CancelledError) as exc:
            outcome.append(type(exc).__name__)
            raise
        finally:
            outcome.append("finally")

    it = portal.iterate(endless)
    assert next(it) == 1
    assert started.wait(BOUND_S)
    it.close()
    assert outcome == ["CancelledError", "finally"]


def test_an_exception_in_the_stream_reaches_the_reader_after_its_items(portal):
    raised = Boom("cut")

    async def cut() -> AsyncIterator[int]:
        yield 1
        yield 2
        raise raised

    got: list[int] = []
    with pytest.raises(Boom) as caught:
        for x in portal.iterate(cut):
            got.append(x)
    assert got == [1, 2] and caught.value is raised


def test_iterate_from_many_threads(portal):
    def read(i: int) -> list[int]:
        return list(portal.iterate(lambda: counting(50 + i, [], threading.Event()), window=4))

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(read, range(12)))
    assert got == [list(range(50 + i)) for i in range(12)]


def test_after_a_fork_the_next_use_starts_a_loop_of_its_own(portal):
    portal.call(value(1))
    first = portal.loop()
    portal._forget()  # what the child runs after a fork: the parent's loop thread is not there
    assert portal.call(value(2))[0] == 2
    assert portal.loop() is not first and portal.generation == 3  # one for the fork, one for the new loop
    first.call_soon_threadsafe(first.stop)  # in this test the "parent's" thread is still here


def test_close_runs_the_registered_closers_then_stops_the_loop(portal):
    closed: list[str] = []

    async def aclose() -> None:
        closed.append(threading.current_thread().name)

    owner = object()
    portal.call(value(1))
    portal.on_close(owner, aclose)
    thread = portal._thread
    portal.close()
    assert closed == ["test-portal"]
    assert thread is not None and not thread.is_alive()
    assert portal.call(value(3))[0] == 3 and portal.generation == 2  # a later use starts again


def test_a_reader_waiting_when_the_loop_stops_gets_client_closed(portal):
    started = threading.Event()

    async def waits() -> AsyncIterator[int]:
        yield 1
        started.set()
        await asyncio.sleep(3600)
        yield 2

    it = portal.iterate(waits)
    assert next(it) == 1
    assert started.wait(BOUND_S)
    threading.Timer(0.05, portal.close).start()
    with pytest.raises(ClientClosedError):
        next(it)


def test_an_interrupt_while_waiting_cancels_the_call_and_waits_for_its_cleanup(portal):
    """Ctrl-C (or a signal's exit) in the caller: the coroutine is cancelled and what it does on
    cancellation (logging the attempt) has finished before the interrupt goes on to shut down."""
    import signal

    cleaned = threading.Event()

    async def attempt() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.05)  # the cancelled attempt's own work, on the loop
            cleaned.set()

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            portal.call(attempt())
        assert cleaned.is_set()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_an_interrupt_inside_submit_leaves_the_coroutine_to_the_loop(portal):
    """A signal's SystemExit can land inside ``submit``, after the loop took the coroutine and
    suspended it. Closing it from the caller's thread would run its cleanup outside the loop
    (anyio's limiter raises "no running event loop" in place of the SystemExit, and a program's
    SIGTERM handler exits 1). The loop cancels it, and the caller waits for that cleanup before the
    SystemExit goes on."""
    suspended = threading.Event()
    cleanups: list[bool] = []

    async def attempt() -> None:
        try:
            suspended.set()
            await asyncio.sleep(30)
        finally:
            asyncio.get_running_loop()  # raises outside a running loop
            cleanups.append(threading.current_thread().name == "test-portal")

    real = portal.submit

    def submit_then_interrupt(coro):
        real(coro)
        assert suspended.wait(BOUND_S)
        raise SystemExit(0)

    portal.submit = submit_then_interrupt
    with pytest.raises(SystemExit):
        portal.call(attempt())
    assert cleanups == [True]


def test_an_interrupt_before_the_loop_took_the_coroutine_closes_it_unstarted(portal, recwarn):
    import gc

    started: list[bool] = []

    async def attempt() -> None:
        started.append(True)

    def submit_interrupted(coro):
        raise SystemExit(0)

    portal.call(value(1))  # the loop is running
    portal.submit = submit_interrupted
    with pytest.raises(SystemExit):
        portal.call(attempt())
    gc.collect()
    assert started == []
    assert not [w for w in recwarn if "was never awaited" in str(w.message)]
