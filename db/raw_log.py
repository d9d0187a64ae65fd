"""Reads of the raw ``request_log``: the newest rows, the last minute's counts per provider, a
provider's latest error, the request table (row filters, keyset pages, bounded counts, batched
export) and the request mix the canary preview reads on demand.

Each read is bounded by an index (``ts``; the failed rows', an error class's, a gateway key's or a
session's partial or compound index) and a LIMIT or a short window; nothing here scans the log. The
figures that chart or sum traffic read the rollups instead (:mod:`db.monitor`). The request
table's count takes its whole minutes from those rollups and only the partial minutes at its edges,
and the filters no rollup carries (key, session), from here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Engine, and_, case, func, literal, or_, select, true

from core.session import validate_session_id
from db.models import ERROR_ROLLUP_TABLES, RequestLog, rollup_table_for
from db.monitor import MonitorFilters, as_int, dimension_filter, raw_ranges, span_parts, split_minutes

RECENT_LIMIT_MAX = 5000

# Operator-facing columns of ``request_log`` for the recent-requests table, in display order.
# prompt_text is opt-in.
RECENT_LOG_COLUMNS = (
    "request_id",
    "attempt",
    "final",
    "api",
    "provider",
    "model",
    "requested_model",
    "intent",
    "side",
    "source",
    "status",
    "finish_reason",
    "http_status",
    "error_class",
    "error_message",
    "latency_ms",
    "ttft_ms",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "tool_calls",
    "cost_usd",
    "fallback",
    "substituted",
    "stream",
    "session_id",
    "key_name",
    "ts",
)


@dataclass(frozen=True)
class RecentCounts:
    """One provider's attempts in the last seconds, read from the raw log: ``requests`` are final
    attempts, ``request_errors`` failed final attempts, ``fallbacks`` final attempts on the
    fallback route."""

    attempts: int
    errors: int
    requests: int
    request_errors: int
    fallbacks: int
    last_failure: float | None = None  # the newest failed attempt's ts; None without one


def recent_counts(
    engine: Engine, *, since: float, until: float, filters: MonitorFilters | None = None
) -> dict[str, RecentCounts]:
    """Attempts per provider with ``since <= ts <= until`` (a ``ts``-indexed range of the raw log:
    the rollups are per minute, too coarse for "the last minute" to mean sixty seconds)."""
    log = RequestLog.__table__
    failed = case((log.c.status != "ok", 1), else_=0)
    final = case((log.c.final.is_(true()), 1), else_=0)
    q = (
        select(
            log.c.provider,
            func.count(),
            func.sum(failed),
            func.sum(final),
            func.sum(case((and_(log.c.final.is_(true()), log.c.status != "ok"), 1), else_=0)),
            func.sum(case((and_(log.c.final.is_(true()), log.c.fallback.is_(true())), 1), else_=0)),
            func.max(case((log.c.status != "ok", log.c.ts), else_=None)),
        )
        .where(log.c.ts >= since, log.c.ts <= until, *dimension_filter(filters, log))
        .group_by(log.c.provider)
    )
    with engine.connect() as conn:
        return {
            r[0]: RecentCounts(
                as_int(r[1]),
                as_int(r[2]),
                as_int(r[3]),
                as_int(r[4]),
                as_int(r[5]),
                None if r[6] is None else float(r[6]),
            )
            for r in conn.execute(q)
        }


def last_error(engine: Engine, *, provider: str, since: float, until: float) -> tuple[str | None, float] | None:
    """``(error_class, ts)`` of the provider's newest failed attempt in the window (a ``ts``-indexed
    lookup; a minute of slack past ``until`` for rows of the minute in progress)."""
    log = RequestLog.__table__
    q = (
        select(log.c.error_class, log.c.ts)
        .where(log.c.ts >= since, log.c.ts <= until + 60, log.c.provider == provider, log.c.status != "ok")
        .order_by(log.c.ts.desc())
        .limit(1)
    )
    with engine.connect() as conn:
        row = conn.execute(q).first()
    return (row.error_class, float(row.ts)) if row else None


def recent_rows(
    engine: Engine,
    *,
    limit: int = 200,
    filters: MonitorFilters | None = None,
    include_prompt: bool = False,
    since: float | None = None,
    until: float | None = None,
) -> list[dict]:
    """The newest attempt rows of ``request_log`` (at most :data:`RECENT_LIMIT_MAX`), newest
    first, as dicts keyed by :data:`RECENT_LOG_COLUMNS` (plus ``prompt_text`` only when
    ``include_prompt``)."""
    log = RequestLog.__table__
    limit = max(0, min(int(limit), RECENT_LIMIT_MAX))
    cols = [log.c[c] for c in RECENT_LOG_COLUMNS]
    if include_prompt:
        cols.append(log.c.prompt_text)
    conds = dimension_filter(filters, log)
    if since is not None:
        conds.append(log.c.ts >= since)
    if until is not None:
        conds.append(log.c.ts <= until)
    q = select(*cols).where(*conds).order_by(log.c.ts.desc(), log.c.id.desc()).limit(limit)
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(q).mappings().all()]


# -- the request table: row filters, keyset pages, bounded counts, batched export -------------------

STATUSES = ("ok", "error")
# A position in ``request_log`` order: (ts, id). Rows are read newest first by (ts, id) descending,
# so a page anchored on a row stays the same page however many newer rows arrive.
Cursor = tuple[float, int]


@dataclass(frozen=True)
class RowFilters:
    """Filters on columns the rollups do not carry (status, error class, gateway key, session), so
    they narrow only raw ``request_log`` reads. Empty means "all". ``ValueError`` on a status other
    than :data:`STATUSES` or an unusable session id (:func:`core.session.validate_session_id`)."""

    status: str | None = None
    error_classes: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    session_id: str | None = None

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}")
        if self.session_id is not None:
            validate_session_id(self.session_id)
        for name in ("error_classes", "keys"):
            values = getattr(self, name) or ()
            if not all(isinstance(v, str) for v in values):
                raise ValueError(f"{name} must be text values")
            object.__setattr__(self, name, tuple(sorted(set(values))))

    @property
    def active(self) -> bool:
        return bool(self.status or self.error_classes or self.keys or self.session_id)


NO_ROW_FILTERS = RowFilters()


def _row_conds(since: float, until: float, filters: MonitorFilters | None, rows: RowFilters | None, log=None) -> list:
    log = RequestLog.__table__ if log is None else log
    return [log.c.ts >= since, log.c.ts <= until, *_filter_conds(filters, rows, log)]


def _filter_conds(filters: MonitorFilters | None, rows: RowFilters | None, log) -> list:
    """What a row must be to pass the filters, its time aside."""
    r = rows or NO_ROW_FILTERS
    conds = [*dimension_filter(filters, log)]
    if r.status == "error":
        # Spelled exactly as the partial index's predicate (migration 0011), so both SQLite and
        # PostgreSQL read the failed rows of a window from it instead of walking every row.
        conds.append(log.c.status != "ok")
    elif r.status == "ok":
        conds.append(log.c.status == "ok")
    if r.error_classes:
        # Only failed rows carry a class: saying so lets both databases read the failed rows'
        # (error_class, ts) partial index (migration 0013) instead of every row of the window.
        if r.status is None:
            conds.append(log.c.status != "ok")
        conds.append(log.c.error_class.in_(r.error_classes))
    if r.keys:
        # Spelled as the key index's predicate (migration 0018), so both databases read one key's
        # rows of the window from it instead of walking every row.
        conds += [log.c.key_name.is_not(None), log.c.key_name.in_(r.keys)]
    if r.session_id is not None:
        conds.append(log.c.session_id == r.session_id)
    return conds


def _older(c: Cursor, log) -> ColumnElement[bool]:
    # (ts, id) < c, written so the ts index bounds the range (ts <= c.ts) on both databases.
    return and_(log.c.ts <= c[0], or_(log.c.ts < c[0], log.c.id < c[1]))


def _newer(c: Cursor, log) -> ColumnElement[bool]:
    return and_(log.c.ts >= c[0], or_(log.c.ts > c[0], log.c.id > c[1]))


def log_page(
    engine: Engine,
    *,
    since: float,
    until: float,
    filters: MonitorFilters | None = None,
    rows: RowFilters | None = None,
    older_than: Cursor | None = None,
    newer_than: Cursor | None = None,
    limit: int = 50,
) -> list[dict]:
    """Up to ``limit`` matching rows of ``[since, until]``, newest first, keyed by
    :data:`RECENT_LOG_COLUMNS` plus ``id``: the newest ones, or those just older than
    ``older_than``, or those just newer than ``newer_than`` (the ``limit`` closest to it)."""
    log = RequestLog.__table__
    limit = max(0, min(int(limit), RECENT_LIMIT_MAX))
    ascending = newer_than is not None
    cursor_conds = []
    if older_than is not None:
        cursor_conds.append(_older(older_than, log))
        until = min(until, older_than[0])
    if newer_than is not None:
        cursor_conds.append(_newer(newer_than, log))
        since = max(since, newer_than[0])
    order = (log.c.ts.asc(), log.c.id.asc()) if ascending else (log.c.ts.desc(), log.c.id.desc())
    cols = (log.c.id, *(log.c[c] for c in RECENT_LOG_COLUMNS))
    r = rows or NO_ROW_FILTERS
    out: list[dict] = []
    with engine.connect() as conn:
        if filters is None or not filters.active or r.keys or r.session_id is not None or limit == 0:
            # No dimension filter: the ts index or the failed rows' indexes yield matching rows as
            # they are walked. A key or a session has an index of its own.
            batches: Iterator[list[tuple[float, float, bool]]] = iter([[(since, until, False)]])
        else:
            batches = _match_ranges(conn, since, until, filters, r, ascending, limit)
        shared = _filter_conds(filters, rows, log)  # built once, the same in every range's condition
        for batch in batches:
            # One query per batch: its ranges read together, in the page's order, up to the page.
            # Each range is a whole condition of its own (filters, cursor and all), so each is read
            # from its own index range and only its rows are walked (SQLite's OR-by-union,
            # PostgreSQL's BitmapOr); one span from the first range to the last with the ranges as
            # a filter would walk every row of the filters' index between them.
            terms = [
                and_(log.c.ts >= a, log.c.ts < b if x else log.c.ts <= b, *shared, *cursor_conds) for a, b, x in batch
            ]
            q = select(*cols).where(or_(*terms) if len(terms) > 1 else terms[0])
            q = q.order_by(*order).limit(limit - len(out))
            out += [dict(row) for row in conn.execute(q).mappings().all()]
            if len(out) >= limit:
                break
    return out[::-1] if ascending else out


GUIDE_FIRST_SPAN_S = 3600  # the rollup minutes a guided page read looks at first


def _match_ranges(
    conn, since: float, until: float, filters: MonitorFilters, rows: RowFilters, ascending: bool, limit: int
) -> Iterator[list[tuple[float, float, bool]]]:
    """Parts of ``[since, until]`` that hold rows passing the filters, nearest the page's start
    first, as batches of ``(start, end, end_exclusive)`` read one query each: the partial minute
    at that edge, then the runs of whole minutes that the rollups say hold matches (they carry the
    dimensions, the status and the error class), in batches that each hold about a page of
    matches by the rollups' counts (``limit``), then the partial minute at the far edge.

    The raw log has no index on the dimensions, so a page read of a filter that matches a few rows
    of a busy window would walk every row of the window (or of an error class) between them; read
    this way it walks only the minutes that hold matches. The caller stops when its page is full,
    so a dense match reads the nearest minutes only, and a sparse one reads the minutes of about one
    page of matches per query, not every matching minute of a span (the ranges of a query are read
    from an index each; a rollup that outlived the log's rows only makes a batch read fewer)."""
    lo, hi = split_minutes(since, until)
    edges = raw_ranges(since, until, lo, hi)
    if lo >= hi:
        yield edges
        return
    low_edge = [e for e in edges if e[0] < lo]  # [since, lo) when since is inside a minute
    high_edge = [e for e in edges if e[0] >= hi]  # [hi, until]
    near, far = (low_edge, high_edge) if ascending else (high_edge, low_edge)
    if near:
        yield near
    t, what = _guide_table(rows)
    conds = [t.c.minute >= lo, t.c.minute < hi, *dimension_filter(filters, t)]
    if rows.error_classes:
        conds.append(t.c.error_class.in_(rows.error_classes))
    # Nearest hour first, then spans four times longer: a dense match is served from the first
    # hour's few rollup rows; a sparse one reads the window's rollup rows once, a few spans at a time.
    bound, span = (lo if ascending else hi), GUIDE_FIRST_SPAN_S
    while bound < hi if ascending else bound > lo:
        a, b = (bound, min(hi, bound + span)) if ascending else (max(lo, bound - span), bound)
        q = (
            select(t.c.minute, func.sum(what))
            .where(*conds, t.c.minute >= a, t.c.minute < b)
            .group_by(t.c.minute)
            .having(func.sum(what) > 0)
            .order_by(t.c.minute.asc() if ascending else t.c.minute.desc())
        )
        minutes: list[int] = []
        held = 0
        for minute, n in conn.execute(q):
            minutes.append(int(minute))
            held += int(n)
            if held >= limit:
                yield _runs(minutes, ascending)
                minutes, held = [], 0
        if minutes:
            yield _runs(minutes, ascending)
        bound, span = (b if ascending else a), span * 4
    if far:
        yield far


def _guide_table(rows: RowFilters):
    """The per-minute rollup that counts the rows ``rows`` lets through, and the sum to read."""
    if rows.error_classes:
        t = ERROR_ROLLUP_TABLES[60].__table__
        return t, t.c.attempts if rows.status != "ok" else literal(0)
    t = rollup_table_for(60)
    if rows.status == "error":
        return t, t.c.errors
    if rows.status == "ok":
        return t, t.c.attempts - t.c.errors
    return t, t.c.attempts


def _runs(minutes: list[int], ascending: bool) -> list[tuple[float, float, bool]]:
    """Whole minutes (sorted in read order) as ``(start, end, True)`` ranges (end exclusive), one per
    run of adjacent minutes, in read order: one range read per run instead of one per minute."""
    out: list[list[int]] = []
    for m in minutes:
        if out and (m == out[-1][1] if ascending else m + 60 == out[-1][0]):
            if ascending:
                out[-1][1] = m + 60
            else:
                out[-1][0] = m
        else:
            out.append([m, m + 60])
    return [(float(a), float(b), True) for a, b in out]


def count_log_rows(
    engine: Engine,
    *,
    since: float,
    until: float,
    filters: MonitorFilters | None = None,
    rows: RowFilters | None = None,
    newer_than: Cursor | None = None,
    cap: int = 100_000,
) -> int:
    """Matching rows of ``[since, until]`` (only those newer than ``newer_than`` when given),
    counted up to ``cap + 1``: a result above ``cap`` means "more than ``cap``".

    Filters the rollups carry (dimensions, status, error class) are counted from them for the whole
    minutes of the range, and from the raw log's ``ts`` index for the partial minutes at its two
    edges (and for minutes older than the oldest raw row: none, the rollups outlive the log). A
    key or session filter, which no rollup carries, counts raw rows from that filter's index
    (``(key_name, ts, id)``, ``(session_id, ts)``), stopping at ``cap + 1``."""
    log = RequestLog.__table__
    r = rows or NO_ROW_FILTERS
    cap = int(cap)
    if r.keys or r.session_id is not None:
        return _count_raw(engine, since, until, filters, r, newer_than, cap)
    low = since if newer_than is None else max(since, newer_than[0])
    with engine.connect() as conn:
        oldest = conn.execute(select(func.min(log.c.ts))).scalar_one()
    if oldest is None:
        return 0
    low = max(low, float(oldest))
    lo, hi = split_minutes(low, until)
    total = _count_rollups(engine, lo, hi, filters, r) if lo < hi else 0
    for a, b, exclusive in raw_ranges(low, until, lo, hi):
        cursor = newer_than if a == low else None
        total += _count_raw(engine, a, b, filters, r, cursor, cap, exclusive=exclusive)
    if lo < hi and newer_than is not None and newer_than[0] == lo:
        # The cursor sits exactly on the first whole minute: its row and those before it at the
        # same ts are in that minute's rollup, but are not newer than it.
        total -= _count_raw(engine, lo, lo, filters, r, None, cap) - _count_raw(
            engine, lo, lo, filters, r, newer_than, cap
        )
    return min(total, cap + 1)


def _count_raw(
    engine: Engine,
    since: float,
    until: float,
    filters: MonitorFilters | None,
    rows: RowFilters,
    newer_than: Cursor | None,
    cap: int,
    *,
    exclusive: bool = False,
) -> int:
    # At most cap + 1 matching rows, in no order (which ones does not change the count), so the
    # planner reads them from whichever index bounds them best: ts, the failed rows', a key's or a
    # session's. ``exclusive``: ts < until.
    log = RequestLog.__table__
    conds = _row_conds(since, until, filters, rows, log)
    if exclusive:
        conds.append(log.c.ts < until)
    if newer_than is not None:
        conds.append(_newer(newer_than, log))
    inner = select(log.c.id).where(*conds).limit(cap + 1).subquery()
    with engine.connect() as conn:
        return as_int(conn.execute(select(func.count()).select_from(inner)).scalar_one())


def _count_rollups(engine: Engine, lo: int, hi: int, filters: MonitorFilters | None, rows: RowFilters) -> int:
    # Attempts of the whole minutes [lo, hi) that pass the filters, from the coarsest rollups that fit.
    if rows.error_classes:
        if rows.status == "ok":
            return 0  # only failed attempts carry an error class
        pieces = [
            (ERROR_ROLLUP_TABLES[span].__table__, a, b)  # mapped subclasses
            for span, a, b in span_parts(lo, hi, (3600, 60))
        ]
        total = 0
        with engine.connect() as conn:
            for t, a, b in pieces:
                q = select(func.sum(t.c.attempts)).where(
                    t.c.minute >= a,
                    t.c.minute < b,
                    t.c.error_class.in_(rows.error_classes),
                    *dimension_filter(filters, t),
                )
                total += as_int(conn.execute(q).scalar_one())
        return total
    total = 0
    with engine.connect() as conn:
        for span, a, b in span_parts(lo, hi):
            t = rollup_table_for(span)
            if rows.status == "error":
                what = func.sum(t.c.errors)
            elif rows.status == "ok":
                what = func.sum(t.c.attempts - t.c.errors)
            else:
                what = func.sum(t.c.attempts)
            q = select(what).where(t.c.minute >= a, t.c.minute < b, *dimension_filter(filters, t))
            total += as_int(conn.execute(q).scalar_one())
    return total


def iter_log_rows(
    engine: Engine,
    *,
    since: float,
    until: float,
    filters: MonitorFilters | None = None,
    rows: RowFilters | None = None,
    batch: int = 5000,
    max_rows: int | None = None,
) -> Iterator[list[dict]]:
    """Every matching row of ``[since, until]``, newest first, in batches of at most ``batch``
    (each one short keyset query: no connection or transaction is held between batches, so a
    long export neither blocks writers nor needs a server-side cursor). Stops after ``max_rows``."""
    batch = max(1, min(int(batch), RECENT_LIMIT_MAX))
    left = max_rows
    cursor: Cursor | None = None
    while left is None or left > 0:
        n = batch if left is None else min(batch, left)
        got = log_page(engine, since=since, until=until, filters=filters, rows=rows, older_than=cursor, limit=n)
        if not got:
            return
        yield got
        if len(got) < n:
            return
        cursor = (got[-1]["ts"], got[-1]["id"])
        if left is not None:
            left -= len(got)


def request_mix(engine: Engine, *, since: float, until: float) -> dict[tuple[str, str, str], int]:
    """Final requests of ``[since, until]`` by (model asked for, intent, canary side): a ``ts``
    range of the raw log, read on demand (the canary preview), not on a page's refresh."""
    log = RequestLog.__table__
    q = (
        select(log.c.requested_model, log.c.intent, log.c.side, func.count())
        .where(log.c.ts >= since, log.c.ts <= until, log.c.final.is_(true()))
        .group_by(log.c.requested_model, log.c.intent, log.c.side)
    )
    with engine.connect() as conn:
        return {(r[0], r[1], r[2]): int(r[3]) for r in conn.execute(q)}
