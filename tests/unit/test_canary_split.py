"""Canary split: share, stickiness, monotonic moves, and propagation of a ratio change."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event

from app.routing.canary import Refreshing, assign_side, session_point
from db.canary import set_ratio

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
@settings(max_examples=200)
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


def test_refreshing_reloads_only_after_ttl():
    now = [0.0]
    calls = []
    r = Refreshing(lambda: calls.append(1) or len(calls), ttl_s=0.5, clock=lambda: now[0])
    assert r.get() == 1 and r.get() == 1
    now[0] = 0.49
    assert r.get() == 1
    now[0] = 0.51
    assert r.get() == 2


def test_refreshing_keeps_last_value_when_reload_fails():
    now = [0.0]
    state = {"fail": False}

    def load():
        if state["fail"]:
            raise RuntimeError("db down")
        return 0.3

    r = Refreshing(load, ttl_s=0.5, clock=lambda: now[0])
    assert r.get() == 0.3
    state["fail"] = True
    now[0] = 1.0
    assert r.get() == 0.3


def test_observed_split_through_router_matches_ratio(client_factory, sqlite_url):
    client = client_factory(sqlite_url)
    set_ratio(client.engine, 0.3, expected_version=None, actor="t", reason="r")
    client._ratio.invalidate()
    sides = [client.chat([{"role": "user", "content": "hi"}], session_id=f"u{i}").side for i in range(1000)]
    assert abs(sides.count("primary") / 1000 - 0.3) <= 0.05


def test_change_from_another_process_reaches_router_within_a_second(client_factory, sqlite_url):
    a = client_factory(sqlite_url)
    b = client_factory(sqlite_url)
    msg = [{"role": "user", "content": "hi"}]
    a.chat(msg)  # load the ratio once
    set_ratio(b.engine, 1.0, expected_version=None, actor="other", reason="promote")
    time.sleep(a.settings.routing.ratio_refresh_s + 0.05)
    assert a.current_ratio() == 1.0
    assert all(a.chat(msg, session_id=f"x{i}").side == "primary" for i in range(20))


def test_no_database_read_per_request(client_factory, sqlite_url):
    client = client_factory(sqlite_url)
    msg = [{"role": "user", "content": "hi"}]
    client.chat(msg)
    reads = []

    @event.listens_for(client.engine, "before_cursor_execute")
    def count(conn, cursor, statement, *args):
        if "canary_setting" in statement:
            reads.append(statement)

    started = time.monotonic()
    for i in range(200):
        client.chat(msg, session_id=f"s{i}")
    elapsed = time.monotonic() - started
    # At most one read per refresh interval (plus the one in progress), however slow the machine.
    assert len(reads) <= elapsed / client.settings.routing.ratio_refresh_s + 1
    assert len(reads) < 200


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
