"""Provider status on the overview: simulated / configured / key missing / failing recently."""

from __future__ import annotations

from dataclasses import dataclass

from app.dashboard.providers import describe_faults, provider_statuses, status_rows
from core.faults import FaultSettings
from tests.configs import two_providers

REAL = two_providers(primary="real")


@dataclass
class Health:
    attempts: int
    errors: int
    error_rate: float | None
    last_error_class: str | None = None


def test_simulated_providers_need_no_key(settings_factory):
    s = settings_factory()
    statuses = provider_statuses(s, {}, env={})
    assert [(x.name, x.role, x.state, x.key) for x in statuses] == [
        ("holysheep", "primary", "simulated", "simulated"),
        ("direct", "fallback", "simulated", "simulated"),
    ]


def test_real_provider_key_missing_then_configured_never_shows_the_key(settings_factory):
    s = settings_factory(REAL)
    missing = provider_statuses(s, env={})[0]
    assert missing.state == "key missing" and "HOLYSHEEP_API_KEY" in missing.detail
    secret = "sk-very-secret-value"
    via_env = provider_statuses(s, env={"HOLYSHEEP_API_KEY": secret})[0]
    via_secrets = provider_statuses(s, env={}, secrets={"HOLYSHEEP_API_KEY": secret})[0]
    assert via_env.state == via_secrets.state == "configured" and via_env.key == "set"
    assert secret not in repr(status_rows([via_env, via_secrets]))
    assert via_env.base == "api.holysheep.example"


def test_failing_recently_needs_enough_attempts(settings_factory):
    s = settings_factory()
    bad = provider_statuses(s, {"holysheep": Health(10, 6, 0.6, "server_error")}, env={})[0]
    assert bad.state == "failing recently" and "60 %" in bad.detail and "server_error" in bad.detail
    one_unlucky = provider_statuses(s, {"holysheep": Health(1, 1, 1.0)}, env={})[0]
    assert one_unlucky.state == "simulated"
    fine = provider_statuses(s, {"holysheep": Health(50, 1, 0.02)}, env={})[0]
    assert fine.state == "simulated" and fine.error_rate == 0.02


def test_fault_injection_is_described(settings_factory):
    assert describe_faults(None) is None and describe_faults(FaultSettings()) is None
    text = describe_faults(FaultSettings(error_rate=0.5, rate_limit_rate=0.1, latency_multiplier=3))
    assert text == "50 % errors, 10 % 429s, latency x3"
    s = settings_factory()
    st = provider_statuses(s, env={}, faults={"direct": FaultSettings(error_rate=0.25)})[1]
    assert st.faults == "25 % errors"
    assert "fault injection: 25 % errors" in status_rows([st])[0]["detail"]


def test_an_open_breaker_is_the_providers_state_and_says_what_it_does(settings_factory):
    s = settings_factory()
    t = 1_764_484_800.0  # 2025-11-30 06:40:00 UTC
    statuses = provider_statuses(s, {}, env={}, breakers={"holysheep": ("open", t), "direct": ("closed", t + 60)})
    primary, fallback = statuses
    assert (primary.state, primary.ok) == ("breaker open", False)
    assert "fail over" in primary.detail and "open since 2025-11-30 06:40:00" in primary.detail
    assert (fallback.state, fallback.ok) == ("simulated", True)
    rows = status_rows(statuses)
    assert [r["breaker"] for r in rows] == ["open since 2025-11-30 06:40:00", "closed since 2025-11-30 06:41:00"]
    half = provider_statuses(s, {}, env={}, breakers={"holysheep": ("half_open", t)})[0]
    assert half.state == "breaker half-open" and "one probe" in half.detail
    assert status_rows(provider_statuses(s, {}, env={}))[0]["breaker"] == "closed"  # no transition recorded
