"""Incidents: which provider is in trouble now, since when, what it fails with and what the
gateway did about it, for the Overview's banner.

A provider is **in an incident** while a live gateway process holds its circuit breaker open
(each process reports its breakers with a heartbeat, :mod:`db.breakers`; a process that stopped
reporting, one that exited or was killed mid-incident, no longer counts; a half-open breaker, whose
cooldown is over, counts only while the provider is also failing), or while it is failing (at
least :data:`FAILING_MIN_ATTEMPTS` attempts in the last minute and an attempt error rate of at
least :data:`FAILING_ERROR_RATE`, and a failed attempt within the last ``quiet_s`` seconds,
``[dashboard] incident_quiet_s``: the banner ends that long after the last failure, seen within a
refresh, instead of when the failure leaves the last minute's figures).

The incident's **start** survives the breaker's cycling: open -> half-open -> open -> ... is one
incident until the breaker has stayed closed for :data:`QUIET_S` seconds (:func:`breaker_incident_start`).
When the provider was already failing before its breaker first opened, the start is its first
failed row in the failing stretch (:func:`failing_since` finds the stretch's first minute), so the
banner says when callers' trouble began, not when the breaker reacted. Everything is read from the
last :data:`LOOKBACK_S` seconds.

The decisions are pure functions of the breaker's transitions and per-minute counts;
:func:`current_incidents` performs the reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from sqlalchemy import Engine

from app.display.fmt import pct
from app.display.safe_text import inert
from app.monitor.figures import LAST_MINUTE_S, Counts, figure_label
from db.breakers import LiveBreaker, live_breakers
from db.events import events_between
from db.incidents import breaker_transitions, error_classes, first_failure
from db.monitor import minute_floor, part_cells

FAILING_MIN_ATTEMPTS = 3  # one unlucky request does not raise a banner
FAILING_ERROR_RATE = 0.2
QUIET_S = 120.0  # a breaker closed this long ends its incident
# A provider without a failed attempt this long is no longer failing (``[dashboard] incident_quiet_s``).
QUIET_AFTER_FAILURE_S = 30.0
LOOKBACK_S = 3600
MAX_CLASSES = 4
# The error classes of requests refused before any attempt (their one row names the provider the
# request would have started on): a provider whose every failure is one of these is not failing,
# its requests are being refused, and the banner says so.
REFUSAL_CLASSES = frozenset({"breaker_open", "no_route", "refused_by_policy", "deadline"})
# The provider name of the rows of requests the gateway refused before any attempt
# (app.routing.core.GATEWAY): the substitution policy, every breaker open, admission (key, limit,
# budget). They are never a provider's incident; the Overview shows them as the gateway's.
GATEWAY = "gateway"


def breaker_incident_start(changes: Iterable[tuple[float, str]], now: float, quiet_s: float = QUIET_S) -> float | None:
    """When the breaker's current incident began: its first move away from ``closed`` after which
    it never stayed closed ``quiet_s`` seconds. ``None`` when there is no such incident (it never
    moved, or it has been closed ``quiet_s`` seconds by ``now``). ``changes`` are ``(ts, state)``."""
    start: float | None = None
    closed_at: float | None = None
    for ts, state in sorted(changes):
        if state == "closed":
            if start is not None and closed_at is None:
                closed_at = ts
        elif state in ("open", "half_open"):
            if start is None or (closed_at is not None and ts - closed_at >= quiet_s):
                start = ts
            closed_at = None
    if start is None or (closed_at is not None and now - closed_at >= quiet_s):
        return None
    return start


def is_failing(counts: Counts) -> bool:
    rate = counts.attempt_error_rate
    return counts.attempts >= FAILING_MIN_ATTEMPTS and rate is not None and rate >= FAILING_ERROR_RATE


def is_quiet(provider: str, last_failure: Mapping[str, float] | None, now: float, quiet_s: float) -> bool:
    """Whether ``provider``'s newest failed attempt is ``quiet_s`` seconds old or older (``False``
    when ``last_failure`` is not known, or names no failure of it: the counts alone decide)."""
    ts = None if last_failure is None else last_failure.get(provider)
    return ts is not None and now - ts >= quiet_s


def failing_since(minutes: Mapping[int, Counts], now: float) -> float | None:
    """The first minute of the failing stretch that reaches ``now``: walking back minute by
    minute, a minute with attempts and an attempt error rate under :data:`FAILING_ERROR_RATE`
    ends the walk; a minute without attempts does not (an open breaker lets none through). The
    start is the earliest walked minute that had errors; ``None`` when none had."""
    start = None
    m = minute_floor(now)
    oldest = min(minutes, default=m)
    while m >= oldest:
        c = minutes.get(m)
        if c is not None and c.attempts:
            if (c.attempt_error_rate or 0.0) < FAILING_ERROR_RATE:
                break
            if c.attempt_errors:
                start = float(m)
        m -= 60
    return start


@dataclass(frozen=True)
class Incident:
    """One provider's incident. Times are epoch seconds; shown in UTC."""

    provider: str
    start: float
    last_minute: Counts
    breaker_state: str | None = None  # open | half_open, when the breaker is not closed
    breaker_since: float | None = None  # its newest transition
    breaker_opened: float | None = None  # first open of this incident
    openings: int = 0  # moves to open within the incident
    error_classes: tuple[tuple[str, int], ...] = ()
    rollbacks: tuple[tuple[float, str], ...] = ()  # guardrail rollbacks since the start: (ts, detail)
    quiet: bool = False  # no failed attempt for the quiet time: the last minute's errors are over

    @property
    def failing(self) -> bool:
        return is_failing(self.last_minute) and not self.quiet

    @property
    def severity(self) -> str:
        """``error`` (breaker open, or failing) or ``warning`` (half-open and not failing now)."""
        return "error" if self.breaker_state == "open" or self.failing else "warning"


