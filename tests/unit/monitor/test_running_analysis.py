"""The controller's running analysis (app/monitor/canary_analysis.RunningAnalysis) against the full
read (``analyse``) on the same log: the same counts and statistics after every update, while each
update reads only the rows of its overlap window, however large the log and long the rollout."""

from __future__ import annotations

import random

import pytest

from app.monitor.canary_analysis import SIGNALS, RunningAnalysis, analyse
from core.records import AttemptRecord
from db.canary import ensure_setting
from db.engine import get_engine
from db.requests import insert_batch

SINCE = 1_000_000.0
TICK_S = 30.0
PER_TICK = 60
OVERLAP_S = 60.0


def _rows(rng: random.Random, start: float, n: int, ids: list[int], *, candidate_share: float) -> list[AttemptRecord]:
    out = []
    for k in range(n):
        ids[0] += 1
        on = rng.random() < candidate_share
        ts = start + k * (TICK_S / n)
        fails = rng.random() < (0.06 if on else 0.01)
        rid = f"r{ids[0]}"
        common = dict(provider="holysheep" if on else "direct", model="gpt-4.1", requested_model="gpt-4.1",
                      intent="explicit", side="primary" if on else "fallback", completion_tokens=5,
                      finish_reason="length" if rng.random() < 0.03 else "stop")  # fmt: skip
        if fails and rng.random() < 0.5:  # a failed first attempt, then a second that answers
            out.append(AttemptRecord(rid, 1, ts, status="error", latency_ms=50.0, final=False, **common))
            out.append(AttemptRecord(rid, 2, ts + 0.1, status="ok", latency_ms=300.0, **common))
        else:
            out.append(AttemptRecord(rid, 1, ts, status="error" if fails else "ok", latency_ms=300.0, **common))
    return out


@pytest.fixture
def engine(sqlite_url):
    eng = get_engine(sqlite_url)
    ensure_setting(eng, 0.2)  # the ratio in force throughout (no audit row: since the beginning)
    return eng


def test_it_matches_the_full_read_and_reads_only_the_overlap_window(engine) -> None:
    rng, ids = random.Random(7), [0]
    # A log with history before the rollout: baseline traffic of an hour.
    insert_batch(engine, _rows(rng, SINCE - 3600, 2000, ids, candidate_share=0.0))
    running = RunningAnalysis(engine, since=SINCE, overlap_s=OVERLAP_S)
    reads = []
    for tick in range(12):
        now = SINCE + (tick + 1) * TICK_S
        insert_batch(engine, _rows(rng, now - TICK_S, PER_TICK, ids, candidate_share=0.2))
        got = running.update(now)
        reads.append(running.rows_read)
        full = analyse(engine, since=SINCE, until=now)
        assert (got.candidate_requests, got.baseline_requests) == (full.candidate_requests, full.baseline_requests)
        for a, b in zip(got.signals, full.signals, strict=True):
            assert (a.signal, a.candidate, a.baseline, a.verdict) == (b.signal, b.candidate, b.baseline, b.verdict)
            assert a.p_value == pytest.approx(b.p_value, rel=1e-9)
    # Each read holds at most the overlap window plus one tick of rows (a request may log 2 rows),
    # while the rollout's rows grew to 12 ticks' worth.
    bound = 2 * PER_TICK * (OVERLAP_S / TICK_S + 1)
    assert max(reads) <= bound and sum(reads) > bound, reads
    assert running.analysis().candidate_requests + running.analysis().baseline_requests == 12 * PER_TICK
    assert {s.signal for s in running.analysis().signals} == set(SIGNALS)


