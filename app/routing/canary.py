"""Canary split: which side (primary gateway or fallback provider) a request goes to.

With a session id the assignment is sticky: the id hashes to a fixed point in [0, 1) and the
request goes to the primary when that point is below the ratio. A conversation therefore keeps its
provider (and that provider's prefix cache), and raising the ratio only moves sessions from the
fallback to the primary, never back. Without a session id the draw is random.

The ratio lives in the database; :class:`RatioCache` re-reads it at most every ``ttl_s`` seconds
(0.5 s by default), so a change made by any process reaches every router within a second without
a database read per request.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Generic, Literal, TypeVar

Side = Literal["primary", "fallback"]
T = TypeVar("T")
log = logging.getLogger(__name__)


def session_point(session_id: str) -> float:
    """A stable point in [0, 1) for a session id (first 64 bits of its SHA-256)."""
    digest = hashlib.sha256(session_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_side(ratio: float, session_id: str | None, rng: random.Random | None = None) -> Side:
    point = session_point(session_id) if session_id else (rng or random).random()
    return "primary" if point < ratio else "fallback"


class Refreshing(Generic[T]):
    """A value re-loaded at most every ``ttl_s`` seconds; the last good value survives a failed load."""

    def __init__(self, loader: Callable[[], T], ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self._loader = loader
        self._ttl = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._value: T | None = None
        self._loaded_at = float("-inf")

    def get(self) -> T:
        now = self._clock()
        if now - self._loaded_at < self._ttl and self._value is not None:
            return self._value
        with self._lock:
            if self._clock() - self._loaded_at < self._ttl and self._value is not None:
                return self._value
            try:
                self._value = self._loader()
            except Exception:
                if self._value is None:
                    raise
                log.warning("refresh failed; keeping the last value", exc_info=True)
            self._loaded_at = self._clock()
            return self._value  # type: ignore[return-value]

    def invalidate(self) -> None:
        with self._lock:
            self._loaded_at = float("-inf")