def _hms(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, tz=UTC).strftime("%H:%M:%S")


def _duration(seconds: float) -> str:
    m = int(seconds // 60)
    return f"{m // 60} h {m % 60} min" if m >= 60 else f"{m} min" if m else f"{int(seconds)} s"


def banner_text(incident: Incident, now: float) -> str:
    """The banner's Markdown: provider, start, figures, error classes, breaker and guardrail, times
    in UTC. Untrusted text (error classes, audit reasons) is made inert."""
    i = incident
    refused_only = bool(i.error_classes) and all(cls in REFUSAL_CLASSES for cls, _ in i.error_classes)
    failing = "requests refused before any attempt" if refused_only else "failing"
    what = "breaker open" if i.breaker_state == "open" else "breaker half-open" if i.breaker_state else failing
    if i.breaker_state and i.failing:
        what += f", {failing}"
    lines = [
        f"**{inert(i.provider)}: incident since {_hms(i.start)} UTC** ({_duration(now - i.start)}, {what})",
    ]
    c = i.last_minute
    label = figure_label("attempt_error_rate", LAST_MINUTE_S)
    lines.append(
        f"{label}: {pct(c.attempt_error_rate, digits=0)} of {c.attempts:,} attempts"
        if c.attempts
        else f"{label}: no attempts (requests skip it)"
    )
    if i.error_classes:
        shown = ", ".join(f"{inert(cls)} ({n:,})" for cls, n in i.error_classes[:MAX_CLASSES])
        more = len(i.error_classes) - MAX_CLASSES
        lines.append(f"Errors seen since the start: {shown}" + (f" and {more} more" if more > 0 else ""))
    if i.breaker_state:
        state = "open" if i.breaker_state == "open" else "half-open (one probe request let through)"
        line = f"Breaker: {state} since {_hms(i.breaker_since or i.start)} UTC"
        if i.breaker_opened is not None and i.breaker_opened != i.breaker_since:
            line += f"; first opened at {_hms(i.breaker_opened)} UTC"
            if i.openings > 1:
                line += f", opened {i.openings} times since"
        lines.append(line)
    for ts, detail in i.rollbacks:
        lines.append(f"Guardrail: rolled back at {_hms(ts)} UTC ({inert(detail)})")
    if not i.rollbacks and not i.breaker_state:
        lines.append("Neither the breaker nor the guardrail has acted yet")
    return "  \n".join(lines)


def build_incidents(
    providers: Sequence[str],
    *,
    now: float,
    last_minute: Mapping[str, Counts],
    transitions: Mapping[str, Sequence[tuple[float, str]]],
    minutes: Mapping[str, Mapping[int, Counts]],
    classes: Mapping[str, Sequence[tuple[str, int]]] | None = None,
    rollbacks: Sequence[tuple[float, str]] = (),
    primary: str | None = None,
    live: Mapping[str, LiveBreaker] | None = None,
    last_failure: Mapping[str, float] | None = None,
    quiet_s: float = QUIET_AFTER_FAILURE_S,
) -> list[Incident]:
    """The providers in an incident now, worst first (open breakers, then failing, then half-open).

    ``live`` is each breaker across the live processes (:func:`db.breakers.live_breakers`): the
    breaker's state is the worst one a live process holds. Without it (``None``) the newest of
    ``transitions`` says the state. ``transitions`` (every process's, merged) date the incident.
    ``last_failure`` is each provider's newest failed attempt (without it, the last minute's
    counts alone decide): a provider quiet for ``quiet_s`` seconds is no longer failing."""
    out = []
    for name in providers:
        changes = sorted(transitions.get(name, ()))
        counts = last_minute.get(name, Counts())
        quiet = is_quiet(name, last_failure, now, quiet_s)
        failing = is_failing(counts) and not quiet
        held = None
        if live is not None:
            held = live.get(name)
            # Half-open alone is no incident: a breaker whose cooldown is over refuses nothing and
            # waits for a probe that may never come (no traffic goes there after a rollback).
            state = held.state if held and (held.state == "open" or failing) else None
        else:
            state = changes[-1][1] if changes else None
        breaker_state = state if state in ("open", "half_open") else None
        if breaker_state is None and not failing:
            continue
        b_start = breaker_incident_start(changes, now) if breaker_state else None
        f_start = failing_since(minutes.get(name, {}), now)
        starts = [s for s in (b_start, f_start) if s is not None]
        start = min(starts) if starts else _breaker_since(changes, held, now - LAST_MINUTE_S)
        opens = [ts for ts, s in changes if s == "open" and b_start is not None and ts >= b_start]
        out.append(
            Incident(
                provider=name,
                start=start,
                last_minute=counts,
                breaker_state=breaker_state,
                breaker_since=_breaker_since(changes, held, now) if breaker_state else None,
                breaker_opened=opens[0] if opens else None,
                openings=len(opens),
                error_classes=tuple((classes or {}).get(name, ())),
                rollbacks=tuple((ts, d) for ts, d in rollbacks if ts >= start) if name == primary else (),
                quiet=quiet,
            )
        )
    rank = {"open": 0, None: 1, "half_open": 2}
    return sorted(out, key=lambda i: (rank[i.breaker_state], i.start))


def _breaker_since(changes: Sequence[tuple[float, str]], held: LiveBreaker | None, default: float) -> float:
    # The newest recorded transition; else when the live process holding it says it moved.
    if changes:
        return changes[-1][0]
    return held.since if held is not None and held.since is not None else default


@dataclass(frozen=True)
class GatewayRefusals:
    """Requests the gateway itself refused before asking any provider, in the last minute."""

    requests: int
    classes: tuple[tuple[str, int], ...] = ()


def gateway_refusals(engine: Engine, *, now: float, last_minute: Mapping[str, Counts]) -> GatewayRefusals | None:
    """The last minute's refusals by the gateway (``None`` when there were none): their count from
    ``last_minute`` (the page's :attr:`~app.monitor.figures.LiveFigures.providers_last_minute`) and
    their error classes (a ``ts``-indexed read of that minute)."""
    counts = last_minute.get(GATEWAY)
    if counts is None or not counts.requests:
        return None
    classes = error_classes(engine, provider=GATEWAY, since=now - LAST_MINUTE_S, until=now)
    return GatewayRefusals(counts.requests, tuple(classes))


def refusals_text(refusals: GatewayRefusals) -> str:
    """The Overview's line about them: whose they are (the gateway's, no provider was asked) and why."""
    n = refusals.requests
    why = ", ".join(f"{inert(cls)} ({k:,})" for cls, k in refusals.classes[:MAX_CLASSES])
    more = len(refusals.classes) - MAX_CLASSES
    return (
        f"**Gateway: {n:,} request{'s' if n != 1 else ''} refused before any attempt in the last "
        f"{LAST_MINUTE_S:g} s** (no provider was asked, so none is blamed)"
        + (f": {why}" + (f" and {more} more" if more > 0 else "") if why else "")
    )


def current_incidents(
    engine: Engine,
    providers: Sequence[str],
    *,
    now: float,
    last_minute: Mapping[str, Counts],
    primary: str | None = None,
    last_failure: Mapping[str, float] | None = None,
    quiet_s: float = QUIET_AFTER_FAILURE_S,
) -> list[Incident]:
    """Read and build :func:`build_incidents`. ``last_minute`` is each provider's last-minute
    counts (:attr:`app.monitor.figures.LiveFigures.providers_last_minute`, already read by the page),
    ``last_failure`` its newest failed attempt (``providers_last_failure``).
    Queries: the live processes' breakers and the lookback's breaker transitions; then, only when
    some provider is in trouble, its per-minute rollups, the guardrail's rollbacks and the error
    classes since each start."""
    since = now - LOOKBACK_S
    live = live_breakers(engine, now=now)
    transitions = breaker_transitions(engine, since=since, until=now)
    suspects = [
        p
        for p in providers
        if (is_failing(last_minute.get(p, Counts())) and not is_quiet(p, last_failure, now, quiet_s))
        or (p in live and live[p].state == "open")
    ]
    if not suspects:
        return []
    cells = part_cells(
        engine,
        span=60,
        start=minute_floor(since),
        end=minute_floor(now) + 60,
        filters=None,
        keys=("provider", "minute"),
    )
    minutes: dict[str, dict[int, Counts]] = {}
    for (provider, minute), cell in cells.items():
        minutes.setdefault(provider, {})[int(minute)] = Counts.of_cell(cell)
    rollbacks = [(e.ts, e.detail) for e in events_between(engine, since=since, until=now) if e.kind == "guardrail"]
    found = build_incidents(
        suspects,
        now=now,
        last_minute=last_minute,
        transitions=transitions,
        minutes=minutes,
        rollbacks=rollbacks,
        primary=primary,
        live=live,
        last_failure=last_failure,
        quiet_s=quiet_s,
    )
    out = []
    for i in found:
        # A failing stretch starts on a minute boundary: the stretch's first failed row says when
        # within that minute (a breaker that opened earlier still wins).
        first = first_failure(engine, provider=i.provider, since=i.start, until=now)
        start = min(s for s in (first or i.start, i.breaker_opened) if s is not None)
        classes = error_classes(engine, provider=i.provider, since=start, until=now)
        acted = tuple(r for r in i.rollbacks if r[0] >= start)
        out.append(replace(i, start=start, error_classes=tuple(classes), rollbacks=acted))
    return out
