"""Routes as data (app/routing/routes.py): the strategies, health per deployment, limits and
fallback kinds as plain data and a seeded rng; then routes through the routing client, each
provider a MockTransport (a real HTTP exchange through the SDK, no sockets)."""

from __future__ import annotations

import json
import random
from collections import Counter

import httpx2
import pytest

from app.config import ConfigError, load_settings
from app.routing import AllRoutesFailed
from app.routing.routes import (
    CONTENT_POLICY,
    CONTEXT_WINDOW,
    Deployment,
    Route,
    RouteTable,
    fallback_kind,
    session_draw,
)

A = Deployment("openai", "gpt-4.1", "gpt-4.1", weight=3, price=10.0)
B = Deployment("azure-eu", "gpt-4.1-prod", "gpt-4.1", weight=1, price=10.0)
C = Deployment("vllm-a", "gpt-4.1", "gpt-4.1", weight=1, price=2.0, context_tokens=8000)


def table(strategy: str = "weighted", *deps: Deployment, seed: int = 1, **kw) -> RouteTable:
    route = Route("r", strategy, deps or (A, B), **kw)
    return RouteTable({"r": route}, random.Random(seed))


def first(t: RouteTable, **kw) -> str:
    targets, _ = t.order("r", now=kw.pop("now", 100.0), prompt_tokens=kw.pop("prompt_tokens", 10), **kw)
    return targets[0].provider


# -- strategies ---------------------------------------------------------------------------------


def test_weighted_splits_exactly_by_weight_in_every_round():
    t = table("weighted", A, B)
    picks = [first(t) for _ in range(400)]
    for i in range(0, 400, 4):  # 3 of every 4, interleaved (smooth), not 3 in a row then 1
        assert Counter(picks[i : i + 4]) == {"openai": 3, "azure-eu": 1}


def test_weighted_split_with_a_session_is_within_five_percent_over_many_sessions():
    t = table("weighted", A, B)
    n = 4000
    counts = Counter(first(t, session_id=f"s{i}") for i in range(n))
    assert abs(counts["openai"] / n - 0.75) < 0.05 and abs(counts["azure-eu"] / n - 0.25) < 0.05


def test_weighted_order_holds_every_deployment_once_and_zero_weight_last():
    z = Deployment("spare", "gpt-4.1", "gpt-4.1", weight=0)
    t = table("weighted", A, z, B)
    for _ in range(50):
        targets, _ = t.order("r", now=0.0, prompt_tokens=1)
        assert sorted(x.provider for x in targets) == ["azure-eu", "openai", "spare"]
        assert targets[-1].provider == "spare" and "weight 0" in targets[-1].why


def test_a_session_stays_on_one_deployment_and_moves_only_while_it_cools():
    t = table("weighted", A, B, C)
    homes = {s: first(t, session_id=s) for s in (f"sess-{i}" for i in range(200))}
    assert set(homes.values()) == {"openai", "azure-eu", "vllm-a"}  # sessions spread
    assert all(first(t, session_id=s) == h for s, h in homes.items())  # and stay
    t.finished(A, 100.0, health=False, cooldown_s=30, allowed_fails=1)  # openai cools
    moved = {s: first(t, session_id=s) for s in homes}
    assert all(moved[s] == h for s, h in homes.items() if h != "openai")  # the others stay put
    assert all(moved[s] != "openai" for s in homes)
    assert all(first(t, session_id=s, now=131.0) == h for s, h in homes.items())  # and come back


def test_ordered_takes_the_first_healthy():
    t = table("ordered", B, A)
    assert [first(t) for _ in range(20)] == ["azure-eu"] * 20
    t.finished(B, 100.0, health=False, cooldown_s=30, allowed_fails=1)
    targets, skipped = t.order("r", now=110.0, prompt_tokens=1)
    assert [x.provider for x in targets] == ["openai"] and "cooling down (20 s left)" in skipped[0]


def test_least_busy_takes_the_fewest_in_flight():
    t = table("least_busy", A, B)
    t.started(A, 0.0, 10)
    t.started(A, 0.0, 10)
    t.started(B, 0.0, 10)
    targets, _ = t.order("r", now=1.0, prompt_tokens=1)
    assert [x.provider for x in targets] == ["azure-eu", "openai"]
    assert targets[0].why == "least_busy: in flight azure-eu 1, openai 2"


