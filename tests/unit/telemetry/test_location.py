"""Database stalls and process deaths against real databases (issue 7): requests keep being served
while the database cannot write, and every answered request is logged exactly once afterwards.

- SQLite: a second connection holds ``BEGIN EXCLUSIVE`` while the gateway serves several times its
  queue (100) in requests.
- PostgreSQL: the backend processes serving the gateway's (single-connection) pool are stopped
  with SIGSTOP while it serves; SIGCONT in a ``finally``. Only the test's own backends are stopped
  (found by a unique ``application_name``, and only while idle), never the shared cluster's
  postmaster, so parallel runs on the same server are not frozen.
- SIGKILL of a gateway process mid-traffic (its database locked, so records sit in the journal):
  ``PRAGMA integrity_check`` is ok and, after the next process replays the journal, the loss is
  bounded by what was only in memory (queue_size + batch_size records).
- SIGTERM of a gateway process mid-traffic: zero loss.

Each stall lasts until a number of requests has been served (conditions, never clocks).
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from app.gateway import build_gateway
from tests.support import paths
from tests.support.small_log import QUEUE, WAIT_S, assert_logged_exactly_once, serve, toml

REPO = paths.REPO


# -- SQLite: an exclusive lock held by another connection ----------------------------------------


# -- PostgreSQL: the gateway's backends stopped with SIGSTOP --------------------------------------


def _proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.postgres
def test_postgresql_backend_stopped_requests_keep_being_served_and_nothing_is_lost(settings_factory, pg_url) -> None:
    from db.engine import get_engine

    get_engine(pg_url)  # migrate the test's schema
    app_name = f"logstall-{uuid.uuid4().hex[:8]}"
    # One connection for the whole gateway, so stopping its backend freezes the database for it.
    engine = create_engine(pg_url, pool_size=1, max_overflow=0, connect_args={"application_name": app_name})
    admin = create_engine(pg_url)
    if not os.access("/proc/self/stat", os.R_OK):
        pytest.skip("needs /proc to watch the stopped backend")
    s = settings_factory(toml(), database_url=pg_url)
    gw = build_gateway(s, engine=engine, sleep=lambda _s: None, guardrail=False)
    served: list[str] = []
    stopped: list[int] = []
    try:
        serve(gw, 50, served)
        assert gw.telemetry.drain(WAIT_S)
        query = text("SELECT pid, state FROM pg_stat_activity WHERE application_name = :n")
        for _ in range(200):  # stop the backend only while it is idle (holds no shared locks)
            with admin.connect() as conn:
                backends = conn.execute(query, {"n": app_name}).all()
            if not backends or any(state != "idle" for _pid, state in backends):
                continue
            for pid, _state in backends:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            with admin.connect() as conn:
                if all(state == "idle" for _pid, state in conn.execute(query, {"n": app_name}).all()):
                    break
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
            stopped.clear()
        assert stopped, "could not catch the gateway's backend idle"
        try:
            during: list[str] = []
            serve(gw, 4 * QUEUE, during)
            served += during
            assert all(_proc_state(pid) == "T" for pid in stopped)  # frozen the whole time
            stats = gw.telemetry.stats()
            assert stats.spilled > 0  # the queue overflowed into the journal, nobody waited
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        assert gw.telemetry.drain(WAIT_S)
        assert gw.telemetry.stats().journal_depth == 0
        assert_logged_exactly_once(admin, served)
    finally:
        gw.close()
        engine.dispose()
        admin.dispose()


# -- signals: SIGKILL and SIGTERM of a serving process --------------------------------------------
