"""The monitor's rollup reads: summed rollup cells, the filter choices, the substitution and
error-class figures and the guardrail's reading.

Everything here is a query that returns what the database summed or stored, as plain frozen values;
building series from them, percentiles, caching settled buckets, date formatting and CSV live in
:mod:`app.monitor`. Reads of raw ``request_log`` rows (the request table, the last minute, a
provider's latest error) are in :mod:`db.raw_log`.

Everything that charts or summarises traffic reads the rollup tables (per minute, and per five
minutes and per hour for long windows: see :func:`db.models.rollup_table_for`), never the raw log, so
the cost of a query depends on the window's minutes and dimensions, not on the request volume.
The error classes and the substitutions come from their own rollups (per minute and per hour:
``request_error_rollup*``, ``request_substitution_rollup*``); the partial minutes at a window's
edges (:func:`split_minutes`, :func:`raw_ranges`) are read from the raw log's partial indexes.

Time bucketing: a rollup's ``minute`` is the integer epoch second of the minute's start. A query cut
into buckets of ``step`` seconds (a whole number of minutes) groups a row under
``minute - minute % step``, computed in SQL, and sums the counters and histogram columns there.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from sqlalchemy import BigInteger, Engine, and_, func, literal_column, or_, select, true, union_all

from core.canary import ROUTE_SIDES
from db.models import (
    API_REQUEST_COUNTERS,
    ERROR_ROLLUP_TABLES,
    LATENCY_BUCKETS,
    NO_ERROR_CLASS,
    NO_ROUTE,
    ROLLUP_TABLES,
    SUBSTITUTION_ROLLUP_TABLES,
    TTFT_BUCKETS,
    ErrorRollup,
    RequestLog,
    RequestRollup,
    rollup_table_for,
)

# The rollup counters a cell carries, in this order.
COUNT_COLUMNS = (
    "attempts",
    "requests",
    "errors",
    "request_errors",
    "fallbacks",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
)


@dataclass(frozen=True)
class MonitorFilters:
    """Dimension filters; an empty tuple means "all". Lists are accepted and stored as tuples so a
    filter is hashable (a cache key). ``routes`` are ``[routes]`` names; ``deployments`` are
    ``"provider/model"`` keys of a route's deployments (:func:`deployment_key`): attempts of the
    two-sided routing are no route's and no deployment's."""

    providers: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    intents: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    routes: tuple[str, ...] = ()
    deployments: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in FILTER_NAMES:
            object.__setattr__(self, name, tuple(sorted(set(getattr(self, name) or ()))))

    @property
    def active(self) -> bool:
        return any(getattr(self, name) for name in FILTER_NAMES)


FILTER_NAMES = ("providers", "models", "intents", "sources", "routes", "deployments")


def deployment_key(provider: str, model: str) -> str:
    """A deployment as the log and the filters name it (``request_log.deployment``)."""
    return f"{provider}/{model}"


def split_deployment(key: str) -> tuple[str, str]:
    """``(provider, model)`` of a :func:`deployment_key` (a provider name holds no ``/``; a model
    name may)."""
    provider, _, model = key.partition("/")
    return provider, model


NO_FILTERS = MonitorFilters()


@dataclass(frozen=True, slots=True)
class SummedCell:
    """One group of rollup rows as summed by SQL: the :data:`COUNT_COLUMNS` counters in that order,
    the cost, and the summed latency and TTFT histograms (``None`` when they hold no samples).
    Model cells carry only ``requests`` and the cost (other counters 0, no histograms)."""

    counts: tuple[int, ...]
    cost: float
    lat: tuple[int, ...] | None = None
    ttft: tuple[int, ...] | None = None

    def count(self, name: str) -> int:
        return self.counts[COUNT_COLUMNS.index(name)]


# bucket start -> ({provider: cell}, {model: cell}); buckets without rows are absent.
BucketCells = dict[int, tuple[dict[str, SummedCell], dict[str, SummedCell]]]


def minute_floor(ts: float) -> int:
    return int(ts // 60) * 60


def minute_ceil(ts: float) -> int:
    """The first minute start at or after ``ts``."""
    return int(-(-ts // 60)) * 60


def dimension_filter(filters: MonitorFilters | None, table) -> list:
    """The filters as conditions on ``table``: a rollup table (route ``''`` for the two-sided
    routing; a deployment is its provider and model on a route) or the raw log (route NULL, and a
    ``deployment`` column of its own)."""
    f = filters or NO_FILTERS
    conds = []
    for values, col in (
        (f.providers, table.c.provider),
        (f.models, table.c.model),
        (f.intents, table.c.intent),
        (f.sources, table.c.source),
        (f.routes, table.c.route),
    ):
        if values:
            conds.append(col.in_(values))
    if f.deployments:
        if "deployment" in table.c:
            conds.append(table.c.deployment.in_(f.deployments))
        else:
            pairs = [split_deployment(d) for d in f.deployments]
            conds.append(table.c.route != NO_ROUTE)
            conds.append(or_(*(and_(table.c.provider == p, table.c.model == m) for p, m in pairs)))
    return conds


def _rollup_range(since: float, until: float, filters: MonitorFilters | None, table=None):
    t = RequestRollup.__table__ if table is None else table
    return and_(t.c.minute >= minute_floor(since), t.c.minute <= int(until), *dimension_filter(filters, t))


def as_int(v) -> int:
    # PostgreSQL returns SUM(bigint) as numeric (Decimal); SQLite as int.
    return int(v or 0)


def _f(v) -> float:
    return float(v or 0.0)


def _ints(values: Sequence) -> tuple[int, ...]:
    try:
        return tuple(map(int, values))  # a grouped SUM of NOT NULL columns is never NULL
    except TypeError:  # a SUM over no rows is NULL
        return tuple(as_int(v) for v in values)


def _hist(values: Sequence) -> tuple[int, ...] | None:
    h = _ints(values)
    return h if any(h) else None


def _sum_cols(names: Sequence[str], table=None) -> list:
    t = RequestRollup.__table__ if table is None else table
    return [func.sum(t.c[n]).label(n) for n in names]


def _bucket_expr(step: int, table=None):
    # The step is inlined (it is an int we computed): with a bound parameter PostgreSQL could not
    # tell that the SELECT and GROUP BY expressions are the same. A step equal to the table's span
    # (a 24-hour window's 5-minute buckets on the 5-minute table, an hour's minutes on the minute
    # table) groups by the minute column itself: both databases then aggregate in a hash or in the
    # primary key's order instead of sorting every rollup row by a computed bucket first.
    t = RequestRollup.__table__ if table is None else table
    if int(step) == _table_span(t):
        return t.c.minute.label("bucket")
    return (t.c.minute - t.c.minute % literal_column(str(int(step)), BigInteger)).label("bucket")


def _table_span(table) -> int:
    return next(span for span, model in ROLLUP_TABLES.items() if model.__table__ is table)  # type: ignore[attr-defined]


def _full_cell(row: Sequence, first: int) -> SummedCell:
    # row[first:]: *COUNT_COLUMNS, cost_usd, *LATENCY_BUCKETS, *TTFT_BUCKETS
    nc, nl = len(COUNT_COLUMNS), len(LATENCY_BUCKETS)
    return SummedCell(
        counts=_ints(row[first : first + nc]),
        cost=_f(row[first + nc]),
        lat=_hist(row[first + nc + 1 : first + nc + 1 + nl]),
        ttft=_hist(row[first + nc + 1 + nl :]),
    )


_REQ = COUNT_COLUMNS.index("requests")


def _model_cell(row: Sequence) -> SummedCell:
    # row: bucket, model, requests, cost_usd
    counts = [0] * len(COUNT_COLUMNS)
    counts[_REQ] = as_int(row[2])
    return SummedCell(counts=tuple(counts), cost=_f(row[3]))


def bucket_cells(engine: Engine, *, since: int, until: float, step: int, filters: MonitorFilters) -> BucketCells:
    """Two grouped scans of the rollups from bucket ``since`` to ``until``: counters and histograms
    by (bucket, provider), requests and cost by (bucket, model). They read the coarsest rollup table
    whose span divides ``step`` (a 24-hour window in 5-minute steps sums 288 buckets, not 1,440)."""
    t = rollup_table_for(step)
    bucket = _bucket_expr(step, t)
    where = _rollup_range(since, until, filters, t)
    by_provider = (
        select(
            bucket,
            t.c.provider,
            *_sum_cols((*COUNT_COLUMNS, "cost_usd"), t),
            *_sum_cols(LATENCY_BUCKETS, t),
            *_sum_cols(TTFT_BUCKETS, t),
        )
        .where(where)
        .group_by(bucket, t.c.provider)
    )
    by_model = (
        select(bucket, t.c.model, *_sum_cols(("requests", "cost_usd"), t)).where(where).group_by(bucket, t.c.model)
    )
    out: BucketCells = {}
    with engine.connect() as conn:
        for row in conn.execute(by_provider):
            out.setdefault(int(row[0]), ({}, {}))[0][row[1]] = _full_cell(row, 2)
        for row in conn.execute(by_model):
            out.setdefault(int(row[0]), ({}, {}))[1][row[1]] = _model_cell(row)
    return out


def window_cell(engine: Engine, *, since: float, until: float, filters: MonitorFilters | None = None) -> SummedCell:
    """Every provider and model (that passed ``filters``) summed over ``[since, until]`` (whole
    rollup minutes)."""
    q = select(*_sum_cols((*COUNT_COLUMNS, "cost_usd")), *_sum_cols(LATENCY_BUCKETS), *_sum_cols(TTFT_BUCKETS)).where(
        _rollup_range(since, until, filters)
    )
    with engine.connect() as conn:
        return _full_cell(conn.execute(q).one(), 0)


@dataclass(frozen=True)
class Breakdown:
    """Whole-window cells for the monitor's level table.

    ``by_provider_side`` is keyed by ``(provider, canary side)`` and ignores the provider filter
    (see :func:`side_filters`); ``by_model`` and ``by_deployment`` honour every filter."""

    by_provider_side: dict[tuple[str, str], SummedCell]
    by_model: dict[str, SummedCell]
    # (route, deployment key) -> cell, the route's attempts only; honours every filter
    by_deployment: dict[tuple[str, str], SummedCell] = field(default_factory=dict)


def span_parts(lo: int, hi: int, spans: Sequence[int] = (3600, 300, 60)) -> list[tuple[int, int, int]]:
    """Cut the minutes ``[lo, hi)`` (whole minutes) into ``(span, start, end)`` pieces, each aligned
    to its table's span, coarsest first: a 24-hour window is 23 hourly rows plus at most a few
    dozen five-minute and one-minute rows per combination, instead of 1,440 minutes."""
    span, rest = spans[0], spans[1:]
    if not rest:
        return [(span, lo, hi)] if lo < hi else []
    a, b = -(-lo // span) * span, hi // span * span
    if a >= b:
        return span_parts(lo, hi, rest)
    return [*span_parts(lo, a, rest), (span, a, b), *span_parts(b, hi, rest)]


# Columns of a level cell: counters, cost and the latency histogram (no TTFT: the level table
# shows attempt latency only).
_LEVEL_COLUMNS = (*COUNT_COLUMNS, "cost_usd", *LATENCY_BUCKETS)


def _lat_cell(row: Sequence, first: int) -> SummedCell:
    # row[first:]: *COUNT_COLUMNS, cost_usd, *LATENCY_BUCKETS
    nc = len(COUNT_COLUMNS)
    return SummedCell(
        counts=_ints(row[first : first + nc]),
        cost=_f(row[first + nc]),
        lat=_hist(row[first + nc + 1 :]),
    )


@lru_cache(maxsize=16)
def _level_select(span: int, keys: tuple[str, ...]):
    # Built once per table and grouping: constructing 40-odd SUM expressions costs more than the
    # query over a settled piece.
    t = rollup_table_for(span)
    return select(*(t.c[k] for k in keys), *_sum_cols(_LEVEL_COLUMNS, t)).group_by(*(t.c[k] for k in keys))


def part_cells(
    engine: Engine, *, span: int, start: int, end: int, filters: MonitorFilters | None, keys: Sequence[str]
) -> dict[tuple, SummedCell]:
    """One piece of :func:`span_parts`: the ``span`` rollup table's minutes ``[start, end)`` summed
    by ``keys`` (e.g. ``("provider", "side", "model")``), keyed by the tuple of key values."""
    t = rollup_table_for(span)
    q = _level_select(span, tuple(keys)).where(t.c.minute >= start, t.c.minute < end, *dimension_filter(filters, t))
    n = len(keys)
    with engine.connect() as conn:
        return {tuple(r[:n]): _lat_cell(r, n) for r in conn.execute(q)}


def side_filters(filters: MonitorFilters | None) -> MonitorFilters:
    """``filters`` without the provider filter: the by-(provider, side) cells keep every provider,
    because the requests a provider started and lost to the fallback are counted on the fallback
    provider's rows (a provider filter would hide exactly them)."""
    f = filters or NO_FILTERS
    return MonitorFilters(
        models=f.models, intents=f.intents, sources=f.sources, routes=f.routes, deployments=f.deployments
    )


