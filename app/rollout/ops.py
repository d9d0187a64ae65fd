"""The operator's commands on rollouts, shared by ``python -m app rollout`` and the Canary page:
start a plan, read where every rollout stands with its evidence, and promote, pause, resume or
abort by hand. Each change is one audited write (:mod:`db.rollouts`) and one alert event.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from app.alerts import event
from app.config import Settings
from app.monitor.canary_analysis import MAX_ROWS, TAIL_SIGNALS, Analysis, RunningAnalysis, analyse_shadow
from app.routing.rollout import Action, Evidence, MetricReading, manual, pct
from core.errors import InvalidRequest
from core.rollout import Plan, RolloutState, steps_text
from db import rollouts
from db.breakers import live_breakers
from db.canary import GLOBAL, get_state, route_scope

#: Signals whose nodata does not hold a step: they need the baseline's p95 from before the rollout,
#: which a fresh deployment lacks. The counts are critical: nodata never passes them.
SOFT_SIGNALS = frozenset(TAIL_SIGNALS)
Notify = Callable[[dict[str, Any]], None]


def _quiet(_: dict[str, Any]) -> None:
    return None


def _text(name: str, value: str) -> str:
    """``value`` stripped, or :class:`InvalidRequest` when empty or not text (bytes that are not
    UTF-8 arrive from a command line as lone surrogates, which no database can store)."""
    value = (value or "").strip()
    if not value:
        raise InvalidRequest(f"{name} must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"{name} is not valid text (it has bytes that are not UTF-8)") from None
    return value


def scope_of(settings: Settings, candidate: str, route: str | None) -> str:
    """The canary scope a rollout of ``candidate`` acts on, or :class:`InvalidRequest` when the
    configuration cannot send it the canary share: the global canary's share goes to
    ``routing.primary``; a route's to its ``canary`` deployment."""
    if route is None:
        if candidate != settings.routing.primary:
            raise InvalidRequest(
                f"--candidate {candidate!r}: the global canary share goes to routing.primary "
                f"({settings.routing.primary!r}); name it, or a route with --route"
            )
        return GLOBAL
    cfg = settings.routes.get(route)
    if cfg is None or cfg.canary is None:
        have = ", ".join(n for n, r in settings.routes.items() if r.canary is not None) or "none"
        raise InvalidRequest(f"--route {route!r} has no canary deployment; routes with one: {have}")
    if cfg.canary.provider != candidate:
        raise InvalidRequest(f"--candidate {candidate!r}: route {route}'s canary deployment is {cfg.canary.provider!r}")
    return route_scope(route)


def rollout_event(kind: str, r: RolloutState, reason: str) -> dict[str, Any]:
    where = "global canary" if r.scope == GLOBAL else f"route {r.plan.route}"
    return event(
        f"rollout.{kind}",
        f"[{where}] {reason}",
        rollout=r.id,
        scope=r.scope,
        candidate=r.plan.candidate,
        state=r.state,
        weight=r.weight,
        dry_run=r.plan.dry_run,
        reason=reason,
    )


def start(
    engine: Engine, settings: Settings, plan: Plan, *, actor: str, reason: str, now: float | None = None,
    notify: Notify = _quiet,
) -> RolloutState:  # fmt: skip
    """Store and start ``plan`` (see :func:`db.rollouts.start`); nothing is written when refused."""
    reason, actor = _text("--reason", reason), _text("--actor", actor)
    scope = scope_of(settings, plan.candidate, plan.route)
    r = rollouts.start(engine, plan, scope=scope, actor=actor, reason=reason, now=now)
    notify(rollout_event("start", r, r.last_reason))
    return r


def metrics_of(analysis: Analysis) -> tuple[MetricReading, ...]:
    return tuple(
        MetricReading(
            s.signal, s.verdict, s.p_value, s.candidate_rate, s.baseline_rate, s.signal not in SOFT_SIGNALS, s.e_value
        )
        for s in analysis.signals
    )


@dataclass(frozen=True)
class Reading:
    """A rollout with the evidence the controller decides on."""

    rollout: RolloutState
    analysis: Analysis
    evidence: Evidence
    canary_version: int


