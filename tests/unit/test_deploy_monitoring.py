"""deploy/: the Prometheus alert rules and the Grafana dashboard refer only to metrics the gateway
exports, and the rules are valid (promtool check + promtool unit tests when promtool is installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from app.server.metrics import GatewayMetrics

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
ALERTS_TEST = REPO / "deploy" / "prometheus" / "alerts_test.yml"
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


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
def test_promtool_checks_and_unit_tests_the_rules():
    check = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 9 rules found" in check.stdout
    unit = subprocess.run(
        ["promtool", "test", "rules", ALERTS_TEST.name], capture_output=True, text=True, timeout=60, cwd=ALERTS.parent
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


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
