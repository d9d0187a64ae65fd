"""The recent-requests table as the operator sees and downloads it: the newest ``request_log``
rows from :func:`db.monitor.recent_rows` with an ISO-8601 UTC time column first, and as CSV.

The CSV holds text from upstreams and callers (error messages, session ids, prompts), which a
spreadsheet would evaluate if it starts like a formula (``=HYPERLINK(...)``): every text cell goes
through :func:`core.text.csv_safe` on the way out."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from sqlalchemy import Engine

from core.text import csv_safe
from db.monitor import RECENT_LOG_COLUMNS, MonitorFilters, recent_rows

# Columns of the table, in display order (prompt_text follows only when asked for).
RECENT_COLUMNS = ("time_utc", *RECENT_LOG_COLUMNS)
# Headings the page shows for columns whose stored name reads badly; the CSV keeps stored names.
RECENT_LABELS = {
    "api": "API",
    "finish_reason": "finish",
    "tool_calls": "tool calls",
    "reasoning_tokens": "reasoning tokens",
}


def time_utc(ts: float) -> str:
    """Epoch seconds as ISO-8601 UTC with milliseconds: ``2023-11-15T12:00:00.000Z``."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def recent_requests(
    engine: Engine,
    *,
    limit: int = 200,
    filters: MonitorFilters | None = None,
    include_prompt: bool = False,
    since: float | None = None,
    until: float | None = None,
) -> list[dict]:
    """The newest attempt rows, newest first, as dicts keyed by :data:`RECENT_COLUMNS` (plus
    ``prompt_text`` only when ``include_prompt``).

    Each attempt is a row (``attempt`` numbers them, ``final`` marks the one the caller got), so
    retries and fallbacks are visible. ``time_utc`` is :func:`time_utc` of ``ts``.
    """
    rows = recent_rows(engine, limit=limit, filters=filters, include_prompt=include_prompt, since=since, until=until)
    return [{"time_utc": time_utc(r["ts"]), **r} for r in rows]


def requests_csv(rows: Sequence[Mapping]) -> str:
    """``rows`` (from :func:`recent_requests`) as CSV text with a header row; ``None`` is empty.
    Text cells that a spreadsheet would read as a formula get a leading apostrophe (numbers stay
    numbers)."""
    buf = io.StringIO()
    header = list(rows[0].keys()) if rows else list(RECENT_COLUMNS)
    w = csv.DictWriter(buf, fieldnames=header, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows({k: csv_safe(v) for k, v in row.items()} for row in rows)
    return buf.getvalue()
