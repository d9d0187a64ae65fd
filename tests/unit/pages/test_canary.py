"""AppTest: the Canary page's route canaries: listed with their stored share, set with a reason
(audited under the route's scope, the global canary untouched), a bad number refused with
nothing written, and a concurrent change refused by the optimistic lock."""

from __future__ import annotations

import pytest

from db.canary import GLOBAL, audit_log, get_state, route_scope, set_ratio
from tests.unit.ui.test_entry import _env, engine, open_app, shown

ROUTE = """
[routes."gpt-4.1"]
deployments = [{ provider = "direct" }]
canary = { provider = "holysheep" }

[routes."gemini-2.5-flash"]
deployments = [{ provider = "direct" }, { provider = "holysheep" }]
"""


@pytest.fixture
def env(tmp_path, monkeypatch, sqlite_url):
    for e in _env(tmp_path, monkeypatch, sqlite_url):
        e.config.write_text(e.config.read_text() + ROUTE)
        yield e


def button(at, key):
    return next(b for b in at.button if b.key == key)


def notes(at) -> str:
    return "\n".join(shown(x.value) for kind in (at.success, at.error, at.warning) for x in kind)


def test_route_canaries_are_listed_and_set_with_a_reason(env):
    at = open_app("../pages/canary.py")
    assert "Route canaries" in [s.value for s in at.subheader]
    labels = [m.label for m in at.metric]
    assert "Route gpt-4.1" in labels and "Route gemini-2.5-flash" not in labels  # only routes with a canary
    assert at.number_input(key="route_pct_gpt-4.1").value == 0.0
    at.number_input(key="route_pct_gpt-4.1").set_value(20.0)
    button(at, "route_apply_gpt-4.1").click().run()
    assert "reason is required" in notes(at).lower()
    untouched = get_state(engine(), route_scope("gpt-4.1"))
    assert (untouched.ratio, untouched.version) == (0.0, 1) and not audit_log(engine(), scope=route_scope("gpt-4.1"))
    at.number_input(key="route_pct_gpt-4.1").set_value(20.0)
    at.text_input(key="route_reason_gpt-4.1").set_value("try holysheep for gpt-4.1")
    button(at, "route_apply_gpt-4.1").click().run()
    assert not at.exception
    state = get_state(engine(), route_scope("gpt-4.1"))
    assert state.ratio == pytest.approx(0.2) and state.reason == "try holysheep for gpt-4.1"
    assert get_state(engine(), GLOBAL).version == 1  # the global canary did not move
    (entry,) = audit_log(engine(), scope=route_scope("gpt-4.1"))
    assert (entry.old_ratio, entry.new_ratio) == (0.0, pytest.approx(0.2))
    assert "20 %" in next(m.value for m in at.metric if m.label == "Route gpt-4.1")
    trail = at.dataframe[-1].value
    assert list(trail["canary"])[:1] == ["gpt-4.1"]


def test_a_route_canary_changed_elsewhere_is_not_overwritten(env):
    at = open_app("../pages/canary.py")
    set_ratio(engine(), 0.5, expected_version=None, actor="other", reason="meanwhile", scope=route_scope("gpt-4.1"))
    at.number_input(key="route_pct_gpt-4.1").set_value(10.0)
    at.text_input(key="route_reason_gpt-4.1").set_value("mine")
    button(at, "route_apply_gpt-4.1").click().run()
    assert get_state(engine(), route_scope("gpt-4.1")).ratio == 0.5  # the other operator's value stands
    assert "changed" in notes(at).lower()


def test_the_page_shows_each_canary_against_its_baseline(env):
    at = open_app("../pages/canary.py")
    assert "Canary vs baseline" in [s.value for s in at.subheader]
    assert not [df for df in at.dataframe if "signal" in df.value.columns]  # read only when asked
    at.toggle(key="canary_analysis_on").set_value(True).run()
    tables = [df.value for df in at.dataframe if "signal" in df.value.columns]
    assert len(tables) == 2  # the global canary and the route's
    assert list(tables[0]["signal"])[:2] == ["attempt failed", "failed"]
    infos = [shown(i.value) for i in at.info]
    assert any(i.startswith("global canary: nodata") for i in infos)  # no traffic yet: nodata, never pass
    assert any(i.startswith("route gpt-4.1: nodata") for i in infos)


