"""Telemetry: the bounded queue + background batch writer, the per-minute rollups it keeps, and the
fixed log-spaced latency histogram the monitor reads percentiles from.
"""

from __future__ import annotations

import math
import queue
import random
import threading
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event, func, select
from sqlalchemy.exc import DataError, OperationalError

from app.telemetry.journal import Journal
from app.telemetry.location import claim_journal, journal_dir_for, open_writer
from app.telemetry.writer import TelemetryWriter, WriterStats, record_from_row, record_to_row
from core.histogram import EDGES, GROWTH, N_BUCKETS, bucket_bounds, bucket_of, percentile
from core.records import AttemptRecord
from db.models import RequestLog
from tests.support.examples import examples
from tests.support.records import attempt

WAIT_S = 30.0  # generous bound on waiting for a background thread; never a timing assertion


def rec(i: int = 0, **kw) -> AttemptRecord:
    base = dict(
        request_id=f"r{i:06d}",
        attempt=1,
        ts=1_700_000_000.0 + i,
        provider="holysheep",
        model="gemini-2.5-flash",
        requested_model="auto",
        intent="general",
        side="primary",
        status="ok",
        latency_ms=12.5,
    )
    base.update(kw)
    return AttemptRecord(**base)


class Sink:
    """A write_batch that records every batch; can be held shut and made to fail."""

    def __init__(self, fail_times: int = 0) -> None:
        self.batches: list[list[AttemptRecord]] = []
        self.calls = 0
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        self.fail_times = fail_times
        self.lock = threading.Lock()

    def __call__(self, batch: Sequence[AttemptRecord]) -> int:
        with self.lock:
            self.calls += 1
        self.entered.set()
        assert self.gate.wait(WAIT_S), "test never released the writer"
        if self.fail_times > 0:
            self.fail_times -= 1
            raise ConnectionError("database went away")
        self.batches.append(list(batch))
        return len(batch)

    @property
    def written(self) -> list[AttemptRecord]:
        return [r for b in self.batches for r in b]


# -- writer ----------------------------------------------------------------------------------------


def test_many_queued_records_are_written_in_batches_of_bounded_size() -> None:
    sink = Sink()
    sink.gate.clear()
    w = TelemetryWriter(sink, queue_size=1000, batch_size=25, flush_interval_s=0.05)
    try:
        w.submit(rec(0))
        assert sink.entered.wait(WAIT_S)
        # While the writer is busy with the first record, 100 more pile up in the queue.
        for i in range(1, 101):
            w.submit(rec(i))
        assert w.pending == 100
        sink.gate.set()
        w.flush()
    finally:
        w.close()
    sizes = [len(b) for b in sink.batches]
    assert sum(sizes) == 101
    assert max(sizes) > 1, f"records were written one per call: {sizes}"
    assert max(sizes) <= 25
    # Far fewer calls than records: the point of batching.
    assert len(sizes) <= 1 + math.ceil(100 / 25) + 1
    assert [r.request_id for r in sink.written] == [f"r{i:06d}" for i in range(101)]
    assert w.written == 101


def test_the_writer_wakes_per_full_batch_not_per_record() -> None:
    sink = Sink()
    two_batches = threading.Event()
    inner = sink.__call__

    def write(batch):
        n = inner(batch)
        if len(sink.batches) == 2:
            two_batches.set()
        return n

    # A one-minute interval: only a full batch (or flush/close) may wake the writer.
    w = TelemetryWriter(write, queue_size=1000, batch_size=10, flush_interval_s=60.0)
    try:
        for i in range(25):
            w.submit_many([rec(i)])
        assert two_batches.wait(WAIT_S)
        assert [len(b) for b in sink.batches] == [10, 10] and w.pending == 5  # the rest waits for the interval
        w.flush()
        assert [len(b) for b in sink.batches] == [10, 10, 5] and w.pending == 0
    finally:
        w.close()
    assert [r.request_id for r in sink.written] == [f"r{i:06d}" for i in range(25)]


def test_a_request_group_larger_than_a_batch_is_split_in_order() -> None:
    sink = Sink()
    w = TelemetryWriter(sink, queue_size=4, batch_size=3, flush_interval_s=60.0)
    try:
        w.submit_many([rec(i) for i in range(7)])  # bigger than the queue: accepted when it is empty
        w.flush()
    finally:
        w.close()
    assert [len(b) for b in sink.batches] == [3, 3, 1]
    assert [r.request_id for r in sink.written] == [f"r{i:06d}" for i in range(7)]


