"""The canary against its baseline, side by side over the same window, from the request log: for
each signal a model migration breaks, both arms' counts, the observed rate ratio and an
always-valid p-value (:class:`core.sequential.RateRatioTest`), so the answer stays valid however
often the operator (or a rollout controller) asks.

The arms are the sides the requests were assigned (the global canary: ``primary`` is the
candidate; a route: ``route_canary``), counted as assigned, whoever answered in the end. Each
request's candidate share is the ratio in force when it was routed, read from the canary's audit
trail. Signals (one per final request):

- ``attempt failed``: the request's first attempt (on its arm's own deployment or provider) failed,
  whatever a retry or fallback made of it afterwards;
- ``failed``: the request failed in the end;
- ``refused``: the model refused (a refusal in the answer, or finish reason ``content_filter``);
- ``truncated``: finish reason ``length``;
- ``empty``: answered with no output tokens and no tool call;
- ``broken tool json``: a tool call's ``arguments`` is not valid JSON;
- ``schema violation``: the caller asked for ``response_format: json_schema`` and the answer does not
  parse or does not validate;
- ``slow`` / ``slow first token`` / ``slow chunks`` / ``verbose`` / ``costly``: latency, TTFT, a
  stream's mean time between chunks, output tokens or cost above the baseline's p95 *before* the
  window (so the threshold is fixed before the data it judges); nodata without such a baseline. The
  candidate has an allowed change on each (:data:`ALLOWED_CHANGE`: latency, TTFT, chunk gaps and
  output tokens +10 %, cost +5 %): its event is a value above
  that p95 times ``1 + allowed``. A candidate whose values are at most ``1 + allowed`` times the
  baseline's (in distribution) then has its events no more often than the baseline has its own,
  which is the null each test holds; one slower or dearer by more is what it finds.

**Units, not requests.** Routing is sticky per session, so a session's requests are one draw, not
many. The tests count experimental units (:mod:`core.units`): a request without a session is a
unit of its own; a session's run of requests on one arm at one weight is one unit, one event for
each signal whose event it had at least once, at the probability that it is on the candidate
given what was seen of that session before (a session's later runs at the same weight
say nothing; a baseline session moved by a step is a fresh draw). A run ends when its session is
idle for a quarter of the bake time (at most 60 s) or a bake time after it started; it is judged
then. Which requests carry a session mirrors routing: in the global canary an empty session id
draws per request; in a route, any id (even empty) is sticky.

A signal's verdict: ``worse`` (rejected at its share of ``alpha``), ``nodata`` (fewer than
``min_samples`` units that say something on either arm: a rollout whose traffic is a handful of
long sessions stays nodata, and pauses as inconclusive, rather than passing on one session's
requests), else ``pass``. ``alpha`` is split over the signals by
:data:`SIGNAL_WEIGHTS` (a weighted Bonferroni split: signal ``s`` rejects at ``alpha * w_s / sum(w)``),
so the chance that a healthy candidate is judged worse on *any* signal, however often the analysis is
read, stays at most ``alpha``, with or without sticky sessions (:mod:`core.sequential` states the
premise; ``python -m benchmarks rollouts`` measures it with sessions of 20 to 200 requests).
The failure signals weigh twice the others: they are what an operator
most needs caught, and their regressions are the rarest events (a provider's errors 1 % -> 3 % has
a few dozen candidate events by the 25 % step), so they need the lower bar most.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, select

from core.canary import ROUTE_SIDES
from core.rollout import DEFAULT_BAKE_S
from core.sequential import RateRatioTest
from core.units import Unit, UnitTracker, run_limits
from db.canary import GLOBAL, audit_log, route_scope
from db.models import RequestLog

SIGNALS = (
    "attempt failed",
    "failed",
    "refused",
    "truncated",
    "empty",
    "broken tool json",
    "schema violation",
    "slow",
    "slow first token",
    "slow chunks",
    "verbose",
    "costly",
)
#: Each signal's share of alpha (relative weights; see the module's docstring).
SIGNAL_WEIGHTS: dict[str, float] = {s: 2.0 if s in ("attempt failed", "failed") else 1.0 for s in SIGNALS}
TAIL_SIGNALS = ("slow", "slow first token", "slow chunks", "verbose", "costly")  # judged against the baseline's p95
#: How much worse than the baseline the candidate may be on each tail signal before it counts.
ALLOWED_CHANGE = {"slow": 0.10, "slow first token": 0.10, "slow chunks": 0.10, "verbose": 0.10, "costly": 0.05}


def allowed_text(signal: str) -> str:
    """The candidate's allowed change on ``signal`` as the tables and the CLI say it."""
    change = ALLOWED_CHANGE.get(signal)
    return "none" if change is None else f"+{change * 100:g} %"


