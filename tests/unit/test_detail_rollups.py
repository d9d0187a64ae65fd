"""The error-class and substitution rollups (migration 0013) on SQLite and PostgreSQL: what the
writer folds equals a recount of the raw rows, per minute and per hour, through replayed batches,
pruning and the migration's backfill; the monitor's reads built on them (error-class choices,
substitution sums, the request table's count) answer what the raw rows answer, for windows and
cursors that do not fall on minute boundaries."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from sqlalchemy import select

from core.records import AttemptRecord
from db import monitor as dbm
from db.engine import create_db_engine
from db.migrate import upgrade
from db.models import (
    ERROR_ROLLUP_KEY,
    ERROR_ROLLUP_TABLES,
    NO_ERROR_CLASS,
    SUBSTITUTION_ROLLUP_KEY,
    SUBSTITUTION_ROLLUP_SUMS,
    SUBSTITUTION_ROLLUP_TABLES,
    RequestLog,
)
from db.partitions import KEEPER
from db.requests import insert_batch, prune

T0 = 1_800_000_000 // 86_400 * 86_400 - 2 * 3600  # 22:00 UTC of a day in 2027: the span crosses midnight
SPAN_S = 3 * 3600 + 17 * 60  # past hour boundaries, with partial minutes and hours
PROVIDERS = ("alpha", "beta", "gateway")
MODELS = ("m1", "m2")
CLASSES = ("timeout", "server_error", "rate_limited", None)


def make_records(n: int, seed: int = 1) -> list[AttemptRecord]:
    """``n`` attempts over :data:`SPAN_S` from ``T0``: failures of every class (and none),
    substitutions, final and not, several providers, models, sources and keys."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        failed = rng.random() < 0.3
        out.append(
            AttemptRecord(
                request_id=f"q{seed}-{i:05d}",
                attempt=1 + rng.randrange(2),
                ts=T0 + rng.random() * SPAN_S,
                provider=rng.choice(PROVIDERS),
                model=rng.choice(MODELS),
                requested_model=rng.choice(("auto", "m1", "m3")),
                intent=rng.choice(("coding", "general")),
                side="primary",
                status="error" if failed else "ok",
                latency_ms=10.0,
                error_class=rng.choice(CLASSES) if failed else None,
                prompt_tokens=rng.randrange(100),
                cached_tokens=rng.randrange(10),
                completion_tokens=rng.randrange(50),
                cost_usd=rng.randrange(1000) / 1e6,
                final=rng.random() < 0.8,
                substituted=rng.random() < 0.2,
                source=rng.choice(("api", "loadgen")),
                key_name=rng.choice(("k1", None)),
            )
        )
    return out


def raw_rows(engine) -> list:
    with engine.connect() as conn:
        return list(conn.execute(select(RequestLog.__table__)).mappings())


