"""Request-log rows for tests: an ok primary attempt with every field a test does not care about
filled in; each test names what it does care about."""

from __future__ import annotations

from typing import Any

from core.records import AttemptRecord

DEFAULTS: dict[str, Any] = dict(
    request_id="r0",
    attempt=1,
    ts=1_700_000_000.0,
    provider="holysheep",
    model="gemini-2.5-flash",
    requested_model="auto",
    intent="general",
    side="primary",
    status="ok",
    latency_ms=12.5,
)


def attempt(**fields: Any) -> AttemptRecord:
    """An :class:`AttemptRecord` of :data:`DEFAULTS` with ``fields`` overriding them."""
    return AttemptRecord(**{**DEFAULTS, **fields})