MAX_ROWS = 200_000  # final requests read for one analysis, newest kept
MIN_SAMPLES = 50
BASELINE_ROWS = 5_000
#: How long after a request starts its rows may still arrive and be counted by a running analysis:
#: the longest request (the default request deadline, 120 s) plus the telemetry writer's delay.
OVERLAP_S = 180.0  # baseline requests before the window that set the p95 thresholds


@dataclass(frozen=True)
class SignalResult:
    signal: str
    candidate: int  # events on the candidate
    baseline: int
    candidate_rate: float | None
    baseline_rate: float | None
    ratio: float | None  # observed candidate rate / baseline rate
    p_value: float
    verdict: str  # worse | pass | nodata
    e_value: float = 1.0  # the test's statistic now (not its maximum): evidence against the candidate


def signal_alpha(signal: str, alpha: float) -> float:
    """The share of ``alpha`` a signal's test rejects at (:data:`SIGNAL_WEIGHTS`)."""
    return alpha * SIGNAL_WEIGHTS[signal] / sum(SIGNAL_WEIGHTS.values())


@dataclass(frozen=True)
class Analysis:
    scope: str
    since: float
    until: float
    candidate_requests: int
    baseline_requests: int
    alpha: float
    signals: tuple[SignalResult, ...]
    # The units the tests counted on each arm (sessions' runs and requests without a session that
    # say something; see the module's docstring): the samples behind ``nodata``.
    candidate_units: int = 0
    baseline_units: int = 0

    @property
    def verdict(self) -> str:
        """``worse`` when any signal is, else ``nodata`` when any is, else ``pass``."""
        kinds = {s.verdict for s in self.signals}
        return "worse" if "worse" in kinds else "nodata" if "nodata" in kinds else "pass"

    def rows(self) -> list[dict]:
        return [
            {
                "signal": s.signal,
                "allowed": allowed_text(s.signal),
                "candidate": s.candidate,
                "baseline": s.baseline,
                "candidate rate": s.candidate_rate,
                "baseline rate": s.baseline_rate,
                "ratio": s.ratio,
                "p (always valid)": s.p_value,
                "verdict": s.verdict,
            }
            for s in self.signals
        ]


def _sides(route: str | None) -> tuple[str, str]:
    return ("route_canary", "route") if route is not None else ("primary", "fallback")


def _shares(engine: Engine, scope: str, since: float) -> tuple[list[float], list[float]]:
    """The ratio in force over time: change times and the ratio from each one on."""
    entries = sorted(audit_log(engine, limit=10_000, scope=scope), key=lambda e: (e.ts, e.version))
    times, ratios = [float("-inf")], [entries[0].old_ratio if entries else 0.0]
    for e in entries:
        times.append(e.ts)
        ratios.append(e.new_ratio)
    if not entries and scope == GLOBAL:
        from db.canary import get_state

        ratios = [get_state(engine).ratio]
    return times, ratios


