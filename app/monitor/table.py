"""The Monitor's request table as an incident tool: which rows match (:class:`RowFilters` on top of
the page's :class:`~db.monitor.MonitorFilters`), where the operator is (:class:`TableCursor`, a
keyset position, never an offset), one page of rows with failures marked first
(:func:`request_page`), and whether the table follows new rows or holds still.

Holding still: an auto-refresh that redraws the grid under the pointer turns a
click on "open" into a click on another row. The table follows the newest rows only on its first
page with no filter of any kind; as soon as the operator pages or filters, it reads up to a fixed
time (:attr:`TableCursor.held_at`) from a fixed anchor row, so re-reading gives the same rows, and
the page re-reads it only on an explicit Refresh. Every decision here is a plain function of its
inputs; the page script only draws and stores the cursor.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Engine

from app.display.fmt import utc_time
from app.monitor.drilldown import request_link
from app.monitor.export import EXPORT_MAX_ROWS, time_utc
from db.monitor import NO_FILTERS, MonitorFilters, error_classes_between
from db.raw_log import RECENT_LOG_COLUMNS, STATUSES, Cursor, RowFilters, count_log_rows, log_page

PAGE_SIZE = 50
COUNT_CAP = 100_000  # "rows 1-50 of more than 100,000 matching": the count's work is bounded
# A gateway key or a session, which no rollup carries, is counted row by row from its index: a
# busy key's hour grows with the traffic, so its count stops sooner ("more than 10,000").
RAW_COUNT_CAP = 10_000
SHORT_ERROR = 80  # characters of the error message shown beside the class
FAILED_MARK = "✖ failed"
OK_MARK = "ok"
ALL = "all"
STATUS_CHOICES = (ALL, *STATUSES)

# Display order: what an operator scans for first, then the rest as stored.
LEAD_COLUMNS = ("status", "time_utc", "error_class", "error", "provider", "model", "open")
_REST = tuple(c for c in RECENT_LOG_COLUMNS if c not in {*LEAD_COLUMNS, "ts"})
TABLE_COLUMNS = (*LEAD_COLUMNS, *_REST)


def parse_row_filters(
    status: str | None, error_classes: Sequence[str] = (), keys: Sequence[str] = (), session_id: str | None = None
) -> RowFilters:
    """The table's filters from the widgets' values; ``ValueError`` with a message for the operator
    (nothing is queried then). The session id is trimmed; empty means "any session"."""
    if status not in (None, *STATUS_CHOICES):
        raise ValueError(f"Status must be one of {', '.join(STATUS_CHOICES)}.")
    if session_id is not None and not isinstance(session_id, str):
        raise ValueError("The session id must be text.")
    sid = (session_id or "").strip() or None
    try:
        return RowFilters(
            status=None if status in (None, ALL) else status,
            error_classes=tuple(error_classes or ()),
            keys=tuple(keys or ()),
            session_id=sid,
        )
    except ValueError as exc:
        raise ValueError(f"Filter refused: {exc}. Fix the value; nothing was searched.") from None


@dataclass(frozen=True)
class TableCursor:
    """Where the table is. ``older_than`` / ``newer_than`` anchor a page on a row's (ts, id);
    neither means the newest page. ``held_at`` is the time the table reads up to while it holds
    still (``None``: it follows new rows). ``query`` is what the position belongs to (window and
    filters); :meth:`for_query` starts over when it changes."""

    query: tuple = ()
    older_than: Cursor | None = None
    newer_than: Cursor | None = None
    held_at: float | None = None

    @property
    def live(self) -> bool:
        return self.held_at is None

    def for_query(self, query: tuple, now: float, *, filtered: bool) -> TableCursor:
        """This cursor if it belongs to ``query``; else the newest page of it, held still when
        ``filtered`` (a filtered table is being read, not watched)."""
        if query == self.query:
            if filtered and self.live:
                return replace(self, held_at=now)
            return self
        return TableCursor(query=query, held_at=now if filtered else None)

    def older(self, page: RequestPage) -> TableCursor:
        if not page.has_older or page.oldest is None:
            return self
        return replace(self, older_than=page.oldest, newer_than=None, held_at=self.held_at or page.until)

    def newer(self, page: RequestPage) -> TableCursor:
        if not page.has_newer or page.newest is None:
            return self
        return replace(self, older_than=None, newer_than=page.newest, held_at=self.held_at or page.until)

    def newest(self, now: float, *, filtered: bool) -> TableCursor:
        """Back to the newest rows; following them again unless a filter is set."""
        return TableCursor(query=self.query, held_at=now if filtered else None)

    def refresh(self, now: float) -> TableCursor:
        """Re-read: the same anchor, up to ``now``."""
        return self if self.live else replace(self, held_at=now)


def table_span(window_s: int | None, span: tuple[float, float] | None, cursor: TableCursor, now: float):
    """``(since, until)`` the table reads: a custom ``span`` as given; a preset window of
    ``window_s`` ending at the held time, or at ``now`` while the table follows new rows."""
    if span is not None:
        return span
    until = cursor.held_at if cursor.held_at is not None else now
    return until - float(window_s or 0), until


def table_refresh_s(cursor: TableCursor, auto_refresh_s: float | None) -> float | None:
    """How often the table re-reads by itself: with the page's auto-refresh while it follows the
    newest rows, never while it holds still."""
    return auto_refresh_s if cursor.live else None


def table_mode(cursor: TableCursor, *, auto_refresh_s: float | None, custom: bool) -> str:
    """What the page says the table is doing."""
    if custom:
        return "A fixed range: the table does not change. Refresh table re-reads it."
    if cursor.live and auto_refresh_s:
        return (
            f"Following the newest rows (re-read every {auto_refresh_s:g} s). Page to older rows or set a "
            "filter and the table holds still while you read it."
        )
    if cursor.held_at is None:
        return "Auto-refresh is paused: the table changes only on Refresh table."
    return (
        f"Held still at {utc_time(cursor.held_at)} UTC while you page or filter (the charts above keep "
        "refreshing). Refresh table re-reads; Newest follows new rows again."
    )


def _short(message: str | None) -> str | None:
    if not message:
        return None
    line = " ".join(message.split())
    return line if len(line) <= SHORT_ERROR else line[: SHORT_ERROR - 1] + "…"


def display_row(row: dict) -> dict:
    """One stored row as the table shows it: a status marker first, then time, error class and a
    one-line error, so a failure reads without scrolling right; the drill-down link; the rest."""
    failed = row["status"] != "ok"
    lead = {
        "status": FAILED_MARK if failed else OK_MARK,
        "time_utc": time_utc(row["ts"]),
        "error_class": row.get("error_class"),
        "error": _short(row.get("error_message")),
        "provider": row["provider"],
        "model": row["model"],
        "open": request_link(row["request_id"]),
    }
    return {**lead, **{c: row.get(c) for c in _REST}}


@dataclass(frozen=True)
class RequestPage:
    """One page of the table. ``first``..``last`` number its rows (1 = newest match) among
    ``total`` matching rows (``total_capped``: more than ``total``)."""

    rows: list[dict]
    first: int
    last: int
    total: int
    total_capped: bool
    has_older: bool
    has_newer: bool
    since: float
    until: float
    newest: Cursor | None = None
    oldest: Cursor | None = None
    stored: list[dict] = field(default_factory=list, repr=False)

    @property
    def total_text(self) -> str:
        return f"more than {self.total:,}" if self.total_capped else f"{self.total:,}"

    @property
    def download_label(self) -> str:
        return f"Download CSV: all {self.total_text} matching rows of the window"

    @property
    def download_help(self) -> str:
        return (
            "Read from the database in batches when you click, newest first, with the filters above "
            f"and the window shown; at most {EXPORT_MAX_ROWS:,} rows. Cells that a spreadsheet would "
            "run as a formula start with an apostrophe."
        )

    @property
    def caption(self) -> str:
        total = f"more than {self.total:,}" if self.total_capped else f"{self.total:,}"
        if not self.rows:
            return f"No rows match ({utc_time(self.since)} to {utc_time(self.until)} UTC)."
        return (
            f"rows {self.first:,}-{self.last:,} of {total} matching, newest first "
            f"({utc_time(self.since)} to {utc_time(self.until)} UTC)"
        )


def request_page(
    engine: Engine,
    *,
    since: float,
    until: float,
    filters: MonitorFilters | None = None,
    rows: RowFilters | None = None,
    cursor: TableCursor | None = None,
    page_size: int = PAGE_SIZE,
    count_cap: int = COUNT_CAP,
) -> RequestPage:
    """The page ``cursor`` points at (the newest page when its anchor no longer has rows on that
    side). Queries: the bounded count (no page read when it is 0), the page (one more row than
    shown, to know whether there are more), and for a page below the first the bounded count of
    matching rows above it."""
    filters = filters or NO_FILTERS
    cursor = cursor or TableCursor()
    if rows is not None and (rows.keys or rows.session_id is not None):
        count_cap = min(count_cap, RAW_COUNT_CAP)
    read: dict[str, Any] = dict(since=since, until=until, filters=filters, rows=rows)
    got: list[dict] = []
    has_older = has_newer = False
    # The count comes from the rollups: when nothing matches, no page read walks the window to
    # find that out (a filter combination that matches nothing would read every candidate row).
    total = count_log_rows(engine, **read, cap=count_cap)
    if total == 0:
        return RequestPage([], 1, 0, 0, False, False, False, since, until)
    if cursor.newer_than is not None:
        got = log_page(engine, **read, newer_than=cursor.newer_than, limit=page_size + 1)
        if len(got) > page_size:
            got, has_newer, has_older = got[1:], True, True
        else:
            got = []  # fewer than a page above the anchor: that is the newest page
    elif cursor.older_than is not None:
        got = log_page(engine, **read, older_than=cursor.older_than, limit=page_size + 1)
        has_newer = bool(got)
    if not got:
        got = log_page(engine, **read, limit=page_size + 1)
        has_newer = False
    if len(got) > page_size:
        got, has_older = got[:page_size], True
    above = 0
    if got and has_newer:
        above = count_log_rows(engine, **read, newer_than=(got[0]["ts"], got[0]["id"]), cap=count_cap)
    capped = total > count_cap
    return RequestPage(
        rows=[display_row(r) for r in got],
        first=above + 1,
        last=above + len(got),
        total=min(total, count_cap),
        total_capped=capped,
        has_older=has_older,
        has_newer=has_newer,
        since=since,
        until=until,
        newest=(got[0]["ts"], got[0]["id"]) if got else None,
        oldest=(got[-1]["ts"], got[-1]["id"]) if got else None,
        stored=got,
    )


def error_class_choices(
    engine: Engine, *, since: float, until: float | None = None, selected: Sequence[str] = ()
) -> list[str]:
    """Error classes seen in the window, plus the selected ones (a choice stays valid when the
    window moves past its last failure)."""
    until = time.time() if until is None else until
    return sorted({*error_classes_between(engine, since=since, until=until), *selected})


def key_choices(engine: Engine, selected: Sequence[str] = ()) -> list[str]:
    """Gateway key names (revoked ones too: their requests are still in the log), plus the selected."""
    from db.keys import list_keys

    return sorted({*(k.name for k in list_keys(engine)), *selected})
