"""Breaker state across processes (issue 28, item 2) without processes: the heartbeat table's
report, staleness and clean exit on SQLite and PostgreSQL; the fleet's view of one breaker; an open
breaker past its cooldown reported half-open; the incident banner deciding from live processes, not
from the merged transitions; a gateway's reporter writing and deleting its own rows. The test with
a real process killed mid-incident is tests/integration/test_breaker_truth.py."""

from __future__ import annotations

import os
import time

from app.monitor.figures import Counts
from app.monitor.incidents import build_incidents
from app.routing.breaker import BreakerPolicy, CircuitBreaker
from app.routing.options import RouteOptions
from db.breakers import (
    LIVE_S,
    LiveBreaker,
    LiveCooldown,
    ReportedBreaker,
    beat,
    combine,
    forget,
    live_breakers,
    live_cooldowns,
)

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


# -- route deployments cooling down, across processes ----------------------------------------------


def test_cooldowns_are_reported_per_process_go_stale_and_leave_with_their_process(engine) -> None:
    beat(engine, process="serve", breakers={}, cooldowns={"azure-eu/gpt-4.1": NOW + 25}, now=NOW, pid=41,
         host="h", source="server")  # fmt: skip
    beat(engine, process="dash", breakers={}, cooldowns={"azure-eu/gpt-4.1": NOW + 5, "openai/gpt-4.1": NOW + 3},
         now=NOW, pid=42, host="h", source="playground")  # fmt: skip
    live = live_cooldowns(engine, now=NOW + 1)
    assert live == {
        "azure-eu/gpt-4.1": [LiveCooldown(NOW + 25, 41, "h", "server"), LiveCooldown(NOW + 5, 42, "h", "playground")],
        "openai/gpt-4.1": [LiveCooldown(NOW + 3, 42, "h", "playground")],
    }
    assert live["azure-eu/gpt-4.1"][0].left_s(NOW + 1) == 24
    # A cooldown that is over no longer counts, even from a live process.
    assert "openai/gpt-4.1" not in live_cooldowns(engine, now=NOW + 4)
    # The next report replaces the process's rows: recovered, nothing cooling.
    beat(engine, process="dash", breakers={}, cooldowns={}, now=NOW + 2, pid=42, host="h", source="playground")
    assert list(live_cooldowns(engine, now=NOW + 2)) == ["azure-eu/gpt-4.1"]
    assert [c.pid for c in live_cooldowns(engine, now=NOW + 2)["azure-eu/gpt-4.1"]] == [41]
    # serve stops reporting (killed): once its report is LIVE_S old its cooldown no longer counts,
    # though the cooldown itself has time left.
    assert live_cooldowns(engine, now=NOW + LIVE_S + 1) == {}
    assert live_cooldowns(engine, now=NOW + 1, live_s=1e9)["azure-eu/gpt-4.1"][0].pid == 41
    forget(engine, "serve")  # or its clean exit takes them at once
    assert live_cooldowns(engine, now=NOW + 1) == {}


def test_hostile_cooldowns_are_stored_safely_or_dropped(engine) -> None:
    beat(
        engine,
        process="x",
        breakers={},
        cooldowns={"p/" + "m" * 500: NOW + 10, "nan/m": float("nan"), "inf/m": float("inf"), "past/m": NOW - 1},
        now=NOW,
        pid=1,
        host="h" * 999,
        source="s\udcff",
    )
    live = live_cooldowns(engine, now=NOW)
    assert [len(k) for k in live] == [200]  # cut to the column; nan, inf and past ones dropped
    assert len(live[next(iter(live))][0].host) == 128


def test_a_gateway_reports_its_cooling_deployments_at_once_and_deletes_them_on_close(client_factory, tmp_path) -> None:
    from app.routing.errors import Failure
    from db.engine import get_engine
    from tests.configs import two_providers

    toml = (
        two_providers()
        + '\n[routes."gpt-4.1"]\nstrategy = "ordered"\n'
        + 'deployments = [{ provider = "holysheep" }, { provider = "direct" }]\nallowed_fails = 2\ncooldown_s = 30\n'
    )
    url = f"sqlite:///{tmp_path / 'g.db'}"
    client = client_factory(url, toml, source="test")
    core = client.core
    client.gateway.breaker_report.timer.stop()  # no periodic beat: only the cooldown hook reports
    d = core.route_table.routes["gpt-4.1"].deployments[0]
    plan = core.plan("chat", {"messages": [{"role": "user", "content": "hi"}]}, RouteOptions(model="gpt-4.1"))
    steps = core.attempts(plan)
    attempt = next(steps)
    for _ in range(2):  # two health failures in a row on holysheep: it cools down
        core.record(plan, attempt.begin(time.time(), core.clock()), failure=Failure("timeout", "slow", retryable=True))
    assert set(core.cooldowns()) == {d.key} and 29 < core.cooldowns()[d.key] <= 30
    engine = get_engine(url)
    # The cooldown hook reported it off the request's thread (the timer beats no more).
    cooling = _wait(lambda: live_cooldowns(engine, now=time.time()).get(d.key))
    assert cooling and cooling[0].source == "test" and cooling[0].pid == os.getpid()
    assert 25 < cooling[0].left_s(time.time()) <= 30
    steps.close()
    client.gateway.close()
    assert live_cooldowns(engine, now=time.time()) == {}


def _wait(read, timeout_s: float = 10.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = read()
        if got:
            return got
        time.sleep(0.02)
    return read()
