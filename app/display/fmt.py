"""Number and time formatting for everything the dashboard shows (pages, the monitor's KPI tiles,
the provider table, tables of audit entries): one place decides how a percent, a duration, a cost or
a UTC time looks. Machine-readable exports (the CSV's ISO times) are formatted where they are made."""

from __future__ import annotations

from datetime import UTC, datetime


def pct(share: float | None, digits: int = 1) -> str:
    """A 0..1 share as a percent string; ``-`` when unknown."""
    if share is None:
        return "-"
    return f"{share * 100:.{digits}f} %"


def ratio_pct(ratio: float) -> str:
    """A ratio the operator set (canary ratio, fault rates) as typed: ``25 %``, ``12.5 %``."""
    return f"{ratio * 100:g} %"


def ms(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 10_000:
        return f"{value / 1000:.1f} s"
    return f"{value:.0f} ms"


def usd(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "$0"
    if abs(value) < 0.01:
        return f"${value:.6f}"
    return f"${value:,.4f}"


def utc_time(epoch: float, *, seconds: bool = True) -> str:
    """An epoch time as UTC wall-clock text: ``2026-11-30 06:30:15`` (``2026-11-30 06:30`` without
    seconds)."""
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def when(epoch: float | None) -> str:
    """An epoch time as UTC text; ``never`` for 0 or None (a setting nobody has written)."""
    if not epoch:
        return "never"
    return f"{utc_time(epoch)} UTC"


def ago(epoch: float | None, now: float) -> str:
    if not epoch:
        return "never"
    s = max(0.0, now - epoch)
    if s < 60:
        return f"{s:.0f} s ago"
    if s < 3600:
        return f"{s / 60:.0f} min ago"
    if s < 86400:
        return f"{s / 3600:.1f} h ago"
    return f"{s / 86400:.1f} days ago"
