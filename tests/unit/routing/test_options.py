"""Routing options (app.routing.options): the public APIs' keywords split into the options the
router reads and the body parameters sent upstream as given."""

from __future__ import annotations

import dataclasses

import pytest

from app.routing.options import ROUTE_KEYWORDS, RouteOptions


def test_route_keywords_become_options_and_the_rest_stays_body() -> None:
    options, rest = RouteOptions.split(
        {"session_id": "s1", "route": "primary", "tools": [{"type": "function"}], "seed": 1}, model="gpt-4.1"
    )
    assert options == RouteOptions(model="gpt-4.1", session_id="s1", route="primary")
    assert rest == {"tools": [{"type": "function"}], "seed": 1}


def test_every_field_is_a_route_keyword_and_the_defaults_route_like_no_options() -> None:
    assert ROUTE_KEYWORDS == {f.name for f in dataclasses.fields(RouteOptions)}
    assert RouteOptions.split({})[0] == RouteOptions()
    assert RouteOptions().model == "auto" and RouteOptions().cache_hints and not RouteOptions().stream


def test_an_option_given_twice_is_refused() -> None:
    with pytest.raises(TypeError):
        RouteOptions.split({"model": "a"}, model="b")