@dataclass(frozen=True)
class SubstitutionSums:
    """Final substituted requests of one (provider, model served, model asked for, intent)."""

    provider: str
    model: str
    requested_model: str
    intent: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_usd: float


def split_minutes(since: float, until: float) -> tuple[int, int]:
    """The whole minutes ``[lo, hi)`` inside ``[since, until]``, which rollups answer (``lo == hi``:
    none); the rest of the range (see :func:`raw_ranges`) is at most a partial minute at each end."""
    lo = minute_ceil(since)
    hi = minute_floor(until)
    return (lo, hi) if lo < hi else (0, 0)


def raw_ranges(since: float, until: float, lo: int, hi: int) -> list[tuple[float, float, bool]]:
    """The parts of ``[since, until]`` outside the whole minutes ``[lo, hi)``, for the raw log:
    ``(start, end, end_exclusive)``."""
    if lo >= hi:
        return [(since, until, False)]
    return ([(since, float(lo), True)] if since < lo else []) + [(float(hi), until, False)]


def _detail_parts(tables: dict, lo: int, hi: int) -> list[tuple[Any, int, int]]:
    """``(table, start, end)`` pieces of the rollup family ``tables`` (spans 60 and 3600) covering
    the whole minutes ``[lo, hi)``, hours where whole hours fit."""
    return [
        (tables[span].__table__, a, b)  # mapped subclasses
        for span, a, b in span_parts(lo, hi, tuple(sorted(tables, reverse=True)))
    ]


