"""The operator's rollout commands (shared by the CLI and the Canary page): which scope a candidate
may take, which rollout a command acts on, and refusals that write nothing."""

from __future__ import annotations

import pytest

from app.rollout import ops
from core.errors import InvalidRequest
from core.rollout import check_plan
from db import canary, rollouts
from tests.support import paths

ROUTE = """
[routes."gpt-4.1"]
deployments = [{ provider = "direct" }]
canary = { provider = "holysheep" }
"""


@pytest.fixture
def settings(settings_factory):
    return settings_factory((paths.REPO / "gateway.toml").read_text() + ROUTE)


def _engine(settings):
    from db.engine import get_engine

    e = get_engine(settings.database_url)
    canary.ensure_setting(e, 0.0)
    return e


def test_scope_of(settings) -> None:
    assert ops.scope_of(settings, "holysheep", None) == "global"
    assert ops.scope_of(settings, "holysheep", "gpt-4.1") == "route:gpt-4.1"
    with pytest.raises(InvalidRequest, match="canary deployment is 'holysheep'"):
        ops.scope_of(settings, "direct", "gpt-4.1")
    with pytest.raises(InvalidRequest, match=r"routes with one: gpt-4\.1"):
        ops.scope_of(settings, "holysheep", "gemini-2.5-flash")


def test_commands_find_their_rollout_and_say_when_they_cannot(settings) -> None:
    engine = _engine(settings)
    with pytest.raises(InvalidRequest, match="no active rollout"):
        ops.find(engine, settings, None)
    events: list[dict] = []
    g = ops.start(engine, settings, check_plan(candidate="holysheep"), actor="a", reason="g", notify=events.append)
    r = ops.start(engine, settings, check_plan(candidate="holysheep", route="gpt-4.1"), actor="a", reason="r")
    assert [e["event"] for e in events] == ["rollout.start"]
    with pytest.raises(InvalidRequest, match="2 rollouts are active"):
        ops.find(engine, settings, None)
    assert ops.find(engine, settings, "gpt-4.1") == r
    new, action = ops.command(engine, r, "abort", actor="bob", reason="bad", notify=events.append)
    assert action.kind == "abort" and canary.get_state(engine, "route:gpt-4.1").ratio == 0.0
    assert events[-1]["event"] == "rollout.abort" and events[-1]["scope"] == "route:gpt-4.1"
    assert ops.find(engine, settings, None) == g
    audits = canary.audit_count(engine)
    with pytest.raises(InvalidRequest, match="is aborted"):
        ops.command(engine, new, "resume", actor="bob", reason="again")
    assert canary.audit_count(engine) == audits and rollouts.get(engine, r.id) == new
    assert "rollout #1 of holysheep on the global canary: running at step 1 of 6 (1 %" in ops.summary(g)
