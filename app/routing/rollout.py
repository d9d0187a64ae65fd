"""The rollout controller's decision: a pure function of the rollout, the evidence and the clock.

:func:`decide` returns what to do now, and why in words fit for the audit trail:

- ``abort`` (weight 0) the moment any metric is judged worse (the tests are anytime-valid, so
  reading them every few seconds keeps the false-abort probability at most ``alpha``), when the
  candidate's circuit breaker is open, or when the scope's ratio was set to 0 underneath the
  rollout (the guardrail, the absolute circuit breaker under the analysis, or an operator);
- ``pause`` when the ratio was moved to another value by hand (the rollout no longer owns it), or
  when the step is inconclusive: :func:`inconclusive_after` passed and a critical metric still
  lacks its samples (nodata never passes a critical metric);
- ``hold`` while the step bakes or gathers samples, and while a metric is *suspect*: its test's
  statistic now (the e-value, not its running maximum) is at least :data:`SUSPECT_E`, i.e. the
  data lean against the candidate without reaching the abort level. Such a step bakes again, up to
  :data:`MAX_SUSPECT_BAKES` more bake times, rather than raise the candidate's share on evidence
  that leans against it; after them the step moves on (its audit reason names the metric).
  Holding longer costs a healthy candidate little time (its e-values drift down) and gives a
  real regression the events it needs to be caught at the weight it is at: provider errors
  1 % -> 3 % have only a few dozen candidate events by the 25 % step. It keeps the
  guarantee: the tests stay valid under any schedule of weights decided from the data so far
  (:mod:`core.sequential`), so holding, like reading every tick, never raises the false-abort
  probability above ``alpha``;
- ``step`` to the next weight once the step baked, every critical metric has data on both arms and
  none is worse; ``complete`` when that next weight is 100 %, or when the last step (below 100 %)
  passed, where it stays.

A dry run decides the same and records it, and never moves the weight (the driver writes no ratio).
Nothing here reads a clock or the database: the driver (:mod:`app.rollout.driver`) gathers the
evidence and performs the action.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.rollout import ABORTED, COMPLETED, PAUSED, RUNNING, RolloutState

# A step pauses as inconclusive when it still lacks samples this long after it started: three bake
# times, and at least five minutes past its bake (a short bake on light traffic is not a verdict).
INCONCLUSIVE_BAKES = 3.0
INCONCLUSIVE_MIN_S = 300.0
# A metric whose e-value is at least this (evidence against the candidate at the 10 % level) holds
# its step for up to this many more bake times before the weight moves on.
SUSPECT_E = 10.0
MAX_SUSPECT_BAKES = 3
RATIO_TOLERANCE = 1e-9

HOLD, STEP, COMPLETE, ABORT, PAUSE = "hold", "step", "complete", "abort", "pause"

#: How each analysis signal reads in a reason ("refusal rate 3.1 % vs 0.4 % baseline").
SIGNAL_WORDS = {
    "attempt failed": "first-attempt failure rate",
    "failed": "failure rate",
    "refused": "refusal rate",
    "truncated": "truncation rate",
    "empty": "empty-answer rate",
    "broken tool json": "broken tool-call JSON rate",
    "schema violation": "response-schema violation rate",
    "slow": "share slower than the baseline's p95",
    "slow first token": "share with first token slower than the baseline's p95",
    "slow chunks": "share of streams with chunks slower than the baseline's p95",
    "verbose": "share with more output tokens than the baseline's p95",
    "costly": "share costlier than the baseline's p95",
}


@dataclass(frozen=True)
class MetricReading:
    """One metric over the rollout so far: both arms' event rates, the verdict and its p-value."""

    name: str
    verdict: str  # worse | pass | nodata
    p_value: float
    candidate_rate: float | None = None
    baseline_rate: float | None = None
    critical: bool = True
    e_value: float = 1.0  # the test's statistic now (1 / p_value is its maximum so far)


