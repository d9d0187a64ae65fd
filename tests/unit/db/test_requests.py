"""Idempotent request-log inserts (issue 7): unique (request_id, attempt), a replayed or retried
batch writes nothing twice and its rollups count each attempt once; migration 0004 removes the
duplicates older versions wrote and takes their counts back out of the rollups.
"""

from __future__ import annotations

import json

from alembic import command
from sqlalchemy import MetaData, Table, func, inspect, select, text
from sqlalchemy.dialects import sqlite

from app.monitor import csv_chunks, recent_requests, table_view
from app.monitor.drilldown import load_story
from app.telemetry.journal import Journal
from app.telemetry.writer import TelemetryWriter
from core.records import FIELD_NAMES, FINISH_REASON_MAX, AttemptRecord
from db.drilldown import forget_columns, request_attempts
from db.engine import create_db_engine
from db.migrate import alembic_config, upgrade
from db.models import ROLLUP_KEY, ROLLUP_TABLES, RequestLog
from db.monitor import MonitorFilters, api_sums
from db.requests import count_rows, insert_batch, rollup_deltas
from tests.support.records import attempt as attempt_record


def rec(i: int, attempt: int = 1, **kw) -> AttemptRecord:
    fields = {"request_id": f"r{i:06d}", "attempt": attempt, "ts": 1_700_000_000.0 + i, "latency_ms": 12.5 + i}
    return attempt_record(**{**fields, "prompt_tokens": 10, "completion_tokens": 5, **kw})


def rollup_attempts(engine) -> dict[int, int]:
    out = {}
    with engine.connect() as conn:
        for span, model in ROLLUP_TABLES.items():
            out[span] = int(conn.execute(select(func.coalesce(func.sum(model.attempts), 0))).scalar_one())
    return out


def test_a_replayed_batch_writes_no_row_or_count_twice(engine) -> None:
    first = [rec(i) for i in range(10)]
    assert insert_batch(engine, first) == 10
    # The same batch again (a retry after commit), then one overlapping it with new attempts.
    assert insert_batch(engine, first) == 0
    mixed = first[5:] + [rec(i, attempt=2) for i in range(5)] + [rec(i) for i in range(10, 13)]
    assert insert_batch(engine, mixed) == 8
    assert count_rows(engine) == 18
    assert rollup_attempts(engine) == {60: 18, 300: 18, 3600: 18}
    with engine.connect() as conn:
        pairs = conn.execute(select(RequestLog.request_id, RequestLog.attempt)).all()
    assert len(pairs) == len(set(pairs)) == 18


def test_duplicates_inside_one_batch_are_written_once(engine) -> None:
    r = rec(1)
    assert insert_batch(engine, [r, r, rec(2), r]) == 2
    assert count_rows(engine) == 2
    assert rollup_attempts(engine)[60] == 2


# What migration 0008 added: absent from the log and the rollups before it.
# (0008: api .. reasoning_tokens; 0010: adjusted_params; 0015: the route fields; 0020: answer quality)
LATER_FIELDS = ("api", "finish_reason", "tool_calls", "reasoning_tokens", "adjusted_params", "route", "deployment",
                "route_why", "refused", "tool_json_bad", "schema_bad", "chunk_gap_ms")  # fmt: skip
LATER_COUNTERS = ("reasoning_tokens", "tool_calls", "responses_requests", "embeddings_requests", "completions_requests")


def _old_deltas(deltas: list[dict]) -> list[dict]:
    return [{k: v for k, v in d.items() if k not in LATER_COUNTERS and k != "route"} for d in deltas]


def _old_upsert(conn, name: str):
    """The rollup upsert on the table as the database has it (before migration 0008)."""
    table = Table(name, MetaData(), autoload_with=conn)
    stmt = sqlite.insert(table)
    counters = [c.name for c in table.c if c.name not in ROLLUP_KEY]
    key = [k for k in ROLLUP_KEY if k != "route"]  # route arrives with 0016
    return stmt.on_conflict_do_update(index_elements=key, set_={c: table.c[c] + stmt.excluded[c] for c in counters})


