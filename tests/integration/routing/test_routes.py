"""Routes over four providers and their fallbacks, through a real ``python -m app serve`` and the
openai SDK, against a loopback upstream that plays openai, azure-eu, anthropic and vllm-a (each
its own path, each deployment its own upstream model name, so every count below is one
deployment's). One serve process for the file; each test uses routes of its own."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2
import openai
import pytest
from sqlalchemy import create_engine, text

from tests.support import serve_process
from tests.support.chaos_upstream import (
    ChaosUpstream,
    Fault,
    bad_request,
    context_length,
    ok,
    rate_limited,
    unavailable,
)
from tests.support.serve_process import cli, wait_for

PROVIDERS = ("openai", "azure-eu", "anthropic", "vllm-a")
MODELS = '["gpt-4.1", "gemini-2.5-flash", "claude-sonnet-4-20250514"]'


def by_model(faults: dict[str, Fault], default: Fault) -> Fault:
    """Answers each upstream model name as told (the routes' deployments send distinct names)."""

    def serve(h, req):
        faults.get(req.model, default).serve(h, req)

    return Fault("by_model", serve)


def slow(delay_s: float) -> Fault:
    inner = ok("slow answer")

    def serve(h, req):
        time.sleep(delay_s)
        inner.serve(h, req)

    return Fault(f"slow {delay_s}", serve)


ROUTES = """
[routes.split]
deployments = [
  { provider = "openai", model = "split-openai", price_as = "gpt-4.1", weight = 3 },
  { provider = "azure-eu", model = "split-azure", price_as = "gpt-4.1", weight = 1 },
]

[routes.failover]
strategy = "ordered"
deployments = [
  { provider = "vllm-a", model = "fo-vllm", price_as = "gpt-4.1" },
  { provider = "openai", model = "fo-openai", price_as = "gpt-4.1" },
]
fallbacks = ["claude-sonnet-4-20250514"]
allowed_fails = 2
cooldown_s = 600

[routes."claude-sonnet-4-20250514"]
deployments = [{ provider = "anthropic" }]

[routes.policy]
strategy = "ordered"
deployments = [
  { provider = "azure-eu", model = "pol-azure", price_as = "gpt-4.1" },
  { provider = "openai", model = "pol-openai", price_as = "gpt-4.1" },
]
content_policy_fallbacks = ["claude-sonnet-4-20250514"]
context_window_fallbacks = ["long"]

[routes.long]
deployments = [{ provider = "vllm-a", model = "long-vllm", price_as = "gemini-2.5-flash" }]

[routes.fast]
strategy = "lowest_latency"
deployments = [
  { provider = "vllm-a", model = "fast-vllm", price_as = "gemini-2.5-flash" },
  { provider = "openai", model = "fast-openai", price_as = "gemini-2.5-flash" },
]

[routes.busy]
strategy = "least_busy"
deployments = [
  { provider = "anthropic", model = "busy-anthropic", price_as = "claude-sonnet-4-20250514" },
  { provider = "vllm-a", model = "busy-vllm", price_as = "claude-sonnet-4-20250514" },
]

[routes.capped]
strategy = "ordered"
deployments = [
  { provider = "azure-eu", model = "cap-azure", price_as = "gpt-4.1", rpm = 3 },
  { provider = "openai", model = "cap-openai", price_as = "gpt-4.1" },
]

[routes.cooled]
strategy = "ordered"
deployments = [
  { provider = "azure-eu", model = "cd-azure", price_as = "gpt-4.1" },
  { provider = "openai", model = "cd-openai", price_as = "gpt-4.1" },
]
allowed_fails = 2
cooldown_s = 600

[routes.canaried]
strategy = "ordered"
deployments = [{ provider = "openai", model = "can-openai", price_as = "gpt-4.1" }]
canary = { provider = "vllm-a", model = "can-vllm", price_as = "gpt-4.1" }
"""


def config(upstream_url: str) -> str:
    providers = "".join(
        f'[providers.{name}]\nbase_url = "{upstream_url}/{name}/v1"\napi_key_env = "CHAOS_KEY"\n'
        f'models = {MODELS}\ndefault_model = "gpt-4.1"\ntimeout_s = 10\n'
        for name in PROVIDERS
    )
    return (
        '[routing]\nprimary = "openai"\nfallback = "anthropic"\ninitial_ratio = 0\n'
        "[retry]\nmax_attempts = 1\nbase_delay_s = 0\n"
        "[breaker]\nmin_attempts = 1000\n"  # the deployments' own cooldowns are what is tested
        "[telemetry]\nflush_interval_s = 0.05\n" + providers + ROUTES
    )


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("routes")
    with ChaosUpstream() as up:
        up.set_default(ok())
        path = tmp / "gateway.toml"
        path.write_text(config(up.url))
        url = f"sqlite:///{tmp / 'gateway.db'}"
        serve = serve_process.start(path, url)
        made = cli(serve.env, "keys", "create", "--name", "routes", "--json")
        assert made.returncode == 0, made.stderr
        key = json.loads(made.stdout)["key"]
        client = openai.OpenAI(base_url=serve.base_url, api_key=key, max_retries=0, timeout=30)
        try:
            yield up, serve, client, url
        finally:
            client.close()
            assert serve.terminate() == 0


def sent(up: ChaosUpstream, model: str) -> int:
    return sum(1 for r in up.requests if r.model == model)


def ask(client: openai.OpenAI, model: str, content: str = "hello") -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}])


