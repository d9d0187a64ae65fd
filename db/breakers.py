"""Circuit-breaker and route-deployment health across processes: every gateway process reports its
breakers (``breaker_heartbeat``) and the route deployments it has cooling down
(``deployment_cooldown``) here with a heartbeat, and readers count only the processes still
reporting.

A process rewrites all of its rows in one short transaction (delete its rows, insert the current
ones), so a reader never sees half a report. A row whose ``beat_at`` is older than :data:`LIVE_S`
belongs to a process that stopped reporting (exited, killed, or cut off from the database): it no
longer counts, and the next report of any process deletes rows older than :data:`FORGET_S`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Engine, Table, delete, insert, select

from core.text import storable
from db.models import BreakerHeartbeat, DeploymentCooldown

HEARTBEAT_S = 5.0  # how often a process reports
LIVE_S = 3 * HEARTBEAT_S  # three missed reports: the process no longer counts
FORGET_S = 3600.0  # rows of processes silent this long are deleted
SEVERITY = {"closed": 0, "half_open": 1, "open": 2}
HEARTBEAT: Table = BreakerHeartbeat.__table__  # type: ignore[assignment]  # a mapped class's Table
COOLDOWNS: Table = DeploymentCooldown.__table__  # type: ignore[assignment]


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
    cooldowns: Mapping[str, float] | None = None,
) -> None:
    """Replace ``process``'s report with ``breakers`` (``{provider: ReportedBreaker}``) and
    ``cooldowns`` (``{deployment: wall time its cooldown ends}``)."""
    t, c = HEARTBEAT, COOLDOWNS
    who = {"beat_at": now, "pid": int(pid), "host": storable(host, 128) or "?", "source": storable(source, 32) or "?"}
    cooling = [
        {"process": process, "deployment": storable(d, 200) or "?", "until": float(until), **who}
        for d, until in sorted((cooldowns or {}).items())
        if math.isfinite(until) and until > now
    ]
    rows = [
        {
            "process": process,
            "provider": storable(provider, 64) or "?",
            "state": b.state if b.state in SEVERITY else "closed",
            "since": b.since,
            **who,
        }
        for provider, b in sorted(breakers.items())
    ]
    with engine.begin() as conn:
        conn.execute(delete(t).where(t.c.process == process))
        conn.execute(delete(t).where(t.c.beat_at < now - FORGET_S))
        if rows:
            conn.execute(insert(t), rows)
        conn.execute(delete(c).where(c.c.process == process))
        conn.execute(delete(c).where(c.c.beat_at < now - FORGET_S))
        if cooling:
            conn.execute(insert(c), cooling)


def forget(engine: Engine, process: str) -> None:
    """Delete ``process``'s report (its clean exit)."""
    with engine.begin() as conn:
        for t in (HEARTBEAT, COOLDOWNS):
            conn.execute(delete(t).where(t.c.process == process))


@dataclass(frozen=True)
class LiveCooldown:
    """A route deployment cooling down in one live process: until when (wall time) and where."""

    until: float
    pid: int
    host: str
    source: str

    def left_s(self, now: float) -> float:
        return max(0.0, self.until - now)


def live_cooldowns(engine: Engine, *, now: float, live_s: float = LIVE_S) -> dict[str, list[LiveCooldown]]:
    """Each route deployment (``"provider/model"``) cooling down at ``now`` in a process that
    reported within ``live_s`` seconds, longest left first; deployments cooling nowhere are
    absent."""
    c = COOLDOWNS
    q = (
        select(c.c.deployment, c.c.until, c.c.pid, c.c.host, c.c.source)
        .where(c.c.beat_at >= now - live_s, c.c.until > now)
        .order_by(c.c.deployment, c.c.until.desc(), c.c.pid)
    )
    out: dict[str, list[LiveCooldown]] = {}
    with engine.connect() as conn:
        for r in conn.execute(q):
            out.setdefault(r.deployment, []).append(LiveCooldown(float(r.until), int(r.pid), r.host, r.source))
    return out


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
