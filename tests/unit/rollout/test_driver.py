"""The rollout controller over real traffic (the routing client, the simulator, the request log):
one of two processes' controllers acts, once; a failing candidate is aborted on its own; a step
without samples pauses as inconclusive; a ratio the guardrail set to 0 aborts; a controller whose
lease was taken over writes nothing."""

from __future__ import annotations

import time

import pytest

from app.rollout import ops
from app.rollout.driver import RolloutDriver
from app.routing.rollout import inconclusive_after
from core.faults import FaultSettings
from core.rollout import check_plan
from core.units import run_limits
from db import canary, rollouts
from db.faults import set_faults

MSG = [{"role": "user", "content": "hello"}]
BAKE_S = 5.0


def _client(client_factory, sqlite_url):
    return client_factory(sqlite_url, guardrail=False)


def _start(client, steps: str = "50,100", *, ago: float = BAKE_S + 1, dry: bool = False):
    plan = check_plan(candidate="holysheep", steps=steps, bake_s=BAKE_S, min_samples=20, dry_run=dry)
    # Started a little over a bake time ago: the step has baked, whatever the traffic's pace.
    r = ops.start(client.engine, client.settings, plan, actor="alice", reason="test", now=time.time() - ago)
    client.refresh()
    return r


def _traffic(client, n: int) -> None:
    from app.routing import AllRoutesFailed

    for i in range(n):
        try:
            client.chat(MSG, session_id=f"s{i}")
        except AllRoutesFailed:
            pass
    client.flush()


def _drivers(client, n: int = 2) -> tuple[list[RolloutDriver], list[dict]]:
    """Controllers whose clock reads a little after the traffic: every request has its own session,
    and a session's run is judged once it has been idle (:func:`core.units.run_limits`)."""
    events: list[dict] = []
    idle_s, _ = run_limits(BAKE_S)
    later = lambda: time.time() + idle_s + 0.5  # noqa: E731
    return [RolloutDriver(client.engine, notify=events.append, holder=f"p{i}", wall_clock=later)
            for i in range(n)], events  # fmt: skip


def test_two_controllers_step_a_healthy_rollout_exactly_once(client_factory, sqlite_url) -> None:
    client = _client(client_factory, sqlite_url)
    r = _start(client)
    _traffic(client, 120)
    (a, b), events = _drivers(client)
    acted = [a.tick(), b.tick(), a.tick(), b.tick()]
    assert [len(x) for x in acted] == [1, 0, 0, 0]  # a holds the lease and acted; b never does
    done = rollouts.get(client.engine, r.id)
    assert done is not None and done.state == "completed" and done.weight == 1.0
    assert canary.get_state(client.engine).ratio == 1.0
    trail = rollouts.history(client.engine, done)
    assert [t[2] for t in trail] == [0.5, 1.0] and trail[1][3] == "rollout"
    assert "complete: 50 % -> 100 %: every metric passes" in trail[1][4]
    assert [e["event"] for e in events] == ["rollout.complete"] and events[0]["text"].startswith("[global canary]")


def test_a_failing_candidate_is_aborted_on_its_own(client_factory, sqlite_url) -> None:
    client = _client(client_factory, sqlite_url)
    set_faults(client.engine, "holysheep", FaultSettings(error_rate=0.6), actor="t")
    r = _start(client, "10,50,100", ago=0.0)  # no bake time needed to abort
    _traffic(client, 300)
    [driver], events = _drivers(client, 1)
    [action] = driver.tick()
    assert action.kind == "abort" and "first-attempt failure rate" in action.reason
    done = rollouts.get(client.engine, r.id)
    assert done is not None and done.state == "aborted" and canary.get_state(client.engine).ratio == 0.0
    assert events[0]["event"] == "rollout.abort" and "always-valid p = " in events[0]["reason"]


def test_a_step_without_samples_pauses_as_inconclusive(client_factory, sqlite_url) -> None:
    client = _client(client_factory, sqlite_url)
    r = _start(client, ago=inconclusive_after(BAKE_S) + 1)
    [driver], events = _drivers(client, 1)
    [action] = driver.tick()
    assert action.kind == "pause" and "inconclusive" in action.reason
    assert rollouts.get(client.engine, r.id).state == "paused"  # type: ignore[union-attr]
    assert canary.get_state(client.engine).ratio == 0.5  # a pause keeps the weight
    assert driver.tick() == []  # paused: nothing more until resumed
    assert [e["event"] for e in events] == ["rollout.pause"]