def test_answer_quality_faults_are_set_from_the_fault_panel(env):
    from db.faults import get_faults

    at = open_app("../pages/canary.py")
    at.text_input(key="q_refusal_rate_holysheep").set_value("nan")
    next(b for b in at.button if b.label == "Save faults" and "holysheep" in (b.key or b.form_id or "")).click().run()
    assert get_faults(engine(), "holysheep") is None  # refused in place, nothing written
    assert any("Refusals must be a number" in shown(e.value) for e in at.error) or "Refusals" in notes(at)
    at.text_input(key="q_refusal_rate_holysheep").set_value("3")
    at.text_input(key="q_ttft_multiplier_holysheep").set_value("1.5")
    next(b for b in at.button if b.label == "Save faults" and "holysheep" in (b.key or b.form_id or "")).click().run()
    assert not at.exception
    f = get_faults(engine(), "holysheep")
    assert f is not None and (f.refusal_rate, f.ttft_multiplier) == (0.03, 1.5)
    assert "3 % refusals" in notes(at)


# -- the rollout panel ---------------------------------------------------------------------------------


def _plan(at, **values):
    for k, v in values.items():
        at.text_input(key=f"rollout_{k}").set_value(v)
    next(b for b in at.button if b.label == "Start rollout").click().run()


def test_a_rollout_plan_is_validated_in_place_and_nothing_is_written(env):
    from db import rollouts

    at = open_app("../pages/canary.py")
    assert "Progressive rollout" in [s.value for s in at.subheader]
    _plan(at, steps="1,5,5", reason="try it")
    assert any("Steps must increase: 5 follows 5" in shown(e.value) for e in at.error)
    _plan(at, steps="1,5,25", bake_s="1e400", reason="try it")
    assert any("Bake-s must be a number" in shown(e.value) for e in at.error)
    _plan(at, bake_s="600", reason="")
    assert any("A reason is required" in shown(e.value) for e in at.error)
    assert rollouts.latest(engine()) is None and get_state(engine()).version == 1


def test_a_rollout_is_started_shown_and_promoted_with_a_confirmation(env):
    import json

    from db import rollouts

    at = open_app("../pages/canary.py")
    _plan(at, steps="10,50,100", reason="new provider")
    r = rollouts.active(engine())
    assert r is not None and r.plan.steps == (10, 50, 100) and get_state(engine()).ratio == 0.1
    assert "rollout #1 of holysheep on the global canary: running at step 1 of 3" in notes(at) + "\n".join(
        shown(i.value) for i in at.info
    )
    table = next(df.value for df in at.dataframe if "critical" in df.value.columns)
    assert list(table["signal"])[:3] == ["attempt failed", "failed", "refused"] and table["critical"].iloc[0]
    chart = next(json.loads(c.proto.spec) for c in at.get("plotly_chart") if "Rollout #1" in c.proto.spec)
    assert chart["data"][0]["y"][0] == 10.0
    button(at, f"rollout_promote_{r.id}").click().run()
    warning = "\n".join(shown(w.value) for w in at.warning)
    assert "Promote rollout #1: the global canary goes from 10 % to 50 % now, without waiting for the bake." in warning
    assert get_state(engine()).ratio == 0.1  # nothing moves before the confirmation
    at.text_input(key=f"rollout_act_reason_{r.id}").set_value("looks good")
    button(at, f"rollout_confirm_{r.id}").click().run()
    assert not at.exception and get_state(engine()).ratio == 0.5
    button(at, f"rollout_abort_{r.id}").click().run()
    assert "goes from 50 % to 0 %" in "\n".join(shown(w.value) for w in at.warning)
    at.text_input(key=f"rollout_act_reason_{r.id}").set_value("enough")
    button(at, f"rollout_confirm_{r.id}").click().run()
    assert rollouts.get(engine(), r.id).state == "aborted" and get_state(engine()).ratio == 0.0  # type: ignore[union-attr]


def test_a_reading_that_cannot_move_on_stops_and_says_how_far_it_got(env, monkeypatch):
    """Should a part ever not move the reading on, the page run ends with the note rather than
    reading forever (the analysis always moves on today: this holds the page to it if not)."""
    from app.dashboard import rollout_panel
    from core.rollout import check_plan
    from db import rollouts

    rollouts.start(engine(), check_plan(candidate="holysheep", steps="10,50,100"), scope="global", actor="a",
                   reason="r")  # fmt: skip
    real = rollout_panel.view
    calls = []

    def stuck_view(*args, **kwargs):
        v = real(*args, **kwargs)
        return rollout_panel.View(v.rollout, v.summary, v.status, v.metrics, v.figure, "Still reading: stuck at 12:00",
                                  read_through=1.0, live=True)  # fmt: skip

    def stuck_part(*args, **kwargs):
        calls.append(1)
        return "Still reading: stuck at 12:00", 1.0

    monkeypatch.setattr(rollout_panel, "view", stuck_view)
    monkeypatch.setattr(rollout_panel, "read_part", stuck_part)
    at = open_app("../pages/canary.py")
    assert not at.exception
    assert "Still reading: stuck at 12:00" in [shown(i.value) for i in at.info]
    assert len(calls) == 1  # after the first part, one more that did not move on, and no third
