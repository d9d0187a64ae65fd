"""The canary against its baseline from the request log (app/monitor/canary_analysis.py): real
requests through the routing client and the simulator, a route's canary at 50 %; a failing canary
is found worse on the failed signal, a healthy one on none; too few requests is nodata; the global
canary's arms are its sides."""

from __future__ import annotations

import time

from app.monitor.canary_analysis import SIGNALS, TAIL_SIGNALS, analyse, signal_alpha
from core.faults import FaultSettings
from db.canary import route_scope, set_ratio
from db.faults import set_faults
from tests.support import paths

ROUTE = """
[routes."gpt-4.1"]
deployments = [{ provider = "direct" }]
canary = { provider = "holysheep" }
allowed_fails = 1000  # the canary keeps its share while it fails: the analysis, not the cooldown, judges

[breaker]
enabled = false
"""

MSG = [{"role": "user", "content": "hello"}]


def _client(client_factory, sqlite_url, error_rate: float):
    client = client_factory(sqlite_url, toml=(paths.REPO / "gateway.toml").read_text() + ROUTE)
    set_ratio(client.engine, 0.5, expected_version=None, actor="t", reason="half", scope=route_scope("gpt-4.1"))
    if error_rate:
        set_faults(client.engine, "holysheep", FaultSettings(error_rate=error_rate), actor="t")
    client.refresh()
    return client


def _traffic(client, n: int) -> None:
    from app.routing import AllRoutesFailed

    for i in range(n):
        try:
            client.chat(MSG, model="gpt-4.1", session_id=f"s{i}")
        except AllRoutesFailed:
            pass
    client.flush()


def test_a_failing_route_canary_is_worse_on_failures(client_factory, sqlite_url):
    client = _client(client_factory, sqlite_url, error_rate=0.6)
    client.settings.routes["gpt-4.1"]  # the route exists
    _traffic(client, 240)
    now = time.time()
    result = analyse(client.engine, since=now - 600, until=now + 1, route="gpt-4.1")
    by = {s.signal: s for s in result.signals}
    assert result.candidate_requests > 60 and result.baseline_requests > 60
    # The canary's own attempts fail; the route's deployment then answers, so few requests fail.
    failed = by["attempt failed"]
    assert failed.verdict == "worse" and failed.p_value < signal_alpha("attempt failed", 0.05)
    assert failed.candidate > 0 and failed.baseline == 0 and failed.ratio is None  # no baseline failures
    assert by["failed"].verdict != "worse"
    assert result.verdict == "worse"


def test_a_healthy_route_canary_is_worse_on_nothing(client_factory, sqlite_url):
    client = _client(client_factory, sqlite_url, error_rate=0.0)
    _traffic(client, 240)
    now = time.time()
    result = analyse(client.engine, since=now - 600, until=now + 1, route="gpt-4.1")
    assert all(s.verdict != "worse" for s in result.signals), result.rows()
    # No baseline before the window: the tail signals have no fixed threshold and say so.
    assert {s.signal for s in result.signals if s.verdict == "nodata"} == set(TAIL_SIGNALS)


def test_too_few_requests_is_nodata(client_factory, sqlite_url):
    client = _client(client_factory, sqlite_url, error_rate=0.0)
    _traffic(client, 20)
    now = time.time()
    result = analyse(client.engine, since=now - 600, until=now + 1, route="gpt-4.1")
    assert result.verdict == "nodata" and all(s.verdict == "nodata" for s in result.signals)


def test_the_global_canary_compares_its_sides(client_factory, sqlite_url):
    # Neither the guardrail nor the breaker acts here: the analysis alone is what is read.
    shipped = (
        (paths.REPO / "gateway.toml").read_text().replace("[guardrail]\nenabled = true", "[guardrail]\nenabled = false")
    )
    assert "enabled = false" in shipped
    client = client_factory(sqlite_url, toml=shipped + "\n[breaker]\nenabled = false\n")
    set_ratio(client.engine, 0.5, expected_version=None, actor="t", reason="half")
    set_faults(client.engine, "holysheep", FaultSettings(error_rate=0.6), actor="t")
    client.refresh()
    _traffic(client, 240)
    now = time.time()
    result = analyse(client.engine, since=now - 600, until=now + 1)
    assert result.scope == "global" and result.candidate_requests > 60
    by = {s.signal: s for s in result.signals}
    assert by["attempt failed"].verdict == "worse" and by["attempt failed"].baseline == 0