def test_migration_0004_removes_old_duplicates_and_their_rollup_counts(tmp_path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'old.db'}")
    upgrade(engine, "0003")
    # What the old writer did on a retried batch: the rows and their rollups, twice.
    records = [rec(i) for i in range(6)]
    batches = [records, records[:4], records[:1]]
    # The log's columns at revision 0003 (key_name arrives with 0005, answer_text with 0007, the
    # API fields with 0008), and the rollup counters it had (0008 adds some).
    later = {"key_name", "answer_text", *LATER_FIELDS}
    old = [i for i, name in enumerate(FIELD_NAMES) if name not in later]
    cols = ", ".join(FIELD_NAMES[i] for i in old)
    with engine.begin() as conn:
        for batch in batches:
            conn.exec_driver_sql(
                f"INSERT INTO request_log ({cols}) VALUES ({', '.join('?' * len(old))})",
                [tuple(r.to_tuple()[i] for i in old) for r in batch],
            )
            for span, model in ROLLUP_TABLES.items():
                conn.execute(_old_upsert(conn, model.__tablename__), _old_deltas(rollup_deltas(batch, span)))
    assert count_rows(engine) == 11
    assert rollup_attempts(engine) == {60: 11, 300: 11, 3600: 11}

    upgrade(engine)

    assert count_rows(engine) == 6
    assert rollup_attempts(engine) == {60: 6, 300: 6, 3600: 6}
    with engine.connect() as conn:
        kept = conn.execute(text("SELECT request_id, id FROM request_log ORDER BY id")).all()
        tokens = conn.execute(text("SELECT SUM(prompt_tokens), SUM(latency_sum_ms) FROM request_rollup")).one()
    assert [k[0] for k in kept] == [r.request_id for r in records]
    assert [k[1] for k in kept] == list(range(1, 7))  # the lowest id of each pair was kept
    assert tokens[0] == 60
    assert abs(tokens[1] - sum(r.latency_ms for r in records)) < 1e-9
    # And from now on the database itself refuses a duplicate.
    assert insert_batch(engine, records) == 0
    engine.dispose()


# -- log api fields --------------------------------------------------------------------------------
# The request log records what the whole OpenAI surface does (migration 0008): which API a request
# used, its finish reason, tool calls and reasoning tokens travel from the attempt record through the
# writer (and the journal, old lines included) into ``request_log`` and the rollups, and back out
# through the Monitor's recent-requests table and the request drill-down.


T0 = 1_700_000_040.0  # whole minute + 40 s: every record below falls in one minute bucket
NEW_LOG_COLUMNS = {"api", "finish_reason", "tool_calls", "reasoning_tokens"}
NEW_ROLLUP_COLUMNS = {
    "reasoning_tokens",
    "tool_calls",
    "responses_requests",
    "embeddings_requests",
    "completions_requests",
}


def rec_log_api_fields(rid: str, attempt: int = 1, **kw) -> AttemptRecord:
    base = dict(
        request_id=rid,
        attempt=attempt,
        ts=T0 + attempt,
        provider="holysheep",
        model="gpt-4.1",
        requested_model="auto",
        intent="general",
        side="primary",
        status="ok",
        latency_ms=20.0,
        prompt_tokens=10,
        completion_tokens=30,
        cost_usd=0.001,
    )
    base.update(kw)
    return AttemptRecord(**base)


RECORDS = [
    rec_log_api_fields("chat-1", finish_reason="tool_calls", tool_calls=2),
    rec_log_api_fields("resp-1", api="responses", finish_reason="stop", reasoning_tokens=12),
    # A failed first attempt of an embeddings request: counted as an attempt, not as a request.
    rec_log_api_fields("emb-1", api="embeddings", status="error", final=False, completion_tokens=0, prompt_tokens=0),
    rec_log_api_fields("emb-1", attempt=2, api="embeddings", prompt_tokens=64, completion_tokens=0),
    rec_log_api_fields("cmp-1", api="completions", finish_reason="length", completion_tokens=16),
]


def write_through_writer(engine, records) -> None:
    w = TelemetryWriter(lambda batch: insert_batch(engine, batch), flush_interval_s=0.01)
    try:
        w.submit_many(records)
        assert w.drain(timeout=30)
    finally:
        w.close()


def log_rows(engine) -> dict[tuple[str, int], dict]:
    log = RequestLog.__table__
    q = select(log.c.request_id, log.c.attempt, *(log.c[c] for c in sorted(NEW_LOG_COLUMNS)))
    with engine.connect() as conn:
        return {(r["request_id"], r["attempt"]): dict(r) for r in conn.execute(q).mappings()}


