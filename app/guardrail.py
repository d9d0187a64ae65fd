"""Canary guardrail: roll the canary back to 0 % when the primary fails too often.

The error rate is the primary provider's failed attempts over its attempts in the last
``window_minutes`` (from the minute rollups), counting only the failures that say something about
its health, as its circuit breaker does (:data:`~core.errors.HEALTH_CLASSES`): callers that
went away mid-answer, or requests refused for their own content, neither count as failures nor as
attempts. The rollback only happens with at least ``min_requests`` attempts in the window, so one
unlucky request cannot trip it. The rollback is an ordinary audited canary change with actor
``guardrail``.

The check runs on its own timer (:func:`guardrail_timer`, started by the gateway), never inside the
telemetry writer: a failing check must not make the writer re-write a batch it already committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine

from app.config import Settings
from app.refresh import Periodic
from core.canary import GuardrailSettings
from core.errors import HEALTH_CLASSES
from db.canary import StaleCanaryError, get_guardrail, get_state, set_ratio
from db.monitor import GuardrailReading
from db.monitor import provider_error_rate as _error_rate

log = logging.getLogger(__name__)
ACTOR = "guardrail"
CHECK_EVERY_S = 2.0
__all__ = [
    "ACTOR",
    "CHECK_EVERY_S",
    "GuardrailReading",
    "check_guardrail",
    "guardrail_defaults",
    "guardrail_timer",
    "provider_error_rate",
]


def provider_error_rate(
    engine: Engine, provider: str, window_minutes: int, now: float | None = None
) -> GuardrailReading:
    """What the guardrail reads: ``provider``'s health failures over its attempts in the window."""
    return _error_rate(engine, provider, window_minutes, now, counted=HEALTH_CLASSES)


def guardrail_defaults(settings: Settings) -> GuardrailSettings:
    """The config's guardrail, which applies until the canary page saves one."""
    return settings.guardrail


def check_guardrail(engine: Engine, settings: Settings, now: float | None = None) -> float | None:
    """Roll back if the guardrail trips; returns the error rate that tripped it, else ``None``."""
    g = get_guardrail(engine, guardrail_defaults(settings))
    if not g.enabled:
        return None
    state = get_state(engine)
    if state.ratio <= 0.0:
        return None
    reading = provider_error_rate(engine, settings.routing.primary, g.window_minutes, now)
    if reading.attempts < g.min_requests or reading.error_rate <= g.error_rate_threshold:
        return None
    reason = (
        f"automatic rollback: {settings.routing.primary} error rate {reading.error_rate:.1%} over "
        f"{g.window_minutes} min ({reading.errors}/{reading.attempts}) exceeded {g.error_rate_threshold:.0%}"
    )
    try:
        set_ratio(engine, 0.0, expected_version=state.version, actor=ACTOR, reason=reason)
    except StaleCanaryError:
        log.info("guardrail tripped but the canary changed meanwhile; leaving it as it is")
        return None  # someone acted at the same moment; their decision stands
    log.warning("canary rolled back to 0 %%: %s", reason)
    return reading.error_rate


def guardrail_timer(
    engine: Engine,
    settings: Settings,
    *,
    on_rollback: Callable[[], None],
    interval_s: float = CHECK_EVERY_S,
    stop: threading.Event | None = None,
    wall_clock: Callable[[], float] = time.time,
) -> Periodic:
    """A (not yet started) timer that checks the guardrail every ``interval_s`` seconds and calls
    ``on_rollback`` (the gateway reloads its ratio) when it rolled the canary back."""

    def check() -> None:
        if check_guardrail(engine, settings, now=wall_clock()) is not None:
            on_rollback()

    return Periodic(check, interval_s, name="gateway-guardrail", stop=stop)
