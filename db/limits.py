"""Per-key rate limits and budgets, enforced atomically by the database shared by every server process.

Rate limits are fixed one-minute windows: one row per (key, minute) whose counters are bumped by a
single ``INSERT ... ON CONFLICT DO UPDATE ... WHERE <under the limit> RETURNING`` statement. The
``WHERE`` makes the increment conditional inside the database, so N processes racing for the last
slot cannot all win: on PostgreSQL the conflicting row is locked for the update, on SQLite the whole
write is serialised. No row returned means the limit was reached.

Budgets are a ledger per (key, period): ``spent`` (settled) plus ``reserved`` (estimates of requests
in flight). :func:`admit` reserves an estimate in the same transaction as the rate-limit increment
(a refusal of either rolls back both, so a request refused for budget does not use up a rate slot);
:func:`settle` replaces the estimate by the real cost and tokens exactly once, keyed by the
reservation id (a second settle, or one racing it in another process, changes nothing).

Requests-per-minute counts admitted requests; tokens-per-minute admits while the window's tokens
(estimates, corrected to real counts on settle) are under the limit, so one request may overshoot
it, as with the providers' own limits. Money is integer micro-USD. Time is passed in (``now``), so
tests pin the window instead of depending on the wall clock.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, Engine, Table, and_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import OperationalError

from db.keys import MICRO, KeyRecord
from db.models import GatewayKeyReservation, GatewayKeySpend, GatewayKeyWindow

T = TypeVar("T")

_W = cast(Table, GatewayKeyWindow.__table__)
_S = cast(Table, GatewayKeySpend.__table__)
_R = cast(Table, GatewayKeyReservation.__table__)

WINDOW_S = 60
RATE_LIMITED = "rate_limit_exceeded"
TOKENS_LIMITED = "tokens_limit_exceeded"
BUDGET_EXCEEDED = "budget_exceeded"
# SQLite in WAL mode can refuse a write with "database is locked" when a deferred transaction's
# snapshot went stale under a concurrent writer; the transaction then did nothing and is retried.
_SQLITE_RETRIES = 20


@dataclass(frozen=True)
class Decision:
    """The outcome of :func:`admit`. ``code`` is None when allowed."""

    allowed: bool
    code: str | None = None
    message: str = ""
    retry_after_s: int | None = None  # for rate limits: seconds until the window resets
    reservation_id: str | None = None
    window_start: int = 0
    requests_in_window: int | None = None


@dataclass(frozen=True)
class SpendState:
    period: str
    period_start: int
    spent_micro_usd: int
    reserved_micro_usd: int
    budget_micro_usd: int

    @property
    def spent_usd(self) -> float:
        return self.spent_micro_usd / MICRO

    @property
    def reserved_usd(self) -> float:
        return self.reserved_micro_usd / MICRO

    @property
    def budget_usd(self) -> float:
        return self.budget_micro_usd / MICRO

    @property
    def used_ratio(self) -> float:
        return self.spent_micro_usd / self.budget_micro_usd


def window_start(now: float) -> int:
    return int(now // WINDOW_S) * WINDOW_S


def period_start(period: str, now: float) -> int:
    """Start of the UTC day or month containing ``now``, in epoch seconds."""
    if period == "day":
        return int(now // 86400) * 86400
    if period == "month":
        d = datetime.fromtimestamp(now, tz=UTC)
        return int(datetime(d.year, d.month, 1, tzinfo=UTC).timestamp())
    raise ValueError(f"unknown budget period {period!r}")


def usd_to_micro(usd: float) -> int:
    if not math.isfinite(usd) or usd < 0:
        raise ValueError(f"cost must be a finite amount of at least 0 USD, got {usd!r}")
    return math.ceil(usd * MICRO)  # round up: a budget is a ceiling, never undercount spend


def _upsert(conn: Connection) -> Any:
    return postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert


def _with_sqlite_retry(engine: Engine, fn: Callable[[Connection], T]) -> T:
    for attempt in range(_SQLITE_RETRIES):
        try:
            with engine.begin() as conn:
                return fn(conn)
        except OperationalError as exc:
            if engine.dialect.name != "sqlite" or "locked" not in str(exc) or attempt == _SQLITE_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


class _Refused(Exception):
    def __init__(self, decision: Decision):
        self.decision = decision


def admit(
    engine: Engine, key: KeyRecord, *, est_tokens: int = 0, est_cost_usd: float = 0.0, now: float | None = None
) -> Decision:
    """Count one request against ``key``'s rate limits and reserve its estimated cost, atomically.

    Allowed decisions carry a ``reservation_id`` to pass to :func:`settle` when the request ends
    (whether it succeeded, failed or was cancelled).
    """
    ts = time.time() if now is None else now
    if est_tokens < 0:
        raise ValueError("est_tokens must be >= 0")
    win = window_start(ts)
    retry_after = max(1, math.ceil(win + WINDOW_S - ts))
    # At least one micro-dollar, so a key whose budget is exactly used up refuses the next request.
    est_micro = max(1, usd_to_micro(est_cost_usd)) if key.budget_micro_usd is not None else 0
    pstart = period_start(key.period, ts) if key.budget_micro_usd is not None and key.period else None

    def run(conn: Connection) -> Decision:
        w = _W
        ins = _upsert(conn)(w).values(key_id=key.id, window_start=win, requests=1, tokens=est_tokens)
        conds = []
        if key.rpm is not None:
            conds.append(w.c.requests < key.rpm)
        if key.tpm is not None:
            conds.append(w.c.tokens < key.tpm)
        stmt = ins.on_conflict_do_update(
            index_elements=[w.c.key_id, w.c.window_start],
            set_={"requests": w.c.requests + 1, "tokens": w.c.tokens + ins.excluded.tokens},
            where=and_(*conds) if conds else None,
        ).returning(w.c.requests)
        got = conn.execute(stmt).first()
        if got is None:
            row = conn.execute(
                select(w.c.requests, w.c.tokens).where(w.c.key_id == key.id, w.c.window_start == win)
            ).one()
            if key.rpm is not None and row.requests >= key.rpm:
                code, msg = RATE_LIMITED, f"rate limit of {key.rpm} requests per minute reached for this key"
            else:
                code, msg = TOKENS_LIMITED, f"rate limit of {key.tpm} tokens per minute reached for this key"
            raise _Refused(Decision(False, code, msg, retry_after_s=retry_after, window_start=win))
        if pstart is not None:
            assert key.budget_micro_usd is not None
            s = _S
            if est_micro > key.budget_micro_usd:
                raise _Refused(_budget_refusal(key, win))
            sins = _upsert(conn)(s).values(
                key_id=key.id, period_start=pstart, spent_micro_usd=0, reserved_micro_usd=est_micro
            )
            sstmt = sins.on_conflict_do_update(
                index_elements=[s.c.key_id, s.c.period_start],
                set_={"reserved_micro_usd": s.c.reserved_micro_usd + sins.excluded.reserved_micro_usd},
                where=s.c.spent_micro_usd + s.c.reserved_micro_usd + sins.excluded.reserved_micro_usd
                <= key.budget_micro_usd,
            ).returning(s.c.spent_micro_usd)
            if conn.execute(sstmt).first() is None:
                raise _Refused(_budget_refusal(key, win))
        rid = uuid.uuid4().hex
        conn.execute(
            _R.insert().values(
                id=rid,
                key_id=key.id,
                window_start=win,
                period_start=pstart,
                est_tokens=est_tokens,
                est_micro_usd=est_micro,
                created_at=ts,
            )
        )
        return Decision(True, reservation_id=rid, window_start=win, requests_in_window=got.requests)

    try:
        return _with_sqlite_retry(engine, run)
    except _Refused as refused:  # raised inside the transaction, so everything it did is rolled back
        return refused.decision


def _budget_refusal(key: KeyRecord, win: int) -> Decision:
    return Decision(
        False,
        BUDGET_EXCEEDED,
        f"this key's {'daily' if key.period == 'day' else 'monthly'} budget of {key.budget_usd:g} USD is used up",
        retry_after_s=None,
        window_start=win,
    )


def settle(engine: Engine, reservation_id: str, *, tokens: int, cost_usd: float, now: float | None = None) -> bool:
    """Replace a reservation's estimate by the request's real tokens and cost. True if this call
    settled it, False if it was already settled (or never existed): settling is exactly-once."""
    ts = time.time() if now is None else now
    if tokens < 0:
        raise ValueError("tokens must be >= 0")
    actual_micro = usd_to_micro(cost_usd)

    def run(conn: Connection) -> bool:
        r = _R
        row = conn.execute(
            update(r)
            .where(r.c.id == reservation_id, r.c.settled_at.is_(None))
            .values(settled_at=ts, actual_tokens=tokens, actual_micro_usd=actual_micro)
            .returning(r.c.key_id, r.c.window_start, r.c.period_start, r.c.est_tokens, r.c.est_micro_usd)
        ).first()
        if row is None:
            return False
        w = _W
        conn.execute(
            update(w)
            .where(w.c.key_id == row.key_id, w.c.window_start == row.window_start)
            .values(tokens=w.c.tokens + (tokens - row.est_tokens))
        )
        if row.period_start is not None:
            s = _S
            conn.execute(
                update(s)
                .where(s.c.key_id == row.key_id, s.c.period_start == row.period_start)
                .values(
                    reserved_micro_usd=s.c.reserved_micro_usd - row.est_micro_usd,
                    spent_micro_usd=s.c.spent_micro_usd + actual_micro,
                )
            )
        return True

    return bool(_with_sqlite_retry(engine, run))


def settle_stale(engine: Engine, *, older_than_s: float, now: float | None = None) -> int:
    """Settle reservations left open longer than ``older_than_s`` (a process died mid-request) at
    their estimate, so a crash never frees budget it may have spent. Returns how many."""
    ts = time.time() if now is None else now
    r = _R
    with engine.connect() as conn:
        stale = conn.execute(
            select(r.c.id, r.c.est_tokens, r.c.est_micro_usd).where(
                r.c.settled_at.is_(None), r.c.created_at < ts - older_than_s
            )
        ).all()
    return sum(settle(engine, s.id, tokens=s.est_tokens, cost_usd=s.est_micro_usd / MICRO, now=ts) for s in stale)


def prune(engine: Engine, *, before: float) -> int:
    """Delete rate-limit windows and settled reservations older than ``before``; returns rows deleted."""
    w, r = _W, _R
    with engine.begin() as conn:
        n = conn.execute(w.delete().where(w.c.window_start < window_start(before))).rowcount
        n += conn.execute(r.delete().where(r.c.settled_at.is_not(None), r.c.settled_at < before)).rowcount
    return n


def spend(engine: Engine, key: KeyRecord, *, now: float | None = None) -> SpendState | None:
    """The key's spend in its current budget period (None when the key has no budget)."""
    if key.budget_micro_usd is None or key.period is None:
        return None
    ts = time.time() if now is None else now
    pstart = period_start(key.period, ts)
    s = _S
    with engine.connect() as conn:
        row = conn.execute(
            select(s.c.spent_micro_usd, s.c.reserved_micro_usd).where(s.c.key_id == key.id, s.c.period_start == pstart)
        ).first()
    spent, reserved = (row.spent_micro_usd, row.reserved_micro_usd) if row else (0, 0)
    return SpendState(key.period, pstart, spent, reserved, key.budget_micro_usd)


def window_usage(engine: Engine, key: KeyRecord, *, now: float | None = None) -> tuple[int, int]:
    """(requests, tokens) counted for ``key`` in the window containing ``now``."""
    ts = time.time() if now is None else now
    w = _W
    with engine.connect() as conn:
        row = conn.execute(
            select(w.c.requests, w.c.tokens).where(w.c.key_id == key.id, w.c.window_start == window_start(ts))
        ).first()
    return (row.requests, row.tokens) if row else (0, 0)
