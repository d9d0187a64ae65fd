"""Request log and per-minute rollups: the write side (batch insert + rollup upsert) and retention.

One call writes a batch of attempt rows and folds them into the rollups (per minute, per five
minutes and per hour: ``request_rollup``, ``request_rollup_5m``, ``request_rollup_1h``; and the
failed attempts by error class and the substituted requests by model asked for, per minute and per
hour: ``request_error_rollup*``, ``request_substitution_rollup*``) in the same transaction, so the
rollups always agree with the log. The rollup upsert adds to existing counters
(``INSERT ... ON CONFLICT DO UPDATE SET col = col + excluded.col``), which is safe when several
processes write at once.

Several writers, no deadlocks: every transaction upserts its rollup cells (and inserts its log
rows) in one global order, sorted by key, table after table in the same order. Two transactions
then always meet on their first common row and one waits for the other; in first-seen order they
could each hold a row the other needs next, which PostgreSQL breaks with ``deadlock detected``.

Inserts are idempotent: ``request_log`` is unique on (request_id, attempt, ts) (migrations 0004 and
0012), and a batch writes only the rows not already there, folding only those into the rollups. So
a batch that is retried after its commit, or replayed from the journal after a crash, never
duplicates a row or a count. On PostgreSQL the insert itself says which rows were new
(``ON CONFLICT DO NOTHING RETURNING``): no existence query to plan, so a fresh database without
statistics is as fast as an analysed one, and a concurrent writer holding the same rows just waits
for the other's commit. On SQLite (one writer at a time) a pre-select by request id finds them.

Retention (:func:`prune`) never runs one long statement: on PostgreSQL whole day partitions of the
log are dropped (:mod:`db.partitions`); everything else (SQLite's log, the legacy partition, the
rollups) is deleted in short batches, each its own transaction, sized to stay well under a second,
so SQLite's write lock is released between them and every statement stays far inside PostgreSQL's
statement timeout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from sqlalchemy import Engine, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError

from core.histogram import bucket_of
from core.records import FIELD_NAMES, AttemptRecord
from db.models import (
    API_REQUEST_COUNTERS,
    ERROR_ROLLUP_KEY,
    ERROR_ROLLUP_SUMS,
    ERROR_ROLLUP_TABLES,
    LATENCY_BUCKETS,
    NO_ERROR_CLASS,
    NO_ROUTE,
    ROLLUP_KEY,
    ROLLUP_SUMS,
    ROLLUP_TABLES,
    SUBSTITUTION_ROLLUP_KEY,
    SUBSTITUTION_ROLLUP_SUMS,
    SUBSTITUTION_ROLLUP_TABLES,
    TTFT_BUCKETS,
    RequestLog,
)
from db.partitions import KEEPER, LEGACY, drop_before, is_partitioned, list_partitions

_COUNTERS = ROLLUP_SUMS + LATENCY_BUCKETS + TTFT_BUCKETS


def rollup_deltas(records: Iterable[AttemptRecord], span_s: int = 60) -> list[dict]:
    """Fold attempt records into one counter row per rollup key (buckets of ``span_s`` seconds)."""
    acc: dict[tuple, dict] = {}
    for r in records:
        key = (int(r.ts // span_s) * span_s, r.provider, r.model, r.intent, r.source, r.side, r.route or NO_ROUTE)
        row = acc.get(key)
        if row is None:
            row = dict(zip(ROLLUP_KEY, key, strict=True))
            row.update({c: 0 for c in _COUNTERS})
            acc[key] = row
        failed = r.status != "ok"
        row["attempts"] += 1
        row["errors"] += failed
        if r.final:
            row["requests"] += 1
            row["request_errors"] += failed
            row["fallbacks"] += bool(r.fallback)
            api_counter = API_REQUEST_COUNTERS.get(r.api)
            if api_counter is not None:
                row[api_counter] += 1
        row["prompt_tokens"] += r.prompt_tokens
        row["cached_tokens"] += r.cached_tokens
        row["completion_tokens"] += r.completion_tokens
        row["reasoning_tokens"] += r.reasoning_tokens
        row["tool_calls"] += r.tool_calls
        row["cost_usd"] += r.cost_usd
        row["latency_sum_ms"] += r.latency_ms
        row[LATENCY_BUCKETS[bucket_of(r.latency_ms)]] += 1
        if r.ttft_ms is not None:
            row["ttft_sum_ms"] += r.ttft_ms
            row["ttft_count"] += 1
            row[TTFT_BUCKETS[bucket_of(r.ttft_ms)]] += 1
    return list(acc.values())


def coarsen(
    deltas: Iterable[dict], span_s: int, key: Sequence[str] = ROLLUP_KEY, counters: Sequence[str] = _COUNTERS
) -> list[dict]:
    """Re-bucket per-minute counter rows (of the table family with ``key`` and ``counters``) into
    buckets of ``span_s`` seconds (cheaper than re-folding the records: a batch has far fewer
    minute rows than records)."""
    acc: dict[tuple, dict] = {}
    for d in deltas:
        start = d["minute"] // span_s * span_s
        k = (start, *(d[c] for c in key[1:]))
        row = acc.get(k)
        if row is None:
            acc[k] = {**d, "minute": start}
        else:
            for c in counters:
                row[c] += d[c]
    return list(acc.values())


def _detail_key(r: AttemptRecord, span_s: int) -> tuple:
    return (
        int(r.ts // span_s) * span_s,
        r.provider,
        r.model,
        r.requested_model,
        r.intent,
        r.source,
        r.route or NO_ROUTE,
    )


def error_deltas(records: Iterable[AttemptRecord], span_s: int = 60) -> list[dict]:
    """Fold the failed attempts among ``records`` into one row per error-rollup key."""
    acc: dict[tuple, dict] = {}
    for r in records:
        if r.status == "ok":
            continue
        key = (*_detail_key(r, span_s), r.error_class or NO_ERROR_CLASS)
        row = acc.get(key)
        if row is None:
            row = acc[key] = {**dict(zip(ERROR_ROLLUP_KEY, key, strict=True)), "attempts": 0, "requests": 0}
        row["attempts"] += 1
        row["requests"] += bool(r.final)
    return list(acc.values())


def substitution_deltas(records: Iterable[AttemptRecord], span_s: int = 60) -> list[dict]:
    """Fold the substituted final attempts among ``records`` into one row per substitution-rollup key."""
    acc: dict[tuple, dict] = {}
    for r in records:
        if not (r.substituted and r.final):
            continue
        key = _detail_key(r, span_s)
        row = acc.get(key)
        if row is None:
            row = acc[key] = {
                **dict(zip(SUBSTITUTION_ROLLUP_KEY, key, strict=True)),
                **{c: 0 for c in SUBSTITUTION_ROLLUP_SUMS},
            }
        row["requests"] += 1
        row["prompt_tokens"] += r.prompt_tokens
        row["cached_tokens"] += r.cached_tokens
        row["completion_tokens"] += r.completion_tokens
        row["cost_usd"] += r.cost_usd
    return list(acc.values())


# The detail families, in the order every writer upserts them (after the main rollups):
# (tables by span, key, counters, fold).
DETAIL_FAMILIES = (
    (ERROR_ROLLUP_TABLES, ERROR_ROLLUP_KEY, ERROR_ROLLUP_SUMS, error_deltas),
    (SUBSTITUTION_ROLLUP_TABLES, SUBSTITUTION_ROLLUP_KEY, SUBSTITUTION_ROLLUP_SUMS, substitution_deltas),
)


_STATEMENTS: dict[tuple[str, str], object] = {}


def _upsert(engine: Engine, table, key: Sequence[str] = ROLLUP_KEY, counters: Sequence[str] = _COUNTERS):
    # Building the 108-column ON CONFLICT clause costs more than executing it: build it once.
    cached = _STATEMENTS.get((engine.dialect.name, table.name))
    if cached is not None:
        return cached
    dialect = engine.dialect.name
    stmt: sqlite.Insert | postgresql.Insert
    if dialect == "sqlite":
        stmt = sqlite.insert(table)
    elif dialect == "postgresql":
        stmt = postgresql.insert(table)
    else:  # pragma: no cover - config refuses other databases
        raise RuntimeError(f"unsupported database {dialect}")
    stmt = stmt.on_conflict_do_update(
        index_elements=list(key),
        set_={c: table.c[c] + stmt.excluded[c] for c in counters},
    )
    _STATEMENTS[(engine.dialect.name, table.name)] = stmt
    return stmt


def _log_insert_sql(engine: Engine) -> str:
    """INSERT for the raw log in the driver's own parameter style: the rows are already plain tuples
    of Python scalars, so SQLAlchemy's per-row parameter processing (the largest cost of ingest) is
    skipped and the driver's executemany does the work. ``ON CONFLICT DO NOTHING`` is the backstop
    behind the pre-select in :func:`insert_batch` (SQLite)."""
    key = (engine.dialect.name, "request_log")
    sql = _STATEMENTS.get(key)
    if sql is None:
        mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"
        cols = ", ".join(FIELD_NAMES)
        sql = (
            f"INSERT INTO {RequestLog.__tablename__} ({cols}) VALUES ({', '.join([mark] * len(FIELD_NAMES))}) "
            f"ON CONFLICT {_LOG_KEY} DO NOTHING"
        )
        _STATEMENTS[key] = sql
    return sql  # type: ignore[return-value]


_LOG_KEY = "(request_id, attempt, ts)"  # the unique key (migration 0012)
# Rows per multi-row INSERT on PostgreSQL: 1,000 x 31 columns stays under its 65,535 parameters.
_PG_ROWS_PER_INSERT = 1000


def _pg_insert_new(conn, records: Sequence[AttemptRecord]) -> set[tuple[str, int, float]]:
    """Insert ``records`` on PostgreSQL; the keys of those that were not there already. A row
    another transaction is inserting at the same moment is waited for, then skipped if it
    committed (so it is counted once, by that writer)."""
    row = "(" + ", ".join(["%s"] * len(FIELD_NAMES)) + ")"
    head = f"INSERT INTO {RequestLog.__tablename__} ({', '.join(FIELD_NAMES)}) VALUES "
    tail = f" ON CONFLICT {_LOG_KEY} DO NOTHING RETURNING request_id, attempt, ts"
    written: set[tuple[str, int, float]] = set()
    for i in range(0, len(records), _PG_ROWS_PER_INSERT):
        chunk = records[i : i + _PG_ROWS_PER_INSERT]
        params = tuple(v for r in chunk for v in r.to_tuple())
        result = conn.exec_driver_sql(head + ", ".join([row] * len(chunk)) + tail, params)
        written.update((rid, int(att), float(ts)) for rid, att, ts in result)
    return written


class ConcurrentInsertError(RuntimeError):
    """Another writer committed some of this batch's rows between our check and our insert. The
    transaction is rolled back (its rollup counts would be wrong); retrying the batch is safe and
    writes only what is still missing. Only possible when two writers hold the same records."""


_ID_CHUNK = 500  # request ids per existence query (well under SQLite's bound-parameter limit)


def _existing_keys(conn, engine: Engine, request_ids: list[str]) -> set[tuple[str, int]]:
    mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"
    found: set[tuple[str, int]] = set()
    for i in range(0, len(request_ids), _ID_CHUNK):
        chunk = request_ids[i : i + _ID_CHUNK]
        sql = (
            f"SELECT request_id, attempt FROM {RequestLog.__tablename__} "
            f"WHERE request_id IN ({', '.join([mark] * len(chunk))})"
        )
        found.update((rid, int(att)) for rid, att in conn.exec_driver_sql(sql, tuple(chunk)).fetchall())
    return found


def new_records(records: Sequence[AttemptRecord], present: set[tuple[str, int]]) -> list[AttemptRecord]:
    """``records`` minus those whose (request_id, attempt) is in ``present`` or earlier in the batch."""
    seen = set(present)
    out = []
    for r in records:
        key = (r.request_id, r.attempt)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def cell_key(delta: dict, key: Sequence[str] = ROLLUP_KEY) -> tuple:
    """A rollup cell's key in the one order every writer upserts in."""
    return tuple(delta[k] for k in key)


