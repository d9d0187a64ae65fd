"""The request log at 36 M requests a day (issue 18, items 9 and 10): rollup upserts in one lock
order so several writer processes never deadlock on PostgreSQL; ``request_log`` partitioned by day
on PostgreSQL so ``prune`` drops whole days; batched deletes everywhere else; retention for every
rollup resolution; the (session_id, ts) index; the insert's idempotency without an existence query
on PostgreSQL; migration 0012 on a populated table.
"""

from __future__ import annotations

import json
import random
import select as io_select
import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import event, func, select, text

from core.records import AttemptRecord
from db.engine import create_db_engine, get_engine
from db.migrate import upgrade
from db.models import ROLLUP_TABLES, RequestLog, RequestRollup, RequestRollup1h, RequestRollup5m
from db.partitions import DAY_S, KEEPER, LEGACY, Partition, days_needed, droppable, list_partitions, missing_days
from db.partitions import parse_bound as parse_partition_bound
from db.requests import count_rows, in_lock_order, insert_batch, next_batch_size, prune, rollup_deltas
from tests.support import paths
from tests.support.records import attempt

REPO = str(paths.REPO)
DAY0 = 1_800_000_000 // DAY_S * DAY_S  # a UTC midnight in 2027


def rec(i: int, ts: float, **kw) -> AttemptRecord:
    return attempt(**{"request_id": f"r{i:07d}", "ts": ts, "latency_ms": 10.0, "prompt_tokens": 3, **kw})


def count(engine, model) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


def attempts(engine) -> dict[int, int]:
    with engine.connect() as conn:
        return {
            span: int(conn.execute(select(func.coalesce(func.sum(m.attempts), 0))).scalar_one())
            for span, m in ROLLUP_TABLES.items()
        }


# -- item 9: one lock order ----------------------------------------------------------------------------


def test_rollup_cells_are_upserted_in_key_order_whatever_the_arrival_order() -> None:
    records = [rec(i, DAY0 + (i * 7919) % 3600, provider=("b", "a", "c")[i % 3]) for i in range(60)]
    orders = set()
    for seed in range(5):
        shuffled = records[:]
        random.Random(seed).shuffle(shuffled)
        orders.add(tuple((d["minute"], d["provider"]) for d in in_lock_order(rollup_deltas(shuffled))))
    assert len(orders) == 1  # every arrival order yields the same upsert order
    (order,) = orders
    assert list(order) == sorted(order) and len(order) > 10


_WRITER = r"""
import json, random, sys
from sqlalchemy.exc import DBAPIError
from core.records import AttemptRecord
from db.engine import create_db_engine
from db.requests import insert_batch

url, seed, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
engine = create_db_engine(url)
rng = random.Random(seed)
cells = [(m, p, model) for m in range(25) for p in ("p1", "p2", "p3") for model in ("m1", "m2", "m3", "m4")]
# Every batch touches the same 300 cells (one attempt each), in its own shuffled order; built
# before the start so the writers spend their time in the database, as a busy gateway's do.
todo = []
for b in range(batches):
    order = cells[:]
    rng.shuffle(order)
    todo.append([
        AttemptRecord(request_id=f"w{seed}-{b}-{k}", attempt=1, ts=1_800_000_000.0 + 60 * m + rng.random(),
                      provider=p, model=model, requested_model="auto", intent="general", side="primary",
                      status="ok", latency_ms=5.0)
        for k, (m, p, model) in enumerate(order)
    ])
engine.connect().close()  # connected before the start too: the race is in the upserts
print("ready", flush=True)
sys.stdin.readline()  # the start, the same moment for all four (the test writes it once all are ready)
deadlocks = other = written = 0
for recs in todo:
    while True:
        try:
            written += insert_batch(engine, recs)
            break
        except DBAPIError as exc:
            if "deadlock detected" in str(exc):
                deadlocks += 1
                if deadlocks >= 5:  # enough to fail the test; each one costs a second of detection
                    print(json.dumps({"deadlocks": deadlocks, "other": other, "written": written}))
                    sys.exit(0)
            else:
                other += 1
                if other > 20:
                    raise
print(json.dumps({"deadlocks": deadlocks, "other": other, "written": written}))
"""


