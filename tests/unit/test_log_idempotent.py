"""Idempotent request-log inserts (issue 7): unique (request_id, attempt), a replayed or retried
batch writes nothing twice and its rollups count each attempt once; migration 0004 removes the
duplicates older versions wrote and takes their counts back out of the rollups.
"""

from __future__ import annotations

from sqlalchemy import MetaData, Table, func, select, text
from sqlalchemy.dialects import sqlite

from core.records import FIELD_NAMES, AttemptRecord
from db.engine import create_db_engine
from db.migrate import upgrade
from db.models import ROLLUP_KEY, ROLLUP_TABLES, RequestLog
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
LATER_FIELDS = ("api", "finish_reason", "tool_calls", "reasoning_tokens", "adjusted_params")  # 0008, 0010
LATER_COUNTERS = ("reasoning_tokens", "tool_calls", "responses_requests", "embeddings_requests", "completions_requests")


def _old_deltas(deltas: list[dict]) -> list[dict]:
    return [{k: v for k, v in d.items() if k not in LATER_COUNTERS} for d in deltas]


def _old_upsert(conn, name: str):
    """The rollup upsert on the table as the database has it (before migration 0008)."""
    table = Table(name, MetaData(), autoload_with=conn)
    stmt = sqlite.insert(table)
    counters = [c.name for c in table.c if c.name not in ROLLUP_KEY]
    return stmt.on_conflict_do_update(
        index_elements=ROLLUP_KEY, set_={c: table.c[c] + stmt.excluded[c] for c in counters}
    )


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
