"""The server's chat handler without a network: outcome -> HTTP status, and the stream hand-off
from a worker thread to the event loop (order, backpressure, cancellation)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from app.routing.result import AllRoutesFailed, AttemptInfo
from app.server.handler import _Pipe, status_for


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


def test_pipe_keeps_order_bounds_the_worker_and_stops_it_on_cancel():
    async def main():
        pipe = _Pipe(asyncio.get_running_loop(), 2)
        put_results: list[bool] = []

        def worker():
            for i in range(6):
                put_results.append(pipe.put(("chunk", i, None)))

        t = threading.Thread(target=worker)
        t.start()
        # Two reads make room for at most two more puts (items 2 and 3); item 4 waits for room.
        assert [(await pipe.get())[1], (await pipe.get())[1]] == [0, 1]
        pipe.cancel()  # wakes the waiting worker, which sees the reader gone and stops handing over
        await asyncio.to_thread(t.join, 10)
        assert not t.is_alive()
        handed = put_results.count(True)
        # Bounded: at most the two buffered plus the two read; then every put refused, in order.
        assert 2 <= handed <= 4 and put_results == [True] * handed + [False] * (6 - handed)

    asyncio.run(main())