@pytest.mark.postgres
def test_four_writer_processes_never_deadlock_on_postgres(pg_url: str) -> None:
    """Four real writer processes upsert the same rollup cells, each in its own shuffled arrival
    order, at the same moment. With the cells upserted in arrival order instead, this run hits
    ``deadlock detected`` within seconds (checked when the sort went in)."""
    get_engine(pg_url)  # migrate once, before the writers start
    batches = 20
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, pg_url, str(seed), str(batches)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(4)
    ]
    results = []
    try:
        # Started together once every writer has built its batches and connected (it says "ready"),
        # not at a fixed time guessed to be late enough for four interpreters on a loaded machine.
        for p in procs:
            assert p.stdout is not None
            readable, _, _ = io_select.select([p.stdout], [], [], 120)  # a bound on a writer's start-up
            assert readable and p.stdout.readline() == "ready\n", p.communicate(timeout=60)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [r["deadlocks"] for r in results] == [0, 0, 0, 0], results
    assert [r["written"] for r in results] == [batches * 300] * 4
    engine = get_engine(pg_url)
    assert count_rows(engine) == 4 * batches * 300
    assert attempts(engine) == {60: 4 * batches * 300, 300: 4 * batches * 300, 3600: 4 * batches * 300}


@pytest.mark.postgres
def test_two_writers_with_the_same_batch_count_it_once_on_postgres(pg_url: str) -> None:
    """The insert says which rows were new (ON CONFLICT DO NOTHING RETURNING): a writer racing
    another with the same rows waits for its commit and counts none of them twice."""
    engine = get_engine(pg_url)
    batch = [rec(i, DAY0 + i) for i in range(300)]
    got: list[int] = []
    errors: list[BaseException] = []

    def write() -> None:
        try:
            got.append(insert_batch(engine, batch))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and sorted(got) == [0, 300]
    assert count_rows(engine) == 300 and attempts(engine) == {60: 300, 300: 300, 3600: 300}


@pytest.mark.postgres
def test_the_insert_runs_no_existence_query_on_postgres(pg_url: str) -> None:
    """On a fresh database without statistics the old ``request_id IN (...)`` pre-check could be
    planned as a scan of the whole table (42 s for one batch at 30 M rows): PostgreSQL now learns
    which rows are new from the insert itself."""
    engine = get_engine(pg_url)
    insert_batch(engine, [rec(i, DAY0 + i) for i in range(10)])
    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda c, cur, stmt, *a: seen.append(stmt))
    assert insert_batch(engine, [rec(i, DAY0 + i) for i in range(20)]) == 10
    log_selects = [s for s in seen if s.lstrip().upper().startswith("SELECT") and "request_log" in s]
    assert log_selects == []
    assert any(s.startswith("INSERT INTO request_log") and "RETURNING" in s for s in seen)


# -- item 10: partitions ---------------------------------------------------------------------------------


def test_partition_arithmetic() -> None:
    assert days_needed([DAY0 + 5, DAY0 + 86_399.9]) == {DAY0, DAY0 + DAY_S}
    parts = [
        parse_partition_bound(LEGACY, f"FOR VALUES FROM (MINVALUE) TO ('{DAY0}')"),
        parse_partition_bound("d1", f"FOR VALUES FROM ('{DAY0}') TO ('{DAY0 + DAY_S}')"),
    ]
    assert parts[0] == Partition(LEGACY, None, DAY0)
    assert missing_days([DAY0 - DAY_S, DAY0, DAY0 + DAY_S], parts) == [DAY0 + DAY_S]
    # The day holding the cutoff is kept whole; only days wholly before it go.
    assert [p.name for p in droppable(parts, DAY0 + DAY_S - 1)] == [LEGACY]
    assert [p.name for p in droppable(parts, DAY0 + DAY_S)] == [LEGACY, "d1"]
    with pytest.raises(ValueError, match="does not manage"):
        parse_partition_bound("x", "DEFAULT")