def substitution_sums(
    engine: Engine, *, since: float, until: float, filters: MonitorFilters | None = None
) -> list[SubstitutionSums]:
    """Substituted final requests in ``[since, until]`` with their tokens and cost, grouped. The
    whole minutes are summed from the substitution rollups (whole hours from the hourly table), the
    partial minutes at the edges from the substituted rows' partial index: the cost depends on the
    window's length and combinations, not on the log's size."""
    lo, hi = split_minutes(since, until)
    log = RequestLog.__table__
    acc: dict[tuple[str, str, str, str], list] = {}
    queries = []
    for t, start, end in _detail_parts(SUBSTITUTION_ROLLUP_TABLES, lo, hi):
        queries.append(
            select(
                t.c.provider,
                t.c.model,
                t.c.requested_model,
                t.c.intent,
                func.sum(t.c.requests),
                func.sum(t.c.prompt_tokens),
                func.sum(t.c.cached_tokens),
                func.sum(t.c.completion_tokens),
                func.sum(t.c.cost_usd),
            )
            .where(t.c.minute >= start, t.c.minute < end, *dimension_filter(filters, t))
            .group_by(t.c.provider, t.c.model, t.c.requested_model, t.c.intent)
        )
    for a, b, exclusive in raw_ranges(since, until, lo, hi):
        queries.append(
            select(
                log.c.provider,
                log.c.model,
                log.c.requested_model,
                log.c.intent,
                func.count(),
                func.sum(log.c.prompt_tokens),
                func.sum(log.c.cached_tokens),
                func.sum(log.c.completion_tokens),
                func.sum(log.c.cost_usd),
            )
            .where(
                log.c.substituted.is_(true()),
                log.c.ts >= a,
                (log.c.ts < b) if exclusive else (log.c.ts <= b),
                log.c.final.is_(true()),
                *dimension_filter(filters, log),
            )
            .group_by(log.c.provider, log.c.model, log.c.requested_model, log.c.intent)
        )
    with engine.connect() as conn:
        for q in queries:
            for r in conn.execute(q):
                cell = acc.setdefault((r[0], r[1], r[2], r[3]), [0, 0, 0, 0, 0.0])
                for i in range(4):
                    cell[i] += as_int(r[4 + i])
                cell[4] += _f(r[8])
    return [SubstitutionSums(*key, *cell) for key, cell in sorted(acc.items())]