def test_models_lists_the_route_names(gateway):
    _, serve, client, _ = gateway
    body = httpx2.get(
        f"{serve.base_url}/models", headers={"Authorization": f"Bearer {client.api_key}"}, timeout=10
    ).json()
    ids = [m["id"] for m in body["data"]]
    assert {"split", "failover", "policy", "long", "fast", "busy", "capped", "canaried"} <= set(ids)
    assert body["object"] == "list" and all(m["object"] == "model" for m in body["data"])


def test_the_weighted_split_over_400_requests(gateway):
    up, _, client, _ = gateway
    with ThreadPoolExecutor(8) as pool:  # eight callers at a time: the split is per request, not per caller
        answered = list(pool.map(lambda _: ask(client, "split").model, range(400)))
    assert set(answered) == {"split-openai", "split-azure"}  # the caller sees which model answered
    a, b = sent(up, "split-openai"), sent(up, "split-azure")
    assert a + b == 400 and abs(a / 400 - 0.75) <= 0.05, (a, b)


def test_failover_inside_a_route_cooldown_then_down_the_fallback_list(gateway):
    up, _, client, url = gateway
    up.set_default(by_model({"fo-vllm": unavailable()}, ok()), "vllm-a")
    try:
        for _ in range(6):
            assert ask(client, "failover").choices[0].message.content == "chaos says hello"
        # allowed_fails = 2: vllm-a's deployment sat out after its second failure, and was not asked
        # again while it cooled down (600 s).
        assert sent(up, "fo-vllm") == 2 and sent(up, "fo-openai") == 6
        up.set_default(by_model({"fo-openai": unavailable()}, ok()), "openai")
        r = client.chat.completions.with_raw_response.create(
            model="failover", messages=[{"role": "user", "content": "hello"}]
        )
        assert r.headers["x-gateway-provider"] == "anthropic"
        assert sent(up, "claude-sonnet-4-20250514") == 1
    finally:
        up.set_default(ok(), "vllm-a")
        up.set_default(ok(), "openai")
    engine = create_engine(url)
    try:
        rows = wait_for(
            lambda: (
                (
                    rs := engine.connect()
                    .execute(text("select deployment, route_why, status from request_log where route is not null"))
                    .all()
                )
                and any(r[0] == "anthropic/claude-sonnet-4-20250514" for r in rs)
                and rs
            ),
            timeout_s=10,
            what="the failover's rows",
        )
    finally:
        engine.dispose()
    by_dep = {(d, s) for d, _, s in rows}
    assert ("vllm-a/fo-vllm", "error") in by_dep and ("openai/fo-openai", "ok") in by_dep
    whys = {w for d, w, _ in rows if d == "anthropic/claude-sonnet-4-20250514"}
    assert whys == {"fallback: weighted: 1 of 1"}


def test_content_policy_fallback(gateway):
    up, _, client, _ = gateway
    refuse = bad_request("The response was filtered due to the prompt triggering content management policy.",
                         code="content_filter")  # fmt: skip
    up.set_default(by_model({"pol-azure": refuse}, ok()), "azure-eu")
    try:
        before = sent(up, "claude-sonnet-4-20250514")
        r = client.chat.completions.with_raw_response.create(
            model="policy", messages=[{"role": "user", "content": "hello"}]
        )
        assert r.headers["x-gateway-provider"] == "anthropic"
        assert sent(up, "claude-sonnet-4-20250514") == before + 1
        assert sent(up, "pol-openai") == 0  # the route's other deployment was not asked to refuse it again
    finally:
        up.set_default(ok(), "azure-eu")


def test_context_window_fallback(gateway):
    up, _, client, _ = gateway
    up.set_default(by_model({"pol-azure": context_length()}, ok()), "azure-eu")
    try:
        r = client.chat.completions.with_raw_response.create(
            model="policy", messages=[{"role": "user", "content": "hello"}]
        )
        assert r.headers["x-gateway-provider"] == "vllm-a" and sent(up, "long-vllm") == 1
        assert sent(up, "pol-openai") == 0
    finally:
        up.set_default(ok(), "azure-eu")


def test_lowest_latency_moves_traffic_off_a_deployment_made_slow(gateway):
    up, _, client, _ = gateway
    for _ in range(10):
        ask(client, "fast")
    up.set_default(by_model({"fast-vllm": slow(0.4)}, ok()), "vllm-a")
    up.set_default(by_model({"fast-openai": ok()}, ok()), "openai")
    try:
        for _ in range(10):  # both measured; the slow one's average climbs
            ask(client, "fast")
        before = sent(up, "fast-vllm")
        for _ in range(40):
            ask(client, "fast")
        # At most the exploration share (5 %) and a few while its average fell behind.
        assert sent(up, "fast-vllm") - before <= 6, (before, sent(up, "fast-vllm"))
    finally:
        up.set_default(ok(), "vllm-a")
        up.set_default(ok(), "openai")