class _Tally:
    """The running sums and tests of one analysis: requests and events per arm (descriptive), and
    the units the tests judge as they close."""

    def __init__(self, alpha: float, bake_s: float | None) -> None:
        idle_s, max_s = run_limits(DEFAULT_BAKE_S if bake_s is None else bake_s)
        self.units = UnitTracker(idle_s=idle_s, max_s=max_s)
        self.tests = {s: RateRatioTest(alpha=signal_alpha(s, alpha)) for s in SIGNALS}
        self.counts = {s: [0, 0] for s in SIGNALS}
        self.n = [0, 0]  # requests
        self.judged = [0, 0]  # units that say something
        self.step_since: float | None = None
        self.step = [0, 0]  # such units that started since ``step_since``

    def add(self, session_id: str | None, started: float, candidate: bool, share: float, events: dict) -> None:
        arm = 0 if candidate else 1
        self.n[arm] += 1
        hit = [signal for signal, on in events.items() if on]
        for signal in hit:
            self.counts[signal][arm] += 1
        for unit in self.units.add(session_id, started, candidate, share, hit):
            self._judge(unit)

    def close(self, now: float) -> None:
        for unit in self.units.close(now):
            self._judge(unit)

    def _judge(self, u: Unit) -> None:
        if not u.informative:
            return
        assert u.share is not None
        arm = 0 if u.candidate else 1
        self.judged[arm] += 1
        if self.step_since is not None and u.started >= self.step_since:
            self.step[arm] += 1
        for signal in u.events:  # the signals whose event the unit had
            self.tests[signal].observe(u.candidate, u.share)

    def analysis(
        self, scope: str, since: float, until: float, alpha: float, min_samples: int, limits: dict
    ) -> Analysis:
        n, results = self.n, []
        for s in SIGNALS:
            t, (c, b) = self.tests[s], self.counts[s]
            nodata = min(self.judged) < min_samples or (s in TAIL_SIGNALS and limits.get(s) is None)
            results.append(
                SignalResult(
                    signal=s, candidate=c, baseline=b, candidate_rate=c / n[0] if n[0] else None,
                    baseline_rate=b / n[1] if n[1] else None,
                    ratio=(c / n[0]) / (b / n[1]) if n[0] and n[1] and b else None, p_value=t.p_value,
                    verdict="worse" if t.rejected else "nodata" if nodata else "pass", e_value=t.lr,
                )
            )  # fmt: skip
        return Analysis(scope, since, until, n[0], n[1], alpha, tuple(results), self.judged[0], self.judged[1])


def _session(session_id: str | None, route: str | None) -> str | None:
    """The session a request was routed by, as routing reads it (:func:`app.routing.canary.assign_side`
    draws per request for an empty id; a route's :func:`app.routing.routes.session_draw` does not)."""
    if route is None:
        return session_id or None
    return session_id


def analyse(
    engine: Engine,
    *,
    since: float,
    until: float,
    route: str | None = None,
    alpha: float = 0.05,
    min_samples: int = MIN_SAMPLES,
    bake_s: float | None = None,
) -> Analysis:
    """The canary of the global split (``route`` None) or of a route, over ``[since, until]``, read
    once. ``bake_s``: the rollout's bake time, which bounds a session's run (default 600 s)."""
    candidate_side, baseline_side = _sides(route)
    scope = route_scope(route) if route is not None else GLOBAL
    log = RequestLog.__table__
    cols = (log.c.request_id, log.c.attempt, log.c.final, log.c.ts, log.c.side, log.c.status, log.c.finish_reason,
            log.c.completion_tokens, log.c.tool_calls, log.c.latency_ms, log.c.ttft_ms, log.c.cost_usd,
            log.c.refused, log.c.tool_json_bad, log.c.schema_bad, log.c.chunk_gap_ms, log.c.session_id)  # fmt: skip
    where: list = [log.c.side.in_((candidate_side, baseline_side))]
    if route is not None:
        where.append(log.c.route == route)
    else:
        where.append(log.c.side.not_in(tuple(ROUTE_SIDES)))
    with engine.connect() as conn:
        attempts = conn.execute(
            select(*cols)
            .where(*where, (log.c.attempt == 1) | log.c.final.is_(True), log.c.ts >= since, log.c.ts <= until)
            .order_by(log.c.ts)
            .limit(MAX_ROWS)
        ).all()
        before = conn.execute(
            select(*_baseline_columns(log))
            .where(*where, log.c.final.is_(True), log.c.side == baseline_side, log.c.ts < since, log.c.status == "ok")
            .order_by(log.c.ts.desc())
            .limit(BASELINE_ROWS)
        ).all()
    limits = _p95s(before)
    times, ratios = _shares(engine, scope, since)
    tally = _Tally(alpha, bake_s)
    first_failed: dict[str, bool] = {}
    started: dict[str, float] = {}
    finals = []
    for r in attempts:
        if r.attempt == 1:
            first_failed[r.request_id] = r.status != "ok"
            started[r.request_id] = float(r.ts)
        if r.final:
            finals.append(r)
    for r in finals:  # in the order the requests ended
        start = started.get(r.request_id, float(r.ts))
        share = ratios[bisect_right(times, start) - 1]
        events = _events(r, limits, r.side == candidate_side)
        events["attempt failed"] = first_failed.get(r.request_id, r.status != "ok")
        tally.add(_session(r.session_id, route), start, r.side == candidate_side, share, events)
    # One read: every session's run ends at ``until`` (a cut fixed before the arms are looked at).
    # The controller's :class:`RunningAnalysis` closes runs only once they end, so its units stay
    # the same from one read to the next.
    tally.close(float("inf"))
    return tally.analysis(scope, since, until, alpha, min_samples, limits)


