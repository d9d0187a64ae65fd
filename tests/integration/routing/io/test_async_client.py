"""The async driver (:class:`app.routing.io.async_client.AsyncRoutingClient`) routes as the sync client
does, because it is built from one and shares its policy: the same answers, retries, fail-overs,
deadlines and attempt records; and cancelling it cancels the upstream request.

Built like tests/integration/routing/io/test_client.py (``make_router``): primary ``chaos`` is the loopback
chaos upstream, fallback ``direct`` is the instant simulator. Each test drives the loop with
``asyncio.run`` and bounds every wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from app.routing import AllRoutesFailed, RoutingClient, StreamBrokenError
from app.routing.io.async_client import AsyncRoutingClient
from core.errors import InvalidRequest
from tests.integration.routing.io.test_client import (
    HI,
    KEY,
    KEY_ENV,
    OK_TEXT,
    chaos_requests,
    flushed,
    log_rows,
    make_router,
)
from tests.support.chaos_upstream import (
    ChaosUpstream,
    bad_json,
    context_length,
    empty_choices,
    hang,
    hang_until_closed,
    html_200,
    json_array_200,
    mid_stream_drop,
    null_choices,
    ok,
    rate_limited,
    redirect,
    reset,
    server_error,
    stall_after,
    trickle,
    unauthorized_echo,
    unavailable,
)

BOUND_S = 10.0  # a bound on each wait, never a timing assertion
# Columns that differ between any two requests (ids, clocks, the simulator's random answer).
VOLATILE = {
    "id",
    "request_id",
    "ts",
    "latency_ms",
    "ttft_ms",
    "chunk_gap_ms",
    "completion_tokens",
    "cost_usd",
    "answer_text",
}


@pytest.fixture
def up() -> Iterator[ChaosUpstream]:
    with ChaosUpstream() as server:
        yield server


@pytest.fixture
def router(tmp_path, up, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "")
    monkeypatch.setenv(KEY_ENV, KEY)
    made: list[RoutingClient] = []

    def build(**options) -> RoutingClient:
        url = f"sqlite:///{tmp_path / f'gateway-{len(made)}.db'}"
        client = make_router(tmp_path / f"gateway-{len(made)}.toml", url, up, **options)
        made.append(client)
        return client

    yield build
    for client in made:
        client.close()


def run_async(client: RoutingClient, **chat):
    """One request through the async driver built from ``client``: its result or its exception."""

    async def go():
        async with AsyncRoutingClient(client) as driver:
            try:
                return await asyncio.wait_for(driver.chat(HI, **chat), BOUND_S)
            except AllRoutesFailed as exc:
                return exc

    return asyncio.run(go())


def run_sync(client: RoutingClient, **chat):
    try:
        return client.chat(HI, **chat)
    except AllRoutesFailed as exc:
        return exc


def test_a_plain_answer_through_the_simulator_matches_the_sync_client(router):
    client = router()
    sync, async_ = run_sync(client, route="fallback"), run_async(client, route="fallback")
    assert async_.provider == sync.provider == "direct"
    assert async_.text and async_.attempts == sync.attempts == 1
    assert (async_.model, async_.intent, async_.side) == (sync.model, sync.intent, sync.side)
    assert async_.usage.prompt_tokens == sync.usage.prompt_tokens > 0
    assert async_.request_id != sync.request_id


def test_a_plain_answer_from_the_loopback_upstream(router, up):
    result = run_async(router())
    assert (result.text, result.provider, result.attempts) == (OK_TEXT, "chaos", 1)


def test_retries_then_fails_over_on_500s_like_the_sync_client(router, up):
    up.set_default(server_error(), provider="chaos")
    client = router(sections={"retry": "max_attempts = 3"})
    sync = run_sync(client)
    after_sync = chaos_requests(up)
    async_ = run_async(client)
    assert after_sync == 3 and chaos_requests(up) - after_sync == 3  # three tries on chaos, each driver
    assert async_.provider == sync.provider == "direct" and async_.fallback_used
    shape = [(a.provider, a.status, a.error_class, a.http_status) for a in async_.attempt_log]
    assert shape == [(a.provider, a.status, a.error_class, a.http_status) for a in sync.attempt_log]
    assert [a.error_class for a in async_.attempt_log] == ["server_error"] * 3 + [None]


def test_the_backoff_is_awaited_with_the_drawn_delays(router, up):
    up.set_default(unavailable(), provider="chaos")
    client = router(sections={"retry": "max_attempts = 3"})  # base_delay_s = 0: every drawn wait is 0
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)

    async def go():
        async with AsyncRoutingClient(client, sleep=sleep) as driver:
            return await asyncio.wait_for(driver.chat(HI), BOUND_S)

    result = asyncio.run(go())
    assert result.provider == "direct" and waits == [0.0, 0.0]  # one wait before each retry


def test_every_route_failing_raises_all_routes_failed(router, up):
    up.set_default(server_error(), provider="chaos")
    client = router(sections={"retry": "max_attempts = 2", "routing": "fallback_enabled = false"})
    exc = run_async(client)
    assert isinstance(exc, AllRoutesFailed) and [a.error_class for a in exc.attempts] == ["server_error"] * 2


def test_a_hang_is_cut_at_the_attempt_deadline_and_fails_over(router, up):
    up.set_default(hang(), provider="chaos")
    client = router(sections={"providers.chaos": "timeout_s = 0.2", "retry": "max_attempts = 1"})
    result = run_async(client)
    assert result.provider == "direct" and result.attempt_log[0].error_class == "timeout"


def test_records_are_logged_as_the_sync_client_logs_them(router, up):
    up.set_default(server_error(), provider="chaos")
    client = router(sections={"retry": "max_attempts = 2"})
    sync, async_ = run_sync(client), run_async(client)
    assert flushed(client)
    rows = log_rows(client)
    by_request = {rid: [r for r in rows if r["request_id"] == rid] for rid in (sync.request_id, async_.request_id)}
    sync_rows, async_rows = by_request[sync.request_id], by_request[async_.request_id]
    assert len(sync_rows) == len(async_rows) == 3
    for s, a in zip(sync_rows, async_rows, strict=True):
        assert s.keys() == a.keys()
        assert {k for k in s if s[k] != a[k]} <= VOLATILE
    assert [r["final"] for r in async_rows] == [False, False, True]


def test_cancelling_the_request_ends_the_upstream_request_by_its_timeout_and_logs_the_attempt(router, up):
    # Cancelled before the answer's head, the upstream request is abandoned and ends at the attempt's
    # timeout (pyreqwest cannot abort it sooner; once an answer has begun, a cancel closes at once).
    up.set_default(hang_until_closed(), provider="chaos")
    client = router(sections={"providers.chaos": "timeout_s = 2"})

    async def go() -> None:
        async with AsyncRoutingClient(client) as driver:
            task = asyncio.create_task(driver.chat(HI))
            (hung,) = await asyncio.to_thread(up.wait_for_requests, 1, BOUND_S)
            assert not hung.served.is_set()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await asyncio.to_thread(hung.served.wait, BOUND_S)  # the upstream saw the close

    asyncio.run(go())
    assert flushed(client)
    rows = log_rows(client)
    assert [(r["provider"], r["error_class"], r["final"]) for r in rows] == [("chaos", "cancelled", True)]
    assert chaos_requests(up) == 1  # no retry, no fail-over after a cancel


# ------------------------------------------------------------------------------------ streams


def stream_async(client: RoutingClient, *, close_after: int | None = None, **chat):
    """(pieces, the stream) of one streamed request through the async driver; ``close_after``
    closes it after that many pieces (a caller that went away). Raises what the stream raises."""

    async def go():
        async with AsyncRoutingClient(client) as driver:
            stream = driver.chat_stream(HI, **chat)
            pieces: list[str] = []
            async with stream:
                async for piece in stream:
                    pieces.append(piece)
                    if close_after is not None and len(pieces) >= close_after:
                        break
            return pieces, stream

    return asyncio.run(asyncio.wait_for(go(), BOUND_S))


def test_a_stream_matches_the_sync_clients_pieces_result_and_records(router, up):
    up.set_default(ok("one two three four"), provider="chaos")
    client = router()
    sync = client.chat(HI, stream=True)
    sync_pieces = list(sync)
    pieces, stream = stream_async(client)
    assert pieces == sync_pieces and "".join(pieces) == "one two three four"
    a, s = stream.result, sync.result
    assert a is not None and s is not None
    assert (a.text, a.provider, a.model, a.attempts, a.finish_reason) == (s.text, s.provider, s.model, 1, "stop")
    assert a.usage == s.usage and a.usage.prompt_tokens == 5 and a.ttft_ms is not None
    assert (stream.provider, stream.model, stream.attempts) == ("chaos", a.model, 1)
    assert flushed(client)
    rows = {r["request_id"]: r for r in log_rows(client)}
    ra, rs = rows[a.request_id], rows[s.request_id]
    assert ra["stream"] and ra["status"] == "ok" and {k for k in ra if ra[k] != rs[k]} <= VOLATILE


def test_a_stream_failing_before_its_first_token_fails_over(router, up):
    up.set_default(server_error(), provider="chaos")
    client = router(sections={"retry": "max_attempts = 2"})
    pieces, stream = stream_async(client)
    assert pieces and stream.result is not None and stream.result.provider == "direct"
    assert [a.error_class for a in stream.result.attempt_log] == ["server_error", "server_error", None]
    assert stream.provider == "direct" and stream.attempts == 3


def test_no_first_token_by_the_attempt_budget_fails_over(router, up):
    up.set_default(trickle(interval_s=5.0), provider="chaos")  # headers at once, then a byte per 5 s
    client = router(sections={"providers.chaos": "timeout_s = 0.3", "retry": "max_attempts = 1"})
    pieces, stream = stream_async(client)
    assert pieces and stream.result is not None and stream.result.provider == "direct"
    first = stream.result.attempt_log[0]
    assert (first.provider, first.error_class) == ("chaos", "timeout")
    assert "first-token" in (first.error or "")


def test_an_idle_gap_after_text_breaks_the_stream_without_fail_over(router, up):
    up.set_default(stall_after(3), provider="chaos")  # role, "one", " two", then silence
    client = router(sections={"retry": "stream_idle_timeout_s = 0.3"})
    with pytest.raises(StreamBrokenError, match="stream broke after 3 chunks"):
        stream_async(client)
    assert flushed(client)
    rows = log_rows(client)
    assert [(r["provider"], r["error_class"], r["final"]) for r in rows] == [("chaos", "stream_broken", True)]
    assert chaos_requests(up) == 1  # an answer under way is never re-sent elsewhere


def test_a_stream_dropped_mid_way_is_broken_not_retried(router, up):
    up.set_default(mid_stream_drop(3), provider="chaos")
    with pytest.raises(StreamBrokenError):
        stream_async(router())
    assert chaos_requests(up) == 1


def test_closing_a_stream_early_closes_the_upstream_and_logs_it_cancelled(router, up):
    up.set_default(stall_after(3), provider="chaos")
    client = router(sections={"retry": "stream_idle_timeout_s = 60"})
    pieces, stream = stream_async(client, close_after=1)
    assert pieces == ["one"] and stream.result is None
    (req,) = up.wait_for_requests(1, BOUND_S)
    assert req.served.wait(BOUND_S)  # the upstream saw its connection closed
    assert flushed(client)
    rows = log_rows(client)
    assert [(r["provider"], r["error_class"], r["final"]) for r in rows] == [("chaos", "cancelled", True)]
    assert rows[0]["ttft_ms"] is not None


def test_invalid_input_raises_before_any_network_call(router, up):
    client = router()

    async def go():
        async with AsyncRoutingClient(client) as driver:
            with pytest.raises(InvalidRequest):
                driver.chat_stream([{"role": "wizard", "content": "x"}])

    asyncio.run(go())
    assert chaos_requests(up) == 0


# ------------------------------------------------------------------------------------ fault parity

PARITY_FAULTS = {
    "html_200": html_200,
    "json_array_200": json_array_200,
    "bad_json": bad_json,
    "empty_choices": empty_choices,
    "null_choices": null_choices,
    "reset": reset,
    "redirect": redirect,
    "rate_limited": lambda: rate_limited(retry_after_s="0"),
    "unauthorized": unauthorized_echo,
    "context_length": context_length,
}


@pytest.mark.parametrize("fault", sorted(PARITY_FAULTS))
def test_each_fault_is_classified_and_routed_as_the_sync_client_does(router, up, fault):
    """The async driver meets each upstream fault through other SDK and httpx code (async
    responses, async transports): the failure classes, statuses, routes and outcome must still be
    the sync client's, attempt by attempt."""
    up.set_default(PARITY_FAULTS[fault](), provider="chaos")
    client = router(sections={"retry": "max_attempts = 2"})
    sync, async_ = run_sync(client), run_async(client)
    assert type(async_) is type(sync)

    def shape(outcome):
        attempts = outcome.attempts if isinstance(outcome, AllRoutesFailed) else outcome.attempt_log
        return [(a.provider, a.status, a.error_class, a.http_status) for a in attempts]

    assert shape(async_) == shape(sync) and shape(sync)[0][2] is not None  # the fault was met
