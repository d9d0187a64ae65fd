"""Per-key rate limits and budgets, enforced atomically by the database shared by every server process.

Rate limits are a sliding window counted in one-second buckets: one row per (key, second) holding
the requests admitted and tokens counted in it. A request is admitted when the buckets of the last
``WINDOW_S + 1`` seconds, itself included, stay within ``rpm`` and ``tpm``. Counting every bucket
that overlaps the trailing minute (not a weighted estimate of the previous window) is what makes the
limit hold in *every* 60-second window: when a request is admitted, every earlier request less than
60 s before it is counted, so no 60 s span ever holds more than the limit (a fixed window, or a
full token bucket, admits up to twice the limit across a boundary). The price is that a request
may wait up to one second longer than strictly needed.

Atomicity: the admission increments its own bucket first and sums the window after, in one
transaction, and rolls back when a limit is exceeded; on PostgreSQL a transaction-scoped advisory
lock per key orders concurrent admissions of that key (they touch different bucket rows, so row
locks alone would not), on SQLite the first write takes the database's write lock. N processes
racing for the last slot cannot all win.

Budgets are a ledger per (key, period): ``spent`` (settled) plus ``reserved`` (requests in flight).
:func:`admit` reserves a request's worst case (``est_cost_usd``: its prompt and its ``max_tokens``,
or the model's output limit) in the same transaction as the rate-limit count (a refusal of either
rolls back both), and holds more, up to ``ceiling_cost_usd`` (the model's own worst case), as far
as the budget has room. The hold is what bounds overspend by one request even when an upstream
bills more output than was asked for (providers that ignore ``max_tokens``, reasoning tokens): a
request that holds less than its model's worst case left the budget no room, so no other request
is admitted until it settles. :func:`settle` replaces the reservation by the real cost and tokens
exactly once, keyed by the reservation id (a second settle, or one racing it in another process,
changes nothing).

Tokens-per-minute admits a request when the window's tokens plus its estimate stay within the
limit; the estimate is corrected to the real count on settle. Money is integer micro-USD. Time is
passed in (``now``), so tests pin the window instead of depending on the wall clock.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, Engine, Table, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import OperationalError

from db.keys import MICRO, KeyRecord
from db.models import GatewayKeyReservation, GatewayKeySpend, GatewayKeyWindow

T = TypeVar("T")

_W = cast(Table, GatewayKeyWindow.__table__)
_S = cast(Table, GatewayKeySpend.__table__)
_R = cast(Table, GatewayKeyReservation.__table__)

WINDOW_S = 60
BUCKET_S = 1  # the sliding window's resolution: one row per key and second
RATE_LIMITED = "rate_limit_exceeded"
TOKENS_LIMITED = "tokens_limit_exceeded"
BUDGET_EXCEEDED = "budget_exceeded"
BUDGET_RESERVED = "budget_reserved"  # the rest of the budget is held by requests in flight
_LOCK_SPACE = 0x6777  # PostgreSQL advisory lock namespace ("gw") for per-key admission
# SQLite in WAL mode can refuse a write with "database is locked" when a deferred transaction's
# snapshot went stale under a concurrent writer; the transaction then did nothing and is retried.
_SQLITE_RETRIES = 20


@dataclass(frozen=True)
class Decision:
    """The outcome of :func:`admit`. ``code`` is None when allowed."""

    allowed: bool
    code: str | None = None
    message: str = ""
    retry_after_s: int | None = None  # for rate limits: seconds until the request would fit
    reservation_id: str | None = None
    window_start: int = 0  # the admission's bucket
    requests_in_window: int | None = None  # in the sliding window, this request included
    reserved_micro_usd: int = 0  # held against the budget until settle


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
    def budget_usd(self) -> float:
        return self.budget_micro_usd / MICRO

    @property
    def used_ratio(self) -> float:
        return self.spent_micro_usd / self.budget_micro_usd


def window_start(now: float) -> int:
    """The start of the one-second bucket holding ``now``."""
    return int(now // BUCKET_S) * BUCKET_S


def window_first_bucket(now: float) -> int:
    """The oldest bucket counted at ``now``: every bucket overlapping the 60 s before ``now``."""
    return window_start(now) - WINDOW_S


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
    engine: Engine,
    key: KeyRecord,
    *,
    est_tokens: int = 0,
    est_cost_usd: float = 0.0,
    ceiling_cost_usd: float | None = None,
    worst_case: str = "",
    now: float | None = None,
) -> Decision:
    """Count one request against ``key``'s rate limits and reserve its cost, atomically.

    ``est_cost_usd`` is the request's worst case and must fit in the budget (``worst_case`` says
    what it counts, for the refusal: "its prompt plus 32,768 output tokens ..."); ``ceiling_cost_usd``
    (at least that) is what it may really cost when the upstream does not honour the request's
    output limit, held as far as the budget has room. Allowed decisions carry a
    ``reservation_id`` to pass to :func:`settle` when the request ends (whether it succeeded,
    failed or was cancelled).
    """
    ts = time.time() if now is None else now
    if est_tokens < 0:
        raise ValueError("est_tokens must be >= 0")
    bucket = window_start(ts)
    first = window_first_bucket(ts)
    budgeted = key.budget_micro_usd is not None
    # At least one micro-dollar, so a key whose budget is exactly used up refuses the next request.
    est_micro = max(1, usd_to_micro(est_cost_usd)) if budgeted else 0
    ceiling_micro = max(est_micro, usd_to_micro(ceiling_cost_usd)) if budgeted and ceiling_cost_usd else est_micro
    pstart = period_start(key.period, ts) if budgeted and key.period else None

    def run(conn: Connection) -> Decision:
        if conn.dialect.name == "postgresql":
            # The two-int form takes int4: ids past 2**31 share a lock with another key, which only
            # orders the two keys' admissions together.
            lock = {"space": _LOCK_SPACE, "key": key.id % 2**31}
            conn.execute(text("SELECT pg_advisory_xact_lock(:space, :key)"), lock)
        w = _W
        ins = _upsert(conn)(w).values(key_id=key.id, window_start=bucket, requests=1, tokens=est_tokens)
        conn.execute(
            ins.on_conflict_do_update(
                index_elements=[w.c.key_id, w.c.window_start],
                set_={"requests": w.c.requests + 1, "tokens": w.c.tokens + ins.excluded.tokens},
            )
        )
        limited = key.rpm is not None or key.tpm is not None
        requests = None
        if limited:
            rows = conn.execute(
                select(w.c.window_start, w.c.requests, w.c.tokens)
                .where(w.c.key_id == key.id, w.c.window_start >= first, w.c.window_start <= bucket)
                .order_by(w.c.window_start)
            ).all()
            requests = sum(r.requests for r in rows)
            tokens = sum(r.tokens for r in rows)
            if key.rpm is not None and requests > key.rpm:
                wait = _retry_after(rows, ts, lambda r: r.requests, requests - key.rpm)
                msg = f"rate limit of {key.rpm} requests per minute reached for this key"
                raise _Refused(Decision(False, RATE_LIMITED, msg, retry_after_s=wait, window_start=bucket))
            if key.tpm is not None and tokens > key.tpm:
                if est_tokens > key.tpm:
                    msg = (
                        f"this request alone is estimated at {est_tokens:,} tokens, more than this key's limit of "
                        f"{key.tpm:,} tokens per minute. Fix: a shorter prompt or a lower max_tokens"
                    )
                    wait = WINDOW_S
                else:
                    msg = f"rate limit of {key.tpm} tokens per minute reached for this key"
                    wait = _retry_after(rows, ts, lambda r: r.tokens, tokens - key.tpm)
                raise _Refused(Decision(False, TOKENS_LIMITED, msg, retry_after_s=wait, window_start=bucket))
        reserved = 0
        if pstart is not None:
            assert key.budget_micro_usd is not None
            budget = key.budget_micro_usd
            if est_micro > budget:
                raise _Refused(_budget_refusal(key, bucket, est_micro=est_micro, worst_case=worst_case))
            s = _S
            sins = _upsert(conn)(s).values(
                key_id=key.id, period_start=pstart, spent_micro_usd=0, reserved_micro_usd=est_micro
            )
            sstmt = sins.on_conflict_do_update(
                index_elements=[s.c.key_id, s.c.period_start],
                set_={"reserved_micro_usd": s.c.reserved_micro_usd + sins.excluded.reserved_micro_usd},
                where=s.c.spent_micro_usd + s.c.reserved_micro_usd + sins.excluded.reserved_micro_usd <= budget,
            ).returning(s.c.spent_micro_usd, s.c.reserved_micro_usd)
            got = conn.execute(sstmt).first()
            if got is None:
                row = conn.execute(
                    select(s.c.spent_micro_usd).where(s.c.key_id == key.id, s.c.period_start == pstart)
                ).one()
                raise _Refused(
                    _budget_refusal(
                        key, bucket, est_micro=est_micro, spent_micro=row.spent_micro_usd, worst_case=worst_case
                    )
                )
            reserved = est_micro
            # The row is now locked by this transaction (PostgreSQL row lock, SQLite write lock), so
            # the room read here is the room there is: hold up to the ceiling within it.
            extra = min(ceiling_micro - est_micro, budget - got.spent_micro_usd - got.reserved_micro_usd)
            if extra > 0:
                conn.execute(
                    update(s)
                    .where(s.c.key_id == key.id, s.c.period_start == pstart)
                    .values(reserved_micro_usd=s.c.reserved_micro_usd + extra)
                )
                reserved += extra
        rid = uuid.uuid4().hex
        conn.execute(
            _R.insert().values(
                id=rid,
                key_id=key.id,
                window_start=bucket,
                period_start=pstart,
                est_tokens=est_tokens,
                est_micro_usd=reserved,
                created_at=ts,
            )
        )
        return Decision(
            True, reservation_id=rid, window_start=bucket, requests_in_window=requests, reserved_micro_usd=reserved
        )

    try:
        return _with_sqlite_retry(engine, run)
    except _Refused as refused:  # raised inside the transaction, so everything it did is rolled back
        return refused.decision


def _retry_after(rows: Sequence[Any], now: float, amount: Callable[[Any], int], excess: int) -> int:
    """Seconds until the oldest buckets holding ``excess`` of the window's amount stop counting
    (a bucket starting at ``b`` counts until ``b + WINDOW_S + BUCKET_S``)."""
    freed = 0
    for r in rows:
        freed += amount(r)
        if freed >= excess:
            return max(1, math.ceil(r.window_start + WINDOW_S + BUCKET_S - now))
    return WINDOW_S + BUCKET_S


def _usd(micro: int) -> str:
    dollars = micro / 1_000_000
    return f"${dollars:,.2f}" if dollars >= 1 else f"${dollars:.6f}".rstrip("0").rstrip(".") if micro else "$0"


def _budget_refusal(
    key: KeyRecord, bucket: int, *, est_micro: int, spent_micro: int | None = None, worst_case: str = ""
) -> Decision:
    """Why the budget refuses a request, one of three: the request's worst case alone is more than
    the whole budget (nothing else would ever fit it: set max_tokens), the budget is used up, or
    what is left is less than the worst case (reserved by requests in flight: retry soon; else
    spent: a smaller max_tokens or the next period)."""
    which = "daily" if key.period == "day" else "monthly"
    assert key.budget_micro_usd is not None
    budget = key.budget_micro_usd
    whole = f"this key's {which} budget of {_usd(budget)}"
    case = f"this request's worst case, {_usd(est_micro)}{f' ({worst_case})' if worst_case else ''},"
    if spent_micro is None:
        message = (
            f"{case} is more than {whole}: it is refused however little is spent (the budget is not used up). "
            "Fix: set max_tokens (max_output_tokens on the Responses API) low enough for the worst case to fit, "
            "or use a key with a larger budget"
        )
        return Decision(False, BUDGET_EXCEEDED, message, retry_after_s=None, window_start=bucket)
    if spent_micro + est_micro <= budget:  # fits once the requests in flight settle
        return Decision(
            False,
            BUDGET_RESERVED,
            f"the rest of {whole} is reserved by its requests in flight; retry when they finish",
            retry_after_s=1,
            window_start=bucket,
        )
    if spent_micro >= budget:
        message = (
            f"{whole} is used up ({_usd(spent_micro)} spent). Fix: raise it with a new key or wait for the next period"
        )
    else:
        message = (
            f"{case} is more than the {_usd(budget - spent_micro)} left of {whole} ({_usd(spent_micro)} spent). "
            "Fix: a lower max_tokens (max_output_tokens on the Responses API), or wait for the next period"
        )
    return Decision(False, BUDGET_EXCEEDED, message, retry_after_s=None, window_start=bucket)


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
        n = conn.execute(w.delete().where(w.c.window_start < window_first_bucket(before))).rowcount
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
    """(requests, tokens) counted for ``key`` in the sliding window at ``now`` (the buckets of the
    last ``WINDOW_S + 1`` seconds)."""
    ts = time.time() if now is None else now
    w = _W
    with engine.connect() as conn:
        row = conn.execute(
            select(func.coalesce(func.sum(w.c.requests), 0), func.coalesce(func.sum(w.c.tokens), 0)).where(
                w.c.key_id == key.id, w.c.window_start >= window_first_bucket(ts), w.c.window_start <= window_start(ts)
            )
        ).one()
    return int(row[0]), int(row[1])
