"""A blocking portal: sync code runs coroutines and reads async streams on one event loop that
lives in a background thread.

The sync :class:`~app.routing.io.client.RoutingClient` is this portal over the async driver: one
send path, one body limit and one deadline mechanism serve both (the async driver's). Measured on
the library path (``python -m benchmarks.driver_portal``), a call through the portal is no slower
than the sync SDK on httpx2 was; what a portal must not do is cross threads once per read of a
stream, so :meth:`Portal.iterate` pumps a whole stream on the loop into a queue the sync reader
takes from, with a window of items for backpressure (the reader hands credit back in halves, not
per item).

- **Any thread.** ``call`` and ``iterate`` may be used from any thread but the portal's own
  (Streamlit runs each script run in a thread of its own; loadgen calls from a thread pool); from
  the portal's own thread they raise instead of waiting on themselves.
- **Lazy and shared.** The loop and its thread start at the first use; every sync client of the
  process shares them (:data:`PORTAL`).
- **Fork.** A forked child has the loop object but not its thread: the first use in the child
  starts a new loop, and what was built on the parent's (the drivers and their HTTP clients) is
  built again there (:meth:`Portal.generation` tells a holder that it must).
- **Exit.** At interpreter exit the drivers registered with :meth:`Portal.on_close` are closed on
  the loop (their connections released, pyreqwest's clients let go of before the interpreter
  finalizes them), and the loop is stopped and its thread joined.
- **Cancellation.** A sync caller that stops reading a stream (``close()``, ``break``, the
  generator dropped) cancels the stream's task on the loop and waits for it to end, so the attempt
  is logged as cancelled and the upstream connection released before ``close()`` returns; an
  exception in the sync caller while it waits (``KeyboardInterrupt``) cancels the coroutine.
  Exceptions reach the sync caller as raised on the loop: the same object, the same class.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import os
import queue
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

from app.routing.errors import ClientClosedError

__all__ = ["PORTAL", "Portal", "PortalError"]

log = logging.getLogger(__name__)
T = TypeVar("T")

WINDOW = 16  # items a stream's pump may read ahead of its sync reader
CLOSE_WAIT_S = 5.0  # how long a stream's close, or the exit, waits for the loop to finish the work
_ITEM, _END, _ERROR = 0, 1, 2


class PortalError(RuntimeError):
    """The portal was used from its own loop's thread, where waiting for the loop would hang."""


