"""The raw request-log reads (db.raw_log): the request table's count against a recount of the raw
rows for any window, cursor and filter, on SQLite and PostgreSQL; the gateway-key filter read from
its index. The rollup reads are in test_monitor.py, whose attempt records these tests share."""

from __future__ import annotations

import random

import pytest

from db import monitor as dbm
from db import raw_log
from db.requests import insert_batch, prune
from tests.support.query_plans import plans as _plans
from tests.unit.db.test_monitor import SPAN_S, T0, T_ROLLUPS, _windows, make_records, raw_rows, rec


@pytest.mark.parametrize(
    ("filters", "row_filters"),
    [
        (None, None),
        (None, raw_log.RowFilters(status="error")),
        (None, raw_log.RowFilters(status="ok")),
        (None, raw_log.RowFilters(error_classes=("timeout", "rate_limited"))),
        (dbm.MonitorFilters(providers=("beta",)), raw_log.RowFilters(status="error", error_classes=("timeout",))),
        (None, raw_log.RowFilters(status="ok", error_classes=("timeout",))),
        (dbm.MonitorFilters(models=("m2",), sources=("api",)), None),
        (None, raw_log.RowFilters(keys=("k1",))),
    ],
)
def test_the_table_count_equals_a_raw_count_for_any_window_and_cursor(engine, filters, row_filters) -> None:
    insert_batch(engine, make_records(400, seed=4))
    rows = raw_rows(engine)
    r = row_filters or raw_log.RowFilters()
    f = filters or dbm.MonitorFilters()

    def matches(row, since, until, cursor=None) -> bool:
        if not since <= row["ts"] <= until:
            return False
        if cursor is not None and (row["ts"], row["id"]) <= cursor:
            return False
        if (r.status == "error" and row["status"] == "ok") or (r.status == "ok" and row["status"] != "ok"):
            return False
        if r.error_classes and row["error_class"] not in r.error_classes:
            return False
        if r.keys and row["key_name"] not in r.keys:
            return False
        return all(
            not want or row[col] in want
            for want, col in ((f.providers, "provider"), (f.models, "model"), (f.sources, "source"))
        )

    rng = random.Random(5)
    for since, until in _windows(rows, rng, 6):
        expected = sum(matches(row, since, until) for row in rows)
        assert raw_log.count_log_rows(engine, since=since, until=until, filters=filters, rows=row_filters) == expected
        # A cursor on a row (as a page below the first has), and one on a minute boundary.
        inside = [row for row in rows if since <= row["ts"] <= until]
        cursors = [(row["ts"], row["id"]) for row in rng.sample(inside, min(3, len(inside)))]
        cursors.append((float(int(since // 60) * 60 + 60), 0))
        for c in cursors:
            want = sum(matches(row, since, until, c) for row in rows)
            got = raw_log.count_log_rows(
                engine, since=since, until=until, filters=filters, rows=row_filters, newer_than=c
            )
            assert got == want, (since, until, c)
    # The cap still bounds what is reported.
    total = sum(matches(row, T_ROLLUPS - 60, T_ROLLUPS + SPAN_S + 60) for row in rows)
    if total > 5:
        capped = raw_log.count_log_rows(
            engine,
            since=T_ROLLUPS - 60,
            until=T_ROLLUPS + SPAN_S + 60,
            filters=filters,
            rows=row_filters,
            cap=5,
        )
        assert capped == 6


def test_rollups_kept_past_the_log_do_not_count_rows_the_table_cannot_show(engine) -> None:
    insert_batch(engine, make_records(300, seed=7))
    cutoff = float(T_ROLLUPS + 3600 + 17)
    prune(engine, raw_before=cutoff)  # the rollups are kept longer than the log
    rows = raw_rows(engine)
    assert raw_log.count_log_rows(engine, since=T_ROLLUPS, until=T_ROLLUPS + SPAN_S) == len(rows)


def _sparse_timeouts(engine, *, failing_every: int):
    """150 minutes of rows 2 s apart: provider "beta" once a minute, the rest "alpha"; every
    ``failing_every``-th row fails with a timeout (60: only beta's rows). Returns the records and a
    read of the newest 5 rows of beta's timeouts (the guided page read)."""
    start = float(T_ROLLUPS)
    records = [
        rec(start + k * 2.0, provider="beta" if k % 60 == 7 else "alpha", ok=k % failing_every != 7, error_class=(
            "timeout" if k % failing_every == 7 else None
        ))
        for k in range(60 * 150)
    ]  # fmt: skip
    insert_batch(engine, records)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE request_log")
    until = start + 60 * 150 * 2.0
    beta, timeouts = dbm.MonitorFilters(providers=("beta",)), raw_log.RowFilters(error_classes=("timeout",))

    def read():
        return raw_log.log_page(engine, since=start, until=until, filters=beta, rows=timeouts, limit=5)

    return records, read


def test_a_sparse_filters_page_reads_about_a_page_of_matching_minutes_per_query(engine) -> None:
    """A filter that matches one row every other minute among many: each query of a page reads the minutes
    of about one page of matches (the rollups count them), not every matching minute of the span
    the rollups were asked about (60 ranges in the first hour, then 240, then 960), which grows
    with the log."""
    from sqlalchemy import event

    records, read = _sparse_timeouts(engine, failing_every=60)
    issued: list[str] = []

    def grab(conn, cursor, statement, parameters, context, executemany) -> None:
        if "FROM request_log" in statement and "ORDER BY" in statement:
            issued.append(statement)

    event.listen(engine, "before_cursor_execute", grab)
    try:
        page = read()
    finally:
        event.remove(engine, "before_cursor_execute", grab)
    want = sorted((r.ts for r in records if r.provider == "beta"), reverse=True)[:5]
    assert [p["ts"] for p in page] == want
    assert issued
    for statement in issued:
        # one "ts >=" per range read (a run of adjacent minutes, or the partial minute at an edge)
        assert statement.count("request_log.ts >=") <= 5 + 1, statement


def test_a_sparse_filters_page_reads_each_range_from_the_index_not_the_span_between(engine) -> None:
    """A query of a guided page reads its ranges from the index one by one (SQLite's OR-by-union,
    PostgreSQL's BitmapOr): read as one span from the first range to the last with the ranges as a
    filter, it would walk every failure of that class between them, which grows with the log."""
    from tests.support.query_plans import plans

    records, read = _sparse_timeouts(engine, failing_every=10)
    want = sorted((r.ts for r in records if r.provider == "beta"), reverse=True)[:5]
    assert [p["ts"] for p in read()] == want
    found = plans(engine, read)
    several = [p for p in found if p.count("ix_request_log_failed_class_ts") > 1 or "BitmapOr" in p]
    assert several, found  # the page's batches hold several ranges each
    for plan in found:
        if engine.dialect.name == "sqlite":
            # one index search per range: either a single range, or the union of each range's own
            assert plan.count("SEARCH request_log") == 1 or "MULTI-INDEX OR" in plan, plan
        else:
            assert "Seq Scan" not in plan, plan


def test_a_gateway_key_filter_reads_that_keys_rows_from_its_index(engine) -> None:
    """A key that sent a few of a busy window's rows: its count and its pages come from the
    (key_name, ts, id) index (migration 0018), never a walk of the window's rows (the count of an
    hour grew with the log: 104 -> 3,888 ms from 1 M to 15 M rows on PostgreSQL)."""
    from dataclasses import replace

    start = float(T0)
    records = [rec(start + k * 0.5, ok=k % 7 != 0) for k in range(4000)]
    sparse = [replace(records[k], key_name="k-sparse") for k in range(3, 4000, 250)]  # 16 rows
    busy = [replace(records[k], key_name="k-busy") for k in range(0, 4000, 2)]
    by_id = {r.request_id: r for r in (*sparse, *busy)}
    insert_batch(engine, [by_id.get(r.request_id, r) for r in records])
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE request_log")
    until = start + 4000 * 0.5
    only = raw_log.RowFilters(keys=("k-sparse",))
    assert raw_log.count_log_rows(engine, since=start, until=until, rows=only) == 16
    page = raw_log.log_page(engine, since=start, until=until, rows=only, limit=5)
    assert [p["request_id"] for p in page] == [s.request_id for s in sparse[::-1][:5]]
    older = raw_log.log_page(
        engine, since=start, until=until, rows=only, older_than=(page[-1]["ts"], page[-1]["id"]), limit=5
    )
    assert [p["request_id"] for p in older] == [s.request_id for s in sparse[::-1][5:10]]
    failed = raw_log.RowFilters(keys=("k-sparse", "k-busy"), status="error")
    want = sum(1 for r in (*sparse, *busy) if r.status == "error")
    assert raw_log.count_log_rows(engine, since=start, until=until, rows=failed) == want

    for call in (
        lambda: raw_log.count_log_rows(engine, since=start, until=until, rows=only),
        lambda: raw_log.log_page(engine, since=start, until=until, rows=only, limit=5),
        lambda: raw_log.log_page(
            engine, since=start, until=until, rows=only, older_than=(page[-1]["ts"], page[-1]["id"])
        ),
    ):
        plans = _plans(engine, call)
        assert plans
        for plan in plans:
            if engine.dialect.name == "sqlite":
                assert "ix_request_log_key_ts" in plan and "SCAN request_log" not in plan, plan
            else:
                # Each day partition's copy of the parent's index is named after the partition.
                assert "key_name_ts_id_idx" in plan and "Seq Scan" not in plan, plan


@pytest.mark.parametrize(
    ("filters", "row_filters"),
    [
        (None, None),
        (None, raw_log.RowFilters(status="error")),
        (dbm.MonitorFilters(providers=("beta",)), None),
        (dbm.MonitorFilters(providers=("beta",)), raw_log.RowFilters(status="error")),
        (dbm.MonitorFilters(providers=("beta",)), raw_log.RowFilters(status="ok")),
        (dbm.MonitorFilters(providers=("beta",)), raw_log.RowFilters(error_classes=("timeout",))),
        (dbm.MonitorFilters(models=("m2",), sources=("api",)), raw_log.RowFilters(error_classes=("timeout", "x"))),
        (dbm.MonitorFilters(providers=("gateway",)), raw_log.RowFilters(status="ok", error_classes=("timeout",))),
    ],
)
def test_pages_are_the_raw_rows_in_order_for_any_window_cursor_and_filter(engine, filters, row_filters) -> None:
    """Every page (newest, older than a row, newer than a row) is exactly the matching rows next to
    its anchor, in (ts, id) order, however the read is split into the minutes the rollups point at."""
    insert_batch(engine, make_records(400, seed=9))
    rows = raw_rows(engine)
    r = row_filters or raw_log.RowFilters()
    f = filters or dbm.MonitorFilters()

    def matches(row, since, until) -> bool:
        if not since <= row["ts"] <= until:
            return False
        if (r.status == "error" and row["status"] == "ok") or (r.status == "ok" and row["status"] != "ok"):
            return False
        if r.error_classes and (row["status"] == "ok" or row["error_class"] not in r.error_classes):
            return False
        return all(
            not want or row[col] in want
            for want, col in ((f.providers, "provider"), (f.models, "model"), (f.sources, "source"))
        )

    rng = random.Random(11)
    for since, until in _windows(rows, rng, 6):
        inside = sorted(((row["ts"], row["id"]) for row in rows if matches(row, since, until)), reverse=True)
        for limit in (1, 7, 500):
            got = raw_log.log_page(engine, since=since, until=until, filters=filters, rows=row_filters, limit=limit)
            assert [(p["ts"], p["id"]) for p in got] == inside[:limit], (since, until, limit)
        anchors = rng.sample(inside, min(3, len(inside)))
        anchors.append((float(int(since // 60) * 60 + 120), 0))  # on a minute boundary
        for c in anchors:
            older = [k for k in inside if k < c]
            newer = [k for k in inside if k > c]
            got = raw_log.log_page(
                engine, since=since, until=until, filters=filters, rows=row_filters, older_than=c, limit=5
            )
            assert [(p["ts"], p["id"]) for p in got] == older[:5], (since, until, c)
            got = raw_log.log_page(
                engine, since=since, until=until, filters=filters, rows=row_filters, newer_than=c, limit=5
            )
            assert [(p["ts"], p["id"]) for p in got] == newer[-5:], (since, until, c)


def _vm_steps(engine, call) -> int:
    """SQLite virtual-machine steps (in thousands) ``call`` costs: the work of its reads, which
    does not depend on the machine's load."""
    from sqlalchemy import event

    steps = [0]

    def tick() -> int:
        steps[0] += 1
        return 0

    def on_checkout(dbapi_conn, record, proxy) -> None:
        dbapi_conn.set_progress_handler(tick, 1000)

    def on_checkin(dbapi_conn, record) -> None:
        dbapi_conn.set_progress_handler(None, 1000)

    event.listen(engine, "checkout", on_checkout)
    event.listen(engine, "checkin", on_checkin)
    try:
        call()
    finally:
        event.remove(engine, "checkout", on_checkout)
        event.remove(engine, "checkin", on_checkin)
    return steps[0]


def test_a_sparse_match_reads_only_the_minutes_that_hold_it(sqlite_url) -> None:
    """A provider's few timeouts at the far end of a window full of another provider's timeouts:
    the page reads the minutes the error-class rollups say hold them, so four times the other
    provider's rows cost the read (almost) nothing more. Read along the class's index, the page
    walked every timeout of the window between them (102 -> 510 ms from 1 M to 15 M rows)."""
    from db.engine import get_engine

    engine = get_engine(sqlite_url)  # SQLite: its virtual machine counts the work
    start = float(T0)
    span = 3 * 3600
    wanted = [rec(start + 30 + k * 7, provider="beta", ok=False, error_class="timeout") for k in range(3)]
    insert_batch(engine, wanted)

    def busy(n: int, seed: int) -> list:
        rng = random.Random(seed)
        # Every minute but the first three holds the busy provider's timeouts.
        return [rec(start + 180 + rng.random() * (span - 180), ok=False, error_class="timeout") for _ in range(n)]

    f, r = dbm.MonitorFilters(providers=("beta",)), raw_log.RowFilters(error_classes=("timeout",))

    def read() -> list:
        return raw_log.log_page(engine, since=start, until=start + span, filters=f, rows=r, limit=51)

    insert_batch(engine, busy(3000, 1))
    assert [p["request_id"] for p in read()] == [w.request_id for w in wanted[::-1]]
    before = _vm_steps(engine, read)
    insert_batch(engine, busy(9000, 2))  # four times the busy provider's rows in the same window
    assert [p["request_id"] for p in read()] == [w.request_id for w in wanted[::-1]]
    after = _vm_steps(engine, read)
    # Walked along the class's index, the same read went from 15 to 60 thousand steps here.
    assert after <= before + 2, (before, after)
    engine.dispose()