def in_lock_order(deltas: Iterable[dict], key: Sequence[str] = ROLLUP_KEY) -> list[dict]:
    """The rollup rows sorted by cell key: the order every transaction takes their row locks in, so
    no two writers ever wait for each other in a cycle."""
    return sorted(deltas, key=lambda d: cell_key(d, key))


def _record_key(r: AttemptRecord) -> tuple[str, int, float]:
    return (r.request_id, r.attempt, r.ts)


def _no_partition(exc: DBAPIError) -> bool:
    # SQLSTATE 23514 "no partition of relation ... found for row": the day's partition was dropped
    # (by a prune in another process) after this process last looked.
    return getattr(exc.orig, "sqlstate", None) == "23514" and "partition" in str(exc.orig)


def insert_batch(engine: Engine, records: Sequence[AttemptRecord]) -> int:
    """Write the records not already in the log, and their rollups, atomically; returns the number
    of rows newly written (0 for a batch that was written before)."""
    if not records:
        return 0
    if engine.dialect.name != "postgresql":
        return _insert(engine, records)
    KEEPER.ensure(engine, {r.ts for r in records})
    try:
        return _insert(engine, records)
    except DBAPIError as exc:
        if not _no_partition(exc):
            raise
        KEEPER.forget()
        KEEPER.ensure(engine, {r.ts for r in records})
        return _insert(engine, records)


