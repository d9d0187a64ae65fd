"""The canary guardrail: rolls back to 0 % only when enabled, with enough attempts, above the
threshold; audited as actor ``guardrail``. On by default (issue 17) with the thresholds that
gateway.toml documents. Runs on SQLite and PostgreSQL."""

from __future__ import annotations

import tomllib

import pytest

from app.guardrail import ACTOR, check_guardrail, guardrail_defaults, provider_error_rate
from core.canary import GuardrailSettings
from core.records import AttemptRecord
from db.canary import audit_log, ensure_setting, get_guardrail, get_state, set_guardrail, set_ratio
from db.requests import insert_batch
from tests.support import paths

NOW = 1_800_000_000.0


def attempts(
    engine, provider: str, ok: int, failed: int, ts: float = NOW - 30, error_class: str = "server_error"
) -> None:
    rows = [
        AttemptRecord(
            request_id=f"{provider}-{i}-{ts}",
            attempt=1,
            ts=ts,
            provider=provider,
            model="gpt-4.1",
            requested_model="auto",
            intent="general",
            side="primary",
            status="ok" if i < ok else "error",
            error_class=None if i < ok else error_class,
            latency_ms=50.0,
        )
        for i in range(ok + failed)
    ]
    insert_batch(engine, rows)


@pytest.fixture
def setup(engine, settings_factory):
    settings = settings_factory()
    ensure_setting(engine, 0.1)
    set_ratio(engine, 0.5, expected_version=None, actor="alice", reason="ramp")
    set_guardrail(engine, enabled=True, error_rate_threshold=0.3, window_minutes=5, min_requests=10, actor="alice")
    return engine, settings


def test_trips_above_threshold_and_is_audited(setup):
    engine, settings = setup
    attempts(engine, settings.routing.primary, ok=6, failed=4)  # 40 % > 30 %
    attempts(engine, settings.routing.fallback, ok=0, failed=50)  # other providers do not count
    rate = check_guardrail(engine, settings, now=NOW)
    assert rate == pytest.approx(0.4)
    state = get_state(engine)
    assert state.ratio == 0.0 and state.updated_by == ACTOR
    last = audit_log(engine, limit=1)[0]
    assert (last.old_ratio, last.new_ratio, last.actor) == (0.5, 0.0, "guardrail")
    assert "40.0%" in last.reason and "4/10" in last.reason
    # Already at 0 %: nothing more to do, nothing more audited.
    assert check_guardrail(engine, settings, now=NOW) is None
    assert len(audit_log(engine)) == 2  # alice's ramp and the one rollback


@pytest.mark.parametrize("ok,failed", [(7, 3), (2, 3)])  # at the threshold; too few attempts
def test_does_not_trip_at_threshold_or_with_few_attempts(setup, ok, failed):
    engine, settings = setup
    attempts(engine, settings.routing.primary, ok=ok, failed=failed)
    assert check_guardrail(engine, settings, now=NOW) is None
    assert get_state(engine).ratio == 0.5


@pytest.mark.parametrize("error_class", ["cancelled", "bad_request"])
def test_failures_that_say_nothing_of_the_provider_neither_trip_it_nor_count_as_attempts(setup, error_class):
    """A caller that went away mid-answer (a closed tab, a load generator stopped) or a request
    refused for its own content is not the provider failing: as in its circuit breaker."""
    engine, settings = setup
    attempts(engine, settings.routing.primary, ok=6, failed=40, error_class=error_class)
    attempts(engine, settings.routing.primary, ok=0, failed=1, ts=NOW - 20)  # one real failure
    reading = provider_error_rate(engine, settings.routing.primary, 5, now=NOW)
    assert (reading.attempts, reading.errors) == (7, 1)
    assert check_guardrail(engine, settings, now=NOW) is None
    assert get_state(engine).ratio == 0.5


def test_disabled_guardrail_does_nothing(setup):
    engine, settings = setup
    set_guardrail(engine, enabled=False, error_rate_threshold=0.3, window_minutes=5, min_requests=10, actor="bob")
    attempts(engine, settings.routing.primary, ok=0, failed=20)
    assert check_guardrail(engine, settings, now=NOW) is None
    assert get_state(engine).ratio == 0.5


def test_window_excludes_old_failures(setup):
    engine, settings = setup
    attempts(engine, settings.routing.primary, ok=0, failed=20, ts=NOW - 10 * 60)  # outside 5 minutes
    attempts(engine, settings.routing.primary, ok=10, failed=0)
    reading = provider_error_rate(engine, settings.routing.primary, 5, now=NOW)
    assert (reading.attempts, reading.errors) == (10, 0)
    assert check_guardrail(engine, settings, now=NOW) is None


MINIMAL = """
[routing]
primary = "holysheep"
fallback = "direct"
[providers.holysheep]
base_url = "sim://holysheep"
models = ["gpt-4.1"]
default_model = "gpt-4.1"
[providers.direct]
base_url = "sim://direct"
models = ["gpt-4.1"]
default_model = "gpt-4.1"
"""


def test_on_by_default_with_the_thresholds_gateway_toml_documents(engine, settings_factory):
    shipped = tomllib.loads((paths.REPO / "gateway.toml").read_text())["guardrail"]
    assert shipped == GuardrailSettings().model_dump()  # the file's documented values are the code's
    assert shipped == {"enabled": True, "error_rate_threshold": 0.2, "window_minutes": 5, "min_requests": 20}
    for settings in (settings_factory(), settings_factory(MINIMAL)):  # with and without a [guardrail] table
        g = get_guardrail(engine, guardrail_defaults(settings))
        assert (g.enabled, g.error_rate_threshold, g.window_minutes, g.min_requests) == (True, 0.2, 5, 20)


def test_the_default_guardrail_rolls_back_without_anyone_saving_it(engine, settings_factory):
    settings = settings_factory(MINIMAL)
    ensure_setting(engine, 0.1)
    set_ratio(engine, 0.5, expected_version=None, actor="alice", reason="ramp")
    attempts(engine, settings.routing.primary, ok=19, failed=4)  # 17 % of 23: under 20 %, nothing happens
    assert check_guardrail(engine, settings, now=NOW) is None
    attempts(engine, settings.routing.primary, ok=0, failed=3, ts=NOW - 20)  # now 7/26 = 27 %
    assert check_guardrail(engine, settings, now=NOW) == pytest.approx(7 / 26)
    assert get_state(engine).updated_by == ACTOR
