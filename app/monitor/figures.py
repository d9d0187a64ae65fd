"""The named figures every page shows, defined once: attempt error rate, final failure rate and
fallback rate, each over a span ("last 1 min", "last 1 h").

* **Attempt error rate** = failed attempts / attempts: what the upstreams did.
* **Final failure rate** = requests whose final attempt failed / requests: what callers saw.
* **Fallback rate** = requests answered by a fallback route / requests.

They are counted from the request log, where every request has exactly one final row, whatever
ended it: a request refused before any attempt (``breaker_open``, ``no_route``,
``refused_by_policy``, ``deadline``) has one final, failed row of zero latency, on the provider it
would have started on. So such a request counts as a request, as a final failure, and as one failed
attempt of that provider (the rollups count it the same way, :func:`db.requests.rollup_deltas`):
the rates can never read lower than what callers saw.

:class:`Counts` holds the counters and the three rates; :func:`figure_label` is the one spelling
of a figure's name with its span; :func:`live_figures` reads a page's last minute (an indexed range
of the raw log: a per-minute rollup cannot say "the last sixty seconds") and its window (the
per-minute rollups) in one call, overall and per provider.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

from sqlalchemy import Engine

from db.monitor import SummedCell, minute_floor, part_cells
from db.raw_log import RecentCounts, recent_counts

ATTEMPT_ERROR_RATE = "attempt_error_rate"
FINAL_FAILURE_RATE = "final_failure_rate"
FALLBACK_RATE = "fallback_rate"
# figure -> its name on every page, in the order pages show them.
FIGURE_NAMES: dict[str, str] = {
    ATTEMPT_ERROR_RATE: "Attempt error rate",
    FINAL_FAILURE_RATE: "Final failure rate",
    FALLBACK_RATE: "Fallback rate",
}
DEFINITIONS: dict[str, str] = {
    ATTEMPT_ERROR_RATE: "Failed attempts / attempts (what the upstreams did; retries, fallbacks and "
    "requests refused before any attempt count).",
    FINAL_FAILURE_RATE: "Requests whose final attempt failed / requests (what callers saw; requests "
    "refused before any attempt count as failed).",
    FALLBACK_RATE: "Requests answered by a fallback route / requests.",
}
LAST_MINUTE_S = 60


def span_label(seconds: float) -> str:
    """``last 1 min``, ``last 15 min``, ``last 1 h``, ``last 6 h``, ``last 7 d``: the span a figure
    covers, as every page spells it."""
    if not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds < 1:
        raise ValueError(f"a span must be a finite number of seconds >= 1, got {seconds!r}")
    s = round(seconds)
    if s % 86400 == 0 and s >= 2 * 86400:
        return f"last {s // 86400} d"
    if s % 3600 == 0:
        return f"last {s // 3600} h"
    return f"last {max(1, round(s / 60))} min"


def figure_label(figure: str, span: float | str) -> str:
    """A figure's name with its span: ``Attempt error rate, last 1 min``. ``span`` is seconds or
    already a label (``custom range``)."""
    return f"{FIGURE_NAMES[figure]}, {span if isinstance(span, str) else span_label(span)}"


def _ratio(n: int, d: int) -> float | None:
    return n / d if d else None


@dataclass(frozen=True)
class Counts:
    """The counters behind the figures. ``requests`` are final rows (one per caller request)."""

    attempts: int = 0
    attempt_errors: int = 0
    requests: int = 0
    request_errors: int = 0
    fallbacks: int = 0

    @property
    def attempt_error_rate(self) -> float | None:
        return _ratio(self.attempt_errors, self.attempts)

    @property
    def final_failure_rate(self) -> float | None:
        return _ratio(self.request_errors, self.requests)

    @property
    def fallback_rate(self) -> float | None:
        return _ratio(self.fallbacks, self.requests)

    def rate(self, figure: str) -> float | None:
        if figure not in FIGURE_NAMES:
            raise KeyError(figure)
        return getattr(self, figure)

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @classmethod
    def total(cls, parts: Iterable[Counts]) -> Counts:
        out = cls()
        for p in parts:
            out = out + p
        return out

    @classmethod
    def of_rows(cls, rows: Iterable[Mapping]) -> Counts:
        """The definition itself, over request-log rows (``status``, ``final``, ``fallback``): every
        row is an attempt, every final row a request. What the SQL below sums, row by row."""
        a = e = r = re = f = 0
        for row in rows:
            failed = row["status"] != "ok"
            a, e = a + 1, e + failed
            if row["final"]:
                r, re, f = r + 1, re + failed, f + bool(row["fallback"])
        return cls(a, e, r, re, f)

    @classmethod
    def of_cell(cls, cell: SummedCell) -> Counts:
        return cls(
            cell.count("attempts"),
            cell.count("errors"),
            cell.count("requests"),
            cell.count("request_errors"),
            cell.count("fallbacks"),
        )

    @classmethod
    def of_recent(cls, recent: RecentCounts) -> Counts:
        return cls(recent.attempts, recent.errors, recent.requests, recent.request_errors, recent.fallbacks)


@dataclass(frozen=True)
class LiveFigures:
    """A page's figures over the last minute and over its window, overall and per provider."""

    window_s: int
    last_minute: Counts
    window: Counts
    providers_last_minute: dict[str, Counts] = field(default_factory=dict)
    providers_window: dict[str, Counts] = field(default_factory=dict)
    # each provider's newest failed attempt of the last minute (epoch seconds; absent without one)
    providers_last_failure: dict[str, float] = field(default_factory=dict)

    def tiles(self) -> list[tuple[str, float | None, str]]:
        """``(label, rate, help)`` for each figure, last minute first, then the window."""
        return [
            (figure_label(name, span), counts.rate(name), DEFINITIONS[name])
            for span, counts in ((LAST_MINUTE_S, self.last_minute), (self.window_s, self.window))
            for name in FIGURE_NAMES
        ]

    def provider(self, name: str, *, last_minute: bool) -> Counts:
        return (self.providers_last_minute if last_minute else self.providers_window).get(name, Counts())


def live_figures(engine: Engine, *, now: float, window_s: int) -> LiveFigures:
    """Two queries: the last :data:`LAST_MINUTE_S` seconds of the raw log (``ts``-indexed) and the
    window's per-minute rollups grouped by provider (whole minutes, the one in progress included)."""
    recent = recent_counts(engine, since=now - LAST_MINUTE_S, until=now)
    lo, hi = minute_floor(now - window_s), minute_floor(now) + 60
    cells = part_cells(engine, span=60, start=lo, end=hi, filters=None, keys=("provider",))
    minute = {p: Counts.of_recent(c) for p, c in recent.items()}
    window = {key[0]: Counts.of_cell(c) for key, c in cells.items()}
    return LiveFigures(
        window_s=int(window_s),
        last_minute=Counts.total(minute.values()),
        window=Counts.total(window.values()),
        providers_last_minute=minute,
        providers_window=window,
        providers_last_failure={p: c.last_failure for p, c in recent.items() if c.last_failure is not None},
    )