def _insert(engine: Engine, records: Sequence[AttemptRecord]) -> int:
    with engine.connect().execution_options(sqlite_immediate=True) as conn, conn.begin():
        if engine.dialect.name == "postgresql":
            batch = sorted(new_records(records, set()), key=_record_key)
            written = _pg_insert_new(conn, batch)
            fresh = [r for r in batch if _record_key(r) in written]
        else:
            present = _existing_keys(conn, engine, list(dict.fromkeys(r.request_id for r in records)))
            fresh = sorted(new_records(records, present), key=_record_key)
            if not fresh:
                return 0
            result = conn.exec_driver_sql(_log_insert_sql(engine), [r.to_tuple() for r in fresh])
            if result.rowcount is not None and 0 <= result.rowcount < len(fresh):
                raise ConcurrentInsertError(
                    f"{len(fresh) - result.rowcount} of {len(fresh)} request-log rows appeared during the insert"
                )
        if not fresh:
            return 0
        per_minute = rollup_deltas(fresh, 60)
        # Tables in one fixed order (60, 300, 3600 s), each table's cells sorted: see the module doc.
        for span, model in sorted(ROLLUP_TABLES.items()):
            deltas = in_lock_order(per_minute if span == 60 else coarsen(per_minute, span))
            conn.execute(_upsert(engine, model.__table__), deltas)  # type: ignore[attr-defined]
        for tables, key, counters, fold in DETAIL_FAMILIES:
            minute_rows = fold(fresh, 60)
            if not minute_rows:
                continue
            for span, detail in sorted(tables.items()):
                rows = minute_rows if span == 60 else coarsen(minute_rows, span, key, counters)
                stmt = _upsert(engine, detail.__table__, key, counters)
                conn.execute(stmt, in_lock_order(rows, key))
    return len(fresh)


