"""The rollout panel's logic (app/dashboard/rollout_panel.py): refusals name their input and write
nothing, viewers change nothing, confirmations say exactly what changes, the banner's states."""

from __future__ import annotations

import pytest

from app.dashboard import rollout_panel
from app.dashboard.identity import Identity
from core.rollout import check_plan
from db import canary, rollouts
from tests.support import paths

ROUTE = """
[routes."gpt-4.1"]
deployments = [{ provider = "direct" }]
canary = { provider = "holysheep" }
"""
OPERATOR = Identity("olga", "operator", "local")
VIEWER = Identity("vic", "viewer", "local")
PLAN = {"steps": "10,50,100", "bake_s": "600", "min_samples": "50", "alpha": "0.05", "dry_run": False}


@pytest.fixture
def setup(settings_factory):
    from db.engine import get_engine

    s = settings_factory((paths.REPO / "gateway.toml").read_text() + ROUTE)
    engine = get_engine(s.database_url)
    canary.ensure_setting(engine, 0.0)
    return engine, s


def test_candidates_are_the_primary_and_each_route_canary(setup) -> None:
    _, s = setup
    assert rollout_panel.candidates(s) == [
        ("holysheep (global canary)", None),
        ("holysheep on route gpt-4.1", "gpt-4.1"),
    ]


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"steps": "50,10"}, "steps", "Steps must increase"),
        ({"bake_s": "nan"}, "bake_s", "Bake-s must be a number"),
        ({"min_samples": "1e400"}, "min_samples", "Min-samples must be a whole number"),
        ({"alpha": "0.9"}, "alpha", "Alpha must be a number"),
        ({"reason": " "}, "reason", "A reason is required"),
        ({"shadow_share": "0.05"}, "shadow_share", "Shadow-share and shadow-budget-usd go together"),
        ({"shadow_share": "1.5", "shadow_budget_usd": "5"}, "shadow_share", "Shadow-share must be a number"),
    ],
)
def test_a_bad_plan_is_refused_next_to_its_input(setup, change, field, words) -> None:
    engine, s = setup
    values = {**PLAN, "reason": "why", **change}
    out = rollout_panel.start_plan(engine, s, route=None, actor=OPERATOR, **values)
    assert (out.ok, out.field) == (False, field) and words in out.message and "Nothing was written" in out.message
    assert rollouts.latest(engine) is None and canary.audit_count(engine) == 0


def test_a_plan_with_a_shadow_phase_starts_there(setup) -> None:
    engine, s = setup
    out = rollout_panel.start_plan(engine, s, route=None, actor=OPERATOR, reason="copies first", **PLAN,
                                   shadow_share="0.05", shadow_budget_usd="5")  # fmt: skip
    assert out.ok and "in its shadow phase (5 % of the baseline mirrored, budget 5 USD" in out.message
    r = rollouts.active(engine, "global")
    assert r is not None and r.shadowing and canary.get_state(engine).ratio == 0.0
    assert rollout_panel.confirm_text(r, "promote").startswith("the global canary goes from 0 % (its shadow phase")


def test_viewers_change_nothing(setup) -> None:
    engine, s = setup
    out = rollout_panel.start_plan(engine, s, route=None, actor=VIEWER, reason="why", **PLAN)
    assert not out.ok and "viewers cannot change anything" in out.message and rollouts.latest(engine) is None
    r = rollouts.start(engine, check_plan(candidate="holysheep"), scope="global", actor="a", reason="r")
    out = rollout_panel.act(engine, r.id, "abort", reason="stop", actor=VIEWER)
    assert not out.ok and rollouts.get(engine, r.id) == r


