"""Canary split: share, stickiness, monotonic moves, and propagation of a ratio change."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event

from app.refresh import Periodic, Refresher
from app.routing.canary import assign_side, session_point
from db.canary import set_ratio
from tests.support.examples import examples

REPO = Path(__file__).resolve().parents[2]
SESSIONS = [f"session-{i}" for i in range(10_000)]


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
def test_split_within_two_percent_over_10k_sessions(ratio):
    share = sum(assign_side(ratio, s) == "primary" for s in SESSIONS) / len(SESSIONS)
    assert abs(share - ratio) <= 0.02


@pytest.mark.parametrize("ratio", [0.1, 0.5])
def test_random_split_without_session_is_near_ratio(ratio):
    rng = random.Random(3)
    share = sum(assign_side(ratio, None, rng) == "primary" for _ in range(10_000)) / 10_000
    assert abs(share - ratio) <= 0.02


def test_sticky_session_keeps_its_side():
    for s in SESSIONS[:500]:
        sides = {assign_side(0.37, s) for _ in range(5)}
        assert len(sides) == 1


@given(st.floats(0, 1), st.floats(0, 1))
@settings(max_examples=examples(200))
def test_raising_the_ratio_only_moves_sessions_to_primary(a, b):
    lo, hi = sorted((a, b))
    for s in SESSIONS[:300]:
        if assign_side(lo, s) == "primary":
            assert assign_side(hi, s) == "primary"


def test_session_point_is_uniform_enough():
    points = [session_point(s) for s in SESSIONS]
    assert all(0.0 <= p < 1.0 for p in points)
    deciles = [sum(int(p * 10) == d for p in points) for d in range(10)]
    assert max(deciles) - min(deciles) < 300


def test_refresher_serves_the_last_load_and_its_age():
    now = [100.0]
    calls = []
    refresher = Refresher(0.5, clock=lambda: now[0])
    r = refresher.add("n", lambda: calls.append(1) or len(calls))
    assert (r.value, r.age_s()) == (1, 0.0)
    now[0] = 100.75
    assert r.get() == 1 and r.age_s() == 0.75  # reading never loads
    refresher.tick()
    assert (r.value, r.age_s(), len(calls)) == (2, 0.0, 2)
    assert refresher.snapshot()["n"].value == 2


def test_refresher_keeps_last_value_when_reload_fails():
    now = [0.0]
    state = {"fail": False}

    def load():
        if state["fail"]:
            raise RuntimeError("db down")
        return 0.3

    refresher = Refresher(0.5, clock=lambda: now[0])
    r = refresher.add("ratio", load)
    state["fail"] = True
    now[0] = 4.0
    refresher.tick()
    assert r.value == 0.3 and r.age_s() == 4.0
    assert refresher.snapshot()["ratio"].last_error == "RuntimeError: db down"
    state["fail"] = False
    refresher.tick()
    assert r.age_s() == 0.0 and r.last_error is None


def test_refresher_thread_reloads_until_stopped():
    loaded = threading.Event()
    calls = []

    def load():
        calls.append(1)
        if len(calls) > 1:
            loaded.set()
        return len(calls)

    refresher = Refresher(0.01)
    refresher.add("n", load)
    refresher.start()
    try:
        assert loaded.wait(timeout=10), "the background thread never reloaded"
    finally:
        refresher.stop()
    settled = len(calls)
    refresher.stop()  # idempotent
    assert len(calls) == settled


def test_periodic_survives_a_failing_run():
    calls = []

    def run():
        calls.append(1)
        raise RuntimeError("boom")

    timer = Periodic(run, 1.0, name="t")
    timer.run_once()
    timer.run_once()
    assert (timer.runs, timer.failures, len(calls)) == (2, 2, 2)


def test_observed_split_through_router_matches_ratio(client_factory, sqlite_url):
    client = client_factory(sqlite_url)
    set_ratio(client.engine, 0.3, expected_version=None, actor="t", reason="r")
    client.refresh()
    sides = [client.chat([{"role": "user", "content": "hi"}], session_id=f"u{i}").side for i in range(1000)]
    assert abs(sides.count("primary") / 1000 - 0.3) <= 0.05


def test_change_from_another_process_reaches_router_within_a_second(client_factory, sqlite_url, tmp_path):
    """A real second process (the operator's ``python -m app canary set``) writes the ratio; this
    process's router must route by it within a second of that process exiting, with no restart."""
    a = client_factory(sqlite_url)
    msg = [{"role": "user", "content": "hi"}]
    a.chat(msg)  # load (and cache) the initial ratio
    assert a.current_ratio() == pytest.approx(0.1)
    config = tmp_path / "cli.toml"
    config.write_text((REPO / "gateway.toml").read_text())
    env = {**os.environ, "DATABASE_URL": sqlite_url, "GATEWAY_CONFIG": str(config), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "app", "canary", "set", "1.0", "--reason", "promote", "--actor", "other"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    # Wait on the condition, bounded by the contract ("within a second"), polling every 10 ms.
    deadline = time.monotonic() + 1.0
    while a.current_ratio() != 1.0:
        assert time.monotonic() < deadline, f"ratio still {a.current_ratio()} a second after the change"
        threading.Event().wait(0.01)
    assert all(a.chat(msg, session_id=f"x{i}").side == "primary" for i in range(20))


def test_requests_never_read_the_database(client_factory, sqlite_url):
    client = client_factory(sqlite_url)
    msg = [{"role": "user", "content": "hi"}]
    readers = []

    @event.listens_for(client.engine, "before_cursor_execute")
    def count(conn, cursor, statement, *args):
        if "canary_setting" in statement or "sim_fault" in statement:
            readers.append(threading.current_thread().name)

    for i in range(50):
        client.chat(msg, session_id=f"s{i}")
    # Only the background refresher reads the ratio and the faults, never the calling thread.
    assert threading.current_thread().name not in readers
    assert set(readers) <= {"gateway-refresher", "gateway-guardrail"}


def test_refresh_applies_own_changes_at_once(client_factory, sqlite_url):
    from core.faults import FaultSettings
    from db.faults import set_faults

    client = client_factory(sqlite_url)
    msg = [{"role": "user", "content": "hi"}]
    client.chat(msg)  # ratio (0.1) and faults (none) now cached for 0.5 s
    set_ratio(client.engine, 1.0, expected_version=None, actor="me", reason="promote")
    set_faults(client.engine, "holysheep", FaultSettings(error_rate=1.0), actor="me")
    client.refresh()
    r = client.chat(msg, session_id="any")
    assert r.side == "primary" and r.fallback_used and r.attempt_log[0].error_class == "server_error"