def cost_between(engine: Engine, *, since: float, until: float) -> float:
    """Total cost in USD of the rollup minutes that start in ``[since, until]`` (the minute holding
    ``until`` included). Whole hours come from the hourly rollups and whole five minutes from
    theirs (:func:`span_parts`), so today's cost reads about 24 + 22 + 8 rows per combination, not
    one per minute since midnight: the cost is the same at any time of day and any traffic."""
    parts = span_parts(minute_ceil(since), minute_floor(until) + 60)
    if not parts:
        return 0.0
    sums = []
    for span, a, b in parts:
        t = rollup_table_for(span)
        sums.append(select(func.sum(t.c.cost_usd).label("cost")).where(t.c.minute >= a, t.c.minute < b))
    both = union_all(*sums).subquery()
    with engine.connect() as conn:  # one round trip
        return _f(conn.execute(select(func.sum(both.c.cost))).scalar_one())


@dataclass(frozen=True)
class ApiSums:
    """Requests per OpenAI API and the answers' reasoning tokens and tool calls over a window."""

    requests: dict[str, int]  # api -> final attempts (chat, responses, embeddings, completions)
    reasoning_tokens: int
    tool_calls: int


def api_sums(engine: Engine, *, since: float, until: float, filters: MonitorFilters | None = None) -> ApiSums:
    """One rollup query over ``[since, until]`` (migration 0008's counters). The rollups count the
    non-chat APIs' requests; chat is every other request."""
    others = tuple(API_REQUEST_COUNTERS.items())
    q = select(*_sum_cols(("requests", "reasoning_tokens", "tool_calls", *(c for _, c in others)))).where(
        _rollup_range(since, until, filters)
    )
    with engine.connect() as conn:
        row = [as_int(v) for v in conn.execute(q).one()]
    per_api = {api: row[3 + i] for i, (api, _) in enumerate(others)}
    return ApiSums({"chat": row[0] - sum(per_api.values()), **per_api}, row[1], row[2])