def test_lowest_latency_prefers_the_unmeasured_then_the_fastest_and_explores():
    t = table("lowest_latency", A, B, seed=7)
    assert first(t) in ("openai", "azure-eu")
    t.finished(A, 1.0, health=True, cooldown_s=30, allowed_fails=3, latency_ms=420.0)
    assert first(t) == "azure-eu"  # never measured: tried first
    t.finished(B, 1.0, health=True, cooldown_s=30, allowed_fails=3, latency_ms=180.0)
    picks = Counter(first(t) for _ in range(2000))
    assert 0.005 < picks["openai"] / 2000 < 0.06  # the exploration share (half of 5 % lands on openai)
    t2 = table("lowest_latency", A, B, seed=11)
    t2.finished(A, 1.0, health=True, cooldown_s=30, allowed_fails=3, latency_ms=420.0)
    t2.finished(B, 1.0, health=True, cooldown_s=30, allowed_fails=3, latency_ms=180.0)
    whys = {x.why for _ in range(100) for x in t2.order("r", now=2.0, prompt_tokens=1)[0][:1]}
    assert "lowest_latency: azure-eu 180 ms < openai 420 ms" in whys


def test_lowest_latency_moves_off_a_deployment_made_slow():
    t = table("lowest_latency", A, B, seed=5)
    for _ in range(3):
        t.finished(A, 1.0, health=True, cooldown_s=30, allowed_fails=3, latency_ms=100.0)
        t.finished(B, 1.0, health=True, cooldown_s=30, allowed_fails=3, latency_ms=200.0)
    assert Counter(first(t) for _ in range(200))["openai"] > 180
    for _ in range(5):  # openai slows down
        t.finished(A, 2.0, health=True, cooldown_s=30, allowed_fails=3, latency_ms=2000.0)
    assert Counter(first(t) for _ in range(200))["azure-eu"] > 180


def test_cheapest_takes_the_lowest_price():
    t = table("cheapest", A, C)
    targets, _ = t.order("r", now=0, prompt_tokens=10)
    assert [x.provider for x in targets] == ["vllm-a", "openai"]
    assert targets[0].why == "cheapest: vllm-a $2/M < openai $10/M"


# -- health and limits ------------------------------------------------------------------------


def test_cooldown_after_allowed_fails_in_a_row_and_back_after_it():
    t = table("ordered", A, B)
    assert t.finished(A, 10.0, health=False, cooldown_s=30, allowed_fails=3) is None
    assert t.finished(A, 10.0, health=None, cooldown_s=30, allowed_fails=3) is None  # says nothing
    assert t.finished(A, 10.0, health=True, cooldown_s=30, allowed_fails=3) is None  # resets the run
    for _ in range(2):
        assert t.finished(A, 11.0, health=False, cooldown_s=30, allowed_fails=3) is None
    msg = t.finished(A, 12.0, health=False, cooldown_s=30, allowed_fails=3)
    assert msg == "openai/gpt-4.1: 3 failures in a row, out for 30 s"
    assert first(t, now=41.9) == "azure-eu" and first(t, now=42.0) == "openai"


def test_a_prompt_longer_than_a_window_skips_that_deployment():
    t = table("cheapest", A, C)
    targets, skipped = t.order("r", now=0, prompt_tokens=9000)
    assert [x.provider for x in targets] == ["openai"]
    assert skipped == ["vllm-a/gpt-4.1: context window 8,000 < prompt ~9,000 tokens"]


def test_rpm_steers_around_before_the_limit():
    capped = Deployment("azure-eu", "gpt-4.1-prod", "gpt-4.1", rpm=3, price=1.0)
    t = table("cheapest", capped, A)
    seen = []
    for i in range(6):
        targets, _ = t.order("r", now=float(i), prompt_tokens=10)
        seen.append(targets[0].provider)
        t.started(targets[0].deployment, float(i), 10)
    assert seen == ["azure-eu"] * 3 + ["openai"] * 3
    targets, _ = t.order("r", now=5.0, prompt_tokens=10)
    assert targets[-1].provider == "azure-eu" and "steered last: at its rpm 3 (3 in the last minute)" in targets[-1].why
    assert first(t, now=61.0) == "azure-eu"  # the minute has passed