def rollup_sums(engine, span: int) -> dict[str, int]:
    table = ROLLUP_TABLES[span].__table__  # type: ignore[attr-defined]
    cols = sorted(NEW_ROLLUP_COLUMNS | {"requests", "attempts"})
    with engine.connect() as conn:
        row = conn.execute(select(*(text(f"COALESCE(SUM({c}), 0)") for c in cols)).select_from(table)).one()
    return dict(zip(cols, (int(v) for v in row), strict=True))


# -- write side ------------------------------------------------------------------------------------


def test_new_fields_default_so_older_callers_and_positional_order_keep_working() -> None:
    r = AttemptRecord("r", 1, T0, "p", "m", "auto", "general", "primary", "ok", 1.0)
    assert (r.api, r.finish_reason, r.tool_calls, r.reasoning_tokens) == ("chat", None, 0, 0)
    # then adjusted_params (0010), the route fields (0015), the answer's quality (0020)
    assert r.to_tuple()[-12:] == ("chat", None, 0, 0, None, None, None, None, False, 0, None, None)


def test_records_round_trip_through_the_writer_with_their_api_fields(engine) -> None:
    write_through_writer(engine, RECORDS)
    rows = log_rows(engine)
    assert len(rows) == len(RECORDS)
    for r in RECORDS:
        got = rows[(r.request_id, r.attempt)]
        assert (got["api"], got["finish_reason"], got["tool_calls"], got["reasoning_tokens"]) == (
            r.api,
            r.finish_reason,
            r.tool_calls,
            r.reasoning_tokens,
        )


def test_rollups_sum_reasoning_tokens_tool_calls_and_final_requests_per_api(engine) -> None:
    write_through_writer(engine, RECORDS)
    expected = {
        "attempts": 5,
        "requests": 4,
        "reasoning_tokens": 12,
        "tool_calls": 2,
        "responses_requests": 1,
        "embeddings_requests": 1,  # the failed non-final attempt is not a request
        "completions_requests": 1,
    }
    for span in ROLLUP_TABLES:
        assert rollup_sums(engine, span) == expected, span
    # Replaying the same batch (a retried write) changes nothing.
    write_through_writer(engine, RECORDS)
    assert rollup_sums(engine, 60) == expected


def test_an_overlong_finish_reason_is_cut_to_its_column_not_rejected(engine) -> None:
    long = "content_filter_" + "x" * 200
    write_through_writer(engine, [rec_log_api_fields("long-1", finish_reason=long)])
    assert log_rows(engine)[("long-1", 1)]["finish_reason"] == long[:FINISH_REASON_MAX]


def test_a_journal_line_written_before_the_api_fields_replays_with_their_defaults(engine, tmp_path) -> None:
    # Exactly what the previous version's writer spilled: no api, finish_reason, tool_calls,
    # reasoning_tokens keys.
    old_line = {
        "request_id": "old-1",
        "attempt": 1,
        "ts": T0,
        "provider": "direct",
        "model": "gpt-4.1",
        "requested_model": "auto",
        "intent": "general",
        "side": "fallback",
        "status": "ok",
        "latency_ms": 15.5,
        "http_status": 200,
        "error_class": None,
        "error_message": None,
        "ttft_ms": None,
        "prompt_tokens": 7,
        "cached_tokens": 0,
        "completion_tokens": 9,
        "cost_usd": 0.0002,
        "fallback": True,
        "final": True,
        "substituted": False,
        "stream": False,
        "source": "api",
        "session_id": None,
        "prompt_text": None,
        "key_name": "team-a",
        "answer_text": None,
    }
    journal_dir = tmp_path / "journal"
    journal_dir.mkdir()
    (journal_dir / "segment-000001.jsonl").write_text(json.dumps(old_line) + "\n")
    journal = Journal(journal_dir)
    assert journal.pending == 1
    w = TelemetryWriter(lambda batch: insert_batch(engine, batch), flush_interval_s=0.01, journal=journal)
    try:
        assert w.drain(timeout=30)
        assert w.stats().rejected == 0
    finally:
        w.close()
    got = log_rows(engine)[("old-1", 1)]
    assert (got["api"], got["finish_reason"], got["tool_calls"], got["reasoning_tokens"]) == ("chat", None, 0, 0)