@dataclass(frozen=True)
class Evidence:
    """What the driver read for one decision."""

    metrics: tuple[MetricReading, ...]
    # Units judged on each arm that started since the current step did (requests without a session,
    # sessions' runs that say something: :mod:`core.units`), the samples a step waits for.
    step_candidate: int
    step_baseline: int
    canary_ratio: float  # the scope's stored ratio now
    # The candidate's circuit breaker is open in a live process: its arm's requests are being
    # answered elsewhere, so the analysis no longer sees the candidate (and the breaker saw enough).
    breaker_open: bool = False
    # The analysis has read the log up to now. A controller that starts mid-rollout (a restart, the
    # lease taken over) reads a long log part by part: an abort may act on a part (the tests are
    # anytime-valid, a part is the rollout as of an earlier time), but a step, a completion or an
    # "inconclusive" pause waits for the whole (the step's samples are not all counted yet).
    caught_up: bool = True


@dataclass(frozen=True)
class Action:
    kind: str  # hold | step | complete | abort | pause
    reason: str
    state: str
    step_index: int
    ratio: float | None  # the scope's ratio to write (None: unchanged)

    @property
    def acts(self) -> bool:
        return self.kind != HOLD


def pct(weight: float) -> str:
    """``0.1`` -> ``"10 %"``."""
    return f"{weight * 100:g} %"


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.2g} %" if v < 0.1 else f"{v * 100:.1f} %"


def describe(m: MetricReading) -> str:
    """``refusal rate 3.1 % vs 0.4 % baseline, always-valid p = 0.003``."""
    words = SIGNAL_WORDS.get(m.name, m.name)
    return f"{words} {_rate(m.candidate_rate)} vs {_rate(m.baseline_rate)} baseline, always-valid p = {m.p_value:.2g}"


def suspects(metrics: tuple[MetricReading, ...] | list[MetricReading]) -> list[MetricReading]:
    """The metrics whose evidence leans against the candidate (``e_value >= SUSPECT_E``), most
    suspect first."""
    return sorted((m for m in metrics if m.e_value >= SUSPECT_E), key=lambda m: -m.e_value)


def inconclusive_after(bake_s: float) -> float:
    """Seconds into a step after which missing samples pause it."""
    return max(INCONCLUSIVE_BAKES * bake_s, bake_s + INCONCLUSIVE_MIN_S)


