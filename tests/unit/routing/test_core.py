"""Blame only who failed (issue 28, item 3): a request the gateway refuses before any attempt (here
the substitution policy, at a ratio that leaves no side serving the model) is logged as the
gateway's row, never the provider's it would have started on; no provider's breaker, attempt error
rate or incident counts it, and the Overview's reading names the gateway and why. Through the
gateway's RoutingClient on the shipped gateway.toml and the built-in simulator."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from app.monitor.figures import live_figures
from app.monitor.incidents import GATEWAY, current_incidents, gateway_refusals, refusals_text
from app.routing.substitution import SubstitutionRefused
from db.canary import set_ratio
from db.models import RequestLog

ONLY_PRIMARY = "deepseek-chat-v3.2"  # gateway.toml: served by holysheep only


def test_a_refusal_before_any_attempt_is_the_gateways_not_a_providers(client_factory, sqlite_url) -> None:
    client = client_factory(sqlite_url)
    set_ratio(client.engine, 0.0, expected_version=None, actor="test", reason="drill")
    client.refresh()
    for i in range(10):
        with pytest.raises(SubstitutionRefused):
            client.chat([{"role": "user", "content": "hi"}], model=ONLY_PRIMARY, session_id=f"r{i}")
    for i in range(5):
        client.chat([{"role": "user", "content": "hi"}], model="gpt-4.1", session_id=f"ok{i}")
    client.flush()
    with client.engine.connect() as conn:
        rows = conn.execute(select(RequestLog.provider, RequestLog.status, RequestLog.error_class)).all()
    refused = [r for r in rows if r.error_class == "refused_by_policy"]
    assert len(refused) == 10 and {r.provider for r in refused} == {GATEWAY}
    assert {r.provider for r in rows if r.status == "ok"} == {"direct"}
    # No breaker heard of them: direct's breaker counted only its five answers.
    assert client.breaker_states()["direct"].failures == 0

    now = time.time()
    figures = live_figures(client.engine, now=now, window_s=900)
    direct = figures.provider("direct", last_minute=True)
    assert (direct.attempts, direct.attempt_errors) == (5, 0)
    found = current_incidents(
        client.engine, ["holysheep", "direct"], now=now, last_minute=figures.providers_last_minute
    )
    assert found == []
    refusals = gateway_refusals(client.engine, now=now, last_minute=figures.providers_last_minute)
    assert refusals is not None and refusals.requests == 10
    assert refusals.classes == (("refused_by_policy", 10),)
    text = refusals_text(refusals)
    assert text.startswith("**Gateway: 10 requests refused before any attempt in the last 60 s**")
    assert "no provider was asked" in text and "refused\\_by\\_policy (10)" in text


def test_no_refusals_no_line(client_factory, sqlite_url) -> None:
    client = client_factory(sqlite_url)
    client.chat([{"role": "user", "content": "hi"}], model="gpt-4.1")
    client.flush()
    now = time.time()
    figures = live_figures(client.engine, now=now, window_s=900)
    assert gateway_refusals(client.engine, now=now, last_minute=figures.providers_last_minute) is None
