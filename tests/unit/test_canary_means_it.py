"""The canary ratio means what it says (issue 17): at 0 % the primary gets no traffic and at 100 %
the fallback gets none except fail-over, whatever model the intent rules pick. Where the side the
ratio chose cannot serve the model, the substitution policy decides, and a refusal names the ratio.
Through the gateway's RoutingClient on the shipped gateway.toml with intent rules that pick models
only the primary serves (tests.configs.one_sided_toml; the shipped rules pick none) and the
built-in simulator."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.routing.substitution import SubstitutionRefused
from db.canary import set_ratio
from db.models import RequestLog
from tests.configs import one_sided_toml

CODING = "Write a python function that merges two sorted lists"
GENERAL = "Tell me about the weather in spring"


def log(client) -> list:
    client.flush()
    with client.engine.connect() as conn:
        rows = conn.execute(select(RequestLog.provider, RequestLog.fallback, RequestLog.error_class))
        return list(rows)


def at_ratio(client, ratio: float):
    set_ratio(client.engine, ratio, expected_version=None, actor="test", reason="drill")
    client.refresh()
    assert client.current_ratio() == ratio
    return client


def test_at_zero_the_primary_gets_nothing_even_for_a_model_only_it_serves(client_factory, sqlite_url):
    client = at_ratio(client_factory(sqlite_url, toml=one_sided_toml()), 0.0)
    primary = client.settings.routing.primary
    for i in range(20):
        client.chat([{"role": "user", "content": GENERAL}], session_id=f"g{i}")
    refused = 0
    for i in range(20):
        with pytest.raises(SubstitutionRefused) as info:
            client.chat([{"role": "user", "content": CODING}], session_id=f"c{i}")  # deepseek: only the primary
        refused += 1
        assert "canary ratio of 0%" in str(info.value) and "routing.substitution" in str(info.value)
    rows = log(client)
    assert [r for r in rows if r.provider == primary and r.error_class != "refused_by_policy"] == []
    # Every request is in the log once: 20 answered, 20 refused by the policy with their own class.
    assert len(rows) == 40 and sum(r.error_class == "refused_by_policy" for r in rows) == refused == 20


def test_at_one_hundred_the_fallback_gets_only_fail_over(client_factory, sqlite_url):
    client = at_ratio(client_factory(sqlite_url, toml=one_sided_toml()), 1.0)
    fallback = client.settings.routing.fallback
    for i in range(20):
        client.chat([{"role": "user", "content": GENERAL}], model="gpt-4.1", session_id=f"s{i}")
    assert [r for r in log(client) if r.provider == fallback and not r.fallback] == []


def test_between_the_ends_a_model_served_by_one_side_still_goes_there(client_factory, sqlite_url):
    client = at_ratio(client_factory(sqlite_url, toml=one_sided_toml()), 0.5)
    primary = client.settings.routing.primary
    results = [client.chat([{"role": "user", "content": CODING}], session_id=f"c{i}") for i in range(20)]
    assert {r.provider for r in results} == {primary}  # rerouted: the fallback does not serve deepseek
    assert {r.side for r in results} == {"primary", "fallback"}