def test_tpm_counts_tokens():
    capped = Deployment("azure-eu", "gpt-4.1-prod", "gpt-4.1", tpm=1000, price=1.0)
    t = table("cheapest", capped, A)
    t.started(capped, 0.0, 900)
    assert first(t, now=1.0, prompt_tokens=50) == "azure-eu"
    assert first(t, now=1.0, prompt_tokens=200) == "openai"


def test_the_tpm_window_forgets_what_left_it_and_an_unlimited_deployment_keeps_no_window():
    """The window's token sum is kept as requests come and go (reading it is not a pass over the
    last minute's requests, which cost 1 ms a request at 1,000 a second), and is the same sum a
    pass would give; a deployment with neither rpm nor tpm keeps no per-request history at all."""
    capped = Deployment("azure-eu", "gpt-4.1-prod", "gpt-4.1", tpm=1000, price=1.0)
    t = table("cheapest", capped, A)
    for i in range(4):
        t.started(capped, float(i * 20), 300)  # at 0, 20, 40, 60 s
    assert t.at_limit(capped, 79.0, 101) == "at its tpm 1,000 (900 in the last minute)"  # 20, 40, 60
    t.started(capped, 80.0, 300)
    assert t.at_limit(capped, 100.5, 400) is None  # 60 and 80 s remain: 600 + 400
    s = t.stat(capped)
    assert (len(s.used), s.used_tokens) == (2, sum(tokens for _, tokens in s.used)) == (2, 600)
    for i in range(1000):
        t.started(A, float(i), 10)
    assert len(t.stat(A).used) == 0 and t.stat(A).used_tokens == 0


@pytest.mark.parametrize(
    ("headers", "tokens", "steered"),
    [
        ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "20s"}, 10, True),
        ({"x-ratelimit-remaining-requests": "5", "x-ratelimit-remaining-tokens": "100"}, 500, True),
        ({"x-ratelimit-remaining-requests": "5", "x-ratelimit-remaining-tokens": "100"}, 50, False),
        ({"x-ratelimit-remaining-requests": "nan"}, 10, False),
        ({"X-RateLimit-Remaining-Requests": "0", "x-ratelimit-reset-requests": "1m30s"}, 10, True),
        ({"x-ratelimit-remaining-requests": "-1"}, 10, False),
    ],
)
def test_ratelimit_headers_steer_around(headers, tokens, steered):
    cheap = Deployment("azure-eu", "gpt-4.1-prod", "gpt-4.1", price=1.0)
    t = table("cheapest", cheap, A)
    t.learn_limits(cheap, 0.0, headers)
    assert (first(t, now=1.0, prompt_tokens=tokens) == "openai") is steered


