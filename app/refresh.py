"""Values kept fresh by a background thread, so the request path never waits on the database.

A :class:`Refresher` owns one daemon thread that re-loads every registered value (the canary
ratio, each simulated upstream's fault settings) every ``interval_s`` seconds. Readers take the
last loaded value from a :class:`Refreshed` without a lock or any I/O; a failed load keeps the last
good value, and the value's age is always known, so a process whose database is unreachable keeps
routing on the last ratio and can report how stale it is.

An outage is logged once, not once a tick (:class:`OutageLog`): one warning line when a timer's
runs start failing (the error's kind and first line, no traceback), one when they work again (how
many runs failed, for how long); the runs in between log at DEBUG, with the traceback.

:class:`Periodic` is the timer both the refresher and the guardrail run on. Its clock and its wait
are injectable: tests call :meth:`Refresher.tick` / :meth:`Periodic.run_once` directly with a fake
clock and never sleep.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


def first_line(exc: BaseException) -> str:
    """``Kind: first line`` of an error: a database driver's later lines are SQL and a link."""
    orig = getattr(exc, "orig", None)  # SQLAlchemy's DBAPIError: the driver's own message
    shown = orig if isinstance(orig, BaseException) else exc
    text = (str(shown).strip().splitlines() or [""])[0][:300]
    return f"{type(shown).__name__}: {text}" if text else type(shown).__name__


class OutageLog:
    """Logs a repeated job's failures once per outage: :meth:`failed` after each failed run,
    :meth:`ok` after each good one. The clock is injectable (tests)."""

    def __init__(self, what: str, *, clock: Callable[[], float] = time.monotonic, logger: logging.Logger = log):
        self.what = what
        self._clock = clock
        self._log = logger
        self.failing_since: float | None = None
        self.failed_runs = 0

    def failed(self, reason: str, retry_s: float, exc: BaseException | None = None) -> None:
        """``reason``: one line (see :func:`first_line`); ``exc``'s traceback goes to DEBUG only."""
        self.failed_runs += 1
        if self.failing_since is None:
            self.failing_since = self._clock()
            self._log.warning(
                "%s failing: %s; retrying every %.2g s, logged again when it recovers", self.what, reason, retry_s
            )
        self._log.debug("%s failed (%d runs so far)", self.what, self.failed_runs, exc_info=exc)

    def ok(self) -> None:
        if self.failing_since is None:
            return
        lasted = self._clock() - self.failing_since
        self._log.warning("%s recovered after %d failed runs over %.1f s", self.what, self.failed_runs, lasted)
        self.failing_since, self.failed_runs = None, 0


class Periodic:
    """Call ``fn`` every ``interval_s`` seconds on a daemon thread until :meth:`stop`.

    An exception from ``fn`` is logged and the timer keeps going: one failed check must not end
    the guardrail or the refresher for the life of the process.
    """

    def __init__(
        self, fn: Callable[[], Any], interval_s: float, *, name: str, stop: threading.Event | None = None
    ) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be greater than 0")
        self._fn = fn
        self.interval_s = interval_s
        self._stop = stop or threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.runs = 0
        self.failures = 0
        self.outage = OutageLog(name)

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def run_once(self) -> None:
        try:
            self._fn()
        except Exception as exc:  # noqa: BLE001 - keep the timer alive; the next run may succeed
            self.failures += 1
            self.outage.failed(first_line(exc), self.interval_s, exc)
        else:
            self.outage.ok()
        finally:
            self.runs += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.run_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


class Refreshed(Generic[T]):
    """The last loaded value of one thing; :attr:`value` is a plain attribute read."""

    def __init__(self, name: str, loader: Callable[[], T], clock: Callable[[], float]) -> None:
        self.name = name
        self._loader = loader
        self._clock = clock
        self._reload_lock = threading.Lock()  # only reloads take it, never readers
        self.value: T = loader()  # the first load fails loudly: there is no last good value yet
        self.loaded_at = clock()
        self.last_error: str | None = None
        self.last_exception: BaseException | None = None

    def get(self) -> T:
        return self.value

    def age_s(self) -> float:
        return max(0.0, self._clock() - self.loaded_at)

    def reload(self) -> bool:
        """Load now; on failure keep the last value, note the error and return ``False`` (the
        :class:`Refresher` logs it, once per outage)."""
        with self._reload_lock:
            try:
                value = self._loader()
            except Exception as exc:  # noqa: BLE001 - any load error: keep serving the last value
                self.last_error, self.last_exception = first_line(exc), exc
                return False
            self.value, self.loaded_at, self.last_error, self.last_exception = value, self._clock(), None, None
            return True


@dataclass(frozen=True)
class RefreshedState:
    name: str
    value: Any
    age_s: float
    last_error: str | None


class Refresher:
    """Keeps a set of :class:`Refreshed` values current from one background thread."""

    def __init__(
        self,
        interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        stop: threading.Event | None = None,
        name: str = "gateway-refresher",
    ) -> None:
        self._clock = clock
        self._values: dict[str, Refreshed[Any]] = {}
        self._timer = Periodic(self.tick, interval_s, name=name, stop=stop)
        self.outage = OutageLog(name, clock=clock)

    @property
    def interval_s(self) -> float:
        return self._timer.interval_s

    def add(self, name: str, loader: Callable[[], T]) -> Refreshed[T]:
        """Register a value; it is loaded once now (raising if that fails) and then every interval."""
        if name in self._values:
            raise ValueError(f"{name!r} is already refreshed")
        refreshed = Refreshed(name, loader, self._clock)
        self._values[name] = refreshed
        return refreshed

    def tick(self) -> None:
        """Reload every value once (what the thread does each interval; tests call it directly)."""
        failed = [r for r in list(self._values.values()) if not r.reload()]
        if failed:
            names = ", ".join(r.name for r in failed)
            reason = f"{failed[0].last_error} (keeping the last values of {names})"
            self.outage.failed(reason, self.interval_s, failed[0].last_exception)
        else:
            self.outage.ok()

    reload_all = tick

    def snapshot(self) -> dict[str, RefreshedState]:
        return {n: RefreshedState(n, r.value, r.age_s(), r.last_error) for n, r in self._values.items()}

    def start(self) -> Refresher:
        self._timer.start()
        return self

    def stop(self) -> None:
        self._timer.stop()
