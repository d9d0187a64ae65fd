"""The recent-requests table as the operator sees and downloads it: the newest ``request_log``
rows from :func:`db.monitor.recent_rows` with an ISO-8601 UTC time column first, and as CSV.

The CSV holds text from upstreams and callers (error messages, session ids, prompts), which a
spreadsheet would evaluate if it starts like a formula (``=HYPERLINK(...)``): every text cell goes
through :func:`core.text.csv_safe` on the way out.

A whole window can hold millions of rows, so its export (:func:`csv_chunks`, :func:`csv_file`) is
read in keyset batches and written chunk by chunk, never built as one string or one list of rows."""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import BinaryIO

from sqlalchemy import Engine

from core.text import csv_safe
from db.monitor import MonitorFilters
from db.raw_log import RECENT_LOG_COLUMNS, RowFilters, iter_log_rows, recent_rows

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


EXPORT_BATCH_ROWS = 5000
EXPORT_MAX_ROWS = 2_000_000  # a bound on one download (about 1 GB of CSV at most); the page says so


def _csv_text(rows: Iterable[Mapping], header: Sequence[str], *, with_header: bool = False) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(header), extrasaction="ignore", lineterminator="\n")
    if with_header:
        w.writeheader()
    w.writerows({k: csv_safe(v) for k, v in row.items()} for row in rows)
    return buf.getvalue()


def csv_chunks(
    engine: Engine,
    *,
    since: float,
    until: float,
    filters: MonitorFilters | None = None,
    rows: RowFilters | None = None,
    batch_rows: int = EXPORT_BATCH_ROWS,
    max_rows: int = EXPORT_MAX_ROWS,
) -> Iterator[str]:
    """The window's matching rows as CSV text, newest first, one chunk per batch of
    ``batch_rows`` (the header is the first chunk): the columns of :data:`RECENT_COLUMNS`, stored
    values (``status`` is ok or error), every text cell formula-safe."""
    header = list(RECENT_COLUMNS)
    yield _csv_text((), header, with_header=True)
    for batch in iter_log_rows(
        engine, since=since, until=until, filters=filters, rows=rows, batch=batch_rows, max_rows=max_rows
    ):
        yield _csv_text(({"time_utc": time_utc(r["ts"]), **r} for r in batch), header)


def csv_file(chunks: Iterable[str]) -> BinaryIO:
    """``chunks`` written one by one to a temporary file, UTF-8 with a byte-order mark (spreadsheets
    then read any script right), returned open for reading from the start. The file has no name
    left on disk (it is unlinked once open) and goes when the returned file is closed. The rows are
    read and written a batch at a time, never held as one list or one string; note that Streamlit
    1.67's download button then reads the finished file into its media store to serve it (it takes
    no generator). Text that cannot be encoded (a lone surrogate) is written as "?"."""
    with tempfile.NamedTemporaryFile("wb", suffix=".csv", delete=False) as out:
        try:
            out.write("\ufeff".encode())
            for chunk in chunks:
                out.write(chunk.encode("utf-8", errors="replace"))
        except BaseException:
            os.unlink(out.name)
            raise
    # A plain buffered reader: what st.download_button accepts from a deferred callable.
    reader = open(out.name, "rb")
    os.unlink(out.name)
    return reader


def window_download(
    engine: Engine,
    *,
    since: float,
    until: float,
    filters: MonitorFilters | None = None,
    rows: RowFilters | None = None,
) -> Callable[[], BinaryIO]:
    """What the page hands ``st.download_button(data=...)``: a callable Streamlit runs only when the
    operator clicks (on its own thread), producing the window's CSV through :func:`csv_chunks`."""
    return partial(_window_file, engine, since, until, filters, rows)


def _window_file(engine: Engine, since: float, until: float, filters, rows) -> BinaryIO:
    return csv_file(csv_chunks(engine, since=since, until=until, filters=filters, rows=rows))
