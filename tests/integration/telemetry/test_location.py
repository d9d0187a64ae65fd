"""The request log while SQLite is held under an exclusive lock for seconds (real lock timeouts)."""

from __future__ import annotations

import sqlite3

from app.gateway import build_gateway
from tests.support import paths
from tests.support.small_log import QUEUE, WAIT_S, assert_logged_exactly_once, serve, toml

REPO = paths.REPO


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
