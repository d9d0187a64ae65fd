"""The canary repository: optimistic locking, audit trail, validation."""

from __future__ import annotations

import math
import threading

import pytest

from db import canary
from db.canary import StaleCanaryError


def test_ensure_setting_creates_the_row_once(engine) -> None:
    canary.ensure_setting(engine, 0.15)
    canary.ensure_setting(engine, 0.9)  # later calls keep what is there
    s = canary.get_state(engine)
    assert s.ratio == 0.15
    assert s.version == 1
    assert canary.read_ratio_version(engine) == (0.15, 1)


def test_stale_expected_version_is_refused_naming_who_changed_it(engine) -> None:
    canary.ensure_setting(engine, 0.1)
    loaded = canary.get_state(engine)
    canary.set_ratio(engine, 0.3, expected_version=loaded.version, actor="alice", reason="ramp up")
    audits = canary.audit_count(engine)
    after_alice = canary.get_state(engine)

    with pytest.raises(StaleCanaryError) as info:
        canary.set_ratio(engine, 0.9, expected_version=loaded.version, actor="bob", reason="stale page")
    msg = str(info.value)
    assert "alice" in msg
    assert "30 %" in msg
    assert info.value.current.updated_by == "alice"
    assert info.value.current.ratio == 0.3
    assert info.value.current.version == after_alice.version
    # Nothing was written.
    assert canary.audit_count(engine) == audits
    assert canary.get_state(engine) == after_alice


def test_concurrent_writers_with_the_same_version_exactly_one_wins(engine) -> None:
    canary.ensure_setting(engine, 0.1)
    v = canary.get_state(engine).version
    start = threading.Barrier(4)
    outcomes: list[object] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        start.wait()
        try:
            s = canary.set_ratio(engine, 0.2 + i / 10, expected_version=v, actor=f"op{i}", reason="race")
            out: object = s
        except StaleCanaryError as exc:
            out = exc
        with lock:
            outcomes.append(out)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wins = [o for o in outcomes if isinstance(o, canary.CanaryState)]
    losses = [o for o in outcomes if isinstance(o, StaleCanaryError)]
    assert len(wins) == 1 and len(losses) == 3
    assert canary.audit_count(engine) == 1
    final = canary.get_state(engine)
    assert final == wins[0]
    assert final.version == v + 1


def test_audit_rows_record_old_new_actor_reason(engine) -> None:
    canary.ensure_setting(engine, 0.1)
    canary.set_ratio(engine, 0.25, expected_version=1, actor="alice", reason="first step", now=1000.0)
    canary.set_ratio(engine, 0.5, expected_version=None, actor="bob", reason="second step", now=2000.0)
    log = canary.audit_log(engine)
    assert [(a.old_ratio, a.new_ratio, a.actor, a.reason, a.version) for a in log] == [
        (0.25, 0.5, "bob", "second step", 3),
        (0.1, 0.25, "alice", "first step", 2),
    ]
    assert [a.ts for a in log] == [2000.0, 1000.0]
    assert canary.audit_log(engine, since=1500.0)[0].actor == "bob"
    assert len(canary.audit_log(engine, since=1500.0)) == 1
    assert canary.audit_log(engine, limit=1)[0].actor == "bob"
    state = canary.get_state(engine)
    assert (state.ratio, state.version, state.updated_by, state.reason) == (0.5, 3, "bob", "second step")


@pytest.mark.parametrize("bad", [-0.1, 1.1, "abc", math.nan, True, False, math.inf, "nan", None, "1.5"])
def test_invalid_ratio_writes_nothing(engine, bad) -> None:
    canary.ensure_setting(engine, 0.1)
    before = canary.get_state(engine)
    with pytest.raises(ValueError):
        canary.set_ratio(engine, bad, expected_version=None, actor="alice", reason="bad input")
    with pytest.raises(ValueError):
        canary.set_ratio(engine, bad, expected_version=before.version, actor="alice", reason="bad input")
    assert canary.audit_count(engine) == 0
    assert canary.get_state(engine) == before


@pytest.mark.parametrize("actor,reason", [("", "why"), ("   ", "why"), ("alice", ""), ("alice", "x" * 501)])
def test_missing_actor_or_reason_writes_nothing(engine, actor: str, reason: str) -> None:
    canary.ensure_setting(engine, 0.1)
    before = canary.get_state(engine)
    with pytest.raises(ValueError):
        canary.set_ratio(engine, 0.5, expected_version=None, actor=actor, reason=reason)
    assert canary.audit_count(engine) == 0
    assert canary.get_state(engine) == before


@pytest.mark.parametrize("good,expected", [(0, 0.0), (1, 1.0), ("0.25", 0.25), (0.999, 0.999)])
def test_valid_ratios_are_accepted(engine, good, expected: float) -> None:
    canary.ensure_setting(engine, 0.1)
    state = canary.set_ratio(engine, good, expected_version=None, actor="alice", reason="ok")
    assert state.ratio == expected
    assert canary.get_state(engine).ratio == expected
    assert canary.audit_count(engine) == 1


def test_overlong_actor_is_refused_before_the_database(engine) -> None:
    """canary_setting.updated_by / canary_audit.actor are VARCHAR(128): a longer actor is refused with
    a ValueError for the operator (not a raw DataError from PostgreSQL) and nothing is written; an
    actor of exactly 128 characters is stored intact."""
    canary.ensure_setting(engine, 0.1)
    before = canary.get_state(engine)
    with pytest.raises(ValueError, match=r"actor is too long \(129 characters, at most 128\)"):
        canary.set_ratio(engine, 0.3, expected_version=None, actor="a" * 129, reason="long name")
    assert canary.audit_count(engine) == 0
    assert canary.get_state(engine) == before

    widest = "b" * 128
    state = canary.set_ratio(engine, 0.3, expected_version=None, actor=widest, reason="long name")
    assert state.updated_by == widest
    assert canary.get_state(engine).updated_by == widest
    assert [e.actor for e in canary.audit_log(engine)] == [widest]


# -- concurrency -----------------------------------------------------------------------------------
# 8 threads x 500 requests while another thread keeps changing the canary ratio.
#
# No ``database is locked``, no lost or duplicated rows, rollups agree with the log, and every ratio
# change is audited exactly once. Runs on SQLite and PostgreSQL.