class RunningAnalysis:
    """:func:`analyse` kept up to date from the rows logged since the last read, for a controller
    that reads every few seconds: its cost is flat in the size of the log and the length of the
    rollout (what the traffic of one overlap window holds), where :func:`analyse` reads every row
    since the rollout started.

    Each :meth:`update` reads the rows that started since the last read, less :data:`OVERLAP_S`
    (a request's rows are logged when it ends, so rows keep arriving for a while after their start
    time), skips the ones already counted (their ids, kept for the overlap window) and feeds the
    new final requests to the running tests and sums. A request whose rows arrive more than
    ``OVERLAP_S`` after it started (longer than the request deadline, or replayed from a journal
    after a database outage) is not counted: the tests stay valid (a row left out is a request the
    analysis never saw), they only see less. At most ``max_rows`` rows are read per update; a
    backlog is read over the next updates.

    The tail signals' thresholds (the baseline's p95) are read once, from before ``since``.
    ``step_counts()`` are the units on each arm, judged so far, that started since the current step
    began (the samples :func:`app.routing.rollout.decide` waits for): requests without a session,
    and sessions' runs that say something. ``bake_s`` bounds a session's run (see the module's
    docstring); each update closes the runs that ended by its ``until``.
    """

    def __init__(
        self, engine: Engine, *, since: float, route: str | None = None, alpha: float = 0.05,
        min_samples: int = MIN_SAMPLES, overlap_s: float | None = None, max_rows: int = 50_000,
        bake_s: float | None = None,
    ) -> None:  # fmt: skip
        self.engine, self.since, self.route, self.alpha, self.min_samples = engine, since, route, alpha, min_samples
        self.overlap_s = OVERLAP_S if overlap_s is None else overlap_s
        self.max_rows = max_rows
        self.candidate_side, self.baseline_side = _sides(route)
        self.scope = route_scope(route) if route is not None else GLOBAL
        log = RequestLog.__table__
        where: list = [log.c.side.in_((self.candidate_side, self.baseline_side))]
        where.append(log.c.route == route if route is not None else log.c.side.not_in(tuple(ROUTE_SIDES)))
        self._where = where
        with engine.connect() as conn:
            before = conn.execute(
                select(*_baseline_columns(log))
                .where(*where, log.c.final.is_(True), log.c.side == self.baseline_side, log.c.ts < since,
                       log.c.status == "ok")
                .order_by(log.c.ts.desc())
                .limit(BASELINE_ROWS)
            ).all()  # fmt: skip
        self.limits = _p95s(before)
        self.tally = _Tally(alpha, bake_s)
        self.cursor = since  # rows that started before this (less the overlap) were read
        self._seen: dict[int, float] = {}  # ids counted within the overlap window -> their ts
        self._first: dict[str, tuple[bool, float]] = {}  # request -> (first attempt failed, start)
        self._resume: tuple[float, int] | None = None  # (start time, id) the last full read stopped at
        self.rows_read = 0  # by the last update
        self.rows_total = 0  # new rows, by every update
        self.until = since

    def update(self, until: float, step_since: float | None = None) -> Analysis:
        """Read what was logged since the last update and return the analysis of ``[since, until]``."""
        if step_since != self.tally.step_since:
            self.tally.step_since, self.tally.step = step_since, [0, 0]
        log = RequestLog.__table__
        cols = (log.c.id, log.c.request_id, log.c.attempt, log.c.final, log.c.ts, log.c.side, log.c.status,
                log.c.finish_reason, log.c.completion_tokens, log.c.tool_calls, log.c.latency_ms, log.c.ttft_ms,
                log.c.cost_usd, log.c.refused, log.c.tool_json_bad, log.c.schema_bad, log.c.chunk_gap_ms,
                log.c.session_id)  # fmt: skip
        window = [log.c.ts <= until]
        if self._resume is not None:  # after a full read: the rows past the last one read, in (ts, id) order
            at, last_id = self._resume
            window += [log.c.ts >= at, (log.c.ts > at) | (log.c.id > last_id)]
        else:
            window.append(log.c.ts >= max(self.since, self.cursor - self.overlap_s))
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(*cols)
                .where(*self._where, (log.c.attempt == 1) | log.c.final.is_(True), *window)
                .order_by(log.c.ts, log.c.id)
                .limit(self.max_rows)
            ).all()
        self.rows_read = len(rows)
        times, ratios = _shares(self.engine, self.scope, self.since)
        fresh = [r for r in rows if r.id not in self._seen]
        self.rows_total += len(fresh)
        for r in fresh:
            self._seen[r.id] = float(r.ts)
            if r.attempt == 1:
                self._first[r.request_id] = (r.status != "ok", float(r.ts))
        for r in fresh:
            if not r.final:
                continue
            failed_first, started = self._first.pop(r.request_id, (r.status != "ok", float(r.ts)))
            share = ratios[bisect_right(times, started) - 1]
            events = _events(r, self.limits, r.side == self.candidate_side)
            events["attempt failed"] = failed_first
            session = _session(r.session_id, self.route)
            self.tally.add(session, started, r.side == self.candidate_side, share, events)
        if rows:
            self.cursor = max(self.cursor, float(rows[-1].ts))
        # A full read leaves a backlog: the next read goes on from where this one stopped, in (start
        # time, id) order, so any number of rows of one start time are read across parts, rather
        # than from the overlap window.
        self._resume = (float(rows[-1].ts), int(rows[-1].id)) if len(rows) >= self.max_rows else None
        # Runs end by the clock; with a backlog left, by the newest row read (a run whose later
        # requests are still unread would otherwise be cut short).
        self.tally.close(until if self._resume is None else min(until, self._resume[0]))
        horizon = self.cursor - self.overlap_s
        self._seen = {i: t for i, t in self._seen.items() if t >= horizon}
        self._first = {k: v for k, v in self._first.items() if v[1] >= horizon - self.overlap_s}
        self.until = until
        return self.analysis()

    def step_counts(self) -> tuple[int, int]:
        return self.tally.step[0], self.tally.step[1]

    @property
    def caught_up(self) -> bool:
        """Whether the last update read every row up to its ``until`` (no backlog left)."""
        return self._resume is None

    @property
    def read_through(self) -> float:
        """The start time up to which rows were read: ``until``, or where a backlog stopped the read."""
        return self.until if self._resume is None else self._resume[0]

    def analysis(self) -> Analysis:
        return self.tally.analysis(self.scope, self.since, self.until, self.alpha, self.min_samples, self.limits)