@pytest.mark.postgres
def test_rows_land_in_day_partitions_and_prune_drops_whole_days(pg_url: str) -> None:
    engine = get_engine(pg_url)
    with engine.connect() as conn:
        kind = conn.execute(text("SELECT relkind FROM pg_class WHERE oid = 'request_log'::regclass")).scalar()
    assert kind == "p"
    insert_batch(engine, [rec(i, DAY0 + (i // 10) * DAY_S + i) for i in range(30)])  # days 0, 1, 2
    with engine.connect() as conn:
        names = [p.name for p in list_partitions(conn)]
        per_part = dict(
            conn.execute(text("SELECT tableoid::regclass::text, count(*) FROM request_log GROUP BY 1")).all()
        )
    assert names == ["request_log_p20270115", "request_log_p20270116", "request_log_p20270117", "request_log_p20270118"]
    assert sorted(per_part.values()) == [10, 10, 10]  # the fourth day was made ahead, still empty
    out = prune(engine, raw_before=DAY0 + 2 * DAY_S + 5)  # the cutoff's own day is kept whole
    assert out == {"request_log": 20, "request_log_partitions_dropped": 2}
    assert count_rows(engine) == 10
    assert attempts(engine)[60] == 30  # rollups untouched without their own cutoffs
    # A late row for a dropped day (a journal replay) gets its partition back.
    assert insert_batch(engine, [rec(99, DAY0 + 7)]) == 1
    assert count_rows(engine) == 11


@pytest.mark.postgres
def test_a_day_dropped_by_another_process_is_recreated_on_insert(pg_url: str) -> None:
    engine = get_engine(pg_url)
    insert_batch(engine, [rec(1, DAY0 + 1)])
    with engine.begin() as conn:  # another process's prune: this process's known-days set is stale
        conn.execute(text('DROP TABLE "request_log_p20270115"'))
    assert insert_batch(engine, [rec(2, DAY0 + 2)]) == 1
    assert count_rows(engine) == 1


def _populate_0011(engine, n: int, first_ts: float) -> None:
    """``n`` rows written as the 0011 schema took them (plain INSERT), plus their rollups."""
    records = [rec(i, first_ts + i * 60.0, session_id=f"s{i % 3}") for i in range(n)]
    with engine.begin() as conn:
        conn.execute(RequestLog.__table__.insert(), [_row_0011(r) for r in records])


def _row_0011(r: AttemptRecord) -> dict:
    """A row as the log had it at revision 0011 (the route fields arrive with 0015)."""
    from core.records import FIELD_NAMES

    later = ("route", "deployment", "route_why", "refused", "tool_json_bad", "schema_bad", "chunk_gap_ms")
    return {k: v for k, v in zip(FIELD_NAMES, r.to_tuple(), strict=True) if k not in later}


def test_migration_0012_keeps_a_populated_log_and_its_ids(empty_db_url: str) -> None:
    engine = create_db_engine(empty_db_url)
    upgrade(engine, "0011")
    old_ts = time.time() - 40 * DAY_S
    _populate_0011(engine, 50, old_ts)
    with engine.connect() as conn:
        max_id = conn.execute(select(func.max(RequestLog.id))).scalar_one()
    upgrade(engine)
    KEEPER.forget()
    assert count_rows(engine) == 50
    now = time.time()
    assert insert_batch(engine, [rec(1000, now), rec(1001, now + 1)]) == 2
    assert insert_batch(engine, [rec(1000, now)]) == 0  # the new unique key still holds
    with engine.connect() as conn:
        ids = [r[0] for r in conn.execute(select(RequestLog.id).order_by(RequestLog.id))]
        if engine.dialect.name == "postgresql":
            parts = list_partitions(conn)
            legacy = [p for p in parts if p.name == LEGACY]
            assert legacy and legacy[0].lower is None and legacy[0].upper is not None
            assert legacy[0].upper % DAY_S == 0 and legacy[0].upper > now
            # The old table is a partition now, indexes and all (the new ones built on it).
            idx = {
                r[0] for r in conn.execute(text("SELECT indexname FROM pg_indexes WHERE tablename = :t"), {"t": LEGACY})
            }
            # its pkey + ts, substituted, failed, failed class+ts, session+ts, key+ts, unique key
            assert len(idx) == 8, idx
    assert len(ids) == len(set(ids)) == 52 and min(ids[-2:]) > max_id
    # Old rows are deleted in batches from the legacy partition (PostgreSQL) or the table (SQLite).
    out = prune(engine, raw_before=old_ts + 20 * 60.0 + 1, first_batch=1)
    assert out["request_log"] == 21 and out["request_log_partitions_dropped"] == 0
    assert count_rows(engine) == 31
    engine.dispose()


@pytest.mark.postgres
def test_migration_0012_on_an_empty_log_replaces_it_and_downgrades(empty_pg_url: str) -> None:
    engine = create_db_engine(empty_pg_url)
    upgrade(engine)
    with engine.connect() as conn:
        assert list_partitions(conn) == []  # no legacy partition for an empty table
    insert_batch(engine, [rec(1, DAY0 + 1)])
    from alembic import command

    from db.migrate import alembic_config

    with engine.begin() as conn:
        cfg = alembic_config(engine)
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0011")
    with engine.connect() as conn:
        kind = conn.execute(text("SELECT relkind FROM pg_class WHERE oid = 'request_log'::regclass")).scalar()
    assert kind == "r" and count_rows(engine) == 1
    KEEPER.forget()
    engine.dispose()


# -- retention: batches and every resolution ---------------------------------------------------------


def test_next_batch_size_keeps_each_batch_near_the_target() -> None:
    assert next_batch_size(10_000, 0.01) == 20_000  # fast: grow
    assert next_batch_size(10_000, 0.15) == 10_000  # near the target: keep
    assert next_batch_size(10_000, 0.5) == 5_000  # over: halve
    assert next_batch_size(10_000, 4.0) == 625  # far over: shrink in proportion
    assert next_batch_size(600, 10.0) == 500 and next_batch_size(150_000, 0.0) == 200_000  # bounds


def test_sqlite_prune_deletes_in_separate_short_transactions(sqlite_url: str) -> None:
    """Each batch is its own transaction, so SQLite's write lock is released between batches (a
    writer gets in) instead of being held for the whole prune."""
    engine = get_engine(sqlite_url)
    insert_batch(engine, [rec(i, DAY0 + i) for i in range(1200)] + [rec(5000, DAY0 + 10 * DAY_S)])
    commits: list[int] = []
    event.listen(engine, "commit", lambda conn: commits.append(1))
    out = prune(engine, raw_before=DAY0 + DAY_S, first_batch=500, clock=iter(range(0, 10**6, 10)).__next__)
    assert out == {"request_log": 1200, "request_log_partitions_dropped": 0}
    assert len(commits) == 3  # 500 + 500 + 200 (each batch "took" 10 s: never grown)
    assert count_rows(engine) == 1


def test_every_rollup_resolution_has_its_own_retention(engine) -> None:
    now = float(DAY0 + 400 * DAY_S)
    ages_days = (1, 100, 500, 2000)
    insert_batch(engine, [rec(i, now - d * DAY_S) for i, d in enumerate(ages_days)])
    out = prune(
        engine,
        raw_before=now - 30 * DAY_S,
        minute_rollups_before=now - 90 * DAY_S,
        rollups_5m_before=now - 400 * DAY_S,
        rollups_1h_before=now - 1830 * DAY_S,
    )
    assert (out["request_log"], out["request_rollup"], out["request_rollup_5m"], out["request_rollup_1h"]) == (
        3,
        3,
        2,
        1,
    )
    assert (count(engine, RequestRollup), count(engine, RequestRollup5m), count(engine, RequestRollup1h)) == (1, 2, 3)


def test_session_search_reads_the_session_ts_index(engine) -> None:
    """The drill-down's newest attempts of a session come from (session_id, ts) in index order, not
    every row of the session sorted (278 ms at 30.6 M rows without it)."""
    from db.drilldown import find_requests

    insert_batch(engine, [rec(i, DAY0 + i, session_id=f"s{i % 50}") for i in range(2000)])
    found = find_requests(engine, "session", "s7", limit=5)
    assert [m.request_id for m in found] == [f"r{1957 - 50 * k:07d}" for k in range(5)]
    sql = "SELECT request_id FROM request_log WHERE session_id = 's7' ORDER BY ts DESC LIMIT 40"
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
            assert "ix_request_log_session_ts" in plan and "TEMP B-TREE" not in plan, plan
        else:
            conn.exec_driver_sql("ANALYZE request_log")
            plan = " ".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql))
            # Each partition's copy of the parent's index (named after the partition) bounds the read
            # to the session's rows; the planner may still sort those few.
            assert "session_id_ts_idx" in plan and "Seq Scan on request_log_p20270115" not in plan, plan
