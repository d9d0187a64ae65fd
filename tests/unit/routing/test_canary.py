"""Canary split: share, stickiness, monotonic moves, and propagation of a ratio change."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event, select

from app.refresh import Periodic, Refresher
from app.routing.canary import assign_side, session_point
from app.routing.substitution import SubstitutionRefused
from db.canary import set_ratio
from db.models import RequestLog
from tests.configs import one_sided_toml
from tests.support.examples import examples

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


def test_requests_never_read_the_database(client_factory, sqlite_url):
    client = client_factory(sqlite_url, toml=one_sided_toml())
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

    client = client_factory(sqlite_url, toml=one_sided_toml())
    msg = [{"role": "user", "content": "hi"}]
    client.chat(msg)  # ratio (0.1) and faults (none) now cached for 0.5 s
    set_ratio(client.engine, 1.0, expected_version=None, actor="me", reason="promote")
    set_faults(client.engine, "holysheep", FaultSettings(error_rate=1.0), actor="me")
    client.refresh()
    r = client.chat(msg, session_id="any")
    assert r.side == "primary" and r.fallback_used and r.attempt_log[0].error_class == "server_error"


# -- canary means it -------------------------------------------------------------------------------
# The canary ratio means what it says (issue 17): at 0 % the primary gets no traffic and at 100 %
# the fallback gets none except fail-over, whatever model the intent rules pick. Where the side the
# ratio chose cannot serve the model, the substitution policy decides, and a refusal names the ratio.
# Through the gateway's RoutingClient on the shipped gateway.toml and the built-in simulator.


CODING = "Write a python function that merges two sorted lists"
GENERAL = "Tell me about the weather in spring"


def log(client) -> list:
    client.flush()
    with client.engine.connect() as conn:
        rows = conn.execute(select(RequestLog.provider, RequestLog.fallback, RequestLog.error_class))
        return list(rows)


def at_ratio(client, ratio: float):
    set_ratio(client.engine, ratio, expected_version=None, actor="test", reason="drill")
    client.refresh()
    assert client.current_ratio() == ratio
    return client


def test_at_zero_the_primary_gets_nothing_even_for_a_model_only_it_serves(client_factory, sqlite_url):
    client = at_ratio(client_factory(sqlite_url, toml=one_sided_toml()), 0.0)
    primary = client.settings.routing.primary
    for i in range(20):
        client.chat([{"role": "user", "content": GENERAL}], session_id=f"g{i}")
    refused = 0
    for i in range(20):
        with pytest.raises(SubstitutionRefused) as info:
            client.chat([{"role": "user", "content": CODING}], session_id=f"c{i}")  # deepseek: only the primary
        refused += 1
        assert "canary ratio of 0%" in str(info.value) and "routing.substitution" in str(info.value)
    rows = log(client)
    assert [r for r in rows if r.provider == primary and r.error_class != "refused_by_policy"] == []
    # Every request is in the log once: 20 answered, 20 refused by the policy with their own class.
    assert len(rows) == 40 and sum(r.error_class == "refused_by_policy" for r in rows) == refused == 20


def test_at_one_hundred_the_fallback_gets_only_fail_over(client_factory, sqlite_url):
    client = at_ratio(client_factory(sqlite_url, toml=one_sided_toml()), 1.0)
    fallback = client.settings.routing.fallback
    for i in range(20):
        client.chat([{"role": "user", "content": GENERAL}], model="gpt-4.1", session_id=f"s{i}")
    assert [r for r in log(client) if r.provider == fallback and not r.fallback] == []


def test_between_the_ends_a_model_served_by_one_side_still_goes_there(client_factory, sqlite_url):
    client = at_ratio(client_factory(sqlite_url, toml=one_sided_toml()), 0.5)
    primary = client.settings.routing.primary
    results = [client.chat([{"role": "user", "content": CODING}], session_id=f"c{i}") for i in range(20)]
    assert {r.provider for r in results} == {primary}  # rerouted: the fallback does not serve deepseek
    assert {r.side for r in results} == {"primary", "fallback"}