def test_ratelimit_headers_expire_with_their_reset():
    cheap = Deployment("azure-eu", "gpt-4.1-prod", "gpt-4.1", price=1.0)
    t = table("cheapest", cheap, A)
    t.learn_limits(cheap, 0.0, {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s"})
    assert first(t, now=59.0) == "openai" and first(t, now=60.5) == "azure-eu"  # capped at a minute
    t.learn_limits(cheap, 100.0, {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "250ms"})
    assert first(t, now=100.2) == "openai" and first(t, now=100.3) == "azure-eu"


def test_canary_goes_first_when_drawn_and_not_at_all_otherwise():
    canary = Deployment("vllm-a", "gpt-4.1", "gpt-4.1")
    t = table("ordered", A, B, canary=canary)
    targets, _ = t.order("r", now=0, prompt_tokens=1, canary_ratio=0.25, draw=0.1)
    assert targets[0].canary and targets[0].provider == "vllm-a" and targets[0].why == "canary: 25% of r"
    targets, _ = t.order("r", now=0, prompt_tokens=1, canary_ratio=0.25, draw=0.3)
    assert "vllm-a" not in [x.provider for x in targets]
    draws = [session_draw("r", f"s{i}") for i in range(4000)]
    assert all(0 < d < 1 for d in draws) and abs(sum(d < 0.25 for d in draws) / 4000 - 0.25) < 0.03
    assert session_draw("r", "ü-Ω-會話") == session_draw("r", "ü-Ω-會話")


@pytest.mark.parametrize(
    ("error_class", "status", "text", "kind"),
    [
        ("bad_request", 400, "This model's maximum context length is 128000 tokens", CONTEXT_WINDOW),
        ("bad_request", 400, "{'code': 'context_length_exceeded'}", CONTEXT_WINDOW),
        ("bad_request", 400, "prompt is too long: 210000 tokens > 200000 maximum", CONTEXT_WINDOW),
        ("bad_request", 400, "The response was filtered due to content_filter", CONTENT_POLICY),
        ("bad_request", 400, "code: content_policy_violation", CONTENT_POLICY),
        ("bad_request", 400, "ResponsibleAIPolicyViolation", CONTENT_POLICY),
        ("bad_request", 400, "temperature must be <= 2", None),
        ("server_error", 500, "maximum context length", None),  # a 5xx fails over as it is
        ("bad_request", None, "maximum context length", None),
    ],
)
def test_fallback_kind(error_class, status, text, kind):
    assert fallback_kind(error_class, status, text) == kind


# -- configuration ----------------------------------------------------------------------------

PROVIDERS = """
[routing]
primary = "openai"
fallback = "anthropic"

[providers.openai]
base_url = "https://api.openai.example/v1"
api_key_env = "OPENAI_API_KEY"
models = ["gpt-4.1", "gemini-2.5-flash"]
default_model = "gpt-4.1"

[providers.azure-eu]
base_url = "https://eu.azure.example/openai/v1"
api_key_env = "AZURE_KEY"
models = ["gpt-4.1"]
default_model = "gpt-4.1"

[providers.anthropic]
base_url = "https://api.anthropic.example/v1"
api_key_env = "ANTHROPIC_KEY"
models = ["claude-sonnet-4-20250514"]
default_model = "claude-sonnet-4-20250514"

[providers.gemini]
base_url = "https://gemini.example/v1beta/openai"
api_key_env = "GEMINI_KEY"
models = ["gemini-2.5-flash"]
default_model = "gemini-2.5-flash"
"""

ROUTES = """
[routes."gpt-4.1"]
strategy = "ordered"
deployments = [
  { provider = "azure-eu", model = "gpt-4.1-prod", price_as = "gpt-4.1" },
  { provider = "openai" },
]
fallbacks = ["claude-sonnet-4-20250514", "gemini-2.5-flash"]
context_window_fallbacks = ["gemini-2.5-flash"]
content_policy_fallbacks = ["claude-sonnet-4-20250514"]
allowed_fails = 2
cooldown_s = 30

[routes."claude-sonnet-4-20250514"]
deployments = [{ provider = "anthropic" }]

[routes."gemini-2.5-flash"]
deployments = [{ provider = "gemini", weight = 1 }, { provider = "openai", weight = 1 }]
"""

ENV = {"OPENAI_API_KEY": "k1", "AZURE_KEY": "k2", "ANTHROPIC_KEY": "k3", "GEMINI_KEY": "k4"}


def load(tmp_path, text: str):
    p = tmp_path / "gateway.toml"
    p.write_text(text)
    return load_settings(p, env={**ENV, "DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}"})


def test_routes_load(tmp_path):
    s = load(tmp_path, PROVIDERS + ROUTES)
    assert list(s.routes) == ["gpt-4.1", "claude-sonnet-4-20250514", "gemini-2.5-flash"]
    assert s.routes["gpt-4.1"].deployments[0].model == "gpt-4.1-prod"


@pytest.mark.parametrize(
    ("route", "message"),
    [
        ('deployments = [{ provider = "nope" }]', "provider 'nope' is not defined"),
        ('deployments = [{ provider = "anthropic" }]', "anthropic does not serve 'gpt-4.1'"),
        ('deployments = [{ provider = "openai" }, { provider = "openai" }]', "listed twice"),
        ('deployments = [{ provider = "openai", weight = 0 }]', "every deployment has weight 0"),
        ('deployments = [{ provider = "openai", weight = -1 }]', "weight"),
        ('deployments = [{ provider = "openai", weight = nan }]', "weight"),
        ('deployments = [{ provider = "openai", rpm = 1e400 }]', "rpm"),
        ('deployments = [{ provider = "openai" }]\nfallbacks = ["gpt-4.1"]', "cannot fall back to itself"),
        ('deployments = [{ provider = "openai" }]\nfallbacks = ["nope"]', "'nope' is not a route"),
        ('deployments = [{ provider = "openai" }]\nstrategy = "random"', "strategy"),
        ("deployments = []", "deployments"),
        ('deployments = [{ provider = "azure-eu", model = "my-dep" }]\n', None),
        ('deployments = [{ provider = "openai", price_as = "nope" }]', "price_as 'nope' is not in the catalog"),
    ],
)
def test_a_bad_route_is_refused_with_the_field_named(tmp_path, route, message):
    text = PROVIDERS + f'\n[routes."gpt-4.1"]\n{route}\n'
    if message is None:  # the route's name prices a deployment alias
        assert load(tmp_path, text).routes["gpt-4.1"].deployments[0].model == "my-dep"
        return
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, text)
    assert "routes" in str(exc.value) and message in str(exc.value)
    assert "got {" not in str(exc.value) and "\n" not in str(exc.value)  # one line, not the whole file echoed


def test_the_example_in_gateway_toml_loads(tmp_path):
    from tests.support import paths

    shipped = (paths.REPO / "gateway.toml").read_text()
    block = shipped[shipped.index('#   [routes."gpt-4.1"]') : shipped.index("# Canary guardrail")]
    example = "\n".join(line[4:] for line in block.splitlines() if line.startswith("#   "))
    p = tmp_path / "gateway.toml"
    p.write_text(shipped + "\n" + example + "\n")
    s = load_settings(p, env={"DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}"})
    assert list(s.routes) == ["gpt-4.1", "gemini-2.5-flash"] and s.routes["gpt-4.1"].canary is not None


def test_an_alias_the_catalog_cannot_price_is_refused(tmp_path):
    text = PROVIDERS + '\n[routes."my-model"]\ndeployments = [{ provider = "azure-eu", model = "my-dep" }]\n'
    with pytest.raises(ConfigError, match="its cost is unknown; set price_as"):
        load(tmp_path, text)


# -- through the routing client -----------------------------------------------------------------


class Upstream:
    """A MockTransport upstream that answers as told and keeps what it was sent."""

    def __init__(self, name: str):
        self.name = name
        self.bodies: list[dict] = []
        self.answer = lambda body: completion(body["model"], f"from {name}")
        self.headers: dict[str, str] = {}

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        out = self.answer(body)
        if isinstance(out, httpx2.Response):
            return out
        return httpx2.Response(200, json=out, headers=self.headers)


def completion(model: str, text: str) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100},
    }


