"""The Monitor's request table (issue 17, points 7 and 8) on SQLite and PostgreSQL: every filter in
SQL, keyset pages that stay put while new rows arrive, the bounded count, the streamed CSV export
(chunks, formula neutralisation, hostile Unicode) and the follow / hold-still decisions."""

from __future__ import annotations

import csv
import io
import itertools
from pathlib import Path

import pytest
from sqlalchemy import text

from app import monitor as m
from app.monitor.table import display_row
from core.records import AttemptRecord
from db import raw_log
from db.requests import insert_batch

T0 = 1_700_006_400 + 12 * 3600
_ids = itertools.count()


def rec(
    ts: float,
    *,
    ok: bool = True,
    provider: str = "alpha",
    model: str = "m1",
    error_class: str | None = None,
    error_message: str | None = None,
    key_name: str | None = None,
    session_id: str | None = None,
    rid: str | None = None,
) -> AttemptRecord:
    return AttemptRecord(
        request_id=rid or f"r{next(_ids)}",
        attempt=1,
        ts=ts,
        provider=provider,
        model=model,
        requested_model="auto",
        intent="general",
        side="primary",
        status="ok" if ok else "error",
        latency_ms=100.0,
        http_status=200 if ok else 503,
        error_class=None if ok else (error_class or "server_error"),
        error_message=None if ok else (error_message or "upstream unavailable"),
        source="api",
        key_name=key_name,
        session_id=session_id,
    )


def ids(page_or_rows) -> list[str]:
    rows = page_or_rows.rows if isinstance(page_or_rows, m.RequestPage) else page_or_rows
    return [r["request_id"] for r in rows]


WINDOW = dict(since=T0 - 3600, until=T0 + 3600)


@pytest.fixture
def mixed(engine):
    """Ten rows a second apart, newest last: a mix of providers, models, failures, keys and sessions."""
    rows = [
        rec(T0 + 0, rid="ok-alpha"),
        rec(T0 + 1, rid="err-timeout", ok=False, error_class="timeout"),
        rec(T0 + 2, rid="err-beta", ok=False, provider="beta", error_class="server_error"),
        rec(T0 + 3, rid="ok-beta-m2", provider="beta", model="m2"),
        rec(T0 + 4, rid="keyed", key_name="team-a"),
        rec(T0 + 5, rid="keyed-err", key_name="team-a", ok=False, error_class="rate_limited"),
        rec(T0 + 6, rid="korean", session_id="세션-1"),
        rec(T0 + 7, rid="quote", session_id="x' OR '1'='1"),
        rec(T0 + 8, rid="other-key", key_name="team-b"),
        rec(T0 + 9, rid="old-window", session_id="세션-1"),
    ]
    insert_batch(engine, rows)
    return engine


@pytest.mark.parametrize(
    ("filters", "rows", "expected"),
    [
        (None, m.RowFilters(status="error"), ["keyed-err", "err-beta", "err-timeout"]),
        (
            None,
            m.RowFilters(status="ok"),
            ["old-window", "other-key", "quote", "korean", "keyed", "ok-beta-m2", "ok-alpha"],
        ),
        (None, m.RowFilters(error_classes=("timeout", "rate_limited")), ["keyed-err", "err-timeout"]),
        (m.MonitorFilters(providers=["beta"]), None, ["ok-beta-m2", "err-beta"]),
        (m.MonitorFilters(models=["m2"]), None, ["ok-beta-m2"]),
        (None, m.RowFilters(keys=("team-a",)), ["keyed-err", "keyed"]),
        (None, m.RowFilters(session_id="세션-1"), ["old-window", "korean"]),
        # A session id that reads like SQL is a value, not SQL: it finds its own row only.
        (None, m.RowFilters(session_id="x' OR '1'='1"), ["quote"]),
        (None, m.RowFilters(session_id="nobody"), []),
        (m.MonitorFilters(providers=["alpha"]), m.RowFilters(status="error", keys=("team-a",)), ["keyed-err"]),
    ],
)
def test_every_filter_narrows_the_rows_in_sql(mixed, filters, rows, expected):
    page = m.request_page(mixed, **WINDOW, filters=filters, rows=rows)
    assert ids(page) == expected
    assert page.total == len(expected) and not page.total_capped
    assert raw_log.count_log_rows(mixed, **WINDOW, filters=filters, rows=rows) == len(expected)


