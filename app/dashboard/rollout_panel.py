"""The Canary page's rollout panel and the Overview's rollout banner: everything they show and do,
so the page only lays it out.

- :func:`start_plan`: the plan form's values checked in place (the refusal names the input it is
  about, nothing is written), then :func:`app.rollout.ops.start`;
- :func:`views`: each active rollout (else the newest) with its evidence: a summary, the per-metric
  table of both arms with verdicts, and a timeline of the weight with every decision on it;
- :func:`confirm_text` says exactly what promote, pause, resume or abort would change, and
  :func:`act` does it (operator and admin roles only);
- :func:`banner`: one line naming a running, paused or recently aborted rollout.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import plotly.graph_objects as go
from sqlalchemy import Engine

from app.config import Settings
from app.dashboard.identity import Identity, refusal
from app.monitor.canary_analysis import RunningAnalysis
from app.rollout import ops
from app.routing.rollout import manual, pct
from core.errors import InvalidRequest
from core.rollout import ABORTED, PAUSED, RUNNING, RolloutState, check_plan
from db import rollouts

NOTHING_WRITTEN = "Nothing was written."
BANNER_ABORTED_S = 24 * 3600.0  # an aborted rollout is named on the Overview for a day
VERBS = ("promote", "pause", "resume", "abort")


@dataclass(frozen=True)
class Outcome:
    ok: bool
    message: str
    field: str | None = None  # the input a refusal is about


_FIELDS = {
    "--steps": "steps",
    "each step": "steps",
    "--bake-s": "bake_s",
    "--min-samples": "min_samples",
    "--shadow-share": "shadow_share",
    "--shadow-budget-usd": "shadow_budget_usd",
    "--alpha": "alpha",
    "--candidate": "candidate",
    "--route": "candidate",
    "--reason": "reason",
}


def _field_of(message: str) -> str | None:
    return next((f for flag, f in _FIELDS.items() if flag in message), None)


def _blank_none(value: object) -> str | None:
    text = str(value or "").strip()
    return text or None


def candidates(settings: Settings) -> list[tuple[str, str | None]]:
    """What may be rolled out: ``(label, route)`` for the global canary's primary and each route's
    canary deployment."""
    out: list[tuple[str, str | None]] = [(f"{settings.routing.primary} (global canary)", None)]
    out += [(f"{r.canary.provider} on route {name}", name) for name, r in settings.routes.items() if r.canary]
    return out


def candidate_of(settings: Settings, route: str | None) -> str:
    if route is None:
        return settings.routing.primary
    canary = settings.routes[route].canary
    assert canary is not None
    return canary.provider


def start_plan(
    engine: Engine, settings: Settings, *, route: str | None, steps: object, bake_s: object, min_samples: object,
    alpha: object, dry_run: bool, reason: object, actor: Identity, notify: ops.Notify | None = None,
    shadow_share: object = "", shadow_budget_usd: object = "",
) -> Outcome:  # fmt: skip
    """Start a rollout from the plan form; a bad value is refused next to its input, nothing written.
    A blank shadow share and budget: no shadow phase."""
    if (why_not := refusal(actor)) is not None:
        return Outcome(False, why_not)
    text = reason.strip() if isinstance(reason, str) else ""
    if not text:
        return Outcome(False, f"A reason is required. {NOTHING_WRITTEN}", "reason")
    try:
        plan = check_plan(
            candidate=candidate_of(settings, route), route=route, steps=str(steps), bake_s=str(bake_s),
            min_samples=str(min_samples), alpha=str(alpha), dry_run=dry_run,
            shadow_share=_blank_none(shadow_share), shadow_budget_usd=_blank_none(shadow_budget_usd),
        )  # fmt: skip
        r = ops.start(engine, settings, plan, actor=actor.name, reason=text, notify=notify or (lambda e: None))
    except (InvalidRequest, ValueError) as exc:
        message = str(exc).replace("--", "")
        return Outcome(False, f"{message[:1].upper()}{message[1:]}. {NOTHING_WRITTEN}", _field_of(str(exc)))
    return Outcome(True, f"Started: {ops.summary(r)}.")


def _status(r: RolloutState) -> str:
    return {RUNNING: "info", PAUSED: "warning", ABORTED: "error"}.get(r.state, "success")


def timeline(r: RolloutState, trail: list[tuple[float, float, float, str, str]], now: float) -> go.Figure:
    """The rollout's weight over time (a step line), each decision a marker with its reason."""
    xs = [datetime.fromtimestamp(t, UTC) for t, *_ in trail]
    ys = [new * 100 for _, _, new, _, _ in trail]
    end = datetime.fromtimestamp(now, UTC) if r.active or not xs else xs[-1]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(x=[*xs, end], y=[*ys, ys[-1] if ys else 0.0], mode="lines", line={"shape": "hv"}, name="weight (%)")
    )
    fig.add_trace(
        go.Scatter(
            x=xs, y=ys, mode="markers", name="decisions", text=[f"{actor}: {why}" for *_, actor, why in trail],
            hovertemplate="%{text}<extra></extra>",
        )
    )  # fmt: skip
    fig.update_xaxes(type="date")
    fig.update_layout(
        title=f"Rollout #{r.id}: weight and decisions", height=280, margin={"l": 40, "r": 10, "t": 40, "b": 30},
        yaxis={"title": "weight (%)", "range": [0, 105]}, showlegend=False,
    )  # fmt: skip
    return fig


