"""Circuit breaker per provider: stop paying every attempt and backoff of a provider that is down.

States, as in the classic pattern (Nygard, *Release It!*):

- **closed**: requests flow; each attempt's outcome is counted in a sliding window of
  ``window_s`` seconds (one-second buckets). When the window holds at least ``min_attempts``
  attempts and the share of failures reaches ``failure_rate``, the breaker **opens**.
- **open**: the provider is skipped (the router fails over at once) for ``cooldown_s`` seconds.
- **half-open**: after the cooldown exactly one request is let through as a probe; every other
  request is still refused. The probe's success closes the breaker (with a fresh window); its
  failure opens it again for another cooldown. A probe that never reports back (its caller
  vanished) is given up after ``cooldown_s`` and another probe is allowed.

Only failures that say something about the provider's health count (5xx, timeouts, connection
errors, malformed answers, rate limits); a request the provider refused for its own content (400,
413, 422) is the caller's fault and counts as neither. The caller decides which is which and
passes ``ok``.

Pure and clocked from outside: every method takes ``now`` (monotonic seconds), so the router, the
async server and the tests drive it with their own clock. Thread-safe under the ``lock`` its owner
hands it (the drivers hand a thread lock; with none it is for one thread, as the tests use it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Literal

State = Literal["closed", "open", "half_open"]
STATES: tuple[State, ...] = ("closed", "open", "half_open")


@dataclass(frozen=True)
class BreakerPolicy:
    window_s: int = 30
    min_attempts: int = 10
    failure_rate: float = 0.5
    cooldown_s: float = 15.0
    enabled: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.window_s <= 3600:
            raise ValueError(f"breaker window_s must be from 1 to 3600 seconds, got {self.window_s}")
        if not 1 <= self.min_attempts <= 1_000_000:
            raise ValueError(f"breaker min_attempts must be from 1 to 1000000, got {self.min_attempts}")
        if not 0.0 < self.failure_rate <= 1.0:
            raise ValueError(f"breaker failure_rate must be above 0 and at most 1, got {self.failure_rate}")
        if not 0.0 < self.cooldown_s <= 3600.0:
            raise ValueError(f"breaker cooldown_s must be above 0 and at most 3600 seconds, got {self.cooldown_s}")


@dataclass(frozen=True)
class BreakerSnapshot:
    state: State
    attempts: int  # in the current window
    failures: int
    opened_at: float | None
    retry_at: float | None  # when an open breaker lets its next probe through
    cooled: bool = False  # open, and its cooldown is over: the next request is let through as a probe

    @property
    def reported_state(self) -> State:
        """The state as other processes and ``/metrics`` are told: an open breaker whose cooldown
        is over refuses nothing any more (the next request probes), so it is reported half-open;
        otherwise :attr:`state`. An idle process then never reports "open" for hours."""
        return "half_open" if self.cooled else self.state


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        policy: BreakerPolicy | None = None,
        on_change: Callable[[str, State, State, str], None] | None = None,
        lock: AbstractContextManager[object] | None = None,
    ):
        self.name = name
        self.policy = policy or BreakerPolicy()
        self._on_change = on_change
        self._lock: AbstractContextManager[object] = lock if lock is not None else nullcontext()
        self._state: State = "closed"
        self._buckets: deque[list[int]] = deque()  # [second, attempts, failures], oldest first
        self._attempts = 0  # sums over _buckets
        self._failures = 0
        self._opened_at: float | None = None
        self._probe_started: float | None = None

    # -- decisions -----------------------------------------------------------------------------
    def allow(self, now: float) -> bool:
        """May a request go to this provider now? In half-open this hands out the one probe."""
        if not self.policy.enabled:
            return True
        with self._lock:
            if self._state == "closed":
                return True
            if self._state == "open":
                assert self._opened_at is not None
                if now - self._opened_at < self.policy.cooldown_s:
                    return False
                self._move("half_open", "cooldown over: one probe allowed")
                self._probe_started = now
                return True
            # half-open: one probe at a time; a probe lost without a report is replaced
            if self._probe_started is not None and now - self._probe_started < self.policy.cooldown_s:
                return False
            self._probe_started = now
            return True

    def record(self, ok: bool, now: float) -> None:
        """Report one attempt's outcome (``ok=False`` only for provider-health failures)."""
        if not self.policy.enabled:
            return
        with self._lock:
            if self._state == "half_open":
                self._probe_started = None
                if ok:
                    self._buckets.clear()
                    self._attempts = self._failures = 0
                    self._opened_at = None
                    self._move("closed", "probe succeeded")
                else:
                    self._opened_at = now
                    self._move("open", "probe failed")
                return
            if self._state == "open":
                return  # a straggler from before the breaker opened
            self._count(ok, now)
            attempts, failures = self._totals(now)
            if attempts >= self.policy.min_attempts and failures >= self.policy.failure_rate * attempts:
                self._opened_at = now
                self._move("open", f"{failures}/{attempts} attempts failed in {self.policy.window_s} s")

    def snapshot(self, now: float) -> BreakerSnapshot:
        with self._lock:
            attempts, failures = self._totals(now)
            retry_at = self._opened_at + self.policy.cooldown_s if self._state == "open" and self._opened_at else None
            cooled = retry_at is not None and now >= retry_at
            return BreakerSnapshot(self._state, attempts, failures, self._opened_at, retry_at, cooled)

    @property
    def state(self) -> State:
        return self._state

    # -- internals (under the lock) ------------------------------------------------------------
    def _count(self, ok: bool, now: float) -> None:
        second = int(now)
        if self._buckets and self._buckets[-1][0] == second:
            bucket = self._buckets[-1]
        else:
            bucket = [second, 0, 0]
            self._buckets.append(bucket)
        bucket[1] += 1
        self._attempts += 1
        if not ok:
            bucket[2] += 1
            self._failures += 1

    def _totals(self, now: float) -> tuple[int, int]:
        # Running totals, so a report costs O(1) on the request path, not a sum over the window.
        oldest = int(now) - self.policy.window_s + 1
        while self._buckets and self._buckets[0][0] < oldest:
            _, attempts, failures = self._buckets.popleft()
            self._attempts -= attempts
            self._failures -= failures
        return self._attempts, self._failures

    def _move(self, new: State, why: str) -> None:
        old, self._state = self._state, new
        if self._on_change is not None and old != new:
            self._on_change(self.name, old, new, why)
