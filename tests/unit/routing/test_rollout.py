"""The rollout controller's decisions, table-driven: rollout + evidence + clock -> action."""

from __future__ import annotations

import pytest

from app.routing.rollout import Evidence, MetricReading, decide, describe, manual
from core.rollout import Plan, RolloutState

STEPS = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0)


def rollout(step: int = 2, *, state: str = "running", started: float = 1000.0, steps=STEPS, dry=False,
            bake: float = 600.0, min_samples: int = 50) -> RolloutState:  # fmt: skip
    plan = Plan(candidate="holysheep", steps=steps, bake_s=bake, min_samples=min_samples, dry_run=dry)
    return RolloutState(1, "global", plan, state, step, started, 0.0, "op", "why", started, "", 3)


def ok(name: str = "failed", p: float = 0.8) -> MetricReading:
    return MetricReading(name, "pass", p, 0.01, 0.01)


REFUSALS_WORSE = MetricReading("refused", "worse", 0.003, 0.031, 0.004)
NODATA = MetricReading("truncated", "nodata", 1.0, None, None)
NODATA_SOFT = MetricReading("slow", "nodata", 1.0, None, None, critical=False)
# Evidence leaning against the candidate (e-value 12, so p <= 1/12) short of the abort level.
ERRORS_LEAN = MetricReading("attempt failed", "pass", 0.05, 0.03, 0.01, e_value=12.0)
ERRORS_FADED = MetricReading("attempt failed", "pass", 0.05, 0.012, 0.01, e_value=9.9)


def evidence(
    *metrics: MetricReading, c: int = 500, b: int = 5000, ratio: float = 0.10, caught_up: bool = True
) -> Evidence:
    return Evidence(metrics or (ok(),), c, b, ratio, caught_up=caught_up)


