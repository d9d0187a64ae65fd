"""What the shadow phase copies on the request path (app/rollout/shadow.Shadower.offer): only a
shadowed baseline's requests (the global canary's fallback side; a route's own deployments, named
by the route), at the phase's share, under its budget, never a request whose caller forbade it, and
never by waiting (a full queue drops the copy). And the copy of a route's request goes to the
route's canary deployment alone (``RouteOptions(canary_only=True)``)."""

from __future__ import annotations

import random

from app.rollout.shadow import Phase, Shadower
from app.routing.options import RouteOptions
from db.canary import get_state, set_ratio

HELLO = {"messages": [{"role": "user", "content": "hello"}], "stream_options": {"include_usage": True}}


def _setup(client_factory, sqlite_url, *, queue_size: int = 8):
    client = client_factory(sqlite_url)
    if get_state(client.engine).ratio != 0.0:  # every request is the baseline's
        set_ratio(client.engine, 0.0, expected_version=None, actor="t", reason="baseline only")
    client.refresh()
    sh = Shadower(client.engine, client.settings, make_client=type(client), queue_size=queue_size,
                  rng=random.Random(1))  # fmt: skip
    client.core.on_plan.append(sh.offer)
    return client, sh


def _plan(client, **options):
    return client.core.plan("chat", HELLO, RouteOptions(model="gpt-4.1", **options))


def test_nothing_is_copied_without_a_shadow_phase(client_factory, sqlite_url) -> None:
    client, sh = _setup(client_factory, sqlite_url)
    _plan(client)
    assert sh._queue.qsize() == 0


def test_the_baseline_is_copied_whole_without_streaming_and_marked_callers_are_not(client_factory, sqlite_url):
    client, sh = _setup(client_factory, sqlite_url)
    sh.phases = {None: Phase(rollout_id=7, route=None, share=1.0, budget_usd=5.0, spent_usd=0.0)}
    plan = _plan(client)
    rollout_id, api, body, model, request_id, stream = sh._queue.get_nowait()
    assert (rollout_id, api, model, request_id, stream) == (7, "chat", "gpt-4.1", plan.request_id, False)
    assert body == {"messages": HELLO["messages"]}  # streaming is the routing option's, as the request's
    streamed = _plan(client, stream=True)
    assert sh._queue.get_nowait()[4:] == (streamed.request_id, True)  # a streamed request's copy streams
    _plan(client, headers={"X-Gateway-No-Shadow": "1"})
    _plan(client, route="primary")  # the candidate's own side: not a baseline request
    assert sh._queue.qsize() == 0
    _plan(client, headers={"x-gateway-no-shadow": "false"})
    assert sh._queue.qsize() == 1


def test_the_share_the_budget_and_a_full_queue(client_factory, sqlite_url) -> None:
    client, sh = _setup(client_factory, sqlite_url, queue_size=1000)
    sh.phases = {None: Phase(rollout_id=1, route=None, share=0.25, budget_usd=5.0, spent_usd=0.0)}
    for _ in range(400):
        _plan(client)
    assert 60 <= sh._queue.qsize() <= 140  # about a quarter (seeded draw)
    sh.phases = {None: Phase(rollout_id=1, route=None, share=1.0, budget_usd=5.0, spent_usd=5.0)}
    before = sh._queue.qsize()
    _plan(client)
    assert sh._queue.qsize() == before  # spent: nothing more
    client2, small = _setup(client_factory, sqlite_url, queue_size=2)
    small.phases = {None: Phase(rollout_id=1, route=None, share=1.0, budget_usd=5.0, spent_usd=0.0)}
    for _ in range(5):
        _plan(client2)
    assert (small._queue.qsize(), small.dropped) == (2, 3)


ROUTE = """
[routes."gpt-4.1"]
deployments = [{ provider = "direct" }]
canary = { provider = "holysheep" }
"""


def test_a_routes_baseline_is_copied_by_route_and_only_while_its_own_phase_runs(client_factory, sqlite_url) -> None:
    from tests.support import paths

    client = client_factory(sqlite_url, (paths.REPO / "gateway.toml").read_text() + ROUTE)
    client.refresh()
    sh = Shadower(client.engine, client.settings, make_client=type(client), rng=random.Random(1))
    client.core.on_plan.append(sh.offer)
    sh.phases = {None: Phase(rollout_id=1, route=None, share=1.0, budget_usd=5.0, spent_usd=0.0)}
    routed = client.core.plan("chat", HELLO, RouteOptions(model="gpt-4.1"))
    assert routed.route == "gpt-4.1" and routed.side == "route"
    assert sh._queue.qsize() == 0  # the global phase does not copy a route's requests
    sh.phases = {"gpt-4.1": Phase(rollout_id=3, route="gpt-4.1", share=1.0, budget_usd=5.0, spent_usd=0.0)}
    plan = client.core.plan("chat", HELLO, RouteOptions(model="gpt-4.1"))
    assert sh._queue.get_nowait() == (3, "chat", {"messages": HELLO["messages"]}, "gpt-4.1", plan.request_id, False)
    client.core.plan("chat", HELLO, RouteOptions(model="gemini-2.5-flash"))  # the two-sided routing: no phase
    assert sh._queue.qsize() == 0
    sh.phases = {"gpt-4.1": Phase(rollout_id=3, route="gpt-4.1", share=1.0, budget_usd=5.0, spent_usd=5.0)}
    client.core.plan("chat", HELLO, RouteOptions(model="gpt-4.1"))
    assert sh._queue.qsize() == 0  # spent


def test_a_canary_only_plan_tries_the_routes_canary_alone(client_factory, sqlite_url) -> None:
    import pytest

    from core.errors import InvalidRequest
    from tests.support import paths

    client = client_factory(sqlite_url, (paths.REPO / "gateway.toml").read_text() + ROUTE)
    plan = client.core.plan("chat", HELLO, RouteOptions(model="gpt-4.1", canary_only=True))
    assert plan.canary_only and plan.side == "route_canary"
    answer = client.chat(HELLO["messages"], model="gpt-4.1", canary_only=True)
    assert answer.provider == "holysheep"  # the canary deployment, at a route ratio of 0
    with pytest.raises(InvalidRequest, match=r"names no route with a canary deployment \(routes with one: gpt-4\.1\)"):
        client.core.plan("chat", HELLO, RouteOptions(model="gemini-2.5-flash", canary_only=True))