def test_full_queue_applies_backpressure_instead_of_dropping() -> None:
    sink = Sink()
    sink.gate.clear()
    w = TelemetryWriter(sink, queue_size=3, batch_size=10, flush_interval_s=0.01)
    try:
        w.submit(rec(0))
        assert sink.entered.wait(WAIT_S)  # the writer holds record 0 and is stuck in write_batch
        for i in range(1, 4):
            w.submit(rec(i), timeout=WAIT_S)
        assert w.pending == 3
        with pytest.raises(queue.Full):
            w.submit(rec(99), timeout=0.05)
        assert w.pending == 3  # the refused record was not silently queued or dropped elsewhere

        # A producer without a timeout waits until there is room, then its record is written.
        done = threading.Event()
        t = threading.Thread(target=lambda: (w.submit(rec(4)), done.set()))
        t.start()
        t.join(0.2)
        assert not done.is_set()  # still waiting: the queue is full and the writer is held
        sink.gate.set()
        t.join(WAIT_S)
        assert done.is_set()
        w.flush()
    finally:
        w.close()
    ids = sorted(r.request_id for r in sink.written)
    assert ids == [f"r{i:06d}" for i in range(5)]
    assert "r000099" not in ids


def test_failing_write_batch_is_retried_without_loss_or_duplicates() -> None:
    sink = Sink(fail_times=2)
    w = TelemetryWriter(sink, queue_size=100, batch_size=50, flush_interval_s=0.01, retry_delays_s=(0.001, 0.002))
    try:
        for i in range(30):
            w.submit(rec(i))
        w.flush()
    finally:
        w.close()
    ids = [r.request_id for r in sink.written]
    assert sorted(ids) == [f"r{i:06d}" for i in range(30)]
    assert len(ids) == len(set(ids))
    assert w.write_failures == 2
    assert sink.calls == len(sink.batches) + 2
    assert w.last_error is not None and "database went away" in w.last_error
    assert w.written == 30