def test_rows_arriving_late_within_the_overlap_count_once(engine) -> None:
    rng, ids = random.Random(3), [0]
    running = RunningAnalysis(engine, since=SINCE, overlap_s=OVERLAP_S)
    early = _rows(rng, SINCE, PER_TICK, ids, candidate_share=0.5)
    insert_batch(engine, early[: len(early) // 2])
    running.update(SINCE + TICK_S)
    # The rest of the first tick's requests end (and are logged) a tick later.
    insert_batch(engine, early[len(early) // 2 :])
    insert_batch(engine, _rows(rng, SINCE + TICK_S, PER_TICK, ids, candidate_share=0.5))
    got = running.update(SINCE + 2 * TICK_S)
    full = analyse(engine, since=SINCE, until=SINCE + 2 * TICK_S)
    assert got.candidate_requests + got.baseline_requests == 2 * PER_TICK
    assert [(s.candidate, s.baseline) for s in got.signals] == [(s.candidate, s.baseline) for s in full.signals]


def test_a_backlog_larger_than_one_read_is_read_over_several(engine) -> None:
    rng, ids = random.Random(5), [0]
    insert_batch(engine, _rows(rng, SINCE, 400, ids, candidate_share=0.3))
    running = RunningAnalysis(engine, since=SINCE, overlap_s=OVERLAP_S, max_rows=150)
    for _ in range(6):
        got = running.update(SINCE + TICK_S)
        assert running.rows_read <= 150
    assert got.candidate_requests + got.baseline_requests == 400


def _session_rows(
    ids: list[int], sessions: list[str], *, start: float, per_session: int, gap_s: float, share: float,
    candidate_fails: float, baseline_fails: float, seed: int,
) -> list[AttemptRecord]:  # fmt: skip
    """Each session's requests ``gap_s`` apart, routed as the gateway routes them (sticky by id)."""
    from app.routing.canary import assign_side

    rng, out = random.Random(seed), []
    for n, sid in enumerate(sessions):
        side = assign_side(share, sid or None, rng)
        on = side == "primary"
        for k in range(per_session):
            ids[0] += 1
            ts = start + n * 0.01 + k * gap_s
            fails = rng.random() < (candidate_fails if on else baseline_fails)
            out.append(AttemptRecord(f"r{ids[0]}", 1, ts, provider="holysheep" if on else "direct", model="gpt-4.1",
                                     requested_model="gpt-4.1", intent="explicit", side=side,
                                     status="error" if fails else "ok", latency_ms=300.0, completion_tokens=5,
                                     session_id=sid))  # fmt: skip
    return out


def _on_candidate(share: float, names: list[str]) -> list[str]:
    from app.routing.canary import session_point

    return [s for s in names if session_point(s) < share]


HOSTILE = ["🙂" * 32, "\u202eevil", "'; drop table request_log; --", "cafe\u0301", "세션" * 64, " s ", "a\nb", "%00"]


def test_a_few_long_sessions_are_a_few_samples_however_many_requests_they_send(engine) -> None:
    # Hostile ids, one of them on the candidate, each sending 150 requests over the rollout. The
    # candidate's session fails 40 % of its requests (that one user's conversation keeps failing).
    on = _on_candidate(0.2, HOSTILE)
    assert on and len(on) < len(HOSTILE)
    ids = [0]
    insert_batch(engine, _session_rows(ids, HOSTILE, start=SINCE, per_session=150, gap_s=2.0, share=0.2,
                                       candidate_fails=0.4, baseline_fails=0.01, seed=1))  # fmt: skip
    running = RunningAnalysis(engine, since=SINCE, overlap_s=OVERLAP_S, bake_s=600.0)
    for tick in range(1, 13):
        got = running.update(SINCE + tick * TICK_S)
    got = running.update(SINCE + 3600.0)  # every session idle since: every run judged
    failed = {s.signal: s for s in got.signals}["attempt failed"]
    assert got.candidate_requests >= 150 and failed.candidate >= 30  # what a request-by-request count would see
    # Each session's run within a bake is one unit; runs after the first at the same weight say nothing.
    assert got.candidate_units == len(on) and got.baseline_units == len(HOSTILE) - len(on)
    assert failed.verdict == "nodata" and got.verdict == "nodata" and failed.p_value > 0.05
    full = analyse(engine, since=SINCE, until=SINCE + 3600.0, bake_s=600.0)
    assert (full.candidate_units, full.baseline_units) == (got.candidate_units, got.baseline_units)


def test_a_failing_candidate_across_many_sessions_is_worse(engine) -> None:
    names = [f"user-{i}-{'é' * (i % 5)}" for i in range(600)]
    ids = [0]
    insert_batch(engine, _session_rows(ids, names, start=SINCE, per_session=3, gap_s=5.0, share=0.2,
                                       candidate_fails=0.3, baseline_fails=0.01, seed=2))  # fmt: skip
    running = RunningAnalysis(engine, since=SINCE, overlap_s=OVERLAP_S, bake_s=600.0)
    running.update(SINCE + 30.0)
    assert running.analysis().candidate_units == 0  # every session still within its idle time
    got = running.update(SINCE + 300.0)
    assert got.candidate_units + got.baseline_units == 600
    assert {s.signal: s for s in got.signals}["attempt failed"].verdict == "worse"


def test_an_empty_session_id_draws_per_request_in_the_global_canary(engine) -> None:
    # Routing gives an empty id a random draw per request (assign_side), so the analysis counts
    # each such request as its own unit, as it does a request without an id.
    ids = [0]
    rows = _session_rows(ids, [""] * 200, start=SINCE, per_session=1, gap_s=1.0, share=0.2,
                         candidate_fails=0.0, baseline_fails=0.0, seed=3)  # fmt: skip
    assert {r.session_id for r in rows} == {""}
    insert_batch(engine, rows)
    got = RunningAnalysis(engine, since=SINCE, overlap_s=OVERLAP_S).update(SINCE + 10.0)
    assert got.candidate_units == got.candidate_requests > 0 and got.baseline_units == got.baseline_requests