def test_a_controller_that_reads_a_long_log_in_parts_decides_only_once_it_has_read_it_all(
    client_factory, sqlite_url
) -> None:
    """A controller that starts mid-rollout (a restart, a lease taken over) reads the log a part per
    tick. The step's samples are not all counted before the last part: the step that had waited
    long enough to be called inconclusive must not be paused on the first part's few samples."""
    client = _client(client_factory, sqlite_url)
    r = _start(client, ago=inconclusive_after(BAKE_S) + 1)
    _traffic(client, 120)
    [driver], events = _drivers(client, 1)
    driver.rows_per_tick = 10  # a part is 10 requests: 5 a side, short of the 20 samples a step needs
    ticks = []
    for _ in range(20):
        ticks.append(driver.tick())
        if ticks[-1]:
            break
    assert ticks[0] == [] and len(ticks) >= 12  # 120 rows, 10 a tick: nothing decided before all were read
    [action] = ticks[-1]
    assert action.kind == "complete", action.reason
    assert rollouts.get(client.engine, r.id).state == "completed"  # type: ignore[union-attr]
    assert [e["event"] for e in events] == ["rollout.complete"]


def test_a_few_long_sessions_are_too_few_samples_however_many_requests(client_factory, sqlite_url) -> None:
    # 240 requests, 50 % on each arm, but from 4 sessions (each sticks to its side): 4 units, far
    # from the 20 a step needs on each arm. Counted request by request, the step would pass.
    from app.routing import AllRoutesFailed
    from app.routing.canary import session_point

    ids = [f"long-{i}-\u00e9\U0001f642" for i in range(4)]
    assert sorted(session_point(s) < 0.5 for s in ids) == [False, False, True, True]  # two on each arm
    client = _client(client_factory, sqlite_url)
    r = _start(client, ago=inconclusive_after(BAKE_S) + 1)
    for i in range(240):
        try:
            client.chat(MSG, session_id=ids[i % 4])
        except AllRoutesFailed:
            pass
    client.flush()
    [driver], _ = _drivers(client, 1)
    [action] = driver.tick()
    assert action.kind == "pause" and "inconclusive" in action.reason and "units" in action.reason, action.reason
    assert rollouts.get(client.engine, r.id).state == "paused"  # type: ignore[union-attr]


def test_a_guardrail_rollback_aborts_the_rollout(client_factory, sqlite_url) -> None:
    client = _client(client_factory, sqlite_url)
    r = _start(client)
    canary.set_ratio(client.engine, 0.0, expected_version=None, actor="guardrail", reason="automatic rollback")
    [driver], _ = _drivers(client, 1)
    [action] = driver.tick()
    assert action.kind == "abort" and "guardrail or operator" in action.reason
    assert rollouts.get(client.engine, r.id).state == "aborted"  # type: ignore[union-attr]


def test_a_dry_run_decides_and_records_but_never_moves_the_weight(client_factory, sqlite_url) -> None:
    client = _client(client_factory, sqlite_url)
    canary.set_ratio(client.engine, 0.5, expected_version=None, actor="t", reason="existing canary")
    r = _start(client, dry=True)
    _traffic(client, 120)
    [driver], _ = _drivers(client, 1)
    [action] = driver.tick()
    assert action.kind == "complete" and "(dry run)" in action.reason
    assert rollouts.get(client.engine, r.id).state == "completed"  # type: ignore[union-attr]
    assert canary.get_state(client.engine).ratio == 0.5


def test_a_controller_whose_lease_was_taken_over_writes_nothing(client_factory, sqlite_url) -> None:
    client = _client(client_factory, sqlite_url)
    r = _start(client)
    _traffic(client, 120)
    clock = [time.time()]
    slow = RolloutDriver(client.engine, notify=lambda e: None, holder="slow", wall_clock=lambda: clock[0])
    fence = rollouts.acquire_lease(client.engine, "slow", ttl_s=10, now=clock[0])
    assert fence is not None
    # "slow" stalls past its lease; another process takes it over (a larger token).
    newer = rollouts.acquire_lease(client.engine, "fast", ttl_s=10, now=clock[0] + 11)
    assert newer is not None and newer.token > fence.token
    audits = canary.audit_count(client.engine)
    with pytest.raises(rollouts.LeaseLost):
        rollouts.apply(client.engine, r, state="completed", step_index=1, ratio=1.0, actor="rollout",
                       reason="late", now=clock[0] + 12, fence=fence)  # fmt: skip
    assert slow.tick() == []  # and its next round finds the lease held
    assert canary.audit_count(client.engine) == audits
    slow.close()
