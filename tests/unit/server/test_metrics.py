"""Gateway Prometheus metrics (app/server/metrics.py), read back from the exposition text."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from app.server.metrics import DURATION_BUCKETS, METRIC_NAMES, GatewayMetrics
from tests.support import paths


def samples(m: GatewayMetrics) -> dict[tuple[str, frozenset], float]:
    out = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(m: GatewayMetrics, name: str, **labels) -> float:
    return samples(m).get((name, frozenset(labels.items())), 0.0)


def make() -> GatewayMetrics:
    return GatewayMetrics(providers=["holysheep", "direct"], models=["gpt-4.1", "gemini-2.5-flash"])


def test_every_declared_family_is_exported_and_names_follow_conventions():
    m = make()
    fams = {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}
    assert set(fams) == set(METRIC_NAMES)
    for name, fam in fams.items():
        if fam.type == "counter":
            assert any(s.name == name + "_total" for s in fam.samples) or not fam.samples
        if fam.type == "histogram":
            assert name.endswith(("_seconds", "_usage"))


def test_own_registry_not_the_global_one():
    a, b = make(), make()
    a.observe_attempt(provider="direct", model="gpt-4.1", status="ok")
    assert (
        value(
            a,
            "gateway_attempts_total",
            gen_ai_system="direct",
            gen_ai_request_model="gpt-4.1",
            status="ok",
            error_type="",
        )
        == 1
    )
    assert (
        value(
            b,
            "gateway_attempts_total",
            gen_ai_system="direct",
            gen_ai_request_model="gpt-4.1",
            status="ok",
            error_type="",
        )
        == 0
    )
    assert REGISTRY.get_sample_value("gateway_attempts_total") is None


def test_request_observation_counts_latency_ttft_tokens_cost():
    m = make()
    m.observe_request(
        provider="holysheep",
        model="gpt-4.1",
        status="ok",
        latency_s=0.3,
        ttft_s=0.05,
        prompt_tokens=100,
        cached_tokens=40,
        completion_tokens=20,
        cost_usd=0.0125,
    )
    m.observe_request(
        provider="holysheep",
        model="gpt-4.1",
        status="ok",
        latency_s=1.0,
        prompt_tokens=10,
        completion_tokens=5,
        cost_usd=0.0025,
    )
    lab = {"gen_ai_system": "holysheep", "gen_ai_request_model": "gpt-4.1"}
    assert value(m, "gateway_requests_total", **lab, status="ok", error_type="") == 2
    hist = {"gen_ai_operation_name": "chat", **lab, "status": "ok"}
    assert value(m, "gen_ai_client_operation_duration_seconds_count", **hist) == 2
    assert value(m, "gen_ai_client_operation_duration_seconds_sum", **hist) == pytest.approx(1.3)
    assert value(m, "gen_ai_client_operation_duration_seconds_bucket", **hist, le="0.32") == 1
    assert value(m, "gen_ai_client_operation_duration_seconds_bucket", **hist, le="1.28") == 2
    assert value(m, "gen_ai_client_operation_duration_seconds_bucket", **hist, le="+Inf") == 2
    ttft = {"gen_ai_operation_name": "chat", **lab}
    assert value(m, "gen_ai_server_time_to_first_token_seconds_count", **ttft) == 1  # only the streamed one
    assert value(m, "gen_ai_server_time_to_first_token_seconds_bucket", **ttft, le="0.04") == 0
    assert value(m, "gen_ai_server_time_to_first_token_seconds_bucket", **ttft, le="0.06") == 1
    assert value(m, "gateway_tokens_total", **lab, token_type="prompt") == 110
    assert value(m, "gateway_tokens_total", **lab, token_type="cached") == 40
    assert value(m, "gateway_tokens_total", **lab, token_type="completion") == 25
    assert value(m, "gen_ai_client_token_usage_sum", **ttft, gen_ai_token_type="input") == 110
    assert value(m, "gen_ai_client_token_usage_count", **ttft, gen_ai_token_type="output") == 2
    assert value(m, "gateway_cost_usd_total", **lab) == pytest.approx(0.015)


def test_errors_labelled_by_bounded_sanitised_class():
    m = make()
    m.observe_attempt(provider="direct", model="gpt-4.1", status="error", error_class="RateLimitError")
    m.observe_attempt(provider="direct", model="gpt-4.1", status="error", error_class=None)
    m.observe_attempt(provider="direct", model="gpt-4.1", status="error", error_class='bad class{}"')
    lab = {"gen_ai_system": "direct", "gen_ai_request_model": "gpt-4.1", "status": "error"}
    assert value(m, "gateway_attempts_total", **lab, error_type="RateLimitError") == 1
    assert value(m, "gateway_attempts_total", **lab, error_type="unknown") == 1
    assert value(m, "gateway_attempts_total", **lab, error_type="bad_class___") == 1
    for i in range(100):
        m.observe_attempt(provider="direct", model="gpt-4.1", status="error", error_class=f"E{i}")
    error_types = {dict(k[1]).get("error_type") for k in samples(m) if k[0] == "gateway_attempts_total"}
    assert len(error_types) <= 32 + 1 and "other" in error_types


def test_unknown_providers_models_become_other_and_no_ids_leak():
    m = make()
    for i in range(50):
        m.observe_request(provider=f"prov{i}", model=f"session-{i}-model", status="ok", latency_s=0.1)
    m.observe_request(provider="direct", model="auto", status="ok", latency_s=0.1)
    models = {dict(k[1]).get("gen_ai_request_model") for k in samples(m)} - {None}
    assert models == {"other", "auto"}
    assert (
        value(
            m, "gateway_requests_total", gen_ai_system="other", gen_ai_request_model="other", status="ok", error_type=""
        )
        == 50
    )
    assert "session-" not in m.exposition().decode()


def attempt_record(**fields) -> SimpleNamespace:
    """An attempt record as the router produces it (observe_record reads it by field name, so it does
    not depend on where the AttemptRecord class lives)."""
    base = {
        "http_status": None,
        "error_class": None,
        "ttft_ms": None,
        "prompt_tokens": 0,
        "cached_tokens": 0,
        "completion_tokens": 0,
        "cost_usd": 0.0,
        "fallback": False,
        "final": True,
        "session_id": None,
    }
    return SimpleNamespace(**{**base, **fields})


def test_observe_record_counts_attempts_and_final_request():
    m = make()
    failed = attempt_record(
        provider="holysheep",
        model="gpt-4.1",
        status="error",
        latency_ms=200.0,
        http_status=503,
        error_class="APIStatusError",
        final=False,
        session_id="secret-session",
    )
    served = attempt_record(
        provider="direct",
        model="gpt-4.1",
        status="ok",
        latency_ms=450.0,
        ttft_ms=120.0,
        prompt_tokens=30,
        cached_tokens=10,
        completion_tokens=7,
        cost_usd=0.001,
        fallback=True,
    )
    m.observe_record(failed)
    m.observe_record(served)
    assert (
        value(
            m,
            "gateway_attempts_total",
            gen_ai_system="holysheep",
            gen_ai_request_model="gpt-4.1",
            status="error",
            error_type="APIStatusError",
        )
        == 1
    )
    assert (
        value(
            m,
            "gateway_attempts_total",
            gen_ai_system="direct",
            gen_ai_request_model="gpt-4.1",
            status="ok",
            error_type="",
        )
        == 1
    )
    assert (
        value(
            m,
            "gateway_requests_total",
            gen_ai_system="direct",
            gen_ai_request_model="gpt-4.1",
            status="ok",
            error_type="",
        )
        == 1
    )
    assert (
        value(
            m,
            "gateway_requests_total",
            gen_ai_system="holysheep",
            gen_ai_request_model="gpt-4.1",
            status="error",
            error_type="APIStatusError",
        )
        == 0
    )
    assert value(
        m,
        "gen_ai_client_operation_duration_seconds_sum",
        gen_ai_operation_name="chat",
        gen_ai_system="direct",
        gen_ai_request_model="gpt-4.1",
        status="ok",
    ) == pytest.approx(0.45)
    assert value(m, "gateway_fallbacks_total", gen_ai_system="direct", gen_ai_request_model="gpt-4.1") == 1
    assert "secret-session" not in m.exposition().decode()


def test_gauges_canary_breaker_log_depths_keys():
    m = make()
    assert value(m, "gateway_circuit_breaker_state", gen_ai_system="holysheep") == 0
    m.set_canary_ratio(0.25)
    m.set_breaker_state("holysheep", "open")
    m.set_breaker_state("direct", "half_open")
    m.set_log_depths(queue=12, journal=3)
    m.observe_key_denial("budget_exceeded")
    m.observe_key_denial("made-up")
    m.set_key_budget_used("team-a", "day", 0.9)
    m.in_flight.inc()
    assert value(m, "gateway_canary_ratio") == 0.25
    assert value(m, "gateway_circuit_breaker_state", gen_ai_system="holysheep") == 2
    assert value(m, "gateway_circuit_breaker_state", gen_ai_system="direct") == 1
    assert value(m, "gateway_log_queue_depth") == 12 and value(m, "gateway_log_journal_depth") == 3
    assert value(m, "gateway_key_denials_total", reason="budget_exceeded") == 1
    assert value(m, "gateway_key_denials_total", reason="other") == 1
    assert value(m, "gateway_key_denials_total", reason="rate_limit_exceeded") == 0
    assert ("gateway_key_denials_total", frozenset({("reason", "rate_limit_exceeded")})) in samples(m)
    assert value(m, "gateway_key_budget_used_ratio", key_name="team-a", period="day") == 0.9
    assert value(m, "gateway_in_flight_requests") == 1
    with pytest.raises(ValueError, match="breaker state"):
        m.set_breaker_state("direct", "melted")


def test_duration_buckets_cover_llm_latency():
    assert DURATION_BUCKETS[0] <= 0.001 and DURATION_BUCKETS[-1] >= 60
    assert list(DURATION_BUCKETS) == sorted(DURATION_BUCKETS)


# -- deploy monitoring -----------------------------------------------------------------------------
# deploy/: the Prometheus alert rules and the Grafana dashboard refer only to metrics the gateway
# exports, and the rules are valid (promtool check + promtool unit tests when promtool is installed).


REPO = paths.REPO
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "dashboard.json"
OURS = re.compile(r"\b(?:gateway|gen_ai)_[a-z0-9_]+\b")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported() -> tuple[set[str], set[str]]:
    """(sample names, label names) the gateway's registry exports once every kind of value was seen."""
    m = GatewayMetrics(providers=["p"], models=["m"])
    m.observe_attempt(provider="p", model="m", status="error", error_class="E")
    m.observe_request(
        provider="p",
        model="m",
        status="ok",
        latency_s=1,
        ttft_s=0.1,
        prompt_tokens=1,
        cached_tokens=1,
        completion_tokens=1,
        cost_usd=0.1,
        fallback=True,
    )
    m.set_key_budget_used("k", "day", 0.5)
    series, labels = set(), set()
    for fam in m.registry.collect():
        series.update(fam.name + s for s in SUFFIXES[fam.type])
        for sample in fam.samples:
            labels.update(sample.labels)
    return series, labels


