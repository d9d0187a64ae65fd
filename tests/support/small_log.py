"""A gateway with a small request-log queue, and the check that every answered request was logged
exactly once: what the telemetry tests of both tiers (lock stalls, stopped databases, killed
processes) share."""

from __future__ import annotations

from sqlalchemy import func, select

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


def assert_logged_exactly_once(engine, served: list[str], *, interrupted: int = 0) -> None:
    """Every answered request has exactly one final row, no (request, attempt) twice, and the
    rollups count exactly the rows. ``interrupted``: how many requests a signal may have cut off
    after they were logged and before their caller printed the answer; each such row is a request
    no one was told of, so it comes after every served one."""
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
    extra = sorted(set(finals) - set(served))
    assert sorted(set(finals) & set(served)) == sorted(served) and len(finals) == len(set(finals))
    assert len(extra) <= interrupted, f"{len(extra)} final rows for requests no one was answered"
    assert all(e > max(served) for e in extra), "a logged request that no one was answered came before an answered one"
    assert (attempts, requests) == (len(rows), len(finals))


def serve(gw, n: int, out: list[str]) -> None:
    for _ in range(n):
        out.append(gw.client.chat(MESSAGES, model="auto").request_id)
