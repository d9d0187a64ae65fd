"""The request log's health for the Overview: the dashboard process's telemetry writer counters
(queued, spilled to the journal, replayed, rejected as dead letters) and a warning when the
database is not taking writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LogCounters:
    queued: int
    spilled: int
    replayed: int
    rejected: int
    journal_depth: int
    database_ok: bool
    last_error: str | None

    def metrics(self) -> list[tuple[str, str, str]]:
        """(label, value, help) per counter, in display order."""
        return [
            ("Log queue", f"{self.queued:,}", "Records in memory waiting for the database"),
            ("Spilled", f"{self.spilled:,}", "Records sent to the local journal (queue full or database failing)"),
            ("Replayed", f"{self.replayed:,}", "Journal records delivered to the database since start"),
            ("Rejected", f"{self.rejected:,}", "Records the database refused: kept in the dead-letter file"),
        ]

    @property
    def warning(self) -> str | None:
        if not self.database_ok:
            return (
                f"The database is not taking request-log writes ({self.last_error}); {self.journal_depth:,} "
                "records are kept in the local journal and will be replayed when it answers."
            )
        if self.rejected:
            return f"{self.rejected:,} request-log records were rejected by the database; see the dead-letter file."
        return None


def log_counters(client: Any) -> LogCounters | None:
    """The counters of ``client``'s telemetry writer (None when it has none to show)."""
    stats_of = getattr(getattr(client, "telemetry", None), "stats", None)
    if not callable(stats_of):
        return None
    s = stats_of()
    return LogCounters(
        queued=s.queued,
        spilled=s.spilled,
        replayed=s.replayed,
        rejected=s.rejected,
        journal_depth=s.journal_depth,
        database_ok=s.database_ok,
        last_error=s.last_error,
    )


@dataclass(frozen=True)
class RatioFreshness:
    """How old the canary ratio this process routes by is (the background refresher re-reads it
    every ``refresh_s``; while the database does not answer, the last known value is served)."""

    age_s: float
    refresh_s: float

    @property
    def stale(self) -> bool:
        # Two missed refreshes plus a second of slack: the database is not answering.
        return self.age_s > 2 * self.refresh_s + 1.0

    def text(self) -> str:
        if self.stale:
            return (
                f"Routing uses the ratio read {self.age_s:.0f} s ago: the database has not answered since, "
                "so the last known ratio is served."
            )
        return f"Routing re-reads the ratio every {self.refresh_s:g} s (last read {self.age_s:.1f} s ago)."


def ratio_freshness(client: Any) -> RatioFreshness | None:
    """The freshness of ``client``'s ratio, ``None`` when it cannot tell (no refresher)."""
    try:
        return RatioFreshness(float(client.ratio_age_s()), float(client.settings.routing.ratio_refresh_s))
    except Exception:  # noqa: BLE001 - a client built without a gateway has no refresher
        return None