def check_expr(expr: str, series: set[str], labels: set[str]) -> None:
    names = set(OURS.findall(expr))
    unknown = names - series - labels
    assert not unknown, f"{expr!r} refers to {sorted(unknown)}, which the gateway does not export"
    assert names & series, f"{expr!r} uses none of the gateway's metrics"


def alert_exprs() -> list[str]:
    """The rule expressions, read without a YAML parser: each `expr:` value, inline or block (|)."""
    lines = ALERTS.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if not m:
            continue
        indent, rest = len(m.group(1)), m.group(2)
        if rest.strip() != "|":
            out.append(rest)
            continue
        block = []
        for nxt in lines[i + 1 :]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            block.append(nxt.strip())
        out.append(" ".join(block))
    return out


def test_alert_rules_use_exported_metrics_and_cover_the_four_concerns():
    series, labels = exported()
    exprs = alert_exprs()
    assert len(exprs) >= 4
    for e in exprs:
        check_expr(e, series, labels)
    text = ALERTS.read_text()
    for alert in ("GatewayHighErrorRate", "GatewayHighLatencyP95", "GatewayKeyBudgetBurn", "GatewayCircuitBreakerOpen"):
        assert f"alert: {alert}" in text


def test_alert_rules_structure_with_yaml():
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(ALERTS.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert len(rules) == len(alert_exprs())
    for r in rules:
        assert {"alert", "expr", "labels", "annotations"} <= set(r)
        assert r["labels"]["severity"] in {"page", "ticket"}


def test_grafana_dashboard_is_valid_and_refers_to_exported_metrics():
    dash = json.loads(DASHBOARD.read_text())
    panels = dash["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    series, labels = exported()
    used = set()
    for p in panels:
        assert p["title"] and p["targets"]
        for t in p["targets"]:
            check_expr(t["expr"], series, labels)
            used |= set(OURS.findall(t["expr"])) & series
    families = {s.removesuffix("_total").removesuffix("_bucket") for s in used}
    # Every family the gateway exports has a panel.
    all_families = {f.name for f in GatewayMetrics().registry.collect()}
    assert all_families <= families, sorted(all_families - families)


def test_check_expr_catches_a_misspelt_metric():
    series, labels = exported()
    with pytest.raises(AssertionError, match="does not export"):
        check_expr("sum(rate(gateway_request_total[5m]))", series, labels)


def test_repeated_observations_accumulate_and_the_kept_label_children_stay_bounded():
    m = make()
    for i in range(500):
        m.observe_attempt(provider="direct", model=f"m{i}", status="error", error_class=f"class_{i}")
        m.observe_attempt(provider="direct", model="gpt-4.1", status="ok")
    labels = {"gen_ai_system": "direct", "gen_ai_request_model": "gpt-4.1", "status": "ok", "error_type": ""}
    assert value(m, "gateway_attempts_total", **labels) == 500
    assert len(m._children) < 100  # unknown models and classes fold into "other"