class _Window:
    """A stream pump's credit (on the loop): it takes one before each read, the reader gives them back."""

    __slots__ = ("free", "waiter")

    def __init__(self, size: int):
        self.free = size
        self.waiter: asyncio.Future[None] | None = None

    async def take(self) -> None:
        while self.free <= 0:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        self.free -= 1

    def give(self, n: int) -> None:
        self.free += n
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Portal:
    """One event loop in a daemon thread, started at first use; see the module docstring."""

    def __init__(self, name: str = "routing-portal"):
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._generation = 0
        self._closers: dict[int, Callable[[], Awaitable[None]]] = {}
        self._exit_hooked = False
        os.register_at_fork(after_in_child=self._forget)

    # -- the loop ------------------------------------------------------------------------------
    @property
    def generation(self) -> int:
        """Which loop is current: it changes when a new loop starts (after a fork, after close)."""
        return self._generation

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, started now if there is none in this process."""
        loop = self._loop
        if loop is not None and self._pid == os.getpid():
            return loop
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                self._start()
            assert self._loop is not None
            return self._loop

    def in_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=self._run, args=(loop,), name=self.name, daemon=True)
        self._loop, self._thread, self._pid = loop, thread, os.getpid()
        self._generation += 1
        self._closers.clear()
        thread.start()
        if not self._exit_hooked:
            self._exit_hooked = True
            atexit.register(self.close)

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in tasks:
                    task.cancel()
                if tasks:
                    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                loop.close()

    def _forget(self) -> None:
        """In a forked child: the parent's loop thread is not here; the next use starts another."""
        self._lock = threading.Lock()
        self._loop = None
        self._thread = None
        self._closers = {}
        self._generation += 1  # what was built on the parent's loop is not to be used, nor closed, here

    def on_close(self, owner: object, aclose: Callable[[], Awaitable[None]]) -> None:
        """Run ``aclose()`` on the loop when the portal closes (at exit), unless
        :meth:`discard` takes it back first."""
        self._closers[id(owner)] = aclose

    def discard(self, owner: object) -> None:
        self._closers.pop(id(owner), None)

    def close(self) -> None:
        """Close what was registered, stop the loop and join its thread (at exit; idempotent)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            if loop is None or thread is None or self._pid != os.getpid() or not thread.is_alive():
                self._loop = self._thread = None
                return
            closers, self._closers = list(self._closers.values()), {}
            self._loop = self._thread = None
        if threading.current_thread() is not thread:
            for aclose in closers:
                try:
                    asyncio.run_coroutine_threadsafe(_awaited(aclose), loop).result(CLOSE_WAIT_S)
                except Exception:
                    log.debug("closing a driver on the portal failed", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        if threading.current_thread() is not thread:
            thread.join(CLOSE_WAIT_S)

    # -- calls ---------------------------------------------------------------------------------
    def _check_thread(self) -> None:
        if self.in_loop_thread():
            raise PortalError("a blocking call from the portal's own event loop thread would wait on itself")

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop (from any thread, its own included) without waiting."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its value (or its exception, as raised). An
        exception in the caller while it waits (``KeyboardInterrupt``, a signal's ``SystemExit``)
        cancels the coroutine and waits for it to end (at most :data:`CLOSE_WAIT_S`), so what it
        does on cancellation (the attempt logged as cancelled) happens before the caller goes on
        to shut the process down."""
        ended = threading.Event()

        async def run() -> T:
            try:
                return await coro
            finally:
                ended.set()

        wrapped = run()
        try:
            self._check_thread()
            future = self.submit(wrapped)
        except BaseException:
            # The exception (a signal's SystemExit) can arrive inside submit, before or after the
            # coroutine was handed to the loop: the loop decides, never this thread (closing a
            # coroutine the loop suspended runs its cleanup here, outside the loop, where anyio
            # raises "no running event loop" in place of the SystemExit).
            self._drop(wrapped, coro, ended)
            raise
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise ClientClosedError("the routing portal's event loop stopped during the call") from None
        except BaseException:
            future.cancel()
            ended.wait(CLOSE_WAIT_S)
            raise

    def _drop(self, wrapped: Coroutine[Any, Any, Any], coro: Coroutine[Any, Any, Any], ended: threading.Event) -> None:
        """On the loop, after anything submit had queued (its callbacks run in order): cancel the
        task running ``wrapped`` and wait for it to end (at most :data:`CLOSE_WAIT_S`), or, when it
        was never scheduled, close both coroutines there."""
        loop = self._loop
        if loop is None or loop.is_closed() or self.in_loop_thread():
            wrapped.close()
            coro.close()
            return
        decided = threading.Event()
        cancelled: list[bool] = []

        def drop() -> None:
            try:
                task = next((t for t in asyncio.all_tasks(loop) if t.get_coro() is wrapped), None)
                if task is not None:
                    task.cancel()
                    cancelled.append(True)
                else:
                    wrapped.close()
                    coro.close()
            finally:
                decided.set()

        try:
            loop.call_soon_threadsafe(drop)
        except RuntimeError:  # the loop was closed meanwhile: nothing runs it any more
            return
        if decided.wait(CLOSE_WAIT_S) and cancelled:
            ended.wait(CLOSE_WAIT_S)

    def iterate(self, make: Callable[[], AsyncIterator[T]], window: int = WINDOW) -> Generator[T, None, None]:
        """The items of the async iterator ``make()`` returns, for a sync reader. ``make`` is
        called on the loop at the first ``next()``; a pump task reads at most ``window`` items
        ahead. Closing this generator before the end cancels the pump (and with it the async
        iterator) and waits, at most :data:`CLOSE_WAIT_S`, for it to end."""
        self._check_thread()
        loop = self.loop()
        handoff = _Handoff(loop)
        credit = _Window(window)
        give_back = max(window // 2, 1)

        async def pump() -> None:
            it = make()
            try:
                while True:
                    await credit.take()
                    try:
                        item = await it.__anext__()
                    except StopAsyncIteration:
                        handoff.put(_END, None)
                        return
                    handoff.put(_ITEM, item)
            except asyncio.CancelledError:
                handoff.put(_ERROR, ClientClosedError("the stream was cancelled"))
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the reader, raised there
                handoff.put(_ERROR, exc)
            finally:
                try:
                    aclose = getattr(it, "aclose", None)
                    if aclose is not None:
                        await aclose()
                finally:
                    handoff.ended.set()

        future = asyncio.run_coroutine_threadsafe(pump(), loop)
        taken = 0
        try:
            while True:
                kind, value = handoff.get()
                if kind == _ITEM:
                    taken += 1
                    if taken >= give_back:
                        loop.call_soon_threadsafe(credit.give, taken)
                        taken = 0
                    yield value
                elif kind == _END:
                    return
                else:
                    raise value
        finally:
            if not handoff.ended.is_set():
                future.cancel()
                if not self.in_loop_thread():
                    handoff.ended.wait(CLOSE_WAIT_S)


class _Handoff:
    """Items from the loop to one sync reader. The loop appends; the reader is woken once per
    turn of the loop that appended anything (not per item), and only when it is waiting."""

    __slots__ = ("_flushing", "_items", "_loop", "_signal", "_waiting", "ended")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._items: deque[tuple[int, Any]] = deque()
        self._signal: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._waiting = False
        self._flushing = False
        self.ended = threading.Event()

    def put(self, kind: int, value: Any) -> None:  # on the loop
        self._items.append((kind, value))
        if not self._flushing:
            self._flushing = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:  # on the loop
        self._flushing = False
        if self._waiting:
            self._waiting = False
            self._signal.put(None)

    def get(self) -> tuple[int, Any]:  # in the reader's thread
        items = self._items
        while not items:
            self._waiting = True
            if items:  # appended while the flag was being set: a wake-up may or may not come
                break
            self._signal.get()  # a stale wake-up returns at once; the loop looks again
        return items.popleft()


async def _awaited(aclose: Callable[[], Awaitable[None]]) -> None:
    await aclose()


PORTAL = Portal()
