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