def test_the_window_bounds_rows_and_count(mixed):
    page = m.request_page(mixed, since=T0 + 2, until=T0 + 5)
    assert ids(page) == ["keyed-err", "keyed", "ok-beta-m2", "err-beta"]
    assert page.caption.startswith("rows 1-4 of 4 matching")


def test_failed_rows_are_marked_with_class_and_a_short_error_first(engine):
    long = "upstream said:\n" + "x" * 300
    insert_batch(engine, [rec(T0, rid="bad", ok=False, error_class="server_error", error_message=long), rec(T0 + 1)])
    page = m.request_page(engine, **WINDOW)
    assert list(page.rows[0])[:7] == list(m.TABLE_COLUMNS[:7])
    assert list(page.rows[0]) == list(m.TABLE_COLUMNS)
    failed = page.rows[1]
    assert failed["status"] == m.FAILED_MARK and page.rows[0]["status"] == "ok"
    assert failed["error_class"] == "server_error"
    assert "\n" not in failed["error"] and len(failed["error"]) <= 80 and failed["error"].endswith("…")
    assert failed["error_message"].startswith("upstream said:")  # the whole message is still there
    assert failed["open"] == "/request?id=bad"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"status": "broken"}, "Status must be"),
        ({"session_id": "a\x00b"}, "NUL"),
        ({"session_id": "s" * 129}, "1 to 128"),
        ({"session_id": "bad\ud800"}, "lone surrogate"),
        ({"session_id": 12}, "must be text"),
    ],
)
def test_bad_filter_values_are_refused_with_a_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        m.parse_row_filters(kwargs.pop("status", "all"), **kwargs)


def test_filter_values_are_normalised():
    f = m.parse_row_filters("error", ["b", "a", "b"], ["k"], "  세션 ")
    assert f == m.RowFilters(status="error", error_classes=("a", "b"), keys=("k",), session_id="세션")
    assert m.parse_row_filters("all", session_id="   ") == m.RowFilters() and not m.RowFilters().active


