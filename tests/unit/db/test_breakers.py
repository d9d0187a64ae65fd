"""Breaker state across processes (issue 28, item 2) without processes: the heartbeat table's
report, staleness and clean exit on SQLite and PostgreSQL; the fleet's view of one breaker; an open
breaker past its cooldown reported half-open; the incident banner deciding from live processes, not
from the merged transitions; a gateway's reporter writing and deleting its own rows. The test with
a real process killed mid-incident is tests/integration/test_breaker_truth.py."""

from __future__ import annotations

import time

from app.monitor.figures import Counts
from app.monitor.incidents import build_incidents
from app.routing.breaker import BreakerPolicy, CircuitBreaker
from db.breakers import LIVE_S, LiveBreaker, ReportedBreaker, beat, combine, forget, live_breakers

NOW = 1_800_000_000.0
WHO = dict(pid=7, host="test-host", source="api")


def test_the_fleet_shows_the_worst_state_a_live_process_holds() -> None:
    assert combine([("closed", None), ("open", NOW - 5), ("open", NOW - 60), ("half_open", NOW)]) == LiveBreaker(
        "open", NOW - 60, 4, 2
    )
    assert combine([("closed", None), ("half_open", NOW)]) == LiveBreaker("half_open", NOW, 2, 1)
    assert combine([("closed", None)]) == LiveBreaker("closed", None, 1, 1)


def test_reports_replace_each_other_go_stale_and_leave_with_their_process(engine) -> None:
    beat(engine, process="a", breakers={"p1": ReportedBreaker("open", NOW - 9)}, now=NOW, **WHO)
    beat(
        engine,
        process="b",
        breakers={"p1": ReportedBreaker("closed"), "p2": ReportedBreaker("half_open", NOW - 1)},
        now=NOW,
        **WHO,
    )
    live = live_breakers(engine, now=NOW + 1)
    assert live == {"p1": LiveBreaker("open", NOW - 9, 2, 1), "p2": LiveBreaker("half_open", NOW - 1, 1, 1)}
    # a's next report says closed: it replaces the old one (no row of the old report is left).
    beat(engine, process="a", breakers={"p1": ReportedBreaker("closed", NOW + 2)}, now=NOW + 2, **WHO)
    assert live_breakers(engine, now=NOW + 3)["p1"] == LiveBreaker("closed", NOW + 2, 2, 2)
    # b stops reporting: once its report is LIVE_S old it no longer counts; a still does.
    later = NOW + 2 + LIVE_S
    assert live_breakers(engine, now=later) == {"p1": LiveBreaker("closed", NOW + 2, 1, 1)}
    forget(engine, "a")  # a's clean exit
    assert live_breakers(engine, now=NOW + 3) == {"p1": LiveBreaker("closed", None, 1, 1), "p2": live["p2"]}
    # A report an hour later clears the rows of processes silent that long.
    beat(engine, process="c", breakers={}, now=NOW + 4000, **WHO)
    assert live_breakers(engine, now=NOW + 3, live_s=1e9) == {}


def test_hostile_names_and_states_are_stored_safely(engine) -> None:
    beat(
        engine,
        process="x",
        breakers={"p" * 500: ReportedBreaker("exploded")},
        now=NOW,
        pid=1,
        host="h" * 999,
        source="s",
    )
    ((name, b),) = live_breakers(engine, now=NOW).items()
    assert len(name) == 64 and b.state == "closed"


def test_an_open_breaker_past_its_cooldown_is_reported_half_open() -> None:
    b = CircuitBreaker("p", BreakerPolicy(min_attempts=2, cooldown_s=10))
    b.record(False, 100.0)
    b.record(False, 100.0)
    assert b.snapshot(105.0).reported_state == "open"
    assert b.snapshot(110.0).state == "open" and b.snapshot(110.0).reported_state == "half_open"


def test_the_banner_follows_the_live_processes_not_the_merged_transitions() -> None:
    transitions = {"holysheep": [(NOW - 600, "open")]}  # a process that died with it open
    held_open = {"holysheep": LiveBreaker("open", NOW - 30, 1, 1)}
    quiet = {"holysheep": Counts()}
    common = dict(now=NOW, last_minute=quiet, transitions=transitions, minutes={})
    assert [i.breaker_state for i in build_incidents(["holysheep"], **common)] == ["open"]  # no live view
    assert build_incidents(["holysheep"], live={}, **common) == []
    assert build_incidents(["holysheep"], live={"holysheep": LiveBreaker("closed", None, 1, 1)}, **common) == []
    held = build_incidents(["holysheep"], live={"holysheep": LiveBreaker("open", NOW - 600, 2, 1)}, **common)
    assert [(i.provider, i.breaker_state, i.start) for i in held] == [("holysheep", "open", NOW - 600)]
    # Half-open (cooldown over, waiting for a probe that no traffic brings) is no incident alone...
    waiting = {"holysheep": LiveBreaker("half_open", NOW - 600, 1, 1)}
    assert build_incidents(["holysheep"], live=waiting, **common) == []
    # ...but it is while the provider also fails.
    failing = {**common, "last_minute": {"holysheep": Counts(attempts=10, attempt_errors=10)}}
    assert [i.breaker_state for i in build_incidents(["holysheep"], live=waiting, **failing)] == ["half_open"]
    # Only heartbeats, no recorded transition: the live report dates the breaker.
    alone = build_incidents(["holysheep"], live=held_open, **{**common, "transitions": {}})
    assert [(i.breaker_since, i.start) for i in alone] == [(NOW - 30, NOW - 30)]


def test_a_gateway_reports_its_breakers_and_deletes_them_on_close(client_factory, sqlite_url) -> None:
    from db.engine import get_engine

    client = client_factory(sqlite_url)
    gateway = client.gateway
    reporter = gateway.breaker_report
    breaker = client.core.breakers["holysheep"]
    for _ in range(20):
        breaker.record(False, client.core.clock())
    assert breaker.state == "open"
    reporter.report()
    engine = get_engine(sqlite_url)
    live = live_breakers(engine, now=time.time())
    assert live["holysheep"].state == "open" and live["holysheep"].since is not None
    assert live["direct"].state == "closed"
    gateway.close()
    assert live_breakers(engine, now=time.time()) == {}
