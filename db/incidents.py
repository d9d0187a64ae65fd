"""The incident banner's SQL: a window's circuit-breaker transitions (``ops_event``) and the error
classes a provider's failed rows carry (``request_log``), both ``ts``-indexed range reads bounded
by the caller's lookback. What they mean (where an incident starts) is :mod:`app.monitor.incidents`.
"""

from __future__ import annotations

from sqlalchemy import Engine, func, select

from db.events import breaker_state_of
from db.models import OpsEvent, RequestLog

MAX_TRANSITIONS = 5000  # a breaker cycling every 15 s writes ~500 an hour


def breaker_transitions(
    engine: Engine, *, since: float, until: float, limit: int = MAX_TRANSITIONS
) -> dict[str, list[tuple[float, str]]]:
    """``{provider: [(ts, state moved to), ...]}`` oldest first, for ``since <= ts <= until`` (the
    newest ``limit`` transitions when there are more)."""
    e = OpsEvent.__table__
    q = (
        select(e.c.ts, e.c.provider, e.c.detail)
        .where(e.c.kind == "breaker", e.c.ts >= since, e.c.ts <= until)
        .order_by(e.c.ts.desc())
        .limit(limit)
    )
    out: dict[str, list[tuple[float, str]]] = {}
    with engine.connect() as conn:
        for r in conn.execute(q):
            if r.provider:
                out.setdefault(r.provider, []).append((float(r.ts), breaker_state_of(r.detail)))
    for changes in out.values():
        changes.reverse()
    return out


def error_classes(engine: Engine, *, provider: str, since: float, until: float) -> list[tuple[str, int]]:
    """The provider's failed rows in ``[since, until]`` counted by error class, most frequent first
    (a row without a class counts as ``error``)."""
    log = RequestLog.__table__
    q = (
        select(log.c.error_class, func.count())
        .where(log.c.ts >= since, log.c.ts <= until, log.c.provider == provider, log.c.status != "ok")
        .group_by(log.c.error_class)
    )
    counts: dict[str, int] = {}
    with engine.connect() as conn:
        for cls, n in conn.execute(q):
            # Grouped on the bare column (PostgreSQL would not match a bound COALESCE default
            # between SELECT and GROUP BY); a row without a class counts as ``error``.
            key = str(cls) if cls is not None else "error"
            counts[key] = counts.get(key, 0) + int(n)
    rows = list(counts.items())
    return sorted(rows, key=lambda r: (-r[1], r[0]))


def first_failure(engine: Engine, *, provider: str, since: float, until: float) -> float | None:
    """When the provider's first failed row in ``[since, until]`` started (``None``: none failed)."""
    log = RequestLog.__table__
    q = select(func.min(log.c.ts)).where(
        log.c.ts >= since, log.c.ts <= until, log.c.provider == provider, log.c.status != "ok"
    )
    with engine.connect() as conn:
        ts = conn.execute(q).scalar_one_or_none()
    return float(ts) if ts is not None else None