def count_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(RequestLog)).scalar_one())


# -- retention ----------------------------------------------------------------------------------------

BATCH_TARGET_S = 0.25  # aim for each delete batch (one transaction, one hold of SQLite's write lock)
BATCH_MIN, BATCH_MAX, BATCH_FIRST = 500, 200_000, 5_000


def next_batch_size(rows: int, elapsed_s: float, target_s: float = BATCH_TARGET_S) -> int:
    """The next delete batch's size after ``rows`` took ``elapsed_s``: halved when it ran past the
    target, doubled when it took under a quarter of it, within [BATCH_MIN, BATCH_MAX]. A batch
    that ran 4x over the target is followed by one that is a quarter of it, so a slow disk gets
    back under a second within a batch or two."""
    if elapsed_s > target_s:
        factor = max(2.0, elapsed_s / target_s)
        return max(BATCH_MIN, int(rows / factor))
    if elapsed_s < target_s / 4:
        return min(BATCH_MAX, rows * 2)
    return rows


def delete_before(
    engine: Engine,
    table: str,
    column: str,
    cutoff: float,
    *,
    first_batch: int = BATCH_FIRST,
    target_s: float = BATCH_TARGET_S,
    clock: Callable[[], float] = time.perf_counter,
) -> int:
    """Delete the rows of ``table`` with ``column < cutoff`` in batches, each its own short
    transaction (an index range on ``column`` picks the batch); returns the rows deleted.

    ``table`` must be a plain table (on PostgreSQL rows are picked by ``ctid``, which is unique
    only within one table: a partition, never a partitioned parent)."""
    if engine.dialect.name == "sqlite":
        sql = f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {column} < ? LIMIT ?)"
    else:
        sql = f"DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE {column} < %s LIMIT %s))"
    total, n = 0, max(1, int(first_batch))
    while True:
        t0 = clock()
        with engine.begin() as conn:
            got = conn.exec_driver_sql(sql, (cutoff, n)).rowcount
        total += got
        if got < n:
            return total
        n = next_batch_size(n, clock() - t0, target_s)