def test_least_busy_spreads_concurrent_requests(gateway):
    up, _, client, _ = gateway
    up.set_default(by_model({"busy-anthropic": slow(0.5)}, ok()), "anthropic")
    up.set_default(by_model({"busy-vllm": slow(0.5)}, ok()), "vllm-a")
    try:
        start = threading.Barrier(8)

        def one(_):
            start.wait(timeout=30)
            return ask(client, "busy")

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(8)))
        a, b = sent(up, "busy-anthropic"), sent(up, "busy-vllm")
        assert a + b == 8 and 3 <= a <= 5, (a, b)
    finally:
        up.set_default(ok(), "anthropic")
        up.set_default(ok(), "vllm-a")


def test_rpm_steers_around_before_any_429(gateway):
    up, _, client, _ = gateway
    # azure-eu's deployment enforces its rpm of 3 as the real one would: a 4th request in the minute
    # gets 429. The gateway never sends it one.
    answered = []

    def limited(h, req):
        answered.append(req)
        (ok() if len(answered) <= 3 else rate_limited(retry_after_s=60)).serve(h, req)

    up.set_default(by_model({"cap-azure": Fault("rpm 3", limited)}, ok()), "azure-eu")
    try:
        for _ in range(7):
            ask(client, "capped")
    finally:
        up.set_default(ok(), "azure-eu")
    assert len(answered) == 3 and sent(up, "cap-openai") == 4


def test_a_route_canary_is_set_by_the_cli_and_takes_its_share(gateway):
    up, serve, client, _ = gateway
    for _ in range(5):
        ask(client, "canaried")
    assert sent(up, "can-vllm") == 0  # 0 % until set
    bad = cli(serve.env, "canary", "set", "0.5", "--route", "split", "--reason", "x")
    assert bad.returncode != 0 and "has no canary deployment; routes with one: canaried" in bad.stderr
    done = cli(serve.env, "canary", "set", "1", "--route", "canaried", "--reason", "try vllm", "--actor", "ops")
    assert done.returncode == 0, done.stderr
    assert "route canaried canary ratio 0 % -> 100 %" in done.stdout
    wait_for(lambda: ask(client, "canaried") and sent(up, "can-vllm") > 0, timeout_s=15, what="the route's new ratio")
    n = sent(up, "can-vllm")
    for _ in range(5):
        ask(client, "canaried")
    assert sent(up, "can-vllm") == n + 5
    shown = cli(serve.env, "canary", "show", "--route", "canaried", "--json")
    assert json.loads(shown.stdout)["ratio"] == 1.0 and json.loads(shown.stdout)["updated_by"] == "ops"
    glob = cli(serve.env, "canary", "show", "--json")
    assert json.loads(glob.stdout)["ratio"] == 0.0  # the global canary did not move


def test_a_cooldown_in_one_serve_process_is_seen_by_others_until_it_stops_reporting(gateway):
    """A deployment's cooldown lives in the process that saw the failures: a second serve process
    cools azure-eu's deployment down, another process (this test, as the dashboard would) reads it
    with that process's pid, and once that process is killed its report goes stale and stops
    counting, though 600 s of the cooldown are left."""
    import os
    import signal
    from pathlib import Path

    from db.breakers import LIVE_S, live_cooldowns
    from db.engine import dispose_all, get_engine

    up, serve, client, url = gateway
    second = serve_process.start(Path(serve.env["GATEWAY_CONFIG"]), url)
    other = openai.OpenAI(base_url=second.base_url, api_key=client.api_key, max_retries=0, timeout=30)
    engine = get_engine(url)
    up.set_default(by_model({"cd-azure": unavailable()}, ok()), "azure-eu")
    try:
        for _ in range(3):
            assert ask(other, "cooled").model == "cd-openai"
        assert sent(up, "cd-azure") == 2  # allowed_fails = 2, then it sat out
        cooling = wait_for(
            lambda: live_cooldowns(engine, now=time.time()).get("azure-eu/cd-azure"),
            timeout_s=30,
            what="the second serve process to report azure-eu/cd-azure cooling down",
        )
        assert [(c.pid, c.source) for c in cooling] == [(second.proc.pid, "server")]  # not the first's
        assert 500 < cooling[0].left_s(time.time()) <= 600
        # The first serve process never saw a failure: it still tries there first.
        assert ask(client, "cooled").model == "cd-openai" and sent(up, "cd-azure") == 3

        os.kill(second.proc.pid, signal.SIGKILL)  # no clean exit: its rows stay behind
        second.proc.wait(timeout=30)
        wait_for(
            lambda: "azure-eu/cd-azure" not in live_cooldowns(engine, now=time.time()),
            timeout_s=LIVE_S + 30,
            what="the killed process's report to go stale",
        )
        # Its row is still there; it just no longer counts.
        assert "azure-eu/cd-azure" in live_cooldowns(engine, now=time.time(), live_s=1e9)
    finally:
        up.set_default(ok(), "azure-eu")
        other.close()
        second.terminate()
        dispose_all()
