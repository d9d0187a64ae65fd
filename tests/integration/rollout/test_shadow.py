"""A rollout's shadow phase end to end: a real ``python -m app serve`` in front of a loopback upstream
that serves both the baseline (``direct``) and the candidate (``holysheep``), the rollout started
with the CLI's ``--shadow-share --shadow-budget-usd``.

- The caller's answer is byte-for-byte the one it gets with no shadow phase, while the candidate's
  upstream receives the mirrored copies (answered differently).
- Mirroring stops at the budget; the mirrors are in ``shadow_log`` and in no figure of real traffic.
- A candidate that never answers delays and fails no caller: each caller has its answer while the
  copy of its request is still unanswered at the candidate.
- A healthy candidate's phase passes and the rollout moves to its first step; a failing one is
  aborted in the shadow phase (the ratio never left 0).
- A route's rollout shadows the route's own deployments to its canary deployment: callers get the
  baseline's bytes, the canary deployment gets copies naming the route, and the passed phase moves
  the route's share (the global canary's stays where it was).
"""

from __future__ import annotations

import json

import httpx2
import pytest
from sqlalchemy import func, select

from db import rollouts, shadow
from db.engine import get_engine
from db.models import RequestLog, RequestRollup
from tests.support import serve_process as sp
from tests.support.chaos_upstream import ChaosUpstream, chat_body, choice, hang, reply, server_error

HELLO = [{"role": "user", "content": "hello"}]
BASELINE = reply(chat_body("gpt-4.1", [choice(content="the baseline's answer")]))
CANDIDATE = reply(chat_body("gpt-4.1", [choice(content="the candidate's answer, which no caller sees")]))


ROUTE = '[routes."gpt-4.1"]\ndeployments = [{ provider = "direct" }]\ncanary = { provider = "holysheep" }\n'


@pytest.fixture(params=["global"])
def rig(tmp_path, request):
    with ChaosUpstream() as upstream:
        upstream.set_default(BASELINE, provider="direct")
        upstream.set_default(CANDIDATE, provider="holysheep")
        cfg = tmp_path / "gateway.toml"
        cfg.write_text(
            sp.chaos_config(upstream.url, timeout_s=30)
            + "[guardrail]\nenabled = false\n[breaker]\nenabled = false\n"
            + (ROUTE if request.param == "route" else "")
        )
        db_url = f"sqlite:///{tmp_path / 'gw.db'}"
        server = sp.start(cfg, db_url)
        created = sp.cli(server.env, "keys", "create", "--name", "main", "--json")
        assert created.returncode == 0, created.stderr
        rig = {"upstream": upstream, "server": server, "env": server.env, "engine": get_engine(db_url),
               "key": json.loads(created.stdout)["key"]}  # fmt: skip
        try:
            yield rig
        finally:
            server.terminate()


