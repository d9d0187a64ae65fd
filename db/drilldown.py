"""The request drill-down's SQL: find requests by request id, session id or gateway key name, and
read every attempt of one request.

``request_log.key_name`` arrives with migration 0005; until a database has it, searching by key
reports that the column is missing instead of failing (:func:`log_columns` reads the table's
columns once per engine). An attempt is read with every column the table has, so the column list
is the model's (:class:`db.models.RequestLog`), spelled nowhere else here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sqlalchemy import Engine, column, inspect, select

from db.models import RequestLog

SEARCH_KINDS = ("request", "session", "key")
MAX_MATCHES = 200  # requests listed per search
_ROWS_PER_MATCH = 8  # attempt rows read per listed request, at most (retries and fallbacks)

_columns_lock = threading.Lock()
_columns: dict[str, frozenset[str]] = {}


def log_columns(engine: Engine) -> frozenset[str]:
    """The columns ``request_log`` has in this database (read once per engine URL)."""
    key = engine.url.render_as_string(hide_password=True)
    with _columns_lock:
        cols = _columns.get(key)
    if cols is None:
        cols = frozenset(c["name"] for c in inspect(engine).get_columns("request_log"))
        with _columns_lock:
            _columns[key] = cols
    return cols


def forget_columns() -> None:
    """Re-read the columns on the next call (after a migration, in tests)."""
    with _columns_lock:
        _columns.clear()


class SearchError(ValueError):
    """A search that cannot run; the message says why and what to do."""


@dataclass(frozen=True)
class Match:
    """One request found by a search: its newest attempt's summary."""

    request_id: str
    ts: float  # first attempt's start
    attempts: int
    provider: str  # of the final attempt read
    model: str
    status: str
    session_id: str | None
    cost_usd: float


def _select(engine: Engine):
    # Every column of the table's model but the row id, where this database has it (a column of a
    # later migration is absent until it runs; the request view gives such a field its default).
    log = RequestLog.__table__
    have = log_columns(engine)
    return log, [c for c in log.c if c.name != "id" and c.name in have]


def find_requests(engine: Engine, kind: str, value: str, *, limit: int = MAX_MATCHES) -> list[Match]:
    """Requests whose ``kind`` (``request`` id, ``session`` id, gateway ``key`` name) equals
    ``value`` exactly, newest first (at most ``limit``). Session ids are compared as stored, any
    Unicode."""
    if kind not in SEARCH_KINDS:
        raise SearchError(f"search by one of {', '.join(SEARCH_KINDS)}, not {kind!r}")
    if not value:
        return []
    log = RequestLog.__table__
    if kind == "request":
        cond = log.c.request_id == value
    elif kind == "session":
        cond = log.c.session_id == value
    else:
        if "key_name" not in log_columns(engine):
            raise SearchError(
                "This database does not record gateway key names yet. Fix: run the migrations "
                "(python -m app db upgrade, or restart the dashboard) once migration 0005 is installed."
            )
        cond = (log.c.key_name if "key_name" in log.c else column("key_name")) == value
    q = (
        select(
            log.c.request_id,
            log.c.ts,
            log.c.attempt,
            log.c.provider,
            log.c.model,
            log.c.status,
            log.c.session_id,
            log.c.cost_usd,
        )
        .select_from(log)
        .where(cond)
        .order_by(log.c.ts.desc(), log.c.id.desc())
        .limit(max(1, int(limit)) * _ROWS_PER_MATCH)
    )
    found: dict[str, dict] = {}
    with engine.connect() as conn:
        for r in conn.execute(q):
            m = found.get(r.request_id)
            if m is None:
                if len(found) >= limit:
                    continue
                found[r.request_id] = m = {
                    "ts": r.ts,
                    "attempts": 0,
                    "last_attempt": -1,
                    "provider": r.provider,
                    "model": r.model,
                    "status": r.status,
                    "session_id": r.session_id,
                    "cost": 0.0,
                }
            m["attempts"] += 1
            m["ts"] = min(m["ts"], r.ts)
            m["cost"] += float(r.cost_usd or 0.0)
            if r.attempt > m["last_attempt"]:
                m.update(last_attempt=r.attempt, provider=r.provider, model=r.model, status=r.status)
    return [
        Match(rid, float(m["ts"]), m["attempts"], m["provider"], m["model"], m["status"], m["session_id"], m["cost"])
        for rid, m in found.items()
    ]


def request_attempts(engine: Engine, request_id: str) -> list[dict]:
    """Every attempt row of one request in attempt order, as dicts keyed by the ``request_log``
    columns this database has (:func:`log_columns`), the row id left out."""
    log, cols = _select(engine)
    q = select(*cols).select_from(log).where(log.c.request_id == request_id).order_by(log.c.attempt, log.c.id)
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(q).mappings().all()]