def _fill(engine, start: float, n: int, prefix: str) -> None:
    # Two rows share each timestamp, so the id breaks ties: a keyset on ts alone would skip rows.
    insert_batch(engine, [rec(start + k // 2, rid=f"{prefix}{k:03d}", ok=k % 3 != 0) for k in range(n)])


def test_keyset_pages_stay_put_while_new_rows_arrive(engine):
    _fill(engine, T0, 120, "a")
    cursor = m.TableCursor().for_query(("q",), T0 + 100, filtered=False)
    first = m.request_page(engine, since=T0 - 60, until=T0 + 100, cursor=cursor)
    assert ids(first) == [f"a{k:03d}" for k in range(119, 69, -1)] and first.caption.startswith("rows 1-50 of 120")
    cursor = cursor.older(first)
    assert not cursor.live  # paging holds the table still
    second = m.request_page(engine, since=T0 - 60, until=cursor.held_at, cursor=cursor)
    assert ids(second) == [f"a{k:03d}" for k in range(69, 19, -1)]
    assert (second.first, second.last, second.has_newer, second.has_older) == (51, 100, True, True)
    # Thirty newer rows arrive between page loads: the held page is the same page, same numbers.
    _fill(engine, T0 + 101, 30, "b")
    again = m.request_page(engine, since=T0 - 60, until=cursor.held_at, cursor=cursor)
    assert ids(again) == ids(second) and again.caption == second.caption
    # Even without the held end, the anchor keeps the incident's rows where they were.
    unheld = m.request_page(engine, since=T0 - 60, until=T0 + 200, cursor=cursor)
    assert ids(unheld) == ids(second) and unheld.first == 81 and unheld.total == 150
    third = m.request_page(engine, since=T0 - 60, until=cursor.held_at, cursor=cursor.older(second))
    assert ids(third) == [f"a{k:03d}" for k in range(19, -1, -1)] and not third.has_older
    back = m.request_page(engine, since=T0 - 60, until=cursor.held_at, cursor=cursor.older(second).newer(third))
    assert ids(back) == ids(second)
    top = m.request_page(engine, since=T0 - 60, until=cursor.held_at, cursor=cursor.newer(second))
    assert ids(top) == ids(first) and not top.has_newer and top.first == 1


def test_paging_failed_rows_only(engine):
    _fill(engine, T0, 120, "a")  # every third row failed: 40
    rows = m.RowFilters(status="error")
    first = m.request_page(engine, **WINDOW, rows=rows, page_size=15)
    second = m.request_page(engine, **WINDOW, rows=rows, page_size=15, cursor=m.TableCursor().older(first))
    assert all(r["status"] == m.FAILED_MARK for r in first.rows + second.rows)
    assert len(set(ids(first)) | set(ids(second))) == 30 and second.caption.startswith("rows 16-30 of 40 matching")


def test_the_count_is_bounded(engine):
    _fill(engine, T0, 25, "a")
    page = m.request_page(engine, **WINDOW, page_size=5, count_cap=10)
    assert page.total_capped and page.total == 10
    assert "of more than 10 matching" in page.caption and "more than 10" in page.download_label
    assert raw_log.count_log_rows(engine, **WINDOW, cap=10) == 11


def test_a_key_filter_is_counted_to_a_lower_cap(engine, monkeypatch):
    """No rollup carries the gateway key, so its count walks the key's rows: it stops at
    RAW_COUNT_CAP, below the rollup-counted filters' cap, and the page says "more than"."""
    monkeypatch.setattr("app.monitor.table.RAW_COUNT_CAP", 8)
    insert_batch(engine, [rec(T0 + k, rid=f"k{k:03d}", key_name="team-a") for k in range(25)])
    keyed = m.request_page(engine, **WINDOW, rows=m.RowFilters(keys=("team-a",)), page_size=5)
    assert keyed.total_capped and keyed.total == 8 and "of more than 8 matching" in keyed.caption
    assert ids(keyed) == [f"k{k:03d}" for k in range(24, 19, -1)]
    plain = m.request_page(engine, **WINDOW, page_size=5)  # counted from the rollups: exact
    assert plain.total == 25 and not plain.total_capped


def test_the_failed_rows_filter_reads_the_partial_index(sqlite_url):
    from sqlalchemy.dialects import sqlite

    from db.engine import get_engine

    engine = get_engine(sqlite_url)
    log = raw_log.RequestLog.__table__
    q = (
        raw_log.select(log.c.id)
        .where(*raw_log._row_conds(T0, T0 + 60, None, m.RowFilters(status="error")))
        .order_by(log.c.ts.desc(), log.c.id.desc())
    )
    sql = str(q.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        plan = " ".join(str(r[-1]) for r in conn.execute(text("EXPLAIN QUERY PLAN " + sql)))
    assert "ix_request_log_failed_ts" in plan


# -- CSV export ------------------------------------------------------------------------------------


def _parse(chunks) -> list[dict]:
    return list(csv.DictReader(io.StringIO("".join(chunks))))


def test_export_is_streamed_in_chunks_of_the_whole_window(engine):
    _fill(engine, T0, 20, "a")
    insert_batch(engine, [rec(T0 - 7200, rid="outside")])
    chunks = list(m.csv_chunks(engine, **WINDOW, batch_rows=7))
    assert len(chunks) == 4  # the header, then 7 + 7 + 6 rows
    assert chunks[0].rstrip("\n").split(",") == list(m.RECENT_COLUMNS)
    assert [c.count("\n") for c in chunks[1:]] == [7, 7, 6]
    parsed = _parse(chunks)
    assert [r["request_id"] for r in parsed] == [f"a{k:03d}" for k in range(19, -1, -1)]
    assert {r["status"] for r in parsed} == {"ok", "error"} and parsed[0]["time_utc"].endswith("Z")
    failed = _parse(m.csv_chunks(engine, **WINDOW, rows=m.RowFilters(status="error"), batch_rows=3))
    assert len(failed) == 7 and {r["status"] for r in failed} == {"error"}
    assert len(_parse(m.csv_chunks(engine, **WINDOW, max_rows=5, batch_rows=2))) == 5


def test_export_neutralises_formulas_and_keeps_hostile_unicode(engine):
    hostile = {
        "eq": '=HYPERLINK("http://evil","x")',
        "plus": "+1+2",
        "minus": "-2+3",
        "at": "@SUM(A1)",
        "rtl": "\u202egnp.exe",
        "korean": "세션 🙂 e\u0301",
    }
    insert_batch(
        engine,
        [
            rec(T0 + k, rid=name, ok=False, error_message=value, session_id=value[:128])
            for k, (name, value) in enumerate(hostile.items())
        ],
    )
    file = m.window_download(engine, **WINDOW)()
    data = file.read()
    assert data.startswith("\ufeff".encode())
    rows = {r["request_id"]: r for r in csv.DictReader(io.StringIO(data.decode("utf-8-sig")))}
    for name in ("eq", "plus", "minus", "at"):
        assert rows[name]["error_message"] == "'" + hostile[name]
        assert rows[name]["session_id"] == "'" + hostile[name]
    assert rows["rtl"]["error_message"] == hostile["rtl"] and rows["korean"]["session_id"] == hostile["korean"]
    assert rows["eq"]["latency_ms"] == "100.0" and rows["eq"]["http_status"] == "503"  # numbers stay numbers
    # Text the database could never hold still cannot break the file: a lone surrogate becomes "?".
    assert m.csv_file(["a,\ud800\n"]).read().decode("utf-8-sig") == "a,?\n"


def test_export_file_is_an_unlinked_temporary_file_streamlit_accepts(tmp_path):
    from streamlit.runtime.download_data_util import convert_data_to_bytes_and_infer_mime

    f = m.csv_file("x" * 1000 + "\n" for _ in range(50))
    assert isinstance(f, io.BufferedReader) and not Path(f.name).exists()
    data, _ = convert_data_to_bytes_and_infer_mime(f, unsupported_error=AssertionError("refused"))
    assert data.count(b"\n") == 50 and data.startswith(b"\xef\xbb\xbf")
    f.close()


def test_error_class_and_key_choices(mixed):
    assert m.error_class_choices(mixed, **WINDOW) == ["rate_limited", "server_error", "timeout"]
    assert m.error_class_choices(mixed, since=T0 + 3, until=T0 + 9, selected=["gone"]) == ["gone", "rate_limited"]


# -- follow or hold still --------------------------------------------------------------------------


def test_the_table_follows_new_rows_only_on_its_first_unfiltered_page():
    live = m.TableCursor().for_query(("1h",), 100.0, filtered=False)
    assert (
        live.live
        and m.table_refresh_s(live, 5) == 5
        and "Following the newest rows" in m.table_mode(live, auto_refresh_s=5, custom=False)
    )
    held = live.for_query(("1h", "error"), 200.0, filtered=True)
    assert held.held_at == 200.0 and m.table_refresh_s(held, 5) is None
    assert "Held still at" in m.table_mode(held, auto_refresh_s=5, custom=False)
    assert held.for_query(("1h", "error"), 300.0, filtered=True) is held  # reruns do not move it
    assert held.refresh(400.0).held_at == 400.0 and live.refresh(400.0) is live
    assert held.newest(500.0, filtered=True).held_at == 500.0
    assert held.newest(500.0, filtered=False).live
    assert "paused" in m.table_mode(live, auto_refresh_s=None, custom=False)
    assert "fixed range" in m.table_mode(live, auto_refresh_s=None, custom=True)


def test_paging_holds_the_table_at_the_time_it_was_read(engine):
    _fill(engine, T0, 60, "a")
    live = m.TableCursor().for_query(("1h",), T0 + 30, filtered=False)
    page = m.table_view(engine, window="1h", cursor=live, now=T0 + 30)
    older = live.older(page)
    assert older.held_at == page.until and m.table_refresh_s(older, 5) is None
    assert older.older_than == (page.rows[-1] and page.oldest)
    later = m.table_view(engine, window="1h", cursor=older, now=T0 + 3000)
    assert later.until == page.until  # the held window does not slide with the clock
    assert live.older(m.request_page(engine, since=0, until=1)) == live  # nothing older: stay


def test_display_row_of_an_ok_row_has_no_error():
    row = {c: None for c in raw_log.RECENT_LOG_COLUMNS} | {
        "status": "ok",
        "ts": T0,
        "provider": "p",
        "model": "m",
        "request_id": "r",
    }
    shown = display_row(row)
    assert shown["status"] == "ok" and shown["error"] is None and shown["time_utc"] == "2023-11-15T12:00:00.000Z"
