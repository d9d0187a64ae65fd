"""The request log while SQLite is held under an exclusive lock for seconds (real lock timeouts)."""

from __future__ import annotations

import sqlite3

from sqlalchemy import func, select

from app.gateway import build_gateway
from db.models import RequestLog, RequestRollup
from tests.support import paths

REPO = paths.REPO


WAIT_S = 30.0  # bound on waiting for background work; never a timing assertion


QUEUE, BATCH = 100, 50


SMALL_LOG = f"""
[telemetry]
queue_size = {QUEUE}
batch_size = {BATCH}
flush_interval_s = 0.05

[database]
lock_timeout_s = 0.2

[simulator]
latency_scale = 0
seed = 3
"""


MESSAGES = [{"role": "user", "content": "hello"}]


def toml() -> str:
    return (REPO / "gateway.toml").read_text() + SMALL_LOG


def assert_logged_exactly_once(engine, served: list[str]) -> None:
    """Every answered request has exactly one final row, no (request, attempt) twice, and the
    rollups count exactly the rows."""
    with engine.connect() as conn:
        rows = conn.execute(select(RequestLog.request_id, RequestLog.attempt, RequestLog.final)).all()
        attempts, requests = conn.execute(
            select(
                func.coalesce(func.sum(RequestRollup.attempts), 0), func.coalesce(func.sum(RequestRollup.requests), 0)
            )
        ).one()
    pairs = [(r[0], r[1]) for r in rows]
    assert len(pairs) == len(set(pairs)), "duplicate (request_id, attempt) rows"
    finals = sorted(r[0] for r in rows if r[2])
    assert finals == sorted(served)
    assert (attempts, requests) == (len(rows), len(finals))


def serve(gw, n: int, out: list[str]) -> None:
    for _ in range(n):
        out.append(gw.client.chat(MESSAGES, model="auto").request_id)


def test_sqlite_exclusive_lock_requests_keep_being_served_and_nothing_is_lost(settings_factory, sqlite_url) -> None:
    s = settings_factory(toml(), database_url=sqlite_url)
    gw = build_gateway(s, sleep=lambda _s: None, guardrail=False)
    served: list[str] = []
    try:
        serve(gw, 50, served)
        assert gw.telemetry.drain(WAIT_S)
        path = sqlite_url.removeprefix("sqlite:///")
        locker = sqlite3.connect(path, isolation_level=None, timeout=WAIT_S)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            rows_before = locker.execute("SELECT COUNT(*) FROM request_log").fetchone()[0]
            during = 0
            # Serve until the writer has failed against the lock and the queue has overflowed
            # several times over: every one of these requests was answered during the stall.
            while during < 8 * QUEUE or gw.telemetry.stats().write_failures == 0:
                serve(gw, 1, served)
                during += 1
                assert during < 100_000, "the writer never hit the lock"
            stats = gw.telemetry.stats()
            assert locker.execute("SELECT COUNT(*) FROM request_log").fetchone()[0] == rows_before
            assert stats.spilled > 0 and stats.journal_depth > 0 and not stats.database_ok
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert gw.telemetry.drain(WAIT_S)
        stats = gw.telemetry.stats()
        assert stats.journal_depth == 0 and stats.replayed >= stats.spilled and stats.rejected == 0
        assert_logged_exactly_once(gw.engine, served)
    finally:
        gw.close()
