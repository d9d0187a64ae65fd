"""The experimental units of a canary analysis, and the probability that each one is the candidate's.

Routing is sticky per session: a session id hashes to a fixed point ``u`` in [0, 1) and every request
of the session goes to the candidate while ``u`` is below the weight in force. A session's requests
are therefore not separate draws: counted one by one, a session that happens to land on the
candidate looks like many independent samples, and its correlated events (a user who keeps hitting
the same refusal, a long conversation that keeps truncating) look like evidence against it. The
analysis counts units instead:

- a request without a session is a unit of its own, on the candidate with probability the weight in
  force when it was routed (``share``);
- a session's **run** is a unit: its requests on one arm at one weight, from the first one seen
  until the session is idle for ``idle_s``, ``max_s`` after the run started, or the session's next
  request is on another arm or at another weight.

A run's probability of being the candidate's is computed from what was seen of the session before
it. Every earlier run bounds the session's point: on the candidate at weight ``w``, ``u < w``; on the
baseline, ``u >= w``. The point is uniform and independent of everything else the analysis saw (a
hash of the id), so a run at weight ``w`` of a session known to lie in ``[lo, hi)`` is the
candidate's with probability ``(clip(w, lo, hi) - lo) / (hi - lo)``:

- a session's first run: ``w`` itself;
- a later run at the same weight: 0 or 1. It says nothing and feeds no test, which is what keeps a
  session that spans the whole rollout from counting again and again;
- a baseline session's first run after a step from ``w`` to ``w'``: ``(w' - w) / (1 - w)``. The
  sessions a step moves to the candidate are a fresh draw, and they count.

A unit in which a signal's event happened at least once is one event of that signal, at the unit's
probability (:meth:`core.sequential.RateRatioTest.observe`): a session that hits the same error ten
times is one session with the error, which is what the null compares (the chance that a unit sees
the event, candidate against baseline). The premise of the guarantee is that
whether and when a session sends requests does not depend on its arm beyond the rates under test; a
run's end is fixed by the clock and the session's own timing, never by its events. A unit that says
nothing still counts its requests and events in the arms' rates (which are descriptive).

Bounds: the tracker remembers at most ``max_sessions`` sessions (by a 64-bit digest of the id, so any
id, of any length or script, costs the same). A session first seen once that many are remembered is
not counted at all, in any of its runs, rather than counted as new when it is not (``ignored``).
An observation that contradicts what is known of a session (a process still routing on the old
weight for a moment after a step) leaves the session saying nothing from then on.

This module imports nothing of ours.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

#: A session's run ends after this long without a request (seconds), or a quarter of the bake time
#: when that is shorter, so the runs of a step are closed and judged within its bake.
SESSION_IDLE_S = 60.0
MAX_SESSIONS = 200_000


def run_limits(bake_s: float) -> tuple[float, float]:
    """``(idle_s, max_s)`` for a rollout baking ``bake_s`` a step: a run lasts at most one bake."""
    bake = max(float(bake_s), 1e-3)
    return min(SESSION_IDLE_S, bake / 4.0), bake


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit, closed: its arm, the probability it had of being the candidate's given what was
    seen before it (None: nothing could be said), when it started, its requests and, for each
    signal, how many of them had the event."""

    candidate: bool
    share: float | None
    started: float
    requests: int
    events: dict[str, int]

    @property
    def informative(self) -> bool:
        return self.share is not None and 0.0 < self.share < 1.0

    def had(self, signal: str) -> bool:
        """Whether ``signal``'s event happened in the unit (at least once)."""
        return self.events.get(signal, 0) > 0


@dataclass(slots=True)
class _Run:
    candidate: bool
    weight: float
    share: float | None
    start: float
    last: float
    requests: int = 0
    events: dict[str, int] = field(default_factory=dict)


def session_key(session_id: str) -> int:
    """A 64-bit digest of the id: the same for the same text, whatever its length or characters."""
    data = session_id.encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _share(weight: float, lo: float, hi: float) -> float | None:
    if not (0.0 <= lo < hi <= 1.0) or weight != weight:  # contradicted knowledge, or nan
        return None
    return (min(max(weight, lo), hi) - lo) / (hi - lo)


class UnitTracker:
    """Requests in, closed units out (see the module's docstring). Feed each request with
    :meth:`add` as it is read, and call :meth:`close` with the clock at each read."""

    def __init__(self, *, idle_s: float = SESSION_IDLE_S, max_s: float = 600.0, max_sessions: int = MAX_SESSIONS):
        if not (idle_s > 0 and max_s > 0 and max_sessions > 0):
            raise ValueError("idle_s, max_s and max_sessions must be positive")
        self.idle_s, self.max_s, self.max_sessions = float(idle_s), float(max_s), int(max_sessions)
        self._known: dict[int, tuple[float, float]] = {}  # session -> [lo, hi) its point lies in
        self._open: dict[int, _Run] = {}
        self.ignored = 0  # requests of sessions beyond max_sessions, not counted

    @property
    def open_runs(self) -> int:
        return len(self._open)

    def add(
        self, session_id: str | None, started: float, candidate: bool, share: float, events: Iterable[str]
    ) -> list[Unit]:
        """One request: its session (None: a unit of its own), start time, arm, the weight in force
        when it was routed and the signals whose event it had. Returns the units this closes."""
        hits = dict.fromkeys(events, 1)
        if session_id is None:
            return [Unit(bool(candidate), share, started, 1, hits)]
        key = session_key(session_id)
        if key not in self._known:
            if len(self._known) >= self.max_sessions:
                self.ignored += 1
                return []
            self._known[key] = (0.0, 1.0)
        out: list[Unit] = []
        run = self._open.get(key)
        if run is not None and (
            run.candidate != bool(candidate)
            or run.weight != share
            or started - run.last > self.idle_s
            or started - run.start >= self.max_s
        ):
            out.append(self._emit(self._open.pop(key)))
            run = None
        if run is None:
            lo, hi = self._known[key]
            run = self._open[key] = _Run(bool(candidate), share, _share(share, lo, hi), started, started)
            if not 0.0 <= share <= 1.0:
                self._known[key] = (1.0, 0.0)  # a weight that is not one: nothing more can be said
            elif candidate:
                self._known[key] = (lo, min(hi, share))
            else:
                self._known[key] = (max(lo, share), hi)
        run.requests += 1
        run.last = max(run.last, started)
        for s in hits:
            run.events[s] = run.events.get(s, 0) + 1
        return out

    def close(self, now: float) -> list[Unit]:
        """The runs that have ended by ``now``: idle for ``idle_s``, or ``max_s`` old."""
        done = [k for k, r in self._open.items() if now - r.last > self.idle_s or now - r.start >= self.max_s]
        return [self._emit(self._open.pop(k)) for k in done]

    @staticmethod
    def _emit(run: _Run) -> Unit:
        return Unit(run.candidate, run.share, run.start, run.requests, run.events)
