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