@dataclass(frozen=True)
class ProviderSums:
    """A provider's attempts, failed attempts, requests and summed latency histogram."""

    attempts: int
    errors: int
    requests: int
    lat: tuple[int, ...] | None


def provider_sums(engine: Engine, *, providers: Sequence[str], since: float, until: float) -> dict[str, ProviderSums]:
    """One grouped rollup query over ``[since, until]``; providers without rows are absent."""
    if not providers:
        return {}
    t = RequestRollup.__table__
    q = (
        select(t.c.provider, *_sum_cols(("attempts", "errors", "requests")), *_sum_cols(LATENCY_BUCKETS))
        .where(_rollup_range(since, until, MonitorFilters(providers=tuple(providers))))
        .group_by(t.c.provider)
    )
    with engine.connect() as conn:
        return {
            r.provider: ProviderSums(as_int(r.attempts), as_int(r.errors), as_int(r.requests), _hist(r[4:]))
            for r in conn.execute(q).all()
        }


def deployment_sums(
    engine: Engine, *, providers: Sequence[str], since: float, until: float
) -> dict[tuple[str, str, str], ProviderSums]:
    """Per route deployment ``(route, provider, model routed to)``: one grouped rollup query over
    ``[since, until]``; the two-sided routing's attempts on the same provider and model are not a
    route's and are left out."""
    if not providers:
        return {}
    t = RequestRollup.__table__
    q = (
        select(
            t.c.route,
            t.c.provider,
            t.c.model,
            *_sum_cols(("attempts", "errors", "requests")),
            *_sum_cols(LATENCY_BUCKETS),
        )
        .where(_rollup_range(since, until, MonitorFilters(providers=tuple(providers))), t.c.route != NO_ROUTE)
        .group_by(t.c.route, t.c.provider, t.c.model)
    )
    with engine.connect() as conn:
        return {
            (r.route, r.provider, r.model): ProviderSums(
                as_int(r.attempts), as_int(r.errors), as_int(r.requests), _hist(r[6:])
            )
            for r in conn.execute(q).all()
        }


