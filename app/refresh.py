"""Values kept fresh by a background thread, so the request path never waits on the database.

A :class:`Refresher` owns one daemon thread that re-loads every registered value (the canary
ratio, each simulated upstream's fault settings) every ``interval_s`` seconds. Readers take the
last loaded value from a :class:`Refreshed` without a lock or any I/O; a failed load keeps the last
good value (and says so in the log), and the value's age is always known, so a process whose
database is unreachable keeps routing on the last ratio and can report how stale it is.

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

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def run_once(self) -> None:
        try:
            self._fn()
        except Exception:  # keep the timer alive; the next run may succeed
            self.failures += 1
            log.warning("%s failed; trying again in %.2fs", self._thread.name, self.interval_s, exc_info=True)
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

    def get(self) -> T:
        return self.value

    def age_s(self) -> float:
        return max(0.0, self._clock() - self.loaded_at)

    def reload(self) -> bool:
        """Load now; on failure keep the last value and return ``False``."""
        with self._reload_lock:
            try:
                value = self._loader()
            except Exception as exc:  # noqa: BLE001 - any load error: keep serving the last value
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("refreshing %s failed; keeping the value from %.1fs ago", self.name, self.age_s())
                return False
            self.value, self.loaded_at, self.last_error = value, self._clock(), None
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
        for refreshed in list(self._values.values()):
            refreshed.reload()

    reload_all = tick

    def snapshot(self) -> dict[str, RefreshedState]:
        return {n: RefreshedState(n, r.value, r.age_s(), r.last_error) for n, r in self._values.items()}

    def start(self) -> Refresher:
        self._timer.start()
        return self

    def stop(self) -> None:
        self._timer.stop()
