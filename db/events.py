"""Operational events that explain a chart: the ``ops_event`` table (fault-injection changes and
circuit-breaker transitions, written here) read together with ``canary_audit`` (canary changes,
and guardrail rollbacks: the audit rows whose actor is ``guardrail``).

Writes are small and never raise into the caller's path: an event that cannot be recorded is
logged and dropped (a breaker transition must not fail the request that caused it).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from sqlalchemy import Engine, insert, select

from core.text import storable
from db.models import CanaryAudit, OpsEvent

log = logging.getLogger(__name__)

KINDS = ("canary", "guardrail", "fault", "breaker")
GUARDRAIL_ACTOR = "guardrail"
MAX_EVENTS = 500  # per read: markers beyond this on one chart would be unreadable anyway
DETAIL_MAX = 500


@dataclass(frozen=True)
class Event:
    """One marker: ``kind`` is one of :data:`KINDS`; ``detail`` and ``actor`` are untrusted text
    (show them as plain text)."""

    ts: float
    kind: str
    provider: str | None
    detail: str
    actor: str


def record_event(
    engine: Engine, *, kind: str, detail: str, actor: str, provider: str | None = None, ts: float | None = None
) -> bool:
    """Append one ``ops_event`` row; ``False`` (and a log line) when the database refused it."""
    if kind not in ("fault", "breaker"):
        raise ValueError(f"kind must be 'fault' or 'breaker', got {kind!r}")
    row = {
        "ts": time.time() if ts is None else float(ts),
        "kind": kind,
        "provider": storable(provider, 64) if provider else None,
        "detail": storable(detail, DETAIL_MAX) or "",
        "actor": storable(actor, 128) or "unknown",
    }
    try:
        with engine.begin() as conn:
            conn.execute(insert(OpsEvent).values(**row))
    except Exception:  # an event is evidence, never a reason to fail the caller
        log.warning("could not record %s event for %s", kind, provider, exc_info=True)
        return False
    return True


def record_fault_change(engine: Engine, provider: str, detail: str, *, actor: str) -> bool:
    """A fault-injection change on ``provider`` (the canary page's save and clear)."""
    return record_event(engine, kind="fault", provider=provider, detail=detail, actor=actor)


def record_breaker_change(engine: Engine, provider: str, old: str, new: str, why: str) -> bool:
    """A circuit-breaker transition, for the router's ``on_change`` hook: ``old -> new`` and why."""
    return record_event(engine, kind="breaker", provider=provider, detail=f"{old} -> {new}: {why}", actor="breaker")


def record_breaker_change_later(engine: Engine, provider: str, old: str, new: str, why: str) -> threading.Thread:
    """:func:`record_breaker_change` on a daemon thread, for a hook called on the request path: the
    insert may wait on the database's write lock, the request must not. Returns the started thread
    (tests join it)."""
    t = threading.Thread(
        target=record_breaker_change, args=(engine, provider, old, new, why), name="breaker-event", daemon=True
    )
    t.start()
    return t


def events_between(engine: Engine, *, since: float, until: float, limit: int = MAX_EVENTS) -> list[Event]:
    """Every event in ``[since, until]``, oldest first: canary changes (``canary``), guardrail
    rollbacks (``guardrail``), fault changes and breaker transitions. Two ``ts``-indexed reads."""
    a, e = CanaryAudit.__table__, OpsEvent.__table__
    qa = (
        select(a.c.ts, a.c.old_ratio, a.c.new_ratio, a.c.actor, a.c.reason, a.c.scope)
        .where(a.c.ts >= since, a.c.ts <= until)
        .order_by(a.c.ts.desc())
        .limit(limit)
    )
    qe = (
        select(e.c.ts, e.c.kind, e.c.provider, e.c.detail, e.c.actor)
        .where(e.c.ts >= since, e.c.ts <= until)
        .order_by(e.c.ts.desc())
        .limit(limit)
    )
    out: list[Event] = []
    with engine.connect() as conn:
        for r in conn.execute(qa):
            kind = "guardrail" if r.actor == GUARDRAIL_ACTOR else "canary"
            which = "canary" if r.scope == "global" else f"{r.scope.removeprefix('route:')} canary"
            detail = f"{which} {r.old_ratio * 100:g} % -> {r.new_ratio * 100:g} %: {r.reason}"
            out.append(Event(float(r.ts), kind, None, detail, r.actor))
        for e_row in conn.execute(qe):
            out.append(Event(float(e_row.ts), e_row.kind, e_row.provider, e_row.detail, e_row.actor))
    out.sort(key=lambda ev: ev.ts)
    return out[-limit:]


def latest_breaker_states(engine: Engine, *, since: float) -> dict[str, tuple[str, float]]:
    """Each provider's newest breaker transition since ``since``, from every process that recorded
    one: ``{provider: (state it moved to, when)}``. Read from the ``ts`` index, newest first."""
    e = OpsEvent.__table__
    q = (
        select(e.c.ts, e.c.provider, e.c.detail)
        .where(e.c.kind == "breaker", e.c.ts >= since)
        .order_by(e.c.ts.desc())
        .limit(MAX_EVENTS)
    )
    out: dict[str, tuple[str, float]] = {}
    with engine.connect() as conn:
        for r in conn.execute(q):
            if r.provider and r.provider not in out:
                out[r.provider] = (breaker_state_of(r.detail), float(r.ts))
    return out


def breaker_state_of(detail: str) -> str:
    """The state a breaker moved to, from the detail :func:`record_breaker_change` wrote
    (``"old -> new: why"``); ``"unknown"`` for anything else."""
    _, arrow, rest = detail.partition(" -> ")
    state = rest.split(":", 1)[0].strip()
    return state if arrow and state in ("closed", "open", "half_open") else "unknown"