def side_counts(engine: Engine, *, since: float, until: float, step: int) -> dict[int, tuple[int, int]]:
    """Final requests per bucket by the global canary's side: ``{bucket: (primary, fallback)}``,
    buckets with no requests absent (a route's requests are left out)."""
    t = RequestRollup.__table__
    bucket = _bucket_expr(step)
    q = (
        select(bucket, t.c.side, func.sum(t.c.requests).label("requests"))
        .where(_rollup_range(since, until, None))
        .group_by(bucket, t.c.side)
    )
    out: dict[int, list[int]] = {}
    with engine.connect() as conn:
        for r in conn.execute(q).all():
            if r.side in ROUTE_SIDES:  # a route's requests are not the global canary's split
                continue
            out.setdefault(int(r.bucket), [0, 0])[0 if r.side == "primary" else 1] += as_int(r.requests)
    return {b: (p, f) for b, (p, f) in out.items()}


def provider_side_sums(engine: Engine, *, since: float, until: float) -> dict[tuple[str, str], tuple[int, int, int]]:
    """Final requests over a window by (provider that answered or refused, canary side):
    ``{(provider, side): (requests, on a fail-over route, failed)}`` (minute rollups)."""
    t = RequestRollup.__table__
    q = (
        select(
            t.c.provider,
            t.c.side,
            func.sum(t.c.requests).label("requests"),
            func.sum(t.c.fallbacks).label("fb"),
            func.sum(t.c.request_errors).label("failed"),
        )
        .where(_rollup_range(since, until, None))
        .group_by(t.c.provider, t.c.side)
    )
    with engine.connect() as conn:
        return {
            (r.provider, r.side): (as_int(r.requests), as_int(r.fb), as_int(r.failed)) for r in conn.execute(q).all()
        }


def has_requests(engine: Engine) -> bool:
    """Whether anything was ever logged (one row probe)."""
    with engine.connect() as conn:
        return conn.execute(select(RequestRollup.minute).limit(1)).first() is not None


