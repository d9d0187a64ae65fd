"""Canary split: which side (primary gateway or fallback provider) a request goes to.

With a session id the assignment is sticky: the id hashes to a fixed point in [0, 1) and the
request goes to the primary when that point is below the ratio. A conversation therefore keeps its
provider (and that provider's prefix cache), and raising the ratio only moves sessions from the
fallback to the primary, never back. Without a session id the draw is random.

The ratio lives in the database; the gateway's background refresher (:mod:`app.refresh`) re-reads
it every ``routing.ratio_refresh_s`` seconds (0.5 s by default), so a change made by any process
reaches every router within a second without a database read on the request path.
"""

from __future__ import annotations

import hashlib
import random
from functools import lru_cache
from typing import Literal

Side = Literal["primary", "fallback"]
#: A planned request's side: the global canary's, or a route's (``core.canary.ROUTE_SIDES``).
PlanSide = Literal["primary", "fallback", "route", "route_canary"]


@lru_cache(maxsize=65_536)  # busy sessions come back turn after turn; skip re-hashing them
def session_point(session_id: str) -> float:
    """A stable point in [0, 1) for a session id (first 64 bits of its SHA-256)."""
    digest = hashlib.sha256(session_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_side(ratio: float, session_id: str | None, rng: random.Random | None = None) -> Side:
    point = session_point(session_id) if session_id else (rng or random).random()
    return "primary" if point < ratio else "fallback"