def test_the_cli_prints_every_signal_and_refuses_bad_input(client_factory, sqlite_url, tmp_path, monkeypatch, capsys):
    import json

    from app.__main__ import main

    client = _client(client_factory, sqlite_url, error_rate=0.6)
    _traffic(client, 200)
    cfg = tmp_path / "cli.toml"
    cfg.write_text((paths.REPO / "gateway.toml").read_text() + ROUTE)
    monkeypatch.setenv("GATEWAY_CONFIG", str(cfg))
    monkeypatch.setenv("DATABASE_URL", sqlite_url)
    assert main(["canary", "analyze", "--route", "gpt-4.1", "--minutes", "30", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scope"] == "route:gpt-4.1" and out["verdict"] == "worse"
    assert [s["signal"] for s in out["signals"]] == list(SIGNALS)
    assert main(["canary", "analyze", "--route", "gpt-4.1"]) == 0
    text = capsys.readouterr().out
    assert "verdict worse" in text and "attempt failed" in text
    for bad, says in (
        (["--minutes", "nan"], "--minutes must be a number from 1 to 10080"),
        (["--minutes", "1e400"], "--minutes must be a number from 1 to 10080"),
        (["--alpha", "0"], "--alpha must be"),
        (["--route", "nope"], "--route 'nope' has no canary deployment"),
    ):
        assert main(["canary", "analyze", *bad]) == 2
        assert says in capsys.readouterr().err


class _ShadowPhase:
    """A gateway serving ``ROUTE`` with ``faults`` on the canary's provider; ``begin`` starts a shadow
    phase that copies every request of the route, ``judge`` mirrors the queued copies (the workers'
    job, done here in order) and returns the pairs and the analysis of them."""

    def __init__(self, settings_factory, sqlite_url: str, faults: FaultSettings) -> None:
        from app.gateway import build_gateway

        settings = settings_factory((paths.REPO / "gateway.toml").read_text() + ROUTE, database_url=sqlite_url,
                                    latency_scale=0.005)  # fmt: skip
        self.gw = build_gateway(settings, guardrail=False)
        self.client = self.gw.client
        self.shadower = None
        set_faults(self.client.engine, "holysheep", faults, actor="t")
        self.client.refresh()

    def begin(self, rollout_id: int, seed: int) -> None:
        import random

        from app.rollout.shadow import Phase, Shadower

        self.client.flush()
        self.rollout_id, self.since = rollout_id, time.time()
        sh = Shadower(self.client.engine, self.client.settings, make_client=type(self.client),
                      transports=self.gw.transports, rng=random.Random(seed), queue_size=64)  # fmt: skip
        sh.phases = {"gpt-4.1": Phase(rollout_id=rollout_id, route="gpt-4.1", share=1.0, budget_usd=100.0,
                                      spent_usd=0.0)}  # fmt: skip
        self.client.core.on_plan.append(sh.offer)
        self.shadower = sh

    def judge(self):
        from app.monitor.canary_analysis import analyse_shadow
        from db.shadow import pairs

        sh = self.shadower
        while not sh._queue.empty():
            sh._mirror(*sh._queue.get_nowait())
        self.client.flush()
        found = pairs(self.client.engine, self.rollout_id)
        result = analyse_shadow(self.client.engine, rollout_id=self.rollout_id, since=self.since, until=time.time(),
                                route="gpt-4.1", min_samples=20)  # fmt: skip
        return found, result, {s.signal: s for s in result.signals}

    def close(self) -> None:
        if self.shadower is not None:
            self.shadower.close()
        self.client.close()


def test_a_shadow_phases_streamed_copies_are_judged_on_their_first_token(settings_factory, sqlite_url) -> None:
    """A route's shadow phase, streamed: the copies stream as the requests they copy did, so a
    candidate whose first token comes 100 times later (well past the baseline's spikes) is found
    worse on the slow first token, from pairs alone; a copy sent whole (of a request sent whole)
    carries no first token to compare."""
    run = _ShadowPhase(settings_factory, sqlite_url, FaultSettings(ttft_multiplier=100.0))
    client = run.client
    try:

        def ask(n: int, stream: bool) -> None:
            for _ in range(n):
                if stream:
                    for _piece in client.chat(MSG, model="gpt-4.1", stream=True):
                        pass
                else:
                    client.chat(MSG, model="gpt-4.1")

        ask(60, True)  # the baseline before the rollout: its p95 first token is the bar
        run.begin(rollout_id=9, seed=3)
        ask(30, True)
        ask(5, False)
        found, result, by = run.judge()
        assert len(found) == 35
        streamed = [p for p in found if p.shadow.stream]
        assert len(streamed) == 30 and all(p.shadow.ttft_ms is not None for p in streamed)
        assert all(p.shadow.ttft_ms is None and p.shadow.chunk_gap_ms is None for p in found if not p.shadow.stream)
        assert by["slow first token"].verdict == "worse", result.rows()
        assert by["slow first token"].candidate >= 25 > by["slow first token"].baseline
        assert by["failed"].verdict != "worse"
    finally:
        run.close()


def test_a_wordier_candidate_is_found_verbose_from_a_shadow_phases_pairs(settings_factory, sqlite_url) -> None:
    """A candidate that answers the same requests at three times the length (the simulator's
    verbosity fault) is found worse on output tokens (``verbose``), from pairs alone."""
    run = _ShadowPhase(settings_factory, sqlite_url, FaultSettings(verbosity_multiplier=3.0))
    try:
        for _ in range(60):  # the baseline before the rollout: its p95 of output tokens is the bar
            run.client.chat(MSG, model="gpt-4.1")
        run.begin(rollout_id=11, seed=5)
        for _ in range(30):
            run.client.chat(MSG, model="gpt-4.1")
        found, result, by = run.judge()
        assert len(found) == 30
        assert by["verbose"].verdict == "worse", result.rows()
        assert by["verbose"].candidate > by["verbose"].baseline
    finally:
        run.close()


def test_the_candidate_has_its_allowed_change_on_each_tail_signal() -> None:
    """A tail event is a value above the baseline's p95; for the candidate, above that p95 times its
    allowed change (latency +10 %, cost +5 %), so a candidate within it is not counted against."""
    from types import SimpleNamespace

    from app.monitor.canary_analysis import ALLOWED_CHANGE, _events

    assert set(ALLOWED_CHANGE) == set(TAIL_SIGNALS)
    limits = {"slow": 1000.0, "slow first token": 200.0, "slow chunks": 50.0, "verbose": 400.0, "costly": 0.01}

    def row(latency_ms: float, cost_usd: float):
        return SimpleNamespace(status="ok", refused=False, finish_reason="stop", completion_tokens=5, tool_calls=0,
                               tool_json_bad=0, schema_bad=None, latency_ms=latency_ms, ttft_ms=None,
                               chunk_gap_ms=None, cost_usd=cost_usd)  # fmt: skip

    within = row(1090.0, 0.0104)  # +9 % latency, +4 % cost: above the p95, within the allowed change
    assert _events(within, limits, candidate=False)["slow"] and _events(within, limits, candidate=False)["costly"]
    assert not _events(within, limits, candidate=True)["slow"] and not _events(within, limits, candidate=True)["costly"]
    beyond = row(1110.0, 0.0106)
    assert _events(beyond, limits, candidate=True)["slow"] and _events(beyond, limits, candidate=True)["costly"]
    assert not _events(row(1110.0, 0.0), {**limits, "slow": None}, candidate=True)["slow"]  # no baseline: no event
    # Output tokens (verbosity) the same way: 9 % more than the baseline's p95 is within, 11 % beyond.
    wordy, wordier = row(1.0, 0.0), row(1.0, 0.0)
    wordy.completion_tokens, wordier.completion_tokens = 436, 444
    assert _events(wordy, limits, candidate=False)["verbose"] and not _events(wordy, limits, candidate=True)["verbose"]
    assert _events(wordier, limits, candidate=True)["verbose"]