PANEL_ROWS_PER_RUN = 25_000  # rows one page run reads at most (about 0.6 s on SQLite); the rest at the next


@dataclass(frozen=True)
class View:
    rollout: RolloutState
    summary: str
    status: str  # info | success | warning | error
    metrics: list[dict[str, Any]]
    figure: go.Figure
    behind: str | None = None  # said while the analysis has not yet read the log up to now
    read_through: float | None = None  # the start time up to which the log was read (None: a shadow phase's pairs)
    live: bool = False  # worth refreshing: the rollout is active, or its analysis is still catching up


@dataclass
class _Kept:
    running: RunningAnalysis
    lock: threading.Lock
    reading: ops.Reading | None = None
    read_at: float = float("-inf")  # monotonic time of the last update


class _Readings:
    """Each shown rollout's analysis, kept up to date across page runs and sessions from the rows
    logged since the last read (as the controller keeps its own), so a page run during a rollout
    reads what arrived since the last one, not every row since the rollout started.

    A read takes at most :data:`PANEL_ROWS_PER_RUN` rows: a long rollout's first reading (150,000
    rows take about 4 s on SQLite in one read) goes part by part, the page saying after each how
    far it has read (the tests are anytime-valid: a prefix of the rollout is a valid reading of it,
    as of an earlier time). Readings younger than ``fresh_s``
    are shared by every session instead of read again. One lock per rollout, since sessions run in
    threads; only the rollouts shown now are kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[int, int, float], _Kept] = {}

    def keep_only(self, engine: Engine, shown: list[RolloutState]) -> None:
        keys = {(id(engine), r.id, r.started_at) for r in shown}
        with self._lock:
            for key in [k for k in self._kept if k[0] == id(engine) and k not in keys]:
                del self._kept[key]  # no longer shown

    def read(
        self, engine: Engine, r: RolloutState, now: float, fresh_s: float = 0.0
    ) -> tuple[ops.Reading, _Kept | None]:
        if r.shadowing:  # a shadow phase reads its pairs (flat per phase, bounded by its budget)
            return ops.read(engine, r, now), None
        key = (id(engine), r.id, r.started_at)
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or kept.running.engine is not engine:
                plan = r.plan
                kept = self._kept[key] = _Kept(
                    RunningAnalysis(engine, since=r.started_at, route=plan.route, alpha=plan.alpha,
                                    min_samples=plan.min_samples, max_rows=PANEL_ROWS_PER_RUN, bake_s=plan.bake_s),
                    threading.Lock(),
                )  # fmt: skip
        with kept.lock:  # one update at a time, never back in time (sessions' clocks differ by a run)
            # An ended rollout's evidence is read up to its end, once; an active one's is shared for fresh_s.
            fresh = not r.active or time.monotonic() - kept.read_at < fresh_s
            same = kept.reading is not None and kept.reading.rollout.version == r.version
            if not (fresh and same and kept.running.caught_up):
                until = now if r.active else min(now, r.updated_at)
                kept.reading = ops.read(engine, r, max(until, kept.running.until), kept.running)
                kept.read_at = time.monotonic()
            assert kept.reading is not None
            return kept.reading, kept


_READINGS = _Readings()


def shown(engine: Engine) -> list[RolloutState]:
    """The rollouts the panel shows: every active one, else the newest."""
    return rollouts.all_active(engine) or [r for r in [rollouts.latest(engine)] if r is not None]


def _behind(kept: _Kept | None) -> str | None:
    if kept is None or kept.running.caught_up:
        return None
    through = datetime.fromtimestamp(kept.running.read_through, UTC).strftime("%H:%M:%S UTC")
    return (
        f"Still reading this rollout's log: the evidence below covers requests up to {through} "
        f"({kept.running.rows_total:,} rows read so far)."
    )


def read_part(engine: Engine, r: RolloutState, *, fresh_s: float = 0.0) -> tuple[str | None, float | None]:
    """Read the next part of ``r``'s log (nothing when the reading is fresh and caught up): the note
    while still behind (None once caught up) and the start time read through. The evidence is drawn
    once, by :func:`view`, after the last part."""
    _, kept = _READINGS.read(engine, r, time.time(), fresh_s)
    return _behind(kept), None if kept is None else kept.running.read_through


def view(engine: Engine, r: RolloutState, now: float | None = None, *, fresh_s: float = 0.0) -> View:
    """One rollout with its evidence read now (``r`` re-read, so a refresh shows its new state)."""
    ts = time.time() if now is None else now
    r = rollouts.get(engine, r.id) or r
    reading, kept = _READINGS.read(engine, r, ts, fresh_s)
    rows = reading.analysis.rows()
    for row in rows:
        row["critical"] = row["signal"] not in ops.SOFT_SIGNALS
    summary = f"{ops.summary(r)}. Last: {r.last_reason}"
    behind = _behind(kept)
    figure = timeline(r, rollouts.history(engine, r), ts)
    through = None if kept is None else kept.running.read_through
    return View(r, summary, _status(r), rows, figure, behind, through, live=r.active or behind is not None)


def keep_only(engine: Engine, every: list[RolloutState]) -> None:
    """Forget the readings of rollouts no longer shown."""
    _READINGS.keep_only(engine, every)


def views(engine: Engine, now: float | None = None) -> list[View]:
    """Every active rollout, else the newest one, with its evidence read now."""
    every = shown(engine)
    keep_only(engine, every)
    return [view(engine, r, now) for r in every]


def confirm_text(r: RolloutState, verb: str, *, full: bool = False) -> str:
    """Exactly what ``verb`` would change, or why it does not apply."""
    try:
        action = manual(r, verb, full=full)
    except ValueError as exc:
        return str(exc)
    where = "the global canary" if r.plan.route is None else f"route {r.plan.route}'s canary"
    now_at = pct(r.weight) + (" (its shadow phase: copies only)" if r.shadowing else "")
    if r.plan.dry_run:
        return f"Dry run: the rollout becomes {action.state}; {where} stays where it is (nothing moves the weight)."
    if verb == "abort":
        return f"{where} goes from {now_at} to 0 %: every request goes to the baseline, and the rollout ends."
    if verb == "pause":
        return f"The rollout stops stepping; {where} stays at {now_at} until you resume or abort."
    if verb == "resume":
        return f"The rollout steps again from {now_at}; this step's bake time starts over."
    to = pct(action.ratio if action.ratio is not None else r.weight)
    ends = " and the rollout completes" if action.state == "completed" else ""
    return f"{where} goes from {now_at} to {to} now, without waiting for the bake{ends}."


def act(
    engine: Engine, rollout_id: int, verb: str, *, reason: object, actor: Identity, full: bool = False,
    notify: ops.Notify | None = None,
) -> Outcome:  # fmt: skip
    """Promote, pause, resume or abort by hand (operator and admin only)."""
    if (why_not := refusal(actor)) is not None:
        return Outcome(False, why_not)
    r = rollouts.get(engine, rollout_id)
    if r is None:
        return Outcome(False, f"Rollout #{rollout_id} does not exist. {NOTHING_WRITTEN}")
    try:
        new, _ = ops.command(engine, r, verb, actor=actor.name, reason=reason if isinstance(reason, str) else "",
                             full=full, notify=notify or (lambda e: None))  # fmt: skip
    except (InvalidRequest, rollouts.StaleRollout) as exc:
        return Outcome(False, f"{exc}. {NOTHING_WRITTEN}", "reason" if "reason" in str(exc) else None)
    return Outcome(True, new.last_reason.split(" ", 1)[-1])


def banner(engine: Engine, now: float | None = None) -> tuple[str, str] | None:
    """``(kind, line)`` naming a running or paused rollout, or one aborted in the last day."""
    ts = time.time() if now is None else now
    r = rollouts.active(engine) or rollouts.latest(engine)
    if r is None or (r.state == "completed") or (r.state == ABORTED and ts - r.updated_at > BANNER_ABORTED_S):
        return None
    where = "global canary" if r.plan.route is None else f"route {r.plan.route}"
    dry = " (dry run)" if r.plan.dry_run else ""
    last = r.last_reason.split(" ", 1)[-1]
    return _status(
        r
    ), f"Rollout #{r.id}{dry} of {r.plan.candidate} on the {where} is {r.state} at {pct(r.weight)}: {last}"