def test_failure_inside_the_insert_transaction_rolls_back_and_retry_does_not_duplicate(engine) -> None:
    """insert_batch writes log rows and rollups atomically: a failure half way through a batch leaves
    nothing behind, so the writer's retry writes every row exactly once."""
    from db.models import RequestRollup
    from db.requests import count_rows, insert_batch

    failures = {"left": 2}

    @event.listens_for(engine, "before_cursor_execute")
    def _boom(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("INSERT INTO REQUEST_ROLLUP") and failures["left"] > 0:
            failures["left"] -= 1
            raise ConnectionError("connection lost during rollup upsert")

    try:
        w = TelemetryWriter(
            lambda b: insert_batch(engine, b),
            batch_size=100,
            flush_interval_s=0.01,
            retry_delays_s=(0.001, 0.002, 0.004),
        )
        records = [rec(i, ts=1_700_000_000.0) for i in range(40)]
        w.submit_many(records)
        w.flush()
        w.close()
    finally:
        event.remove(engine, "before_cursor_execute", _boom)

    assert failures["left"] == 0
    assert w.write_failures >= 2
    assert count_rows(engine) == 40
    with engine.connect() as conn:
        ids = conn.execute(select(RequestLog.request_id)).scalars().all()
        attempts = conn.execute(select(RequestRollup.attempts)).scalars().all()
    assert sorted(ids) == sorted(r.request_id for r in records)
    assert sum(attempts) == 40


def test_close_flushes_everything_queued_and_refuses_later_records() -> None:
    sink = Sink()
    # A long flush interval: without close() draining, the writer would still be filling a batch.
    w = TelemetryWriter(sink, queue_size=1000, batch_size=10_000, flush_interval_s=60.0)
    for i in range(250):
        w.submit(rec(i))
    w.close()
    assert sorted(r.request_id for r in sink.written) == [f"r{i:06d}" for i in range(250)]
    assert w.pending == 0
    with pytest.raises(RuntimeError, match="closed"):
        w.submit(rec(999))
    w.close()  # a second close is harmless
    assert len(sink.written) == 250


# -- rollups ---------------------------------------------------------------------------------------


def _random_records(seed: int, n: int) -> list[AttemptRecord]:
    rng = random.Random(seed)
    out = []
    t0 = 1_700_000_040.0  # mid-minute, so records straddle minute boundaries
    for i in range(n):
        status = "ok" if rng.random() < 0.75 else "error"
        ttft = rng.choice([None, rng.uniform(0.1, 3000.0)])
        out.append(
            rec(
                i,
                request_id=uuid.uuid4().hex,
                attempt=rng.randint(1, 3),
                ts=t0 + rng.uniform(0, 240),
                provider=rng.choice(["holysheep", "direct"]),
                model=rng.choice(["gpt-4.1", "gemini-2.5-flash", "deepseek-chat-v3.2"]),
                intent=rng.choice(["coding", "general", "long_context"]),
                source=rng.choice(["api", "loadgen"]),
                side=rng.choice(["primary", "fallback"]),
                status=status,
                latency_ms=rng.choice([0.0, rng.uniform(0.0, 2.0), rng.lognormvariate(5, 1.5)]),
                ttft_ms=ttft,
                http_status=200 if status == "ok" else rng.choice([429, 500, 503]),
                error_class=None if status == "ok" else "server_error",
                prompt_tokens=rng.randint(0, 5000),
                cached_tokens=rng.randint(0, 1000),
                completion_tokens=rng.randint(0, 800),
                cost_usd=round(rng.uniform(0, 0.05), 7),
                fallback=rng.random() < 0.3,
                final=rng.random() < 0.6,
                route=rng.choice([None, "gpt-4.1"]),
            )
        )
    return out


def test_rollups_equal_aggregates_over_raw_request_log_rows(engine) -> None:
    from db.models import LATENCY_BUCKETS, ROLLUP_KEY, TTFT_BUCKETS, RequestRollup
    from db.requests import insert_batch

    records = _random_records(seed=11, n=600)
    # Small batches through the real writer so the same rollup key is upserted many times.
    w = TelemetryWriter(lambda b: insert_batch(engine, b), batch_size=37, flush_interval_s=0.01)
    w.submit_many(records)
    w.close()

    with engine.connect() as conn:
        raw = conn.execute(select(RequestLog)).mappings().all()
        rollups = {
            tuple(r[k] for k in ROLLUP_KEY): dict(r) for r in conn.execute(select(RequestRollup)).mappings().all()
        }
    assert len(raw) == len(records)

    expected: dict[tuple, Counter] = defaultdict(Counter)
    costs: dict[tuple, float] = defaultdict(float)
    lat_sums: dict[tuple, float] = defaultdict(float)
    for r in raw:
        key = (
            math.floor(r["ts"] / 60.0) * 60, r["provider"], r["model"], r["intent"], r["source"], r["side"],
            r["route"] or "",
        )  # fmt: skip
        e = expected[key]
        failed = r["status"] != "ok"
        e["attempts"] += 1
        e["errors"] += failed
        e["requests"] += bool(r["final"])
        e["request_errors"] += bool(r["final"]) and failed
        e["fallbacks"] += bool(r["final"]) and bool(r["fallback"])
        for col in ("prompt_tokens", "cached_tokens", "completion_tokens"):
            e[col] += r[col]
        costs[key] += r["cost_usd"]
        lat_sums[key] += r["latency_ms"]
        e[LATENCY_BUCKETS[bucket_of(r["latency_ms"])]] += 1
        if r["ttft_ms"] is not None:
            e["ttft_count"] += 1
            e[TTFT_BUCKETS[bucket_of(r["ttft_ms"])]] += 1

    assert set(rollups) == set(expected)
    assert len(expected) > 20  # the data really spreads over minutes, providers, models, ...
    for key, e in expected.items():
        got = rollups[key]
        for col in (
            "attempts",
            "errors",
            "requests",
            "request_errors",
            "fallbacks",
            "prompt_tokens",
            "cached_tokens",
            "completion_tokens",
            "ttft_count",
        ):
            assert got[col] == e[col], (key, col)
        assert got["cost_usd"] == pytest.approx(costs[key], rel=1e-9, abs=1e-12), key
        assert got["latency_sum_ms"] == pytest.approx(lat_sums[key], rel=1e-9, abs=1e-9), key
        assert [got[c] for c in LATENCY_BUCKETS] == [e[c] for c in LATENCY_BUCKETS], key
        assert [got[c] for c in TTFT_BUCKETS] == [e[c] for c in TTFT_BUCKETS], key
        assert sum(got[c] for c in LATENCY_BUCKETS) == got["attempts"]

    # Totals, as the monitor would show them for the whole window.
    assert sum(r["errors"] for r in rollups.values()) == sum(r.status != "ok" for r in records)
    assert sum(r["fallbacks"] for r in rollups.values()) == sum(r.final and r.fallback for r in records)
    assert sum(r["completion_tokens"] for r in rollups.values()) == sum(r.completion_tokens for r in records)
    assert sum(r["cost_usd"] for r in rollups.values()) == pytest.approx(sum(r.cost_usd for r in records))


def test_percentile_from_rollup_histogram_matches_raw_rows(engine) -> None:
    from db.models import LATENCY_BUCKETS, RequestRollup
    from db.requests import insert_batch

    records = _random_records(seed=5, n=400)
    insert_batch(engine, records[:150])
    insert_batch(engine, records[150:])
    with engine.connect() as conn:
        lat = sorted(conn.execute(select(RequestLog.latency_ms)).scalars().all())
        rows = conn.execute(select(*[RequestRollup.__table__.c[c] for c in LATENCY_BUCKETS])).all()
    counts = [sum(r[i] for r in rows) for i in range(N_BUCKETS)]
    for q in (0.5, 0.9, 0.95, 0.99):
        exact = lat[max(math.ceil(q * len(lat)) - 1, 0)]
        lo, hi = bucket_bounds(bucket_of(exact))
        assert lo <= percentile(counts, q) <= hi


# -- histogram ---------------------------------------------------------------------------------


def _exact_percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, no numpy."""
    s = sorted(values)
    return s[max(math.ceil(q * len(s)) - 1, 0)]


@settings(max_examples=examples(300), deadline=None)
@given(
    values=st.lists(st.floats(min_value=0.0, max_value=100_000.0, allow_nan=False), min_size=1, max_size=300),
    q=st.floats(min_value=0.0, max_value=1.0),
)
def test_histogram_percentile_is_within_bucket_resolution_of_exact(values: list[float], q: float) -> None:
    counts = [0] * N_BUCKETS
    for v in values:
        counts[bucket_of(v)] += 1
    est = percentile(counts, q)
    exact = _exact_percentile(values, q)
    lo, hi = bucket_bounds(bucket_of(exact))
    assert est is not None
    assert lo <= est <= hi
    # Relative resolution: above the first edge, one bucket spans a factor of GROWTH.
    if exact >= EDGES[0]:
        assert exact / GROWTH <= est <= exact * GROWTH


def test_percentile_edge_cases() -> None:
    assert percentile([0] * N_BUCKETS, 0.5) is None
    assert percentile([], 0.9) is None
    with pytest.raises(ValueError):
        percentile([1] * N_BUCKETS, 1.5)
    with pytest.raises(ValueError):
        percentile([1] * N_BUCKETS, -0.1)
    one = [0] * N_BUCKETS
    one[10] = 7
    lo, hi = bucket_bounds(10)
    for q in (0.0, 0.5, 1.0):
        assert lo <= percentile(one, q) <= hi
    assert percentile(one, 0.5) < percentile(one, 1.0)


def test_bucket_of_edges() -> None:
    assert len(EDGES) == N_BUCKETS - 1
    assert bucket_of(0.0) == 0
    assert bucket_of(-3.0) == 0
    assert bucket_of(math.nextafter(EDGES[0], 0.0)) == 0
    for i, edge in enumerate(EDGES):
        # Bucket i is [EDGES[i-1], EDGES[i]): an edge value belongs to the bucket above it.
        assert bucket_of(edge) == i + 1, i
        assert bucket_of(math.nextafter(edge, 0.0)) == i, i
        lo, hi = bucket_bounds(i)
        assert lo < hi
        assert hi == edge
    for i in range(1, len(EDGES)):
        assert EDGES[i] / EDGES[i - 1] == pytest.approx(GROWTH)
    assert bucket_of(EDGES[-1] * 1000) == N_BUCKETS - 1
    assert bucket_of(math.inf) == N_BUCKETS - 1
    lo, hi = bucket_bounds(N_BUCKETS - 1)
    assert lo == EDGES[-1] and hi > lo


@settings(max_examples=examples(200), deadline=None)
@given(st.floats(min_value=0.0, max_value=EDGES[-1], allow_nan=False, exclude_max=True))
def test_bucket_of_places_value_inside_its_bounds(v: float) -> None:
    lo, hi = bucket_bounds(bucket_of(v))
    assert lo <= v < hi


def test_one_oversized_field_does_not_poison_the_batch(db_url: str, client_factory) -> None:
    """A caller-supplied value longer than its column (session_id is VARCHAR(128)) must not make the
    batch unwritable: PostgreSQL enforces the length, the writer would retry the same batch and drop
    it, good records included, at close. The router refuses it up front (ValueError naming the limit)
    and nothing of it is queued; a session id of exactly 128 characters is stored intact."""

    client = client_factory(db_url)
    good = client.chat([{"role": "user", "content": "hello"}], session_id="normal-session")
    with pytest.raises(ValueError, match="session_id must be 1 to 128 characters"):
        client.chat([{"role": "user", "content": "hello"}], session_id="s" * 129)
    widest = client.chat([{"role": "user", "content": "hello"}], session_id="w" * 128)
    after = client.chat([{"role": "user", "content": "hello again"}], session_id="normal-session")
    client.close()
    with client.engine.connect() as conn:
        stored = dict(conn.execute(select(RequestLog.request_id, RequestLog.session_id)).all())
    assert client.telemetry.last_error is None, client.telemetry.last_error
    assert stored == {
        good.request_id: "normal-session",
        widest.request_id: "w" * 128,
        after.request_id: "normal-session",
    }


def test_prune_deletes_old_raw_rows_and_minute_rollups_only(engine):
    from sqlalchemy import select

    from db.models import RequestLog, RequestRollup, RequestRollup1h, RequestRollup5m
    from db.requests import insert_batch, prune

    now = 1_800_000_000.0
    old, recent = now - 40 * 86400, now - 3600
    recs = [
        AttemptRecord(
            request_id=f"p{i}",
            attempt=1,
            ts=ts,
            provider="p",
            model="gpt-4.1",
            requested_model="auto",
            intent="general",
            side="primary",
            status="ok",
            latency_ms=10.0,
        )
        for i, ts in enumerate([old, old + 1, recent])
    ]
    insert_batch(engine, recs)

    def count(model) -> int:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(model)).scalar_one())

    deleted = prune(engine, raw_before=now - 30 * 86400, minute_rollups_before=now - 30 * 86400)
    # PostgreSQL drops the old day's partition (and the one made ahead of it); SQLite deletes rows.
    dropped = 2 if engine.dialect.name == "postgresql" else 0
    assert deleted == {
        "request_log": 2,
        "request_log_partitions_dropped": dropped,
        "request_rollup": 1,
        "request_error_rollup": 0,  # no failed or substituted request among them
        "request_substitution_rollup": 0,
    }
    assert count(RequestLog) == 1 and count(RequestRollup) == 1
    # Without their own cutoffs the long windows stay intact.
    assert count(RequestRollup5m) == 2 and count(RequestRollup1h) == 2


# -- log journal writer ----------------------------------------------------------------------------
# The telemetry writer with its journal (issue 7: "the log never blocks and never loses"): a full
# queue spills instead of blocking, a failing database sends batches to the journal and they are
# replayed in order when it answers, rejected records become dead letters with their reason, a
# journal left by a dead process is replayed at start-up, and each database and process has its own
# journal directory.


def rec_log_journal_writer(i: int = 0, **kw) -> AttemptRecord:
    return attempt(**{"request_id": f"r{i:06d}", "ts": 1_700_000_000.0 + i, **kw})


def db_down() -> OperationalError:
    return OperationalError("INSERT ...", {}, Exception("database is locked"))


class Db:
    """A write_batch keyed like the real table (idempotent), that can be held, failed or made to
    reject records whose error_message is "poison"."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], AttemptRecord] = {}
        self.order: list[str] = []
        self.down = False
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.calls = 0

    def __call__(self, batch: Sequence[AttemptRecord]) -> int:
        self.calls += 1
        self.entered.set()
        assert self.gate.wait(WAIT_S), "test never released the database"
        if self.down:
            raise db_down()
        if any(r.error_message == "poison" for r in batch):
            raise DataError("INSERT ...", {}, Exception("value too long for type character varying(500)"))
        new = 0
        for r in batch:
            if (r.request_id, r.attempt) not in self.rows:
                self.rows[(r.request_id, r.attempt)] = r
                self.order.append(r.request_id)
                new += 1
        return new


def ids(n: int, start: int = 0) -> list[str]:
    return [f"r{i:06d}" for i in range(start, start + n)]


def test_a_full_queue_spills_to_the_journal_instead_of_blocking(tmp_path) -> None:
    db = Db()
    db.gate.clear()
    w = TelemetryWriter(db, queue_size=3, batch_size=2, flush_interval_s=0.01, journal=Journal(tmp_path / "j"))
    try:
        w.submit(rec_log_journal_writer(0))
        assert db.entered.wait(WAIT_S)  # the writer is stuck in the database with record 0
        for i in range(1, 20):
            w.submit(rec_log_journal_writer(i))  # would block forever without the journal: the database is held shut
        s = w.stats()
        assert s.spilled >= 16 and s.journal_depth == s.spilled
        assert s.queued <= 3 and s.accepted == 20
        db.gate.set()
        assert w.drain(WAIT_S)
    finally:
        w.close()
    assert sorted(db.order) == ids(20)  # every record exactly once
    assert w.stats().replayed == w.stats().spilled
    assert w.stats().journal_depth == 0


def test_a_failing_database_sends_batches_to_the_journal_and_they_are_replayed_in_order(tmp_path) -> None:
    db = Db()
    db.down = True
    w = TelemetryWriter(
        db, queue_size=1000, batch_size=5, flush_interval_s=0.01, retry_delays_s=(0.01,), journal=Journal(tmp_path)
    )
    try:
        for i in range(30):
            w.submit(rec_log_journal_writer(i))
        w.flush()  # everything is handled: in the journal, since the database is down
        s = w.stats()
        assert not s.database_ok and s.written == 0
        assert s.spilled == 30 and s.journal_depth == 30
        assert s.last_error is not None and "database is locked" in s.last_error
        for i in range(30, 40):  # the writer keeps taking new records meanwhile
            w.submit(rec_log_journal_writer(i))
        db.down = False
        assert w.drain(WAIT_S)
    finally:
        w.close()
    assert db.order == ids(40)  # replayed in the order they were accepted
    s = w.stats()
    assert s.database_ok and s.written == 40 and s.journal_depth == 0 and s.replayed >= 30


def test_a_rejected_record_is_dead_lettered_with_its_reason_and_the_rest_are_written(tmp_path) -> None:
    db = Db()
    journal = Journal(tmp_path)
    w = TelemetryWriter(db, batch_size=50, flush_interval_s=0.01, journal=journal)
    try:
        w.submit_many([rec_log_journal_writer(i, error_message="poison" if i == 7 else None) for i in range(20)])
        assert w.drain(WAIT_S)
    finally:
        w.close()
    assert sorted(db.order) == [i for i in ids(20) if i != "r000007"]
    assert w.stats().rejected == 1
    [dead] = list(journal.dead_letters())
    assert dead["record"]["request_id"] == "r000007"
    assert "value too long" in dead["reason"]


def test_a_record_rejected_during_replay_is_dead_lettered_and_replay_goes_on(tmp_path) -> None:
    db = Db()
    db.down = True
    journal = Journal(tmp_path)
    w = TelemetryWriter(db, batch_size=4, flush_interval_s=0.01, retry_delays_s=(0.01,), journal=journal)
    try:
        w.submit_many([rec_log_journal_writer(i, error_message="poison" if i == 3 else None) for i in range(10)])
        w.flush()
        assert w.stats().journal_depth == 10
        db.down = False
        assert w.drain(WAIT_S)
    finally:
        w.close()
    assert db.order == [i for i in ids(10) if i != "r000003"]
    assert [d["record"]["request_id"] for d in journal.dead_letters()] == ["r000003"]


def test_close_journals_what_a_hung_database_holds_and_the_next_writer_replays_it(tmp_path) -> None:
    db = Db()
    db.gate.clear()
    w = TelemetryWriter(db, queue_size=100, batch_size=10, flush_interval_s=0.01, journal=Journal(tmp_path))
    w.submit_many([rec_log_journal_writer(i) for i in range(10)])
    assert db.entered.wait(WAIT_S)  # batch of 10 in flight, stuck
    w.submit_many([rec_log_journal_writer(i) for i in range(10, 25)])
    w.close(timeout=0.2)
    assert Journal(tmp_path).pending == 25  # in-flight batch and queue, all kept
    db2 = Db()
    w2 = TelemetryWriter(db2, flush_interval_s=0.01, journal=Journal(tmp_path))
    try:
        assert w2.drain(WAIT_S)
    finally:
        w2.close()
        db.gate.set()
    assert db2.order == ids(25)


def test_records_round_trip_through_journal_rows_including_non_finite_numbers() -> None:
    r = rec_log_journal_writer(1, latency_ms=float("inf"), ttft_ms=float("nan"), error_message="bad \udcff thing\x00")
    back = record_from_row(record_to_row(r))
    assert back.latency_ms == float("inf") and back.ttft_ms != back.ttft_ms
    assert back.error_message == r.error_message and back.request_id == r.request_id


def test_each_database_gets_its_own_journal_directory(tmp_path) -> None:
    a = journal_dir_for(f"sqlite:///{tmp_path / 'a.db'}")
    b = journal_dir_for(f"sqlite:///{tmp_path / 'b.db'}")
    assert a is not None and b is not None and a != b
    assert a.parent == tmp_path / "journal"
    assert journal_dir_for("sqlite://") is None and journal_dir_for("sqlite:///:memory:") is None
    p1 = journal_dir_for("postgresql+psycopg://u:secret@h/db1", cwd=tmp_path)
    p2 = journal_dir_for("postgresql+psycopg://u:other@h/db1", cwd=tmp_path)
    p3 = journal_dir_for("postgresql+psycopg://u:secret@h/db2", cwd=tmp_path)
    assert p1 == p2 != p3  # the password is not part of the identity, the database is
    assert p1 is not None and "secret" not in str(p1) and p1.parent == tmp_path / "data" / "journal"
    assert journal_dir_for("postgresql+psycopg://u@h/db1", configured=str(tmp_path / "j")).parent == tmp_path / "j"


def test_two_processes_on_one_database_hold_different_slots_and_a_dead_ones_journal_is_adopted(tmp_path) -> None:
    first = claim_journal(tmp_path)
    second = claim_journal(tmp_path)
    assert first.journal.dir != second.journal.dir
    second.journal.append([record_to_row(rec_log_journal_writer(i)) for i in range(3)])
    second.journal.close()
    second.release()  # what the operating system does when its process dies
    third = claim_journal(tmp_path)
    # The third process takes the free slot (the dead one's) and replays it as its own journal.
    assert third.journal.dir == second.journal.dir and third.journal.pending == 3
    first.release()
    third.journal.close()
    third.release()
    fourth = claim_journal(tmp_path)  # slot 0 is free again: slot 1's records are adopted
    assert [o.pending for o in fourth.orphans] == [3]
    fourth.release()


def test_open_writer_replays_a_journal_left_by_a_killed_process(sqlite_url: str) -> None:
    from db.engine import dispose_all, get_engine
    from db.requests import count_rows, insert_batch

    engine = get_engine(sqlite_url)
    directory = journal_dir_for(sqlite_url)
    assert directory is not None
    left = claim_journal(directory)
    left.journal.append([record_to_row(rec_log_journal_writer(i)) for i in range(40)])
    left.release()  # killed: no close(), the lines are in the file

    w = open_writer(sqlite_url, lambda b: insert_batch(engine, b), flush_interval_s=0.01)
    try:
        assert w.drain(WAIT_S)
        stats = w.stats()
    finally:
        w.close()
    assert isinstance(stats, WriterStats)
    assert count_rows(engine) == 40 and stats.replayed == 40 and stats.written == 40
    dispose_all()


def test_without_a_journal_the_writer_keeps_its_backpressure(tmp_path) -> None:
    w = TelemetryWriter(Db(), queue_size=10)
    try:
        assert w.stats().journal_dir is None
    finally:
        w.close()
    with pytest.raises(RuntimeError, match="closed"):
        w.submit(rec_log_journal_writer(1))


def test_closing_on_a_failing_database_journals_the_queue_without_probing_it_per_batch(tmp_path) -> None:
    db = Db()
    db.down = True
    db.gate.clear()  # hold the writer until everything is queued and close() has been called
    w = TelemetryWriter(
        db, queue_size=1000, batch_size=5, flush_interval_s=60.0, retry_delays_s=(0.0,), journal=Journal(tmp_path)
    )
    w.submit_many([rec_log_journal_writer(i) for i in range(40)])
    closer = threading.Thread(target=w.close)
    closer.start()
    db.gate.set()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    # One write that found the database down, then at most one replay probe: each probe of a hung
    # database costs its lock timeout, so closing must not make one per batch.
    assert db.calls <= 2
    assert Journal(tmp_path).pending == 40 and w.stats().spilled == 40
