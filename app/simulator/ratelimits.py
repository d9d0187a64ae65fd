"""The ``x-ratelimit-*`` headers of the simulator: what one minute's budget of requests and tokens
has left, as OpenAI reports it on every answer.

The simulator never refuses for this budget (the rate-limit fault does that); it only reports it,
so clients that read the headers see plausible, moving values. Usage is counted in one-second
buckets over a sliding minute, so memory stays bounded at any request rate.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["RateWindow", "format_reset"]

WINDOW_S = 60


def format_reset(seconds: float) -> str:
    """OpenAI's duration style: ``"17ms"``, ``"1.5s"``, ``"6m0s"``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    if minutes:
        return f"{int(minutes)}m{round(rest)}s"
    return f"{round(rest, 3):g}s"


class RateWindow:
    """Requests and tokens of the last minute against per-minute limits."""

    def __init__(
        self,
        requests_per_minute: int = 10_000,
        tokens_per_minute: int = 30_000_000,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self._clock = clock
        self._buckets: deque[list[int]] = deque()  # [second, requests, tokens]
        self._lock = threading.Lock()

    def record(self, tokens: int) -> dict[str, str]:
        """Count one request of ``tokens`` and return the headers that report the budget left."""
        now = self._clock()
        second = int(now)
        with self._lock:
            while self._buckets and self._buckets[0][0] <= second - WINDOW_S:
                self._buckets.popleft()
            if self._buckets and self._buckets[-1][0] == second:
                self._buckets[-1][1] += 1
                self._buckets[-1][2] += tokens
            else:
                self._buckets.append([second, 1, tokens])
            requests = sum(b[1] for b in self._buckets)
            used = sum(b[2] for b in self._buckets)
            oldest = self._buckets[0][0]
        reset = oldest + WINDOW_S - now
        return {
            "x-ratelimit-limit-requests": str(self.requests_per_minute),
            "x-ratelimit-remaining-requests": str(max(0, self.requests_per_minute - requests)),
            "x-ratelimit-limit-tokens": str(self.tokens_per_minute),
            "x-ratelimit-remaining-tokens": str(max(0, self.tokens_per_minute - used)),
            "x-ratelimit-reset-requests": format_reset(reset),
            "x-ratelimit-reset-tokens": format_reset(reset),
        }
