"""``python -m app serve --workers N`` (issue 16): N processes share one port, each with its own
upstream pool and log writer, one database; /metrics says which worker answered; a key's rate
limit holds across workers; SIGTERM drains all of them (exit 0, every answered request logged)."""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path

import httpx2
import pytest

from tests.support import serve_process as sp
from tests.support.chaos_upstream import ChaosUpstream

HI = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def two_workers(tmp_path: Path):
    with ChaosUpstream() as up:
        cfg = tmp_path / "gw.toml"
        cfg.write_text(sp.chaos_config(up.url))
        db = tmp_path / "gw.sqlite"
        server = sp.start(cfg, f"sqlite:///{db}", args=("--workers", "2"))
        try:
            yield server, db
        finally:
            if server.proc.poll() is None:
                server.terminate()


def worker_of(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("gateway_worker_info{"):
            return line.split('worker="', 1)[1].split('"', 1)[0]
    raise AssertionError("no gateway_worker_info in /metrics")


def test_two_workers_share_the_port_and_drain_on_sigterm(two_workers):
    server, db = two_workers
    made = sp.cli(server.env, "keys", "create", "--name", "w", "--json")
    key = json.loads(made.stdout)["key"]
    limited = json.loads(sp.cli(server.env, "keys", "create", "--name", "lim", "--rpm", "3", "--json").stdout)["key"]
    seen: set[str] = set()
    with httpx2.Client(base_url=server.url, timeout=10) as c:
        for _ in range(60):  # new connections: the kernel spreads them over both workers' accepts
            with httpx2.Client(base_url=server.url, timeout=10) as fresh:
                seen.add(worker_of(fresh.get("/metrics").text))
            if len(seen) == 2:
                break
        answered = [
            c.post("/v1/chat/completions", json=HI, headers={"authorization": f"Bearer {key}"}) for _ in range(6)
        ]
        statuses = []
        for _ in range(6):  # 3 per minute, whichever worker serves each
            with httpx2.Client(base_url=server.url, timeout=10) as fresh:
                r = fresh.post("/v1/chat/completions", json=HI, headers={"authorization": f"Bearer {limited}"})
                statuses.append(r.status_code)
    assert seen == {"0", "1"}
    assert [r.status_code for r in answered] == [200] * 6
    assert sorted(statuses) == [200, 200, 200, 429, 429, 429]  # the limit holds across workers
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0
    con = sqlite3.connect(db)
    try:
        ok = con.execute("select count(*) from request_log where final and status = 'ok'").fetchone()[0]
    finally:
        con.close()
    assert ok == 9  # every answered request, from both workers, flushed before they exited


def test_every_new_connection_is_answered_and_spread_over_both_workers(two_workers):
    """Each worker listens on a socket of its own in the port's SO_REUSEPORT group, and the
    parent's socket (bound, holding the port) never listens: a connection the kernel gave to a
    socket nobody accepts on would hang here until the timeout."""
    server, _ = two_workers
    counts: dict[str, int] = {}
    for _ in range(100):
        with httpx2.Client(base_url=server.url, timeout=5) as fresh:
            w = worker_of(fresh.get("/metrics").text)
        counts[w] = counts.get(w, 0) + 1
    assert sum(counts.values()) == 100
    assert len(counts) == 2 and min(counts.values()) >= 15, counts  # the kernel's hash, not one busy accept loop


def test_workers_is_bounded(tmp_path):
    env = sp.env_for(tmp_path / "none.toml", f"sqlite:///{tmp_path / 'x.db'}")
    for bad in ("0", "65", "two", "1e400"):
        r = sp.cli(env, "serve", "--workers", bad)
        assert r.returncode != 0 and "--workers" in r.stderr and "Traceback" not in r.stderr


def test_the_server_process_tunes_the_collector_once_built():
    import gc

    from app.server.serve import GC_GEN0, _tune_gc

    before = gc.get_threshold()
    try:
        _tune_gc()
        assert gc.get_threshold()[0] == GC_GEN0 > before[0]
        assert gc.get_freeze_count() > 0  # what was alive at start-up is out of the collector's walks
        assert gc.get_threshold()[1:] == before[1:]
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