def analyse_shadow(
    engine: Engine, *, rollout_id: int, since: float, until: float, route: str | None = None, alpha: float = 0.05,
    min_samples: int = MIN_SAMPLES,
) -> Analysis:  # fmt: skip
    """A shadow phase's analysis: each mirrored request is a pair, the candidate's answer to the
    copy (``shadow_log``) and the baseline's own answer to the request (its final ``request_log``
    row), judged by the same signals and tests as the canary arm.

    Both arms answered the same requests, so each event is tested with a candidate share of 1/2:
    under the null that a pair's two answers are exchangeable (the candidate is no worse *on the same
    request*), an event of a pair where only one arm has it is the candidate's with probability at
    most 1/2, and a pair where both have it multiplies the statistic by ``4 q (1 - q) <= 1``; so each
    test's statistic is a supermartingale, Ville's inequality holds and the false-abort guarantee of
    :mod:`core.sequential` carries over (a sequential sign test, McNemar's, read at any time).
    ``since``: the rollout's start (the tail signals' baseline p95 comes from before it); ``until`` is
    kept for the report."""
    from db.shadow import pairs as shadow_pairs

    baseline_side = _sides(route)[1]
    scope = route_scope(route) if route is not None else GLOBAL
    log = RequestLog.__table__
    where: list = [log.c.side == baseline_side]
    where.append(log.c.route == route if route is not None else log.c.side.not_in(tuple(ROUTE_SIDES)))
    with engine.connect() as conn:
        before = conn.execute(
            select(*_baseline_columns(log))
            .where(*where, log.c.final.is_(True), log.c.ts < since, log.c.status == "ok")
            .order_by(log.c.ts.desc())
            .limit(BASELINE_ROWS)
        ).all()
    # A copy streams when the request it copies did, so first token and chunk gaps compare on
    # streamed pairs; a pair sent whole has neither on either side (a copy stored before copies
    # streamed has none either, and counts for no tail signal).
    limits = _p95s(before)
    tests = {s: RateRatioTest(alpha=signal_alpha(s, alpha)) for s in SIGNALS}
    counts = {s: [0, 0] for s in SIGNALS}
    found = shadow_pairs(engine, rollout_id)
    for p in found:
        for arm, row in ((0, p.shadow), (1, p.baseline)):
            events = _events(row, limits, arm == 0)
            # The baseline's first attempt failed when it failed or was retried; the copy has one.
            events["attempt failed"] = row.status != "ok" or int(getattr(row, "attempt", 1) or 1) > 1
            for signal, hit in events.items():
                if hit:
                    counts[signal][arm] += 1
                    tests[signal].observe(arm == 0, 0.5)
    n = len(found)
    results = []
    for s in SIGNALS:
        t, (c, b) = tests[s], counts[s]
        nodata = n < min_samples or (s in TAIL_SIGNALS and limits.get(s) is None)
        results.append(
            SignalResult(
                signal=s, candidate=c, baseline=b, candidate_rate=c / n if n else None,
                baseline_rate=b / n if n else None, ratio=c / b if b else None, p_value=t.p_value,
                verdict="worse" if t.rejected else "nodata" if nodata else "pass", e_value=t.lr,
            )
        )  # fmt: skip
    return Analysis(scope, since, until, n, n, alpha, tuple(results), n, n)


