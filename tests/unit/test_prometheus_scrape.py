"""Debian's Prometheus server scrapes the gateway app (real uvicorn) and a PromQL query over the
scraped series matches the requests that were sent; the alert rules load into the real server.
Skipped only when the `prometheus` binary is absent (apt-get install prometheus)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx2
import pytest

from tests.unit.test_server_asgi import GOOD, HELLO, Server, echo_handler, make_app

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
REPO = Path(__file__).resolve().parents[2]


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
