"""Circuit-breaker state across processes: every gateway process reports its breakers here with a
heartbeat (``breaker_heartbeat``), and readers count only the processes still reporting.

A process rewrites all of its rows in one short transaction (delete its rows, insert the current
ones), so a reader never sees half a report. A row whose ``beat_at`` is older than :data:`LIVE_S`
belongs to a process that stopped reporting (exited, killed, or cut off from the database): it no
longer counts, and the next report of any process deletes rows older than :data:`FORGET_S`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Engine, Table, delete, insert, select

from core.text import storable
from db.models import BreakerHeartbeat

HEARTBEAT_S = 5.0  # how often a process reports
LIVE_S = 3 * HEARTBEAT_S  # three missed reports: the process no longer counts
FORGET_S = 3600.0  # rows of processes silent this long are deleted
SEVERITY = {"closed": 0, "half_open": 1, "open": 2}
HEARTBEAT: Table = BreakerHeartbeat.__table__  # type: ignore[assignment]  # a mapped class's Table


@dataclass(frozen=True)
class ReportedBreaker:
    """One provider's breaker in one process: its state now and the wall time it moved there."""

    state: str
    since: float | None = None


@dataclass(frozen=True)
class LiveBreaker:
    """One provider's breaker across the live processes: the worst state any of them holds
    (open > half_open > closed), since when (the earliest among those holding it), and how many
    live processes report it, and hold that worst state."""

    state: str
    since: float | None
    processes: int
    holding: int


def beat(
    engine: Engine,
    *,
    process: str,
    breakers: Mapping[str, ReportedBreaker],
    now: float,
    pid: int,
    host: str,
    source: str,
) -> None:
    """Replace ``process``'s report with ``breakers`` (``{provider: ReportedBreaker}``)."""
    t = HEARTBEAT
    rows = [
        {
            "process": process,
            "provider": storable(provider, 64) or "?",
            "state": b.state if b.state in SEVERITY else "closed",
            "since": b.since,
            "beat_at": now,
            "pid": int(pid),
            "host": storable(host, 128) or "?",
            "source": storable(source, 32) or "?",
        }
        for provider, b in sorted(breakers.items())
    ]
    with engine.begin() as conn:
        conn.execute(delete(t).where(t.c.process == process))
        conn.execute(delete(t).where(t.c.beat_at < now - FORGET_S))
        if rows:
            conn.execute(insert(t), rows)


def forget(engine: Engine, process: str) -> None:
    """Delete ``process``'s report (its clean exit)."""
    t = HEARTBEAT
    with engine.begin() as conn:
        conn.execute(delete(t).where(t.c.process == process))


def live_breakers(engine: Engine, *, now: float, live_s: float = LIVE_S) -> dict[str, LiveBreaker]:
    """Each provider's breaker across the processes that reported within ``live_s`` seconds of
    ``now``; providers no live process reports are absent."""
    t = HEARTBEAT
    q = select(t.c.provider, t.c.state, t.c.since).where(t.c.beat_at >= now - live_s)
    per: dict[str, list[tuple[str, float | None]]] = {}
    with engine.connect() as conn:
        for r in conn.execute(q):
            per.setdefault(r.provider, []).append((r.state, None if r.since is None else float(r.since)))
    return {provider: combine(reports) for provider, reports in per.items()}


def combine(reports: list[tuple[str, float | None]]) -> LiveBreaker:
    """The fleet's view of one breaker from its live processes' ``(state, since)`` reports."""
    worst = max((s for s, _ in reports), key=lambda s: SEVERITY.get(s, 0))
    holding = [since for s, since in reports if s == worst]
    known = [s for s in holding if s is not None]
    return LiveBreaker(worst, min(known) if known else None, len(reports), len(holding))