def test_confirmations_say_exactly_what_changes(setup) -> None:
    engine, s = setup
    assert rollout_panel.start_plan(engine, s, route="gpt-4.1", actor=OPERATOR, reason="try", **PLAN).ok
    r = rollouts.active(engine, "route:gpt-4.1")
    assert r is not None
    text = {v: rollout_panel.confirm_text(r, v) for v in rollout_panel.VERBS}
    assert text["promote"] == "route gpt-4.1's canary goes from 10 % to 50 % now, without waiting for the bake."
    assert rollout_panel.confirm_text(r, "promote", full=True).endswith("to 100 % now, without waiting for the bake "
                                                                        "and the rollout completes.")  # fmt: skip
    assert text["pause"].startswith("The rollout stops stepping; route gpt-4.1's canary stays at 10 %")
    assert text["abort"].startswith("route gpt-4.1's canary goes from 10 % to 0 %")
    assert text["resume"] == f"rollout #{r.id} is already running"
    out = rollout_panel.act(engine, r.id, "pause", reason="", actor=OPERATOR)
    assert not out.ok and out.field == "reason"
    out = rollout_panel.act(engine, r.id, "pause", reason="lunch", actor=OPERATOR)
    assert out.ok and out.message == "rollout pause at 10 % by hand (olga): lunch"
    kind, line = rollout_panel.banner(engine)  # type: ignore[misc]
    assert kind == "warning" and line.startswith("Rollout #1 of holysheep on the route gpt-4.1 is paused at 10 %")


def test_the_banner_forgets_an_abort_after_a_day_and_a_completion_at_once(setup) -> None:
    engine, _ = setup
    assert rollout_panel.banner(engine) is None
    r = rollouts.start(engine, check_plan(candidate="holysheep"), scope="global", actor="a", reason="r", now=100.0)
    done = rollouts.apply(engine, r, state="aborted", step_index=0, ratio=0.0, actor="x", reason="abort", now=200.0)
    assert rollout_panel.banner(engine, now=200.0 + 3600)[0] == "error"  # type: ignore[index]
    assert rollout_panel.banner(engine, now=200.0 + 86401) is None
    assert done.state == "aborted"
    r2 = rollouts.start(engine, check_plan(candidate="holysheep"), scope="global", actor="a", reason="r", now=300.0)
    rollouts.apply(engine, r2, state="completed", step_index=5, ratio=1.0, actor="x", reason="done", now=400.0)
    assert rollout_panel.banner(engine, now=401.0) is None


def test_the_timeline_draws_each_decision(setup) -> None:
    engine, _ = setup
    r = _start(engine, 100.0)
    r = rollouts.apply(engine, r, state="running", step_index=1, ratio=0.5, actor="rollout", reason="step", now=200.0)
    [view] = rollout_panel.views(engine, now=300.0)
    weight, decisions = view.figure.data
    assert list(weight.y) == [10.0, 50.0, 50.0] and list(decisions.y) == [10.0, 50.0]
    assert decisions.text[1] == f"rollout: #{r.id} step" and view.status == "info"


def test_each_page_run_reads_only_what_was_logged_since_the_last(setup) -> None:
    """The panel keeps each shown rollout's analysis up to date across runs (as the controller does):
    a later run reads the rows logged since, and shows what one full read of the log would."""
    engine, _ = setup
    since = 1_000_000.0
    r = _start(engine, since)
    log = _Log(engine)

    log(since + 1, 3000)
    rollout_panel.views(engine, now=since + 600)
    running = rollout_panel._READINGS._kept[(id(engine), r.id, r.started_at)].running
    assert running.rows_read == 3000
    log(since + 601, 40)
    [later] = rollout_panel.views(engine, now=since + 700)
    assert running.rows_read < 3000  # the overlap window and what came since, not the whole rollout
    full = _as_one_full_read(engine, later.metrics, since, since + 700)
    assert full.candidate_requests + full.baseline_requests == 3040
    by_signal = {row["signal"]: row for row in later.metrics}
    assert by_signal["failed"]["candidate"] + by_signal["failed"]["baseline"] > 0  # a comparison of something


def _start(engine, now: float):
    return rollouts.start(engine, check_plan(candidate="holysheep", steps="10,50,100"), scope="global", actor="a",
                          reason="r", now=now)  # fmt: skip


def _as_one_full_read(engine, metrics: list[dict], since: float, until: float):
    """The panel's figures are what one full read of the log gives; returns that analysis."""
    from app.monitor.canary_analysis import analyse

    full = analyse(engine, since=since, until=until)
    by_signal = {row["signal"]: row for row in metrics}
    for sig in full.signals:
        assert (by_signal[sig.signal]["candidate"], by_signal[sig.signal]["baseline"]) == (sig.candidate, sig.baseline)
        assert by_signal[sig.signal]["verdict"] == sig.verdict
    return full


