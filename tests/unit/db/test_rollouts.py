"""Rollouts as data: one active per scope, every change audited with the ratio, fenced writes."""

from __future__ import annotations

import pytest

from core.errors import InvalidRequest
from core.rollout import check_plan
from db import canary, rollouts
from db.rollouts import Fence, LeaseLost, StaleRollout


def _start(engine, *, scope: str = "global", dry: bool = False, now: float = 100.0):
    canary.ensure_setting(engine, 0.0)
    plan = check_plan(candidate="holysheep", steps="1,5,100", bake_s=2, dry_run=dry)
    return rollouts.start(engine, plan, scope=scope, actor="alice", reason="new model", now=now)


def test_start_moves_the_ratio_to_the_first_step_with_an_audit_row(engine) -> None:
    r = _start(engine)
    assert (r.state, r.step_index, r.weight, r.step_started_at) == ("running", 0, 0.01, 100.0)
    assert canary.get_state(engine).ratio == 0.01
    [audit] = canary.audit_log(engine, scope="global")
    assert (audit.old_ratio, audit.new_ratio, audit.actor) == (0.0, 0.01, "alice")
    assert audit.reason.startswith(f"#{r.id} rollout start of holysheep at 1 %") and "new model" in audit.reason


def test_a_dry_run_records_but_leaves_the_ratio(engine) -> None:
    r = _start(engine, dry=True)
    assert canary.get_state(engine).ratio == 0.0
    [audit] = canary.audit_log(engine, scope="global")
    assert audit.old_ratio == audit.new_ratio == 0.0 and "(dry run)" in audit.reason
    assert r.plan.dry_run


def test_one_active_rollout_per_scope_and_nothing_written_on_refusal(engine) -> None:
    first = _start(engine)
    audits = canary.audit_count(engine)
    with pytest.raises(InvalidRequest, match=f"already has an active rollout \\(#{first.id}, running at 1 %\\)"):
        _start(engine)
    assert canary.audit_count(engine) == audits
    # Another scope is free, and an ended rollout frees its scope.
    other = _start(engine, scope="route:gpt-4.1")
    assert other.scope == "route:gpt-4.1" and canary.get_state(engine, "route:gpt-4.1").ratio == 0.01
    rollouts.apply(engine, first, state="aborted", step_index=0, ratio=0.0, actor="op", reason="stop")
    assert rollouts.active(engine, "global") is None
    again = _start(engine)
    assert again.id > first.id and rollouts.latest(engine, "global") == again


def test_apply_steps_restarts_the_bake_clock_and_refuses_a_stale_read(engine) -> None:
    r = _start(engine)
    stepped = rollouts.apply(engine, r, state="running", step_index=1, ratio=0.05, actor="rollout",
                             reason="rollout step 1 % -> 5 %", now=110.0)  # fmt: skip
    assert (stepped.step_index, stepped.step_started_at, stepped.version) == (1, 110.0, r.version + 1)
    assert canary.get_state(engine).ratio == 0.05
    paused = rollouts.apply(engine, stepped, state="paused", step_index=1, ratio=None, actor="op", reason="p", now=120)
    assert paused.step_started_at == 110.0 and canary.get_state(engine).ratio == 0.05
    resumed = rollouts.apply(engine, paused, state="running", step_index=1, ratio=0.05, actor="op", reason="r",
                             now=130, restart_clock=True)  # fmt: skip
    assert resumed.step_started_at == 130.0
    audits = canary.audit_count(engine)
    with pytest.raises(StaleRollout):
        rollouts.apply(engine, stepped, state="aborted", step_index=1, ratio=0.0, actor="op", reason="stale")
    assert canary.audit_count(engine) == audits and canary.get_state(engine).ratio == 0.05
    assert [h[4] for h in rollouts.history(engine, resumed)] == [
        f"#{r.id} rollout start of holysheep at 1 % (steps 1,5,100, bake 2 s): new model",
        f"#{r.id} rollout step 1 % -> 5 %",
        f"#{r.id} p",
        f"#{r.id} r",
    ]


def test_the_lease_renews_for_its_holder_and_passes_on_only_after_expiry(engine) -> None:
    a = rollouts.acquire_lease(engine, "a", ttl_s=10, now=100)
    assert a == Fence("a", 1)
    assert rollouts.acquire_lease(engine, "b", ttl_s=10, now=105) is None
    assert rollouts.acquire_lease(engine, "a", ttl_s=10, now=108) == Fence("a", 1)  # renewed, same token
    assert rollouts.acquire_lease(engine, "b", ttl_s=10, now=117) is None  # a renewed until 118
    b = rollouts.acquire_lease(engine, "b", ttl_s=10, now=118)
    assert b == Fence("b", 2)
    rollouts.release_lease(engine, "b")
    assert rollouts.acquire_lease(engine, "a", ttl_s=10, now=119) == Fence("a", 3)


def test_a_fenced_write_with_an_old_token_writes_nothing(engine) -> None:
    r = _start(engine)
    old = rollouts.acquire_lease(engine, "a", ttl_s=10, now=100)
    assert old is not None
    new = rollouts.acquire_lease(engine, "b", ttl_s=10, now=111)  # a's lease expired; b took over
    assert new is not None and new.token > old.token
    audits = canary.audit_count(engine)
    with pytest.raises(LeaseLost):
        rollouts.apply(engine, r, state="running", step_index=1, ratio=0.05, actor="rollout", reason="late",
                       now=112, fence=old)  # fmt: skip
    assert canary.audit_count(engine) == audits and rollouts.get(engine, r.id) == r
    rollouts.apply(engine, r, state="running", step_index=1, ratio=0.05, actor="rollout", reason="ok", now=112,
                   fence=new)  # fmt: skip
    assert canary.get_state(engine).ratio == 0.05


def test_racing_takeovers_of_an_expired_lease_leave_exactly_one_holder(engine) -> None:
    import threading

    rollouts.acquire_lease(engine, "old", ttl_s=1, now=100)
    start = threading.Barrier(4)
    got: list[Fence | None] = []
    lock = threading.Lock()

    def take(i: int) -> None:
        start.wait()
        fence = rollouts.acquire_lease(engine, f"p{i}", ttl_s=10, now=200)
        with lock:
            got.append(fence)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [f for f in got if f is not None]
    assert len(winners) == 1 and winners[0].token == 2
    assert rollouts.lease_holder(engine) == (winners[0].holder, 2, 210.0)
