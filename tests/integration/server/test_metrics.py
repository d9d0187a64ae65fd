"""Metrics with real processes: promtool over the alert rules, a real serve process scraped by
Prometheus, gauges moving with real conditions."""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.server.test_asgi import Server
from tests.support import paths
from tests.support import serve_process as sp
from tests.support.chaos_upstream import ChaosUpstream, ok, server_error
from tests.support.echo_app import GOOD, echo_handler, make_app

REPO = paths.REPO


ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"


ALERTS_TEST = REPO / "deploy" / "prometheus" / "alerts_test.yml"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_promtool_checks_and_unit_tests_the_rules():
    check = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 9 rules found" in check.stdout
    unit = subprocess.run(
        ["promtool", "test", "rules", ALERTS_TEST.name], capture_output=True, text=True, timeout=60, cwd=ALERTS.parent
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


# -- prometheus scrape -----------------------------------------------------------------------------
# Debian's Prometheus server scrapes the gateway app (real uvicorn) and a PromQL query over the
# scraped series matches the requests that were sent; the alert rules load into the real server.
# Skipped only when the `prometheus` binary is absent (apt-get install prometheus).


pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, *, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.2)  # polling a condition with a bound, not a timed assertion
    pytest.fail(f"timed out waiting for {what}")


def observing_app():
    """The test app, its handler reporting each request to the metrics as the router's driver will."""

    async def handler(req, key):
        reply = await echo_handler(req, key)
        app.metrics.observe_request(provider="direct", model=req.model, status="ok", latency_s=0.01)
        return reply

    app = make_app(handler=handler)
    return app