class _Log:
    """Final requests of a global canary at 10 %, 5 % of them failed, ``step_s`` apart (0.1 s)."""

    def __init__(self, engine) -> None:
        import random

        self.engine, self.rng, self.n = engine, random.Random(4), 0

    def __call__(self, start: float, count: int, step_s: float = 0.1) -> None:
        from core.records import AttemptRecord
        from db.requests import insert_batch

        rows = []
        for k in range(count):
            self.n += 1
            on = self.rng.random() < 0.1
            status = "error" if self.rng.random() < 0.05 else "ok"
            rows.append(AttemptRecord(f"q{self.n}", 1, start + k * step_s, status=status,
                                      latency_ms=300.0, provider="holysheep" if on else "direct", model="gpt-4.1",
                                      requested_model="gpt-4.1", intent="explicit",
                                      side="primary" if on else "fallback", completion_tokens=5))  # fmt: skip
        insert_batch(self.engine, rows)


def test_a_long_rollouts_first_reading_is_spread_over_runs_and_says_how_far_it_has_read(setup, monkeypatch) -> None:
    """Each run reads at most PANEL_ROWS_PER_RUN rows and says up to when its evidence goes; once
    caught up it shows what one full read of the log would."""
    engine, _ = setup
    monkeypatch.setattr(rollout_panel, "PANEL_ROWS_PER_RUN", 1000)
    since = 2_000_000.0
    _start(engine, since)
    log = _Log(engine)
    log(since + 1, 2500)  # 250 s of requests
    seen = []
    for _ in range(5):
        [v] = rollout_panel.views(engine, now=since + 600)
        seen.append(v)
        if v.behind is None:
            break
    assert [v.behind is not None for v in seen] == [True, True, False]
    assert "1,000 rows read so far" in seen[0].behind and "2,000 rows read so far" in seen[1].behind
    # the first run's evidence goes up to the 1,000th request's start: since + 1 + 99.9 s, 03:35:00.9 UTC
    assert "up to 03:35:00 UTC" in seen[0].behind
    assert all(v.live for v in seen[:2]) and seen[-1].live  # active: still worth refreshing
    full = _as_one_full_read(engine, seen[-1].metrics, since, since + 600)
    assert full.candidate_requests + full.baseline_requests == 2500


def test_sessions_share_a_fresh_reading_and_an_ended_rollout_is_read_once(setup) -> None:
    engine, _ = setup
    since = 3_000_000.0
    r = _start(engine, since)
    log = _Log(engine)
    log(since + 1, 100)
    [first] = rollout_panel.views(engine, now=since + 20)
    log(since + 15, 50)
    again = rollout_panel.view(engine, r, now=since + 21, fresh_s=60.0)  # another session, within fresh_s
    assert again.metrics == first.metrics
    moved = rollout_panel.view(engine, r, now=since + 22, fresh_s=0.0)
    assert moved.metrics != first.metrics  # read again: the 50 later requests counted
    r = rollouts.apply(engine, r, state="aborted", step_index=0, ratio=0.0, actor="x", reason="stop", now=since + 30)
    ended = rollout_panel.view(engine, r, now=since + 40)
    assert not ended.live and ended.behind is None
    log(since + 25, 50)  # logged late, before the end: the reading of an ended rollout is not read again
    assert rollout_panel.view(engine, r, now=since + 50).metrics == ended.metrics


def test_more_rows_at_one_start_time_than_a_part_reads_are_read_across_parts(setup, monkeypatch) -> None:
    """A replayed journal can write many rows with one start time: the parts go on in (start time,
    id) order, so the reading moves past them and counts each once."""
    engine, _ = setup
    monkeypatch.setattr(rollout_panel, "PANEL_ROWS_PER_RUN", 10)
    since = 4_000_000.0
    r = _start(engine, since)
    _Log(engine)(since + 60, 35, step_s=0.0)
    behind = []
    for _ in range(10):
        v = rollout_panel.view(engine, r, now=since + 600)
        behind.append(v.behind)
        if v.behind is None:
            break
    assert len(behind) == 4 and behind[-1] is None  # 10 + 10 + 10 + 5
    running = rollout_panel._READINGS._kept[(id(engine), r.id, r.started_at)].running
    analysis = running.analysis()
    assert running.rows_total == 35 and analysis.candidate_requests + analysis.baseline_requests == 35
