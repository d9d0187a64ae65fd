"""The canary's rules, stated once: the ratio's range and the guardrail's settings with their
bounds and defaults. The config file, the database, the guardrail, the CLI and the canary page
all validate against these.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import InvalidRequest

# The canary side of a request to a [routes] entry: its route's canary deployment (``route_canary``)
# or the route's own deployments (``route``). They are not sides of the global canary, whose split
# (``primary`` / ``fallback``) the ratio's reports count.
ROUTE_SIDES = frozenset({"route", "route_canary"})

RATIO_MIN = 0.0
RATIO_MAX = 1.0
WINDOW_MINUTES_MAX = 60  # the guardrail reads per-minute rollups; an hour is the longest window


def ratio_in_range(value: float) -> bool:
    """The one range check for a canary ratio (0 = all traffic to the fallback, 1 = all primary)."""
    return math.isfinite(value) and RATIO_MIN <= value <= RATIO_MAX


class GuardrailSettings(BaseModel):
    """When the guardrail rolls the canary back: the primary's error rate over the window is above
    the threshold, with at least ``min_requests`` attempts in it. The ``[guardrail]`` table of the
    config gives the defaults; the canary page stores overrides in the database.

    On by default: an operator who has not turned it on still gets a rollback when the primary
    fails most of its attempts. 20 % over 5 minutes is far above a
    healthy provider's few percent and well below an outage's, and 20 attempts keep one unlucky
    minute of light traffic from tripping it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = True
    error_rate_threshold: float = Field(default=0.2, gt=0, le=1)
    window_minutes: int = Field(default=5, ge=1, le=WINDOW_MINUTES_MAX)
    min_requests: int = Field(default=20, ge=1)

    @classmethod
    def checked(
        cls, *, enabled: bool, error_rate_threshold: float, window_minutes: int, min_requests: int
    ) -> GuardrailSettings:
        """Validated settings, or :class:`InvalidRequest` phrased for the operator."""
        try:
            return cls(
                enabled=bool(enabled),
                error_rate_threshold=error_rate_threshold,
                window_minutes=window_minutes,
                min_requests=min_requests,
            )
        except ValidationError as exc:
            field = str(exc.errors()[0]["loc"][0])
            raise InvalidRequest(_GUARDRAIL_MESSAGES.get(field, str(exc))) from None


_GUARDRAIL_MESSAGES = {
    "error_rate_threshold": "error-rate threshold must be above 0 % and at most 100 %",
    "window_minutes": f"window must be 1 to {WINDOW_MINUTES_MAX} minutes",
    "min_requests": "minimum requests must be at least 1",
}
