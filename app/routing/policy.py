"""The routing decisions as pure functions of plain inputs: retry, resend without hints, fail over
or stop; which attempts count against a provider's breaker; deadline arithmetic (a request's
:class:`Deadline`, an attempt's :class:`AttemptDeadline`).

No I/O, no clock, no randomness here: the routing core (:class:`app.routing.core.RoutingCore`)
reads its injected clock, draws the backoff from its injected randomness and asks these functions
what to do next; the two drivers (:class:`app.routing.io.client.RoutingClient`,
:class:`app.routing.io.async_client.AsyncRoutingClient`) only perform the I/O it decides. Tested once,
without a network (``tests/unit/routing/test_policy.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from app.routing.errors import Failure

Action = Literal["retry", "resend_without_hints", "fail_over", "stop"]


@dataclass(frozen=True)
class Step:
    """What to do after a failed attempt; ``delay_s`` is the sleep before a retry."""

    action: Action
    reason: str
    delay_s: float = 0.0


@dataclass(frozen=True)
class Deadline:
    """A point on a monotonic clock by which something must be over."""

    start: float
    end: float

    @classmethod
    def after(cls, now: float, seconds: float) -> Deadline:
        return cls(now, now + seconds)

    def remaining(self, now: float) -> float:
        return self.end - now

    def passed(self, now: float) -> bool:
        return now >= self.end


class AttemptDeadline:
    """One attempt's deadlines on the router's monotonic ``clock`` (injected: the core reads no
    clock of its own).

    ``end``: by when the attempt must be over (non-streamed: the attempt's timeout, capped by the
    request deadline; streamed: the request deadline). ``first_token_by``: by when a stream must
    deliver text (cleared by :meth:`first_token`). ``idle_s``: the longest gap between chunks.
    The drivers enforce it (:mod:`app.routing.io.deadline`); this only says what is left and what
    has passed."""

    __slots__ = ("clock", "end", "first_token_by", "idle_s")

    def __init__(
        self,
        clock: Callable[[], float],
        end: float,
        *,
        first_token_by: float | None = None,
        idle_s: float | None = None,
    ):
        self.clock = clock
        self.end = end
        self.first_token_by = first_token_by
        self.idle_s = idle_s

    def first_token(self) -> None:
        self.first_token_by = None

    def time_left(self, now: float, *, body: bool = False) -> float:
        left = self.end - now
        if self.first_token_by is not None:
            left = min(left, self.first_token_by - now)
        if body and self.idle_s is not None:
            left = min(left, self.idle_s)
        return left

    def overdue(self, now: float) -> str | None:
        """Which deadline has passed at ``now``, in words, or None while time is left."""
        if now >= self.end:
            return "the attempt's deadline passed"
        if self.first_token_by is not None and now >= self.first_token_by:
            return "no first token before the time-to-first-token deadline"
        return None


def attempt_budget_s(attempt_timeout_s: float, request_remaining_s: float) -> float:
    """An attempt gets its own timeout, but never more than what is left of the request's deadline."""
    return max(0.0, min(attempt_timeout_s, request_remaining_s))


def max_attempts_for(provider_max: int | None, retry_max: int) -> int:
    """A provider's attempts per request: its own ``max_attempts`` (1 for a retrying gateway), else
    the ``[retry]`` default."""
    return provider_max if provider_max is not None else retry_max


def wants_retry(failure: Failure, attempts_made: int, max_attempts: int, retry_after_cap_s: float) -> bool:
    """Whether a retry on the same provider is possible at all (before any backoff is drawn)."""
    if not failure.retryable or attempts_made >= max_attempts:
        return False
    return failure.retry_after_s is None or failure.retry_after_s <= retry_after_cap_s


def next_step(
    failure: Failure,
    *,
    attempts_made: int,
    max_attempts: int,
    hints_dropped: bool,
    retry_after_cap_s: float,
    delay_s: float | None,
    remaining_s: float,
) -> Step:
    """The next step after ``failure``, the ``attempts_made``-th attempt on this provider.

    ``delay_s`` is the backoff the driver drew for a retry (``None``: none drawn, or over the total
    wait budget); ``remaining_s`` is what is left of the request's deadline. A retry whose sleep
    would not leave time to try again fails over instead; so does a ``Retry-After`` beyond the cap
    (waiting the capped time would only be refused again)."""
    if failure.hint_rejection and not hints_dropped:
        return Step("resend_without_hints", "the provider rejected the cache hints")
    if failure.retryable and attempts_made < max_attempts:
        ra = failure.retry_after_s
        if ra is not None and ra > retry_after_cap_s:
            reason = f"Retry-After {ra:g} s is beyond retry_after_cap_s {retry_after_cap_s:g} s"
        elif delay_s is None:
            reason = "the retry wait budget is spent"
        elif delay_s >= remaining_s:
            reason = "the request deadline leaves no time for a retry"
        else:
            return Step("retry", "retryable failure", delay_s)
    elif failure.retryable:
        reason = f"{attempts_made} of {max_attempts} attempts failed"
    else:
        reason = "not retryable"
    if failure.fallback:
        return Step("fail_over", reason)
    return Step("stop", "the request itself was refused")


def breaker_outcome(failure: Failure | None) -> bool | None:
    """What an attempt reports to its provider's breaker: ``True`` (healthy), ``False`` (a
    provider-health failure) or ``None`` (says nothing about the provider: the request's own fault,
    a cancelled stream, a key not configured)."""
    if failure is None:
        return True
    return False if failure.provider_health else None