def read(engine: Engine, r: RolloutState, now: float, running: RunningAnalysis | None = None) -> Reading:
    """The analysis since the rollout started (anytime-valid, so it may be read every tick), the
    current step's samples (units) per arm and the scope's stored ratio. ``running``: the controller's
    running analysis of this rollout, brought up to date with the rows logged since its last read
    (instead of reading every row since the start)."""
    plan = r.plan
    caught_up = True
    if r.shadowing:
        analysis = analyse_shadow(engine, rollout_id=r.id, since=r.started_at, until=now, route=plan.route,
                                  alpha=plan.alpha, min_samples=plan.min_samples)  # fmt: skip
        step_c = step_b = analysis.candidate_requests
    elif running is not None:
        analysis = running.update(now, step_since=r.step_started_at)
        step_c, step_b = running.step_counts()
        caught_up = running.caught_up
    else:
        # One read of every row since the start (what :func:`analyse` reads), counting the step's
        # units as the controller's running analysis does.
        once = RunningAnalysis(engine, since=r.started_at, route=plan.route, alpha=plan.alpha,
                               min_samples=plan.min_samples, max_rows=MAX_ROWS, bake_s=plan.bake_s)  # fmt: skip
        analysis = once.update(now, step_since=r.step_started_at)
        step_c, step_b = once.step_counts()
        caught_up = once.caught_up
    ratio = get_state(engine, r.scope)
    breaker = live_breakers(engine, now=now).get(plan.candidate)
    is_open = breaker is not None and breaker.state == "open"
    evidence = Evidence(metrics_of(analysis), step_c, step_b, ratio.ratio, breaker_open=is_open, caught_up=caught_up)
    return Reading(r, analysis, evidence, ratio.version)


def find(engine: Engine, settings: Settings, route: str | None) -> RolloutState:
    """The active rollout a command acts on: ``route``'s, else the only active one."""
    if route is not None:
        cfg = settings.routes.get(route)
        if cfg is None:
            raise InvalidRequest(f"--route {route!r} is not a route")
        r = rollouts.active(engine, route_scope(route))
        if r is None:
            raise InvalidRequest(f"route {route} has no active rollout")
        return r
    every = rollouts.all_active(engine)
    if not every:
        raise InvalidRequest("no active rollout (start one with `rollout start`)")
    if len(every) > 1:
        names = ", ".join(f"#{r.id} {r.scope}" for r in every)
        raise InvalidRequest(f"{len(every)} rollouts are active ({names}); say which with --route")
    return every[0]


def command(
    engine: Engine, r: RolloutState, verb: str, *, actor: str, reason: str, full: bool = False,
    now: float | None = None, notify: Notify = _quiet,
) -> tuple[RolloutState, Action]:  # fmt: skip
    """``promote [--full] | pause | resume | abort`` by hand on ``r``: refused (nothing written)
    when it does not apply to its state or the reason is empty."""
    reason, actor = _text("--reason", reason), _text("--actor", actor)
    try:
        action = manual(r, verb, full=full)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    ts = time.time() if now is None else now
    why = f"{action.reason} ({actor}): {reason}"
    ratio = None if r.plan.dry_run else action.ratio
    new = rollouts.apply(engine, r, state=action.state, step_index=action.step_index, ratio=ratio, actor=actor,
                         reason=why, now=ts, restart_clock=verb == "resume")  # fmt: skip
    notify(rollout_event("resume" if verb == "resume" else action.kind, new, why))
    return new, action


def summary(r: RolloutState) -> str:
    plan = r.plan
    where = "global canary" if r.scope == GLOBAL else f"route {plan.route}"
    dry = ", dry run" if plan.dry_run else ""
    at = (
        f"in its shadow phase ({plan.shadow_share * 100:g} % of the baseline mirrored, budget "
        f"{plan.shadow_budget_usd:g} USD{dry};"
        if r.shadowing and plan.shadow_share is not None and plan.shadow_budget_usd is not None
        else f"at step {r.step_index + 1} of {len(plan.steps)} ({pct(r.weight)}{dry};"
    )
    return (
        f"rollout #{r.id} of {plan.candidate} on the {where}: {r.state} {at} steps {steps_text(plan.steps)}, bake "
        f"{plan.bake_s:g} s, {plan.min_samples} samples per arm, alpha {plan.alpha:g})"
    )
