"""The telemetry writer with its journal (issue 7: "the log never blocks and never loses"): a full
queue spills instead of blocking, a failing database sends batches to the journal and they are
replayed in order when it answers, rejected records become dead letters with their reason, a
journal left by a dead process is replayed at start-up, and each database and process has its own
journal directory.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from sqlalchemy.exc import DataError, OperationalError

from app.telemetry.journal import Journal
from app.telemetry.location import claim_journal, journal_dir_for, open_writer
from app.telemetry.writer import TelemetryWriter, WriterStats, record_from_row, record_to_row
from core.records import AttemptRecord
from tests.support.records import attempt

WAIT_S = 30.0  # bound on waiting for the writer thread; never a timing assertion


def rec(i: int = 0, **kw) -> AttemptRecord:
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
        w.submit(rec(0))
        assert db.entered.wait(WAIT_S)  # the writer is stuck in the database with record 0
        for i in range(1, 20):
            w.submit(rec(i))  # would block forever without the journal: the database is held shut
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
            w.submit(rec(i))
        w.flush()  # everything is handled: in the journal, since the database is down
        s = w.stats()
        assert not s.database_ok and s.written == 0
        assert s.spilled == 30 and s.journal_depth == 30
        assert s.last_error is not None and "database is locked" in s.last_error
        for i in range(30, 40):  # the writer keeps taking new records meanwhile
            w.submit(rec(i))
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
        w.submit_many([rec(i, error_message="poison" if i == 7 else None) for i in range(20)])
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
        w.submit_many([rec(i, error_message="poison" if i == 3 else None) for i in range(10)])
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
    w.submit_many([rec(i) for i in range(10)])
    assert db.entered.wait(WAIT_S)  # batch of 10 in flight, stuck
    w.submit_many([rec(i) for i in range(10, 25)])
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
    r = rec(1, latency_ms=float("inf"), ttft_ms=float("nan"), error_message="bad \udcff thing\x00")
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
    second.journal.append([record_to_row(rec(i)) for i in range(3)])
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
    left.journal.append([record_to_row(rec(i)) for i in range(40)])
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
        w.submit(rec(1))


def test_closing_on_a_failing_database_journals_the_queue_without_probing_it_per_batch(tmp_path) -> None:
    db = Db()
    db.down = True
    db.gate.clear()  # hold the writer until everything is queued and close() has been called
    w = TelemetryWriter(
        db, queue_size=1000, batch_size=5, flush_interval_s=60.0, retry_delays_s=(0.0,), journal=Journal(tmp_path)
    )
    w.submit_many([rec(i) for i in range(40)])
    closer = threading.Thread(target=w.close)
    closer.start()
    db.gate.set()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    # One write that found the database down, then at most one replay probe: each probe of a hung
    # database costs its lock timeout, so closing must not make one per batch.
    assert db.calls <= 2
    assert Journal(tmp_path).pending == 40 and w.stats().spilled == 40