# (case, rollout, evidence, now, kind, state, step, ratio, words in the reason)
CASES = [
    ("bakes", rollout(), evidence(), 1000 + 599, "hold", "running", 2, None, ""),
    ("steps once baked", rollout(), evidence(), 1000 + 600, "step", "running", 3, 0.25, "step 10 % -> 25 %"),
    ("worse aborts at once", rollout(), evidence(ok(), REFUSALS_WORSE), 1001, "abort", "aborted", 2, 0.0,
     "rollout abort at 10 %: refusal rate 3.1 % vs 0.4 % baseline, always-valid p = 0.003"),
    ("too few samples holds", rollout(), evidence(c=49), 1000 + 1799, "hold", "running", 2, None, ""),
    ("a short bake waits five minutes past it", rollout(bake=2), evidence(c=49), 1000 + 301, "hold", "running", 2,
     None, ""),
    ("then pauses", rollout(bake=2), evidence(c=49), 1000 + 302, "pause", "paused", 2, None, "after 302 s"),
    ("inconclusive pauses", rollout(), evidence(c=49), 1000 + 1800, "pause", "paused", 2, None,
     "inconclusive after 1800 s: 49 candidate"),
    ("critical nodata never passes", rollout(), evidence(ok(), NODATA), 1000 + 1800, "pause", "paused", 2, None,
     "no data for truncated"),
    ("a leaning metric holds a baked step", rollout(), evidence(ok(), ERRORS_LEAN), 1000 + 600, "hold", "running",
     2, None, ""),
    ("... up to three more bakes", rollout(), evidence(ok(), ERRORS_LEAN), 1000 + 2399, "hold", "running", 2, None,
     ""),
    ("... then moves on and says so", rollout(), evidence(ok(), ERRORS_LEAN), 1000 + 2400, "step", "running", 3, 0.25,
     "first-attempt failure rate still leans against the candidate (e-value 12)"),
    ("evidence that fades below the bar lets it step", rollout(), evidence(ok(), ERRORS_FADED), 1000 + 601, "step",
     "running", 3, 0.25, "step 10 % -> 25 %"),
    ("soft nodata passes", rollout(), evidence(ok(), NODATA_SOFT), 1000 + 600, "step", "running", 3, 0.25, ""),
    ("to 100 % completes", rollout(4), evidence(ratio=0.5), 1600,
     "complete", "completed", 5, 1.0, "complete: 50 % -> 100 %"),
    ("last step below 100 completes there", rollout(1, steps=(1.0, 25.0)), evidence(ratio=0.25), 1600,
     "complete", "completed", 1, None, "complete at 25 %"),
    ("an open breaker aborts", rollout(), Evidence((ok(),), 500, 5000, 0.10, breaker_open=True), 1001, "abort",
     "aborted", 2, 0.0, "circuit breaker for holysheep is open"),
    ("guardrail zero aborts", rollout(), evidence(ratio=0.0), 1001, "abort", "aborted", 2, 0.0, "set to 0 %"),
    ("a worse metric explains a guardrail's zero", rollout(), evidence(REFUSALS_WORSE, ratio=0.0), 1001, "abort",
     "aborted", 2, 0.0, "rollout abort at 10 %: refusal rate"),
    ("hand-set ratio pauses", rollout(), evidence(ratio=0.3), 1001, "pause", "paused", 2, None, "set to 30 %"),
    ("paused holds", rollout(state="paused"), evidence(REFUSALS_WORSE), 5000, "hold", "paused", 2, None, ""),
    ("dry run ignores the ratio", rollout(dry=True), evidence(ratio=0.0), 1600, "step", "running", 3, 0.25,
     "rollout (dry run) step"),
    ("dry run abort says so", rollout(dry=True), evidence(REFUSALS_WORSE, ratio=0.0), 1001, "abort", "aborted", 2,
     0.0, "rollout (dry run) abort"),
    ("a part of the log read: no inconclusive pause", rollout(), evidence(c=49, caught_up=False), 1000 + 1800, "hold",
     "running", 2, None, ""),
    ("... nor a step", rollout(), evidence(caught_up=False), 1000 + 601, "hold", "running", 2, None, ""),
    ("... but a worse metric in it aborts", rollout(), evidence(REFUSALS_WORSE, caught_up=False), 1000 + 1800,
     "abort", "aborted", 2, 0.0, "refusal rate"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "r", "e", "now", "kind", "state", "step", "ratio", "words"), CASES,
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_decide(case, r, e, now, kind, state, step, ratio, words) -> None:
    a = decide(r, e, now)
    assert (a.kind, a.state, a.step_index, a.ratio) == (kind, state, step, ratio)
    assert words in a.reason
    assert a.acts == (kind != "hold")


def test_several_worse_metrics_name_the_strongest_first() -> None:
    failed = MetricReading("failed", "worse", 0.01, 0.03, 0.01)
    a = decide(rollout(), evidence(failed, REFUSALS_WORSE), 1001)
    assert a.reason.index("refusal rate") < a.reason.index("failure rate")


def test_describe_reads_like_the_audit() -> None:
    assert describe(REFUSALS_WORSE) == "refusal rate 3.1 % vs 0.4 % baseline, always-valid p = 0.003"


MANUAL = [
    ("promote", False, rollout(), "step", "running", 3, 0.25),
    ("promote", True, rollout(), "complete", "completed", 5, 1.0),
    ("promote", False, rollout(4), "complete", "completed", 5, 1.0),
    ("pause", False, rollout(), "pause", "paused", 2, None),
    ("resume", False, rollout(state="paused"), "step", "running", 2, 0.10),
    ("abort", False, rollout(state="paused"), "abort", "aborted", 2, 0.0),
]


@pytest.mark.parametrize(("command", "full", "r", "kind", "state", "step", "ratio"), MANUAL)
def test_manual(command, full, r, kind, state, step, ratio) -> None:
    a = manual(r, command, full=full)
    assert (a.kind, a.state, a.step_index, a.ratio) == (kind, state, step, ratio)
    assert "by hand" in a.reason


@pytest.mark.parametrize(("command", "r", "words"), [
    ("pause", rollout(state="paused"), "already paused"),
    ("resume", rollout(), "already running"),
    ("abort", rollout(state="aborted"), "is aborted"),
    ("promote", rollout(state="completed"), "is completed"),
])  # fmt: skip
def test_manual_refuses_what_does_not_apply(command, r, words) -> None:
    with pytest.raises(ValueError, match=words):
        manual(r, command)