def _dims(r, span: int) -> tuple:
    return (int(r["ts"] // span) * span, r["provider"], r["model"], r["requested_model"], r["intent"], r["source"])


def recount_errors(rows, span: int) -> dict[tuple, tuple[int, int]]:
    acc: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        if r["status"] != "ok":
            cell = acc[(*_dims(r, span), r["error_class"] or NO_ERROR_CLASS)]
            cell[0] += 1
            cell[1] += bool(r["final"])
    return {k: tuple(v) for k, v in acc.items()}


def recount_substitutions(rows, span: int) -> dict[tuple, tuple]:
    acc: dict[tuple, list] = defaultdict(lambda: [0, 0, 0, 0, 0.0])
    for r in rows:
        if r["substituted"] and r["final"]:
            cell = acc[_dims(r, span)]
            for i, name in enumerate(("prompt_tokens", "cached_tokens", "completion_tokens")):
                cell[1 + i] += r[name]
            cell[0] += 1
            cell[4] += r["cost_usd"]
    return {k: (*v[:4], round(v[4], 9)) for k, v in acc.items()}


def stored_errors(engine, span: int) -> dict[tuple, tuple[int, int]]:
    t = ERROR_ROLLUP_TABLES[span].__table__  # type: ignore[attr-defined]
    cols = [t.c[k] for k in ERROR_ROLLUP_KEY] + [t.c.attempts, t.c.requests]
    with engine.connect() as conn:
        return {tuple(r[:7]): (int(r[7]), int(r[8])) for r in conn.execute(select(*cols))}


def stored_substitutions(engine, span: int) -> dict[tuple, tuple]:
    t = SUBSTITUTION_ROLLUP_TABLES[span].__table__  # type: ignore[attr-defined]
    cols = [t.c[k] for k in (*SUBSTITUTION_ROLLUP_KEY, *SUBSTITUTION_ROLLUP_SUMS)]
    with engine.connect() as conn:
        return {tuple(r[:6]): (*(int(v) for v in r[6:10]), round(float(r[10]), 9)) for r in conn.execute(select(*cols))}


def assert_rollups_match_log(engine) -> None:
    rows = raw_rows(engine)
    for span in (60, 3600):
        assert stored_errors(engine, span) == recount_errors(rows, span)
        assert stored_substitutions(engine, span) == recount_substitutions(rows, span)


def test_rollups_equal_a_recount_of_the_log_through_batches_and_replays(engine) -> None:
    records = make_records(600)
    for i in range(0, len(records), 70):
        insert_batch(engine, records[i : i + 70])
    insert_batch(engine, records[100:300])  # a replayed batch (journal after a crash) adds nothing
    rows = raw_rows(engine)
    assert len(rows) == 600
    assert sum(a for a, _ in stored_errors(engine, 60).values()) == sum(r["status"] != "ok" for r in rows) > 100
    assert sum(v[0] for v in stored_substitutions(engine, 3600).values()) > 50
    assert_rollups_match_log(engine)


def _raw_classes(rows, since, until) -> list[str]:
    return sorted(
        {r["error_class"] for r in rows if r["status"] != "ok" and since <= r["ts"] <= until and r["error_class"]}
    )


def _raw_subs(rows, since, until, providers=()) -> dict[tuple, tuple]:
    acc: dict[tuple, list] = defaultdict(lambda: [0, 0, 0, 0, 0.0])
    for r in rows:
        if (
            r["substituted"]
            and r["final"]
            and since <= r["ts"] <= until
            and (not providers or r["provider"] in providers)
        ):
            cell = acc[(r["provider"], r["model"], r["requested_model"], r["intent"])]
            cell[0] += 1
            cell[1] += r["prompt_tokens"]
            cell[2] += r["cached_tokens"]
            cell[3] += r["completion_tokens"]
            cell[4] += r["cost_usd"]
    return {k: (*v[:4], round(v[4], 9)) for k, v in acc.items()}


def _windows(rows, rng: random.Random, n: int) -> list[tuple[float, float]]:
    # Windows ending on, just after and between rows; some shorter than two minutes, some hours long.
    out = [(T0 - 60.0, T0 + SPAN_S + 60.0), (T0, T0 + 3600.0), (T0 + 59.5, T0 + 61.0)]
    stamps = sorted(r["ts"] for r in rows)
    for _ in range(n):
        a, b = sorted(rng.sample(stamps, 2))
        out.append((a, b))
        out.append((a + rng.random() * 30, a + rng.random() * 150))
    return out


def test_error_classes_and_substitutions_answer_what_the_raw_rows_answer(engine) -> None:
    insert_batch(engine, make_records(500, seed=2))
    rows = raw_rows(engine)
    rng = random.Random(3)
    for since, until in _windows(rows, rng, 12):
        assert dbm.error_classes_between(engine, since=since, until=until) == _raw_classes(rows, since, until)
        got = {
            (s.provider, s.model, s.requested_model, s.intent): (
                s.requests,
                s.prompt_tokens,
                s.cached_tokens,
                s.completion_tokens,
                round(s.cost_usd, 9),
            )
            for s in dbm.substitution_sums(engine, since=since, until=until)
        }
        assert got == _raw_subs(rows, since, until), (since, until)
    only_beta = dbm.substitution_sums(
        engine, since=T0, until=T0 + SPAN_S, filters=dbm.MonitorFilters(providers=("beta",))
    )
    assert {s.provider for s in only_beta} == {"beta"}
    assert len(only_beta) == len(_raw_subs(rows, T0, T0 + SPAN_S, ("beta",)))


@pytest.mark.parametrize(
    ("filters", "row_filters"),
    [
        (None, None),
        (None, dbm.RowFilters(status="error")),
        (None, dbm.RowFilters(status="ok")),
        (None, dbm.RowFilters(error_classes=("timeout", "rate_limited"))),
        (dbm.MonitorFilters(providers=("beta",)), dbm.RowFilters(status="error", error_classes=("timeout",))),
        (None, dbm.RowFilters(status="ok", error_classes=("timeout",))),
        (dbm.MonitorFilters(models=("m2",), sources=("api",)), None),
        (None, dbm.RowFilters(keys=("k1",))),
    ],
)
def test_the_table_count_equals_a_raw_count_for_any_window_and_cursor(engine, filters, row_filters) -> None:
    insert_batch(engine, make_records(400, seed=4))
    rows = raw_rows(engine)
    r = row_filters or dbm.RowFilters()
    f = filters or dbm.MonitorFilters()

    def matches(row, since, until, cursor=None) -> bool:
        if not since <= row["ts"] <= until:
            return False
        if cursor is not None and (row["ts"], row["id"]) <= cursor:
            return False
        if (r.status == "error" and row["status"] == "ok") or (r.status == "ok" and row["status"] != "ok"):
            return False
        if r.error_classes and row["error_class"] not in r.error_classes:
            return False
        if r.keys and row["key_name"] not in r.keys:
            return False
        return all(
            not want or row[col] in want
            for want, col in ((f.providers, "provider"), (f.models, "model"), (f.sources, "source"))
        )

    rng = random.Random(5)
    for since, until in _windows(rows, rng, 6):
        expected = sum(matches(row, since, until) for row in rows)
        assert dbm.count_log_rows(engine, since=since, until=until, filters=filters, rows=row_filters) == expected
        # A cursor on a row (as a page below the first has), and one on a minute boundary.
        inside = [row for row in rows if since <= row["ts"] <= until]
        cursors = [(row["ts"], row["id"]) for row in rng.sample(inside, min(3, len(inside)))]
        cursors.append((float(int(since // 60) * 60 + 60), 0))
        for c in cursors:
            want = sum(matches(row, since, until, c) for row in rows)
            got = dbm.count_log_rows(engine, since=since, until=until, filters=filters, rows=row_filters, newer_than=c)
            assert got == want, (since, until, c)
    # The cap still bounds what is reported.
    total = sum(matches(row, T0 - 60, T0 + SPAN_S + 60) for row in rows)
    if total > 5:
        capped = dbm.count_log_rows(
            engine, since=T0 - 60, until=T0 + SPAN_S + 60, filters=filters, rows=row_filters, cap=5
        )
        assert capped == 6


def test_pruning_keeps_the_rollups_equal_to_the_rows_that_remain(engine) -> None:
    insert_batch(engine, make_records(500, seed=6))
    # Midnight: every resolution is cut at the same instant, and on PostgreSQL the day partition
    # before it is dropped whole.
    cutoff = float(T0 + 2 * 3600)
    out = prune(engine, raw_before=cutoff, minute_rollups_before=cutoff, rollups_1h_before=cutoff)
    assert out["request_error_rollup"] > 0 and out["request_substitution_rollup_1h"] > 0
    rows = raw_rows(engine)
    assert rows and min(r["ts"] for r in rows) >= cutoff
    assert_rollups_match_log(engine)
    assert dbm.error_classes_between(engine, since=T0, until=T0 + SPAN_S) == _raw_classes(rows, T0, T0 + SPAN_S)


def test_rollups_kept_past_the_log_do_not_count_rows_the_table_cannot_show(engine) -> None:
    insert_batch(engine, make_records(300, seed=7))
    cutoff = float(T0 + 3600 + 17)
    prune(engine, raw_before=cutoff)  # the rollups are kept longer than the log
    rows = raw_rows(engine)
    assert dbm.count_log_rows(engine, since=T0, until=T0 + SPAN_S) == len(rows)


def test_migration_0013_backfills_from_the_rows_already_logged(db_url: str) -> None:
    engine = create_db_engine(db_url)
    upgrade(engine, "0012")
    records = make_records(400, seed=8)
    if engine.dialect.name == "postgresql":
        KEEPER.forget()
        KEEPER.ensure(engine, {r.ts for r in records})
    with engine.begin() as conn:
        conn.execute(RequestLog.__table__.insert(), [_row(r) for r in records])
    upgrade(engine)
    assert_rollups_match_log(engine)
    # The writer continues on top of the backfilled cells.
    insert_batch(engine, make_records(100, seed=9))
    assert_rollups_match_log(engine)
    KEEPER.forget()
    engine.dispose()


def _row(r: AttemptRecord) -> dict:
    from core.records import FIELD_NAMES

    return dict(zip(FIELD_NAMES, r.to_tuple(), strict=True))