def test_prometheus_scrapes_the_gateway_and_promql_counts_the_requests(tmp_path):
    with Server(observing_app()) as srv:
        with httpx2.Client(base_url=f"http://127.0.0.1:{srv.port}") as http:
            for _ in range(7):
                r = http.post(
                    "/v1/chat/completions",
                    json={"model": "gpt-4.1", "messages": HELLO},
                    headers={"Authorization": f"Bearer {GOOD}"},
                )
                assert r.status_code == 200, r.text
            for _ in range(3):
                assert http.get("/v1/models").status_code == 401
        shutil.copy(REPO / "deploy" / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
        (tmp_path / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "rule_files: [alerts.yml]\n"
            "scrape_configs:\n  - job_name: gateway\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{srv.port}']}}]\n"
        )
        prom_port = free_port()
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            base = f"http://127.0.0.1:{prom_port}/api/v1"

            def query(expr: str):
                try:
                    r = httpx2.get(f"{base}/query", params={"query": expr}, timeout=5)
                except httpx2.TransportError:
                    return None
                return r.json()["data"]["result"] if r.status_code == 200 else None

            result = wait_for(
                lambda: query('sum(gateway_requests_total{gen_ai_request_model="gpt-4.1",status="ok"})'),
                timeout_s=60,
                what="the first scrape",
            )
            assert float(result[0]["value"][1]) == 7
            denied = query('gateway_key_denials_total{reason="unauthorized"}')
            assert float(denied[0]["value"][1]) == 3
            rules = httpx2.get(f"{base}/rules", timeout=5).json()["data"]["groups"]
            assert {r["name"] for g in rules for r in g["rules"]} >= {
                "GatewayHighErrorRate",
                "GatewayCircuitBreakerOpen",
            }
            assert all(r["health"] != "err" for g in rules for r in g["rules"])
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


# -- gauges tell truth -----------------------------------------------------------------------------
# Issue 18 item 5: the journal-depth and circuit-breaker gauges of a real ``python -m app serve``
# process move with the real condition, and what ``/metrics`` shows then fires the deploy/ alert.
#
# - ``gateway_log_journal_depth``: the SQLite database is held under an exclusive write lock by this
#   test (a stuck writer elsewhere, as in an incident), so the request log's batches fail and spill to
#   the journal; the gauge shows them, and drops back to 0 once the lock is released and they replay.
# - ``gateway_circuit_breaker_state``: the upstream answers 500 until the breaker opens; the gauge
#   reads 2 (open) for that provider.
#
# Each scrape is then fed to ``promtool test rules`` against deploy/prometheus/alerts.yml as the
# series Prometheus would have stored, and the alert must fire (skipped without promtool).


HELLO = [{"role": "user", "content": "hello"}]
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")


def scrape(server: sp.ServeProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} from the process's /metrics."""
    text = httpx2.get(f"{server.url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def promtool_fires(tmp: Path, series: str, value: float, minutes: int, alert: str, exp_labels: dict, summary: str):
    """Run promtool with ``series`` held at ``value`` for ``minutes`` minutes and return its result
    for an assertion that ``alert`` fires with these labels and summary at the end."""
    labels = "\n".join(f"              {k}: {v}" for k, v in exp_labels.items())
    test = tmp / "gauge_alert_test.yml"
    test.write_text(
        f"rule_files:\n  - {ALERTS}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n"
        f"      - series: '{series}'\n        values: '{value:g}x{minutes + 1}'\n    alert_rule_test:\n"
        f"      - eval_time: 0m\n        alertname: {alert}\n        exp_alerts: []\n"
        f"      - eval_time: {minutes}m\n        alertname: {alert}\n        exp_alerts:\n"
        f"          - exp_labels:\n{labels}\n            exp_annotations:\n"
        f'              summary: "{summary}"\n'
        f"              description: {_description(alert)!r}\n"
    )
    return subprocess.run(["promtool", "test", "rules", str(test)], capture_output=True, text=True, timeout=60)


def _description(alert: str) -> str:
    """The alert's description line, read from the rules file (the test checks firing, not wording)."""
    lines = ALERTS.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == f"- alert: {alert}")
    for line in lines[start + 1 :]:
        if line.strip().startswith("description:"):
            return line.split(":", 1)[1].strip().strip('"')
    raise AssertionError(f"{alert} has no description")


def config(upstream_url: str, extra: str) -> str:
    return sp.chaos_config(upstream_url) + extra


@pytest.fixture()
def upstream():
    with ChaosUpstream() as up:
        yield up


def start(tmp_path: Path, upstream: ChaosUpstream, extra: str) -> tuple[sp.ServeProcess, Path]:
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(config(upstream.url, extra))
    db = tmp_path / "gw.db"
    return sp.start(cfg, f"sqlite:///{db}"), db


def make_key(server: sp.ServeProcess) -> str:

    out = sp.cli(server.env, "keys", "create", "--name", "app", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["key"]


def chat(server: sp.ServeProcess, key: str) -> httpx2.Response:
    return httpx2.post(
        f"{server.base_url}/chat/completions",
        json={"model": "gpt-4.1", "messages": HELLO},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def test_journal_depth_gauge_shows_the_records_a_locked_database_left_in_the_journal(tmp_path, upstream):
    upstream.set_default(ok())
    # A write waits at most 0.3 s for the lock, so the writer gives up (and journals) quickly.
    server, db = start(tmp_path, upstream, "[database]\nlock_timeout_s = 0.3\n")
    try:
        key = make_key(server)
        assert chat(server, key).status_code == 200
        sp.wait_for(lambda: scrape(server)[("gateway_log_queue_depth", ())] == 0, timeout_s=30, what="queue empty")
        assert scrape(server)[("gateway_log_journal_depth", ())] == 0

        holder = sqlite3.connect(db, timeout=5, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")  # WAL: readers (the key lookup) still read; no writer gets in
        try:
            sent = 12
            for _ in range(sent):
                assert chat(server, key).status_code == 200  # served: only the log is stuck
            depth = sp.wait_for(
                lambda: scrape(server)[("gateway_log_journal_depth", ())],
                timeout_s=60,
                what="gateway_log_journal_depth above 0 while the database is locked",
            )
            assert 0 < depth <= sent  # one record per request, some may still be queued in memory
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        # The database answers again: the journal replays and the gauge says so.
        sp.wait_for(lambda: scrape(server)[("gateway_log_journal_depth", ())] == 0, timeout_s=60, what="replay")
    finally:
        server.terminate()

    if shutil.which("promtool"):
        res = promtool_fires(
            tmp_path,
            "gateway_log_journal_depth",
            depth,
            16,
            "GatewayLogJournalBacklog",
            {"severity": "ticket"},
            f"{depth:g} request-log records waiting in the local journal for 15 minutes",
        )
        assert res.returncode == 0, res.stdout + res.stderr


def test_breaker_state_gauge_reads_open_while_the_upstream_fails(tmp_path, upstream):
    upstream.set_default(server_error())
    extra = "[breaker]\nmin_attempts = 3\nwindow_s = 60\nfailure_rate = 0.5\ncooldown_s = 600\n"
    server, _ = start(tmp_path, upstream, extra)
    try:
        key = make_key(server)
        before = scrape(server)
        assert before[("gateway_circuit_breaker_state", (("gen_ai_system", "direct"),))] == 0
        statuses = [chat(server, key).status_code for _ in range(5)]
        assert all(s >= 500 for s in statuses), statuses
        after = scrape(server)
        state = after[("gateway_circuit_breaker_state", (("gen_ai_system", "direct"),))]
        assert state == 2  # open: the gateway stopped sending to "direct"
        assert after[("gateway_circuit_breaker_state", (("gen_ai_system", "holysheep"),))] == 0  # never tried
        # The breaker really is open: the next request is refused without reaching the upstream.
        seen = len(upstream.requests)
        assert chat(server, key).status_code == 503 and len(upstream.requests) == seen
    finally:
        server.terminate()

    if shutil.which("promtool"):
        res = promtool_fires(
            tmp_path,
            'gateway_circuit_breaker_state{gen_ai_system="direct"}',
            state,
            2,
            "GatewayCircuitBreakerOpen",
            {"severity": "page", "gen_ai_system": "direct"},
            "Circuit breaker open for provider direct",
        )
        assert res.returncode == 0, res.stdout + res.stderr


@needs_promtool
def test_promtool_helper_fails_when_the_gauge_stays_at_zero(tmp_path):
    """The promtool check above can fail: a gauge stuck at 0 (the bug) does not fire the alert."""
    res = promtool_fires(
        tmp_path,
        "gateway_log_journal_depth",
        0,
        16,
        "GatewayLogJournalBacklog",
        {"severity": "ticket"},
        "0 request-log records waiting in the local journal for 15 minutes",
    )
    assert res.returncode != 0 and "GatewayLogJournalBacklog" in res.stdout + res.stderr
