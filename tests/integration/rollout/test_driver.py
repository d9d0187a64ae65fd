"""Rollouts end to end with real processes: two ``python -m app serve`` processes on one database in
front of a loopback upstream, the rollout started with the CLI, traffic through the servers, events
at a loopback webhook receiver.

- A healthy candidate is promoted to 100 % on its own; each step is taken exactly once though two
  controllers run (one audit row per step); the upstream then sees every request on the candidate.
- Both servers are stopped mid-rollout and a new one carries on from the stored step.
- A degraded candidate (half its answers fail) is aborted on its own; the upstream then sees no
  request on it.
- The webhook receives every event: start, each step, completion, abort.
"""

from __future__ import annotations

import json
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2
import pytest

from db import rollouts
from db.engine import get_engine
from tests.support import serve_process as sp
from tests.support.chaos_upstream import ChaosUpstream, Fault, ok, server_error

BAKE_S = "2"
HELLO = [{"role": "user", "content": "hello"}]


class Receiver:
    """A loopback webhook endpoint that keeps every JSON body it is sent."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        lock = self._lock = threading.Lock()
        events = self.events

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with lock:
                    events.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def kinds(self) -> list[str]:
        with self._lock:
            return [e["event"] for e in self.events]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def flaky(share: float, seed: int = 1) -> Fault:
    """Fails ``share`` of the requests with a 500, answers the rest (seeded)."""
    rng, lock = random.Random(seed), threading.Lock()

    def serve(h, req) -> None:
        with lock:
            fail = rng.random() < share
        (server_error() if fail else ok()).serve(h, req)

    return Fault("flaky", serve)


@pytest.fixture
def rig(tmp_path):
    receiver = Receiver()
    with ChaosUpstream() as upstream:
        cfg = tmp_path / "gateway.toml"
        cfg.write_text(
            sp.chaos_config(upstream.url, max_attempts=2)
            + "[guardrail]\nenabled = false\n[breaker]\nenabled = false\n"
            + f'[alerts]\nwebhooks = ["{receiver.url}"]\ntimeout_s = 5\n'
        )
        db_url = f"sqlite:///{tmp_path / 'gw.db'}"
        servers = sp.start_many(2, cfg, db_url)
        env = servers[0].env
        created = sp.cli(env, "keys", "create", "--name", "main", "--json")
        assert created.returncode == 0, created.stderr
        rig = {"upstream": upstream, "receiver": receiver, "servers": servers, "cfg": cfg, "db_url": db_url,
               "env": env, "key": json.loads(created.stdout)["key"], "engine": get_engine(db_url)}  # fmt: skip
        try:
            yield rig
        finally:
            for s in rig["servers"]:
                s.terminate()
            receiver.close()


def _send(rig, n: int) -> None:
    servers = rig["servers"]
    for i in range(n):
        s = servers[i % len(servers)]
        r = httpx2.post(f"{s.base_url}/chat/completions", json={"model": "gpt-4.1", "messages": HELLO},
                        headers={"Authorization": f"Bearer {rig['key']}"}, timeout=30)  # fmt: skip
        assert r.status_code == 200, r.text


def _drive_until(rig, rollout_id: int, done, what: str, timeout_s: float = 240.0):
    """Send traffic through the servers until ``done(rollout)`` (a condition with a bound)."""

    def check():
        _send(rig, 10)
        r = rollouts.get(rig["engine"], rollout_id)
        return r if done(r) else None

    return sp.wait_for(check, timeout_s=timeout_s, what=what)


def _settled_off(rig, provider: str) -> None:
    """Wait (with a bound) until a batch of requests through both servers sends none to ``provider``:
    each server reads the stored weight on its own refresh, so the last one may lag by a refresh."""

    def quiet() -> bool:
        before = len(rig["upstream"].requests_for(provider))
        _send(rig, 10)
        return len(rig["upstream"].requests_for(provider)) == before

    # Two quiet batches in a row: a server still at the last step's weight sends each request to
    # ``provider`` with that weight's chance, so one small batch can miss it (2 requests at 50 %: 1 in 4).
    sp.wait_for(lambda: quiet() and quiet(), timeout_s=15, what=f"both servers to stop sending to {provider}")


def _start(rig, steps: str) -> dict:
    out = sp.cli(rig["env"], "rollout", "start", "--candidate", "holysheep", "--steps", steps, "--bake-s", BAKE_S,
                 "--min-samples", "20", "--reason", "new provider", "--actor", "tester", "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_healthy_candidate_is_promoted_once_across_processes_and_restarts(rig) -> None:
    started = _start(rig, "20,50,100")
    rid = started["id"]
    stepped = _drive_until(rig, rid, lambda r: r.step_index >= 1, "the first step")
    assert stepped.state == "running" and stepped.weight == 0.5
    # Stop both servers mid-rollout; a new one carries on from the stored step and its clock.
    for s in rig["servers"]:
        s.terminate()
    rig["servers"] = sp.start_many(2, rig["cfg"], rig["db_url"])
    carried = rollouts.get(rig["engine"], rid)
    assert carried is not None and carried.step_index >= 1 and carried.step_started_at == stepped.step_started_at
    done = _drive_until(rig, rid, lambda r: r.state != "running", "completion")
    assert done.state == "completed" and done.weight == 1.0, done.last_reason
    # Each step exactly once, though two controllers ran all along: start, 20 -> 50, 50 -> 100.
    trail = rollouts.history(rig["engine"], done)
    assert [(t[1], t[2]) for t in trail] == [(0.0, 0.2), (0.2, 0.5), (0.5, 1.0)], trail
    assert [t[3] for t in trail] == ["tester", "rollout", "rollout"]
    # The upstream sees it: every request now goes to the candidate, once both servers have refreshed.
    _settled_off(rig, "direct")
    before = len(rig["upstream"].requests_for("direct"))
    _send(rig, 20)
    assert len(rig["upstream"].requests_for("direct")) == before
    kinds = sp.wait_for(lambda: (k := rig["receiver"].kinds()) and "rollout.complete" in k and k, timeout_s=30,
                        what="the completion event")  # fmt: skip
    assert kinds == ["rollout.start", "rollout.step", "rollout.complete"]
    complete = rig["receiver"].events[-1]
    assert complete["rollout"] == rid and "complete: 50 % -> 100 %" in complete["text"]


def test_a_degraded_candidate_is_aborted_on_its_own(rig) -> None:
    rig["upstream"].set_default(flaky(0.5), provider="holysheep")
    rid = _start(rig, "25,50,100")["id"]
    done = _drive_until(rig, rid, lambda r: r.state != "running", "the abort")
    assert done.state == "aborted" and done.step_index == 0, done.last_reason
    assert "rollout abort at 25 %: first-attempt failure rate" in done.last_reason
    _settled_off(rig, "holysheep")
    before = len(rig["upstream"].requests_for("holysheep"))
    _send(rig, 20)
    assert len(rig["upstream"].requests_for("holysheep")) == before  # weight 0: the candidate sees nothing
    trail = rollouts.history(rig["engine"], done)
    assert [(t[2], t[3]) for t in trail] == [(0.25, "tester"), (0.0, "rollout")]
    kinds = sp.wait_for(lambda: (k := rig["receiver"].kinds()) and "rollout.abort" in k and k, timeout_s=30,
                        what="the abort event")  # fmt: skip
    assert kinds == ["rollout.start", "rollout.abort"]
