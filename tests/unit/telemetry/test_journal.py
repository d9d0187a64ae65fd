"""The spill journal: order, deletion only after a successful write, torn lines, surrogates,
batched fsync, dead letters, and a process killed with SIGKILL losing nothing it had appended."""

from __future__ import annotations

import pytest

from app.telemetry import journal as jmod
from app.telemetry.journal import Journal


def rows(start: int, n: int) -> list[dict]:
    return [{"request_id": f"r{i}", "attempt": 1, "error_message": None} for i in range(start, start + n)]


def test_replay_returns_rows_in_append_order_and_empties_the_journal(tmp_path):
    j = Journal(tmp_path)
    j.append(rows(0, 3))
    j.append(rows(3, 4))
    got: list[dict] = []
    assert j.replay(got.extend, batch_size=2) == 7
    assert [r["request_id"] for r in got] == [f"r{i}" for i in range(7)]
    assert j.pending == 0
    assert j.stats().segments == 0
    assert j.replay(got.extend) == 0


def test_failed_write_keeps_the_rows_for_the_next_replay(tmp_path):
    j = Journal(tmp_path)
    j.append(rows(0, 5))

    def down(batch):
        raise ConnectionError("database down")

    with pytest.raises(ConnectionError):
        j.replay(down)
    assert j.pending == 5
    got: list[dict] = []
    j.replay(got.extend)
    assert [r["request_id"] for r in got] == [f"r{i}" for i in range(5)]


def test_appends_after_a_replay_started_go_to_a_new_segment(tmp_path):
    j = Journal(tmp_path)
    j.append(rows(0, 2))
    seen: list[dict] = []

    def write(batch):
        seen.extend(batch)
        j.append(rows(100, 1))  # traffic keeps spilling while we replay

    j.replay(write)
    assert [r["request_id"] for r in seen] == ["r0", "r1"]
    assert j.pending == 1
    later: list[dict] = []
    j.replay(later.extend)
    assert [r["request_id"] for r in later] == ["r100"]


def test_pending_count_survives_reopening(tmp_path):
    j = Journal(tmp_path)
    j.append(rows(0, 3))
    j.close()
    again = Journal(tmp_path)
    assert again.pending == 3
    got: list[dict] = []
    again.replay(got.extend)
    assert len(got) == 3


def test_torn_last_line_is_skipped(tmp_path):
    j = Journal(tmp_path)
    j.append(rows(0, 2))
    j.close()
    seg = next(tmp_path.glob("segment-*.jsonl"))
    with open(seg, "ab") as f:
        f.write(b'{"request_id": "r2", "att')  # the process died mid-write
    got: list[dict] = []
    Journal(tmp_path).replay(got.extend)
    assert [r["request_id"] for r in got] == ["r0", "r1"]


def test_any_text_round_trips_including_lone_surrogates_and_nul(tmp_path):
    j = Journal(tmp_path)
    nasty = "bad \udcff thing \x00 세션 😀"
    j.append([{"request_id": "x", "attempt": 1, "error_message": nasty}])
    got: list[dict] = []
    j.replay(got.extend)
    assert got[0]["error_message"] == nasty


def test_fsync_is_batched(tmp_path):
    calls: list[int] = []
    now = [0.0]
    j = Journal(tmp_path, fsync_every=10, fsync_interval_s=5.0, clock=lambda: now[0], fsync=calls.append)
    for i in range(9):
        j.append(rows(i, 1))
    assert calls == []  # 9 records, 0 s: not due yet
    j.append(rows(9, 1))
    assert len(calls) == 1  # the 10th record makes the batch
    j.append(rows(10, 1))
    now[0] = 6.0
    j.append(rows(11, 1))
    assert len(calls) == 2  # the interval passed
    j.close()
    assert len(calls) == 2  # nothing unsynced at close


def test_close_syncs_what_is_unsynced(tmp_path):
    calls: list[int] = []
    j = Journal(tmp_path, fsync_every=100, fsync=calls.append)
    j.append(rows(0, 1))
    j.close()
    assert len(calls) == 1


def test_segments_roll_over_by_size(tmp_path, monkeypatch):
    monkeypatch.setattr(jmod, "SEGMENT_MAX_BYTES", 200)
    j = Journal(tmp_path)
    for i in range(20):
        j.append(rows(i, 1))
    assert j.stats().segments > 1
    got: list[dict] = []
    j.replay(got.extend)
    assert [r["request_id"] for r in got] == [f"r{i}" for i in range(20)]


def test_dead_letters_keep_record_and_reason(tmp_path):
    j = Journal(tmp_path)
    j.dead_letter({"request_id": "bad", "attempt": 1}, "DataError: value too long", ts=123.0)
    assert j.stats().dead_letters == 1
    (entry,) = list(j.dead_letters())
    assert entry == {"ts": 123.0, "reason": "DataError: value too long", "record": {"request_id": "bad", "attempt": 1}}
    assert Journal(tmp_path).stats().dead_letters == 1


def test_non_finite_numbers_are_refused_not_written_as_invalid_json(tmp_path):
    j = Journal(tmp_path)
    with pytest.raises(ValueError):
        j.append([{"latency_ms": float("nan")}])
    assert j.pending == 0
