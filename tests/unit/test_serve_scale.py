"""Scale-out and observability of real ``serve`` processes: two servers on one PostgreSQL share keys,
rate limits, budgets and the canary ratio; Debian's Prometheus scrapes a server and PromQL counts
the requests that were sent."""

from __future__ import annotations

import os
import shutil
import subprocess

import httpx2
import pytest

from app import catalog
from app.server.admission import estimate_prompt_tokens
from db.canary import set_ratio
from db.engine import get_engine
from db.keys import create_key
from tests.support import serve_process as sp
from tests.support.chaos_upstream import ChaosUpstream, ok, server_error

HELLO = [{"role": "user", "content": "hello"}]
PG = os.environ.get("TEST_POSTGRES_URL")


def post(server, key, body):
    return httpx2.post(
        f"{server.base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


@pytest.fixture()
def pg_url():
    if not PG:
        pytest.skip("TEST_POSTGRES_URL not set (make test starts PostgreSQL and sets it)")
    from sqlalchemy import create_engine, text

    eng = create_engine(PG)
    with eng.begin() as conn:  # a clean schema: this test counts rows and windows
        conn.execute(text("drop schema public cascade"))
        conn.execute(text("create schema public"))
    eng.dispose()
    return PG


@pytest.mark.postgres
def test_two_servers_share_limits_budget_and_ratio(pg_url, tmp_path):
    with ChaosUpstream() as up:
        # A 5000-token prompt as the upstream reports it: the real cost far above the estimate.
        up.set_default(ok(prompt_tokens=5000))
        cfg = tmp_path / "gateway.toml"
        cfg.write_text(sp.chaos_config(up.url))
        a = sp.start(cfg, pg_url)
        b = sp.start(cfg, pg_url)
        try:
            engine = get_engine(pg_url)
            # rpm: 3 per minute for the key, whichever process counts them.
            _, k = create_key(engine, "shared-rpm", rpm=3)
            codes = [post(s, k, {"model": "gpt-4.1", "messages": HELLO}).status_code for s in (a, b, a, b)]
            assert sorted(codes) == [200, 200, 200, 429]
            assert codes[-1] == 429

            # budget: room for one request's estimate; its real cost (settled by A) uses it up for B.
            body = {"model": "gpt-4.1", "messages": HELLO, "max_tokens": 4}
            est = catalog.cost_usd("gpt-4.1", estimate_prompt_tokens(HELLO), 0, 4)
            _, kb = create_key(engine, "shared-budget", budget_usd=2 * est, period="day")
            assert post(a, kb, body).status_code == 200
            r = post(b, kb, body)
            assert r.status_code == 429 and r.json()["error"]["code"] == "budget_exceeded"

            # the canary ratio set once reaches both processes' routers
            set_ratio(engine, 1.0, expected_version=None, actor="test", reason="all to the canary")

            def sides():
                got = {post(s, k2, body).headers.get("x-gateway-canary-side") for s in (a, b)}
                return got == {"primary"}

            _, k2 = create_key(engine, "ratio-probe")
            sp.wait_for(sides, timeout_s=15, what="both servers to route to the primary")
        finally:
            a.terminate()
            b.terminate()


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_prometheus_scrapes_a_serve_process(tmp_path):
    with ChaosUpstream() as up:
        cfg = tmp_path / "gateway.toml"
        cfg.write_text(sp.chaos_config(up.url))
        server = sp.start(cfg, f"sqlite:///{tmp_path / 'gw.db'}")
        prom = None
        try:
            _, k = create_key(get_engine(f"sqlite:///{tmp_path / 'gw.db'}"), "prom")
            for _ in range(5):
                assert post(server, k, {"model": "gpt-4.1", "messages": HELLO}).status_code == 200
            up.script(server_error(), server_error(), provider="direct")
            for _ in range(2):
                assert post(server, k, {"model": "gpt-4.1", "messages": HELLO}).status_code == 502
            (tmp_path / "prometheus.yml").write_text(
                "global:\n  scrape_interval: 1s\n"
                "scrape_configs:\n  - job_name: gateway\n"
                f"    static_configs: [{{targets: ['127.0.0.1:{server.port}']}}]\n"
            )
            prom_port = sp.free_port()
            prom = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            base = f"http://127.0.0.1:{prom_port}/api/v1"

            def query(expr: str):
                try:
                    r = httpx2.get(f"{base}/query", params={"query": expr}, timeout=5)
                except httpx2.TransportError:
                    return None
                return r.json()["data"]["result"] if r.status_code == 200 else None

            ok_total = sp.wait_for(
                lambda: query('sum(gateway_requests_total{gen_ai_system="direct",status="ok"})'),
                timeout_s=60,
                what="the first scrape",
            )
            assert float(ok_total[0]["value"][1]) == 5
            errors = query('sum by (error_type) (gateway_requests_total{status="error"})')
            assert [(e["metric"]["error_type"], float(e["value"][1])) for e in errors] == [("server_error", 2.0)]
            attempts = query("sum(gateway_attempts_total)")
            assert float(attempts[0]["value"][1]) == 7
            ratio = query("gateway_canary_ratio")
            assert float(ratio[0]["value"][1]) == 0.0
        finally:
            if prom is not None:
                prom.terminate()
                try:
                    prom.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    prom.kill()
            server.terminate()