def refusal(status: int, message: str, code: str | None = None) -> httpx2.Response:
    return httpx2.Response(status, json={"error": {"message": message, "type": "invalid_request_error", "code": code}})


@pytest.fixture
def routed(client_factory, sqlite_url, monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    ups = {n: Upstream(n) for n in ("openai", "azure-eu", "anthropic", "gemini")}
    client = client_factory(
        sqlite_url, toml=PROVIDERS + ROUTES, transports={n: httpx2.MockTransport(u) for n, u in ups.items()}
    )
    return client, ups


MSG = [{"role": "user", "content": "hello"}]


def test_a_route_sends_its_deployment_model_and_logs_why(routed):
    client, ups = routed
    r = client.chat(MSG, model="gpt-4.1")
    assert (r.provider, r.model, r.requested_model, r.text) == ("azure-eu", "gpt-4.1-prod", "gpt-4.1", "from azure-eu")
    assert ups["azure-eu"].bodies[0]["model"] == "gpt-4.1-prod" and not ups["openai"].bodies
    assert r.cost_usd == pytest.approx((1000 * 2.0 + 100 * 8.0) / 1e6)  # priced as gpt-4.1
    client.telemetry.flush()
    from sqlalchemy import text

    with client.engine.connect() as conn:
        row = conn.execute(text("select route, deployment, route_why, model from request_log")).one()
    assert tuple(row) == ("gpt-4.1", "azure-eu/gpt-4.1-prod", "ordered: priority 1", "gpt-4.1-prod")


def test_failover_inside_the_route_then_cooldown_seen_at_the_upstream(routed):
    client, ups = routed
    ups["azure-eu"].answer = lambda body: httpx2.Response(503, json={"error": {"message": "down"}})
    r = client.chat(MSG, model="gpt-4.1")
    assert r.provider == "openai" and not r.fallback_used
    tried = len(ups["azure-eu"].bodies)
    assert tried == 2  # allowed_fails = 2: it cooled down during this request's own retries
    for _ in range(5):
        assert client.chat(MSG, model="gpt-4.1").provider == "openai"
    assert len(ups["azure-eu"].bodies) == tried  # no attempt while it cools


def test_down_the_fallback_list_when_every_deployment_failed(routed):
    client, ups = routed
    for n in ("azure-eu", "openai", "anthropic"):
        ups[n].answer = lambda body: httpx2.Response(500, json={"error": {"message": "boom"}})
    r = client.chat(MSG, model="gpt-4.1")
    assert (r.provider, r.model, r.fallback_used) == ("gemini", "gemini-2.5-flash", True)
    # In order: the route's two deployments, then claude's route, then gemini's (whose openai
    # deployment may come first by weight, and fails like openai's other one).
    order = [(a.provider, a.model) for a in r.attempt_log if (a.provider, a.model) != ("openai", "gemini-2.5-flash")]
    firsts = list(dict.fromkeys(order))
    assert firsts == [("azure-eu", "gpt-4.1-prod"), ("openai", "gpt-4.1"), ("anthropic", "claude-sonnet-4-20250514"),
                      ("gemini", "gemini-2.5-flash")]  # fmt: skip


def test_context_window_fallback_on_the_upstreams_refusal(routed):
    client, ups = routed
    too_long = refusal(400, "This model's maximum context length is 128000 tokens.", "context_length_exceeded")
    ups["azure-eu"].answer = lambda body: too_long
    r = client.chat(MSG, model="gpt-4.1")
    assert r.model == "gemini-2.5-flash" and r.fallback_used and r.provider in ("gemini", "openai")
    # Straight to the context-window fallback: not the route's other deployment, not the general list.
    assert [b["model"] for b in ups["openai"].bodies] in ([], ["gemini-2.5-flash"]) and not ups["anthropic"].bodies


def test_context_window_fallback_before_any_attempt_when_the_prompt_fits_no_window(routed):
    client, ups = routed
    from app import catalog

    window = catalog.get("gpt-4.1").context_tokens
    assert catalog.get("gemini-2.5-flash").context_tokens > window + 600
    long = [{"role": "user", "content": "x" * ((window + 300) * 4)}]  # 4 characters a token
    r = client.chat(long, model="gpt-4.1")
    assert r.model == "gemini-2.5-flash" and r.fallback_used
    sent = [b["model"] for u in ups.values() for b in u.bodies]
    assert sent and set(sent) == {"gemini-2.5-flash"}  # gpt-4.1's deployments were never asked


def test_content_policy_fallback(routed):
    client, ups = routed
    ups["azure-eu"].answer = lambda body: refusal(400, "The response was filtered", "content_filter")
    r = client.chat(MSG, model="gpt-4.1")
    assert (r.provider, r.fallback_used) == ("anthropic", True)
    assert not ups["openai"].bodies  # the route's other deployment would refuse it too: not tried


def test_a_plain_bad_request_is_not_a_fallback(routed):
    client, ups = routed
    ups["azure-eu"].answer = lambda body: refusal(400, "temperature must be <= 2")
    with pytest.raises(AllRoutesFailed):
        client.chat(MSG, model="gpt-4.1")
    assert not ups["openai"].bodies and not ups["anthropic"].bodies


def test_auto_picks_a_route_by_its_intent_rule(routed):
    client, _ = routed
    r = client.chat(MSG)  # the default intent model is gemini-2.5-flash, a route here
    assert r.requested_model == "auto" and r.model == "gemini-2.5-flash" and r.provider in ("gemini", "openai")


def test_models_without_a_route_keep_the_two_sided_routing(client_factory, sqlite_url):
    client = client_factory(sqlite_url)
    r = client.chat(MSG, model="gpt-4.1")
    assert r.provider in ("holysheep", "direct")
    client.telemetry.flush()
    from sqlalchemy import text

    with client.engine.connect() as conn:
        assert conn.execute(text("select route, deployment from request_log")).one() == (None, None)


def test_the_drill_down_shows_the_route_the_deployments_and_why(routed):
    from app.monitor import load_story

    client, ups = routed
    ups["azure-eu"].answer = lambda body: httpx2.Response(503, json={"error": {"message": "eu is down"}})
    r = client.chat(MSG, model="gpt-4.1")
    client.flush()
    story = load_story(client.engine, r.request_id)
    assert story is not None and story.route == "gpt-4.1"
    facts = {f["field"]: f["value"] for f in story.facts()}
    assert facts["route"] == "gpt-4.1" and facts["strategy"] == "ordered: priority 2"
    assert facts["answered by"] == "openai / gpt-4.1"
    rows = story.timeline_rows()
    assert [(x["provider"], x["model"], x["status"]) for x in rows] == [
        ("azure-eu", "gpt-4.1-prod", "error"),
        ("azure-eu", "gpt-4.1-prod", "error"),
        ("openai", "gpt-4.1", "ok"),
    ]
    assert [x["chosen because"] for x in rows] == ["ordered: priority 1", "ordered: priority 1", "ordered: priority 2"]


def test_the_drill_down_of_two_sided_routing_has_no_route_fields(client_factory, sqlite_url):
    from app.monitor import load_story

    client = client_factory(sqlite_url)
    r = client.chat(MSG)
    client.flush()
    story = load_story(client.engine, r.request_id)
    assert story is not None and story.route is None
    assert "route" not in {f["field"] for f in story.facts()}
    assert "chosen because" not in story.timeline_rows()[0]


SIM_ROUTES = """
[routes."gpt-4.1"]
strategy = "ordered"
deployments = [{ provider = "holysheep" }, { provider = "direct" }]

[routes."text-embedding-3-small"]
deployments = [{ provider = "direct" }]
"""


@pytest.fixture
def simulated(client_factory, sqlite_url):
    from tests.support import paths

    return client_factory(sqlite_url, toml=(paths.REPO / "gateway.toml").read_text() + SIM_ROUTES)


def test_a_stream_through_a_route_is_accounted_to_its_deployment(simulated):
    stream = simulated.chat(MSG, model="gpt-4.1", stream=True)
    text = "".join(stream)
    r = stream.result
    assert text and r is not None and (r.provider, r.model) == ("holysheep", "gpt-4.1") and r.cost_usd > 0
    simulated.flush()
    from sqlalchemy import text as sql

    with simulated.engine.connect() as conn:
        row = conn.execute(sql("select route, deployment, stream, status from request_log")).one()
    assert tuple(row) == ("gpt-4.1", "holysheep/gpt-4.1", True, "ok")


def test_the_responses_api_and_embeddings_through_routes(simulated):
    r = simulated.responses("hello", model="gpt-4.1")
    assert r.provider == "holysheep" and r.text
    e = simulated.embeddings(["one", "two"], model="text-embedding-3-small")
    assert e.provider == "direct" and len(e.raw["data"]) == 2


def test_a_routes_requests_are_not_counted_in_the_global_canary_split(simulated):
    import time as _time

    from app.monitor.stats import split_by_cause
    from db.monitor import side_counts

    for _ in range(6):
        simulated.chat(MSG, model="gpt-4.1")  # the route (holysheep first: ordered)
    simulated.chat(MSG, model="gemini-2.5-flash")  # no route: the two-sided routing
    simulated.flush()
    now = _time.time()
    split = split_by_cause(simulated.engine, primary="holysheep", fallback="direct", now=now, minutes=15)
    assert split.total == 1 and split.refused == 0 and not split.moved
    assert sum(p + f for p, f in side_counts(simulated.engine, since=now - 900, until=now, step=60).values()) == 1


def test_cooling_left_names_each_cooling_deployment_with_its_seconds_left():
    t = table("ordered", A, B)
    assert t.cooling_left(0.0) == {}
    t.finished(A, 100.0, health=False, cooldown_s=30, allowed_fails=1)
    assert t.cooling_left(110.0) == {A.key: 20.0}
    assert t.cooling_left(130.0) == {}  # over: not reported
