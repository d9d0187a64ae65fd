"""The canary split at volume: a thousand requests through the whole router."""

from __future__ import annotations

from db.canary import set_ratio


def test_observed_split_through_router_matches_ratio(client_factory, sqlite_url):
    client = client_factory(sqlite_url)
    set_ratio(client.engine, 0.3, expected_version=None, actor="t", reason="r")
    client.refresh()
    sides = [client.chat([{"role": "user", "content": "hi"}], session_id=f"u{i}").side for i in range(1000)]
    assert abs(sides.count("primary") / 1000 - 0.3) <= 0.05
