"""The server's chat handler without a network: outcome -> HTTP status."""

from __future__ import annotations

import pytest

from app.routing.result import AllRoutesFailed, AttemptInfo
from app.server.handler import status_for


def attempt(n, error_class, http_status=None, provider="p"):
    return AttemptInfo(n, provider, "gpt-4.1", "error", 1.0, error_class, http_status, f"{error_class}: boom")


@pytest.mark.parametrize(
    ("attempts", "status"),
    [
        ([attempt(1, "timeout"), attempt(2, "timeout")], 504),
        ([attempt(1, "connection"), attempt(2, "timeout")], 503),
        ([attempt(1, "server_error", 503)], 503),
        ([attempt(1, "server_error", 500), attempt(2, "timeout")], 502),
        ([attempt(1, "bad_response")], 502),
        ([attempt(1, "server_error", 500), attempt(2, "bad_request", 400)], 400),
        ([], 502),
    ],
)
def test_status_for_all_routes_failed(attempts, status):
    err = status_for(AllRoutesFailed("rid1", attempts))
    assert err.status == status
    assert "rid1" in err.message


def test_the_no_shadow_header_reaches_the_router_and_only_forwardable_fields_join_it() -> None:
    """A caller's ``x-gateway-no-shadow`` goes to the router (which never copies that request to a
    shadow candidate) whether or not any provider forwards headers; other fields only when some
    provider forwards them."""
    import dataclasses
    from types import SimpleNamespace

    from app.routing.core import NO_SHADOW_HEADER
    from app.server import wire
    from app.server.handler import ChatHandler

    def options(forwardable: frozenset[str], headers: list[tuple[bytes, bytes]]):
        client = SimpleNamespace(core=SimpleNamespace(forwardable=forwardable), settings=None)
        handler = ChatHandler(client, engine=None, driver=object())  # type: ignore[arg-type]
        req = wire.validate_api_request("chat", {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]})
        return handler._route_options(dataclasses.replace(req, headers=tuple(headers)), None).headers

    sent = [(b"authorization", b"Bearer k"), (b"X-Gateway-No-Shadow", b"1"), (b"x-trace", b"t")]
    assert options(frozenset(), sent) == {NO_SHADOW_HEADER: "1"}
    assert options(frozenset({"x-trace"}), sent) == {NO_SHADOW_HEADER: "1", "x-trace": "t"}
    assert options(frozenset(), [(b"authorization", b"Bearer k")]) is None