def filter_options(engine: Engine, *, since: float) -> dict[str, list[str]]:
    """Distinct ``providers``, ``models``, ``intents``, ``sources``, ``routes`` and
    ``deployments`` (:func:`deployment_key`, on a route) with traffic since ``since``.

    Whole hours come from the hourly rollups and only the partial hour at the window's start from
    the per-minute ones, so a 7-day window reads about 170 hourly buckets of combinations, not
    10,080 minutes' worth.
    """
    first_hour = -(-int(since) // 3600) * 3600  # the first hour boundary at or after ``since``
    minutes, hours = RequestRollup.__table__, rollup_table_for(3600)
    queries = [
        select(t.c.provider, t.c.model, t.c.intent, t.c.source, t.c.route).distinct().where(*where)
        for t, where in (
            (minutes, (minutes.c.minute >= minute_floor(since), minutes.c.minute < first_hour)),
            (hours, (hours.c.minute >= first_hour,)),
        )
    ]
    out: dict[str, set[str]] = {name: set() for name in FILTER_NAMES}
    with engine.connect() as conn:
        for q in queries:
            for r in conn.execute(q):
                out["providers"].add(r.provider)
                out["models"].add(r.model)
                out["intents"].add(r.intent)
                out["sources"].add(r.source)
                if r.route != NO_ROUTE:
                    out["routes"].add(r.route)
                    out["deployments"].add(deployment_key(r.provider, r.model))
    return {k: sorted(v) for k, v in out.items()}


@dataclass(frozen=True)
class GuardrailReading:
    """A provider's attempts and failed attempts over the guardrail's window."""

    attempts: int
    errors: int

    @property
    def error_rate(self) -> float:
        return self.errors / self.attempts if self.attempts else 0.0


def provider_error_rate(
    engine: Engine,
    provider: str,
    window_minutes: int,
    now: float | None = None,
    *,
    counted: Collection[str] | None = None,
) -> GuardrailReading:
    """Attempts and failures of ``provider`` in the last ``window_minutes`` minutes (the current
    minute included), from the per-minute rollups. With ``counted`` (error classes), only failures
    of those classes count, and the other failed attempts (the caller went away, the request was
    refused for its own content) are left out of the attempts too: they say nothing either way."""
    now = time.time() if now is None else now
    since = minute_floor(now) - (window_minutes - 1) * 60
    t = RequestRollup.__table__
    q = select(func.coalesce(func.sum(t.c.attempts), 0), func.coalesce(func.sum(t.c.errors), 0)).where(
        t.c.provider == provider, t.c.minute >= since
    )
    with engine.connect() as conn:
        attempts, errors = (as_int(v) for v in conn.execute(q).one())
        if counted is None or not errors:
            return GuardrailReading(attempts, errors)
        e = ErrorRollup.__table__
        health = as_int(
            conn.execute(
                select(func.coalesce(func.sum(e.c.attempts), 0)).where(
                    e.c.provider == provider, e.c.minute >= since, e.c.error_class.in_(sorted(counted))
                )
            ).scalar_one()
        )
    return GuardrailReading(attempts - (errors - health), health)


def error_classes_between(engine: Engine, *, since: float, until: float) -> list[str]:
    """Distinct error classes of the failed attempts in ``[since, until]``: the whole minutes from
    the error-class rollups (whole hours from the hourly table), the partial minutes at the edges
    from the failed rows' partial index (migration 0011)."""
    lo, hi = split_minutes(since, until)
    log = RequestLog.__table__
    queries = [
        select(t.c.error_class)
        .distinct()
        .where(t.c.minute >= start, t.c.minute < end, t.c.error_class != NO_ERROR_CLASS)
        for t, start, end in _detail_parts(ERROR_ROLLUP_TABLES, lo, hi)
    ]
    # The partial minutes: the failed rows of a minute at most, read from their ``ts`` index. No
    # "error_class IS NOT NULL" here: with it, PostgreSQL walks the (error_class, ts) index from
    # its first class to its last for a minute's worth of ts (a whole day's failures at 30 M rows).
    queries += [
        select(log.c.error_class)
        .distinct()
        .where(log.c.status != "ok", log.c.ts >= a, (log.c.ts < b) if exclusive else (log.c.ts <= b))
        for a, b, exclusive in raw_ranges(since, until, lo, hi)
    ]
    found: set[str] = set()
    with engine.connect() as conn:
        for q in queries:
            found.update(r[0] for r in conn.execute(q))
    found.discard(None)
    return sorted(found)