def decide(rollout: RolloutState, evidence: Evidence, now: float) -> Action:
    """What the controller does now (see the module's docstring). In the shadow phase the evidence
    is the mirrored pairs' (:func:`app.monitor.canary_analysis.analyse_shadow`), the ratio stays 0
    and passing moves to the first step."""
    r, plan = rollout, rollout.plan
    at = "shadow" if r.shadowing else pct(r.weight)
    dry = " (dry run)" if plan.dry_run else ""
    hold = Action(HOLD, "", r.state, r.step_index, None)
    if r.state != RUNNING:
        return hold
    worse = sorted((m for m in evidence.metrics if m.verdict == "worse"), key=lambda m: m.p_value)
    if worse:
        why = f"rollout{dry} abort at {at}: {describe(worse[0])}"
        if len(worse) > 1:
            why += f" (and {', '.join(SIGNAL_WORDS.get(m.name, m.name) for m in worse[1:])})"
        return Action(ABORT, why, ABORTED, r.step_index, 0.0)
    if evidence.breaker_open:
        why = (
            f"rollout{dry} abort at {at}: the circuit breaker for {plan.candidate} is open (its requests are "
            "answered elsewhere, so the analysis cannot see it)"
        )
        return Action(ABORT, why, ABORTED, r.step_index, 0.0)
    if not plan.dry_run and abs(evidence.canary_ratio - r.weight) > RATIO_TOLERANCE:
        if evidence.canary_ratio <= 0.0:
            why = f"rollout abort at {at}: the canary ratio was set to 0 % outside the rollout (guardrail or operator)"
            return Action(ABORT, why, ABORTED, r.step_index, 0.0)
        why = f"rollout pause at {at}: the canary ratio was set to {pct(evidence.canary_ratio)} outside the rollout"
        return Action(PAUSE, why, PAUSED, r.step_index, None)
    elapsed = now - r.step_started_at
    if elapsed < plan.bake_s or not evidence.caught_up:
        return hold
    short = min(evidence.step_candidate, evidence.step_baseline) < plan.min_samples
    missing = [m.name for m in evidence.metrics if m.critical and m.verdict == "nodata"]
    if short or missing:
        if elapsed < inconclusive_after(plan.bake_s):
            return hold
        what = (
            f"{evidence.step_candidate} candidate and {evidence.step_baseline} baseline units (requests or "
            f"sessions) this step, {plan.min_samples} needed on each"
            if short
            else f"no data for {', '.join(missing)}"
        )
        return Action(PAUSE, f"rollout{dry} pause at {at}: inconclusive after {elapsed:.0f} s: {what}", PAUSED,
                      r.step_index, None)  # fmt: skip
    leaning = suspects(evidence.metrics)
    if leaning and elapsed < plan.bake_s * (1 + MAX_SUSPECT_BAKES):
        return hold
    best = min((m.p_value for m in evidence.metrics), default=1.0)
    still = (
        f"; {SIGNAL_WORDS.get(leaning[0].name, leaning[0].name)} still leans against the candidate "
        f"(e-value {leaning[0].e_value:.3g}) after {MAX_SUSPECT_BAKES} more bakes"
        if leaning
        else ""
    )
    passed = (
        f"every metric passes after {elapsed:.0f} s ({evidence.step_candidate} candidate, "
        f"{evidence.step_baseline} baseline units this step; smallest p = {best:.2g}){still}"
    )
    if r.last_step:
        return Action(COMPLETE, f"rollout{dry} complete at {at}: {passed}", COMPLETED, r.step_index, None)
    nxt = r.step_index + 1
    weight = plan.steps[nxt] / 100.0
    if nxt == len(plan.steps) - 1 and plan.steps[nxt] >= 100.0:
        return Action(COMPLETE, f"rollout{dry} complete: {at} -> {pct(weight)}: {passed}", COMPLETED, nxt, weight)
    return Action(STEP, f"rollout{dry} step {at} -> {pct(weight)}: {passed}", RUNNING, nxt, weight)


def manual(rollout: RolloutState, command: str, *, full: bool = False) -> Action:
    """An operator's ``promote [--full] | pause | resume | abort`` as an action, or ``ValueError``
    saying why it does not apply in the rollout's state."""
    r, at = rollout, "shadow" if rollout.shadowing else pct(rollout.weight)
    if not r.active:
        raise ValueError(f"rollout #{r.id} is {r.state}; nothing to {command}")
    if command == "pause":
        if r.state == PAUSED:
            raise ValueError(f"rollout #{r.id} is already paused")
        return Action(PAUSE, f"rollout pause at {at} by hand", PAUSED, r.step_index, None)
    if command == "resume":
        if r.state == RUNNING:
            raise ValueError(f"rollout #{r.id} is already running")
        return Action(STEP, f"rollout resume at {at} by hand", RUNNING, r.step_index, r.weight)
    if command == "abort":
        return Action(ABORT, f"rollout abort at {at} by hand", ABORTED, r.step_index, 0.0)
    if command == "promote":
        last = len(r.plan.steps) - 1
        if full or r.step_index >= last:
            return Action(COMPLETE, f"rollout promote {at} -> 100 % by hand", COMPLETED, last, 1.0)
        nxt = r.step_index + 1
        weight = r.plan.steps[nxt] / 100.0
        if nxt == last and r.plan.steps[nxt] >= 100.0:
            return Action(COMPLETE, f"rollout promote {at} -> 100 % by hand", COMPLETED, nxt, weight)
        return Action(STEP, f"rollout promote {at} -> {pct(weight)} by hand", r.state, nxt, weight)
    raise ValueError(f"unknown rollout command {command!r}")