# Rollup table -> bucket span (s); the cutoff is floored to a bucket start so only whole buckets
# older than it go.
_ROLLUP_NAMES = {model.__tablename__: span for span, model in ROLLUP_TABLES.items()}  # type: ignore[attr-defined]
# The detail rollups (error classes, substitutions) go with the main rollups of their span.
_DETAIL_NAMES = {model.__tablename__: span for tables, *_ in DETAIL_FAMILIES for span, model in tables.items()}


def prune(
    engine: Engine,
    *,
    raw_before: float,
    minute_rollups_before: float | None = None,
    rollups_5m_before: float | None = None,
    rollups_1h_before: float | None = None,
    first_batch: int = BATCH_FIRST,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, int]:
    """Remove raw log rows older than ``raw_before`` and the rollup buckets older than their
    cutoffs (epoch seconds; ``None`` keeps that resolution whole). Returns the rows removed per
    table, plus ``request_log_partitions_dropped``.

    On PostgreSQL the log's day partitions wholly older than ``raw_before`` are dropped (a day's
    partition of 37 M rows goes in milliseconds; the day holding the cutoff is kept whole, so at
    most a day more than asked is kept) and their row count is the planner's estimate; the legacy
    partition of a table migrated by 0012 is deleted from in batches. On SQLite, and for the
    rollups, rows are deleted in short batches (:func:`delete_before`)."""
    out = {"request_log": 0, "request_log_partitions_dropped": 0}
    with engine.connect() as conn:
        partitioned = is_partitioned(conn)
        legacy = partitioned and any(p.name == LEGACY for p in list_partitions(conn))
    if partitioned:
        with engine.begin() as conn:
            dropped, rows = drop_before(conn, raw_before)
        KEEPER.forget()
        out["request_log"] += rows
        out["request_log_partitions_dropped"] = len(dropped)
        if legacy and LEGACY not in dropped:
            out["request_log"] += delete_before(engine, LEGACY, "ts", raw_before, first_batch=first_batch, clock=clock)
    else:
        out["request_log"] = delete_before(
            engine, RequestLog.__tablename__, "ts", raw_before, first_batch=first_batch, clock=clock
        )
    cutoffs = (minute_rollups_before, rollups_5m_before, rollups_1h_before)
    for (name, span), before in zip(sorted(_ROLLUP_NAMES.items(), key=lambda kv: kv[1]), cutoffs, strict=True):
        if before is not None:
            cutoff = int(before // span) * span
            out[name] = delete_before(engine, name, "minute", cutoff, first_batch=first_batch, clock=clock)
    by_span = dict(zip((60, 300, 3600), cutoffs, strict=True))
    for name, span in sorted(_DETAIL_NAMES.items(), key=lambda kv: (kv[1], kv[0])):
        before = by_span[span]
        if before is not None:
            cutoff = int(before // span) * span
            out[name] = delete_before(engine, name, "minute", cutoff, first_batch=first_batch, clock=clock)
    return out