def _p95(values: Sequence[float]) -> float | None:
    xs = sorted(v for v in values if v is not None)
    return xs[int(0.95 * (len(xs) - 1))] if len(xs) >= MIN_SAMPLES else None


def _baseline_columns(log) -> tuple:
    """What :func:`_p95s` reads of each baseline row."""
    return (log.c.latency_ms, log.c.ttft_ms, log.c.cost_usd, log.c.chunk_gap_ms, log.c.completion_tokens)


def _p95s(before: Sequence) -> dict[str, float | None]:
    return {
        "slow": _p95([r.latency_ms for r in before]),
        "slow first token": _p95([r.ttft_ms for r in before]),
        "slow chunks": _p95([r.chunk_gap_ms for r in before]),
        "verbose": _p95([r.completion_tokens for r in before]),
        "costly": _p95([r.cost_usd for r in before]),
    }


def _events(r, limits: dict[str, float | None], candidate: bool) -> dict[str, bool]:
    """The signals' events of one final row; the candidate's tail events are counted above the
    baseline's p95 times its allowed change (:data:`ALLOWED_CHANGE`)."""
    ok = r.status == "ok"
    over = {
        name: limit is not None
        and value is not None
        and float(value) > (limit * (1.0 + ALLOWED_CHANGE[name]) if candidate else limit)
        for name, value, limit in (
            ("slow", r.latency_ms, limits["slow"]),
            ("slow first token", r.ttft_ms, limits["slow first token"]),
            ("slow chunks", r.chunk_gap_ms, limits["slow chunks"]),
            ("verbose", r.completion_tokens, limits["verbose"]),
            ("costly", r.cost_usd, limits["costly"]),
        )
    }
    return {
        "failed": not ok,
        "refused": ok and (bool(r.refused) or r.finish_reason == "content_filter"),
        "truncated": ok and r.finish_reason == "length",
        "empty": ok and not r.completion_tokens and not r.tool_calls,
        "broken tool json": ok and bool(r.tool_json_bad),
        "schema violation": ok and r.schema_bad is True,
        **{k: ok and v for k, v in over.items()},
    }


def arm_requests(engine: Engine, *, since: float, until: float, route: str | None = None) -> tuple[int, int]:
    """Final requests on each arm ``(candidate, baseline)`` that started in ``[since, until]``: the
    samples a rollout's current step has gathered."""
    from sqlalchemy import func

    candidate_side, baseline_side = _sides(route)
    log = RequestLog.__table__
    where: list = [log.c.final.is_(True), log.c.ts >= since, log.c.ts <= until,
                   log.c.side.in_((candidate_side, baseline_side))]  # fmt: skip
    if route is not None:
        where.append(log.c.route == route)
    with engine.connect() as conn:
        counts: dict[str, int] = dict(
            conn.execute(select(log.c.side, func.count()).where(*where).group_by(log.c.side)).all()
        )
    return int(counts.get(candidate_side, 0)), int(counts.get(baseline_side, 0))