def _ask(rig, messages: list[dict] = HELLO, headers: dict[str, str] | None = None) -> bytes:
    r = httpx2.post(f"{rig['server'].base_url}/chat/completions", json={"model": "gpt-4.1", "messages": messages},
                    headers={"Authorization": f"Bearer {rig['key']}", **(headers or {})}, timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    return r.content


def _start(rig, share: str, budget: str, *, bake: str = "2", samples: str = "5", route: str | None = None) -> int:
    out = sp.cli(rig["env"], "rollout", "start", "--candidate", "holysheep", "--steps", "10,100", "--bake-s", bake,
                 "--min-samples", samples, "--shadow-share", share, "--shadow-budget-usd", budget, "--reason",
                 "try the new provider on copies first", "--json", *(("--route", route) if route else ()))  # fmt: skip
    assert out.returncode == 0, out.stderr
    started = json.loads(out.stdout)
    assert started["step_index"] == -1 and started["weight"] == 0.0
    return int(started["id"])


def _shadowing(rig, rid: int) -> None:
    """Wait (bounded) until the server's mirror has read the phase: a request's copy arrives."""
    seen = len(rig["upstream"].requests_for("holysheep"))

    def mirrored():
        _ask(rig)
        return len(rig["upstream"].requests_for("holysheep")) > seen

    sp.wait_for(mirrored, timeout_s=30, what="the first mirrored request")


def test_the_caller_gets_the_baselines_bytes_while_the_candidate_sees_copies_until_the_budget(rig) -> None:
    reference = _ask(rig)  # no rollout yet: the baseline's answer as the gateway gives it
    assert b"the baseline's answer" in reference
    # A budget of about 10 copies: the scripted usage costs the same on every copy.
    rid = _start(rig, "1", "0.0008", bake="600", samples="1000")
    _shadowing(rig, rid)
    answers = [_ask(rig) for _ in range(60)]
    assert all(a == reference for a in answers)  # byte for byte, whatever the candidate answered
    pairs = sp.wait_for(lambda: (n := shadow.spent(rig["engine"], rid)) and n[0] >= 5 and n, timeout_s=30,
                        what="the mirrored answers in shadow_log")  # fmt: skip
    copies = rig["upstream"].requests_for("holysheep")
    assert copies and all(not c.wants_stream and c.json["messages"] == HELLO for c in copies)
    # The budget stops mirroring: more traffic, and no more copies than the budget allows plus the
    # bounded overshoot (copies in flight and answered within one refresh).
    count, usd = pairs
    per_copy = usd / count
    assert per_copy > 0
    for _ in range(40):
        _ask(rig)
    n, _ = shadow.spent(rig["engine"], rid)
    budget_copies = 0.0008 / per_copy
    assert n <= budget_copies + 2 + 32 + 10, (n, budget_copies)
    before = len(rig["upstream"].requests_for("holysheep"))
    for _ in range(30):
        _ask(rig)
    assert len(rig["upstream"].requests_for("holysheep")) == before  # spent: nothing more is mirrored
    # No figure of real traffic counts a mirror: the log and the rollups have the callers' requests only.
    with rig["engine"].connect() as conn:
        logged = conn.execute(select(func.count()).select_from(RequestLog).where(RequestLog.provider == "holysheep"))
        rolled = conn.execute(select(func.coalesce(func.sum(RequestRollup.requests), 0))
                              .where(RequestRollup.provider == "holysheep"))  # fmt: skip
        assert logged.scalar_one() == 0 and rolled.scalar_one() == 0
    r = rollouts.get(rig["engine"], rid)
    assert r is not None and r.shadowing and r.state == "running"


def test_a_candidate_that_never_answers_delays_no_caller(rig) -> None:
    rig["upstream"].set_default(hang(), provider="holysheep")
    rid = _start(rig, "1", "5", bake="600", samples="1000")
    _shadowing(rig, rid)
    copies = rig["upstream"].requests_for("holysheep")
    reference = None
    for _ in range(10):
        got = _ask(rig)
        reference = reference or got
        assert got == reference and b"the baseline's answer" in got
    # Every caller was answered while the copies sent so far still hang at the candidate.
    assert copies and not any(c.served.is_set() for c in rig["upstream"].requests_for("holysheep"))


def test_a_healthy_shadow_phase_moves_to_the_first_step(rig) -> None:
    rid = _start(rig, "1", "5")

    def stepped():
        _ask(rig)
        r = rollouts.get(rig["engine"], rid)
        return r if r is not None and not r.shadowing else None

    r = sp.wait_for(stepped, timeout_s=120, what="the end of the shadow phase")
    assert r.state == "running" and r.weight == 0.1, r.last_reason
    assert "rollout step shadow -> 10 %" in r.last_reason
    trail = rollouts.history(rig["engine"], r)
    assert [(t[1], t[2]) for t in trail] == [(0.0, 0.0), (0.0, 0.1)], trail


def test_a_failing_candidate_is_aborted_in_the_shadow_phase(rig) -> None:
    rig["upstream"].set_default(server_error(), provider="holysheep")
    rid = _start(rig, "1", "5", samples="20")

    def ended():
        assert b"the baseline's answer" in _ask(rig)  # the caller never sees the candidate's failures
        r = rollouts.get(rig["engine"], rid)
        return r if r is not None and r.state != "running" else None

    r = sp.wait_for(ended, timeout_s=120, what="the abort")
    assert r.state == "aborted" and r.shadowing, r.last_reason
    assert "rollout abort at shadow: " in r.last_reason and "failure rate" in r.last_reason, r.last_reason
    trail = rollouts.history(rig["engine"], r)
    assert all(t[2] == 0.0 for t in trail)  # the candidate never had real traffic


@pytest.mark.parametrize("rig", ["route"], indirect=True)
def test_a_routes_shadow_phase_copies_its_deployments_requests_to_its_canary_then_steps(rig) -> None:
    from db import canary

    reference = _ask(rig)
    assert b"the baseline's answer" in reference
    assert not rig["upstream"].requests_for("holysheep")  # the route's canary share is 0
    rid = _start(rig, "1", "5", route="gpt-4.1")
    _shadowing(rig, rid)
    assert all(_ask(rig) == reference for _ in range(5))  # the caller's bytes, whatever the copy got
    copies = rig["upstream"].requests_for("holysheep")
    assert copies and all(c.json["model"] == "gpt-4.1" and not c.wants_stream for c in copies)
    # A caller's mark is honoured on a route too: its requests are never copied. One unmarked request
    # after them: once its copy arrived, the marked ones (queued before it) would have too.
    private = [{"role": "user", "content": "never duplicate me"}]
    for _ in range(8):
        _ask(rig, private, {"x-gateway-no-shadow": "1"})
    last = [{"role": "user", "content": "the unmarked one"}]
    _ask(rig, last)
    sp.wait_for(lambda: any(c.json["messages"] == last for c in rig["upstream"].requests_for("holysheep")),
                timeout_s=30, what="the unmarked request's copy")  # fmt: skip
    assert not any(c.json["messages"] == private for c in rig["upstream"].requests_for("holysheep"))

    def stepped():
        _ask(rig)
        r = rollouts.get(rig["engine"], rid)
        return r if r is not None and not r.shadowing else None

    r = sp.wait_for(stepped, timeout_s=120, what="the end of the route's shadow phase")
    assert r.state == "running" and r.weight == 0.1 and r.scope == "route:gpt-4.1", r.last_reason
    assert "rollout step shadow -> 10 %" in r.last_reason
    assert canary.get_state(rig["engine"], "route:gpt-4.1").ratio == 0.1
    assert canary.get_state(rig["engine"]).ratio == 0.0  # the global canary was not touched
    n, _ = shadow.spent(rig["engine"], rid)
    assert n >= 5