def test_the_minute_rollup_gives_requests_per_api_and_reasoning_tokens(engine) -> None:
    write_through_writer(engine, [*RECORDS, rec_log_api_fields("chat-2", provider="direct", reasoning_tokens=5)])
    sums = api_sums(engine, since=T0 - 60, until=T0 + 60)
    assert sums.requests == {"chat": 2, "responses": 1, "embeddings": 1, "completions": 1}
    assert (sums.reasoning_tokens, sums.tool_calls) == (17, 2)
    direct = api_sums(engine, since=T0 - 60, until=T0 + 60, filters=MonitorFilters(providers=("direct",)))
    assert direct.requests == {"chat": 1, "responses": 0, "embeddings": 0, "completions": 0}
    assert direct.reasoning_tokens == 5
    assert api_sums(engine, since=T0 + 3600, until=T0 + 7200).requests["chat"] == 0


# -- migration -------------------------------------------------------------------------------------


def _columns(engine, table: str) -> set[str]:
    return {c["name"] for c in inspect(engine).get_columns(table)}


def _downgrade(engine, revision: str) -> None:
    with engine.begin() as conn:
        cfg = alembic_config(engine)
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def test_migration_0008_upgrades_old_rows_to_chat_and_downgrades_cleanly(empty_db_url: str) -> None:
    engine = create_db_engine(empty_db_url)
    try:
        upgrade(engine, "0007")
        assert not NEW_LOG_COLUMNS & _columns(engine, "request_log")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO request_log (request_id, attempt, ts, provider, model, requested_model, intent, "
                    "side, status, latency_ms, prompt_tokens, cached_tokens, completion_tokens, cost_usd, "
                    "fallback, final, substituted, stream, source) VALUES ('before', 1, :ts, 'direct', 'gpt-4.1', "
                    "'auto', 'general', 'primary', 'ok', 5.0, 1, 0, 2, 0.0, false, true, false, false, 'api')"
                ),
                {"ts": T0},
            )

        upgrade(engine, "0008")
        assert NEW_LOG_COLUMNS <= _columns(engine, "request_log")
        for model in ROLLUP_TABLES.values():
            assert NEW_ROLLUP_COLUMNS <= _columns(engine, model.__tablename__)
        before = log_rows(engine)[("before", 1)]
        assert (before["api"], before["finish_reason"], before["tool_calls"], before["reasoning_tokens"]) == (
            "chat",
            None,
            0,
            0,
        )
        upgrade(engine, "head")  # the writer writes today's columns (0010 adds adjusted_params)
        assert insert_batch(engine, [rec_log_api_fields("after", api="responses", reasoning_tokens=3)]) == 1
        assert rollup_sums(engine, 60)["reasoning_tokens"] == 3

        _downgrade(engine, "0007")
        assert not NEW_LOG_COLUMNS & _columns(engine, "request_log")
        for model in ROLLUP_TABLES.values():
            assert not NEW_ROLLUP_COLUMNS & _columns(engine, model.__tablename__)
        with engine.connect() as conn:
            kept = conn.execute(text("SELECT request_id FROM request_log ORDER BY request_id")).scalars().all()
        assert kept == ["after", "before"]  # rows survive the downgrade, only the new columns go

        upgrade(engine)  # and up again to head
        assert log_rows(engine)[("after", 1)]["api"] == "chat"  # the dropped value is gone, default back
    finally:
        engine.dispose()


def _cells(engine, table: str, cols: tuple[str, ...]) -> list[tuple]:
    with engine.connect() as conn:
        return sorted(tuple(r) for r in conn.execute(text(f"SELECT {', '.join(cols)} FROM {table}")))


