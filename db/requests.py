"""Request log and per-minute rollups: the write side (batch insert + rollup upsert).

One call writes a batch of attempt rows and folds them into the rollups (per minute, per five
minutes and per hour: ``request_rollup``, ``request_rollup_5m``, ``request_rollup_1h``) in the same
transaction, so the rollups always agree with the log. The rollup upsert adds to existing counters
(``INSERT ... ON CONFLICT DO UPDATE SET col = col + excluded.col``), which is safe when several
processes write at once.

Inserts are idempotent: ``request_log`` is unique on (request_id, attempt) (migration 0004), and a
batch writes only the rows not already there, folding only those into the rollups. So a batch that
is retried after its commit, or replayed from the journal after a crash, never duplicates a row or
a count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import Engine, func, select
from sqlalchemy.dialects import postgresql, sqlite

from core.histogram import bucket_of
from core.records import FIELD_NAMES, AttemptRecord
from db.models import (
    API_REQUEST_COUNTERS,
    LATENCY_BUCKETS,
    ROLLUP_KEY,
    ROLLUP_SUMS,
    ROLLUP_TABLES,
    TTFT_BUCKETS,
    RequestLog,
)

_COUNTERS = ROLLUP_SUMS + LATENCY_BUCKETS + TTFT_BUCKETS


def rollup_deltas(records: Iterable[AttemptRecord], span_s: int = 60) -> list[dict]:
    """Fold attempt records into one counter row per rollup key (buckets of ``span_s`` seconds)."""
    acc: dict[tuple, dict] = {}
    for r in records:
        key = (int(r.ts // span_s) * span_s, r.provider, r.model, r.intent, r.source, r.side)
        row = acc.get(key)
        if row is None:
            row = dict(zip(ROLLUP_KEY, key, strict=False))
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


def coarsen(deltas: Iterable[dict], span_s: int) -> list[dict]:
    """Re-bucket per-minute counter rows into buckets of ``span_s`` seconds (cheaper than
    re-folding the records: a batch has far fewer minute rows than records)."""
    acc: dict[tuple, dict] = {}
    for d in deltas:
        start = d["minute"] // span_s * span_s
        key = (start, *(d[k] for k in ROLLUP_KEY[1:]))
        row = acc.get(key)
        if row is None:
            acc[key] = {**d, "minute": start}
        else:
            for c in _COUNTERS:
                row[c] += d[c]
    return list(acc.values())


_STATEMENTS: dict[tuple[str, str], object] = {}


def _upsert(engine: Engine, table):
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
        index_elements=ROLLUP_KEY,
        set_={c: table.c[c] + stmt.excluded[c] for c in _COUNTERS},
    )
    _STATEMENTS[(engine.dialect.name, table.name)] = stmt
    return stmt


def _log_insert_sql(engine: Engine) -> str:
    """INSERT for the raw log in the driver's own parameter style: the rows are already plain tuples
    of Python scalars, so SQLAlchemy's per-row parameter processing (the largest cost of ingest) is
    skipped and the driver's executemany does the work. ``ON CONFLICT DO NOTHING`` is the backstop
    behind the pre-select in :func:`insert_batch`."""
    key = (engine.dialect.name, "request_log")
    sql = _STATEMENTS.get(key)
    if sql is None:
        mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"
        cols = ", ".join(FIELD_NAMES)
        sql = (
            f"INSERT INTO {RequestLog.__tablename__} ({cols}) VALUES ({', '.join([mark] * len(FIELD_NAMES))}) "
            "ON CONFLICT (request_id, attempt) DO NOTHING"
        )
        _STATEMENTS[key] = sql
    return sql  # type: ignore[return-value]


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


def insert_batch(engine: Engine, records: Sequence[AttemptRecord]) -> int:
    """Write the records not already in the log, and their rollups, atomically; returns the number
    of rows newly written (0 for a batch that was written before)."""
    if not records:
        return 0
    with engine.connect().execution_options(sqlite_immediate=True) as conn, conn.begin():
        present = _existing_keys(conn, engine, list(dict.fromkeys(r.request_id for r in records)))
        fresh = new_records(records, present)
        if not fresh:
            return 0
        result = conn.exec_driver_sql(_log_insert_sql(engine), [r.to_tuple() for r in fresh])
        if result.rowcount is not None and 0 <= result.rowcount < len(fresh):
            raise ConcurrentInsertError(
                f"{len(fresh) - result.rowcount} of {len(fresh)} request-log rows appeared during the insert"
            )
        per_minute = rollup_deltas(fresh, 60)
        for span, model in ROLLUP_TABLES.items():
            deltas = per_minute if span == 60 else coarsen(per_minute, span)
            conn.execute(_upsert(engine, model.__table__), deltas)  # type: ignore[attr-defined]
    return len(fresh)


def count_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(RequestLog)).scalar_one())


def prune(engine: Engine, *, raw_before: float, minute_rollups_before: float | None = None) -> dict[str, int]:
    """Delete raw log rows older than ``raw_before`` and per-minute rollups older than
    ``minute_rollups_before`` (epoch seconds). The 5-minute and hourly rollups are kept: they are
    small and keep long windows of the monitor intact. Returns the rows deleted per table."""
    from sqlalchemy import delete

    from db.models import RequestRollup

    deleted = {}
    with engine.begin() as conn:
        deleted["request_log"] = conn.execute(delete(RequestLog).where(RequestLog.ts < raw_before)).rowcount
        if minute_rollups_before is not None:
            cutoff = int(minute_rollups_before // 60) * 60
            deleted["request_rollup"] = conn.execute(
                delete(RequestRollup).where(RequestRollup.minute < cutoff)
            ).rowcount
    return deleted