def test_migration_0016_keys_the_rollups_by_route_and_downgrades_by_folding(empty_db_url: str) -> None:
    from db.partitions import KEEPER

    engine = create_db_engine(empty_db_url)
    KEEPER.forget()
    try:
        upgrade(engine, "0015")
        # A cell the writer wrote before the migration: every counter column, 3 attempts.
        table = Table("request_rollup", MetaData(), autoload_with=engine)
        key = {"minute": 1_700_000_040, "provider": "holysheep", "model": "gemini-2.5-flash", "intent": "general",
               "source": "api", "side": "primary"}  # fmt: skip
        with engine.begin() as conn:
            conn.execute(table.insert(), {**{c.name: 0 for c in table.c}, **key, "attempts": 3, "requests": 3})
        upgrade(engine)
        assert "route" in _columns(engine, "request_rollup")
        assert _cells(engine, "request_rollup", ("route", "attempts")) == [("", 3)]
        # The same provider, model and minute on a route is a cell of its own; without one, the old cell.
        failed = {"status": "error", "error_class": "server_error"}
        routed = {"route": "gpt-4.1", "deployment": "holysheep/gemini-2.5-flash"}
        insert_batch(engine, [rec(40 + i, ts=T0 + i, **routed, **failed) for i in range(2)] + [rec(50, ts=T0 + 5)])
        assert _cells(engine, "request_rollup", ("route", "attempts")) == [("", 4), ("gpt-4.1", 2)]
        assert _cells(engine, "request_error_rollup", ("route", "attempts")) == [("gpt-4.1", 2)]

        _downgrade(engine, "0015")
        for name in ("request_rollup", "request_rollup_1h", "request_error_rollup", "request_substitution_rollup"):
            assert "route" not in _columns(engine, name)
        assert _cells(engine, "request_rollup", ("attempts", "errors")) == [(6, 2)]  # folded, nothing lost
        assert _cells(engine, "request_error_rollup", ("attempts",)) == [(2,)]
        upgrade(engine)
        assert _cells(engine, "request_rollup", ("route", "attempts")) == [("", 6)]
    finally:
        KEEPER.forget()
        engine.dispose()


# -- read side -------------------------------------------------------------------------------------


def test_monitor_recent_requests_carry_the_api_columns(engine) -> None:
    insert_batch(engine, RECORDS)
    rows = recent_requests(engine, limit=10)
    by_key = {(r["request_id"], r["attempt"]): r for r in rows}
    for r in RECORDS:
        got = by_key[(r.request_id, r.attempt)]
        assert (got["api"], got["finish_reason"], got["tool_calls"], got["reasoning_tokens"]) == (
            r.api,
            r.finish_reason,
            r.tool_calls,
            r.reasoning_tokens,
        )
    page = table_view(engine, window="1h", now=T0 + 120)
    assert {r["api"] for r in page.rows} == {"chat", "responses", "embeddings", "completions"}
    header = "".join(csv_chunks(engine, since=page.since, until=page.until)).splitlines()[0].split(",")
    assert {"api", "finish_reason", "tool_calls", "reasoning_tokens"} <= set(header)


def test_drilldown_shows_api_finish_reason_tool_calls_and_reasoning_tokens(engine) -> None:
    insert_batch(engine, RECORDS)
    forget_columns()
    chat = load_story(engine, "chat-1")
    assert chat is not None
    facts = {f["field"]: f["value"] for f in chat.facts()}
    assert facts["API"] == "chat completions"
    assert facts["finish reason"] == "tool_calls" and facts["tool calls"] == "2"
    assert facts["reasoning tokens"].startswith("0 ")
    resp = load_story(engine, "resp-1")
    assert resp is not None
    facts = {f["field"]: f["value"] for f in resp.facts()}
    assert facts["API"] == "responses" and facts["reasoning tokens"].startswith("12 ")
    assert facts["completion tokens"] == "30"


def test_drilldown_of_an_embedding_shows_embedding_tokens_only(engine) -> None:
    insert_batch(engine, RECORDS)
    forget_columns()
    emb = load_story(engine, "emb-1")
    assert emb is not None
    facts = {f["field"]: f["value"] for f in emb.facts()}
    assert facts["API"] == "embeddings" and facts["embedding tokens"] == "64"
    assert not {"completion tokens", "reasoning tokens", "tool calls", "finish reason"} & set(facts)
    timeline = emb.timeline_rows()
    assert [t["status"] for t in timeline] == ["error", "ok"] and "finish reason" in timeline[0]


def test_drilldown_finish_reason_per_attempt(engine) -> None:
    insert_batch(
        engine,
        [
            rec_log_api_fields("retry-1", status="error", final=False, finish_reason=None),
            rec_log_api_fields("retry-1", attempt=2, finish_reason="length"),
        ],
    )
    forget_columns()
    rows = request_attempts(engine, "retry-1")
    assert [r["finish_reason"] for r in rows] == [None, "length"]
    story = load_story(engine, "retry-1")
    assert story is not None
    assert [t["finish reason"] for t in story.timeline_rows()] == [None, "length"]
