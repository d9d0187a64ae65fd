"""Backoff schedule, per-attempt timeouts and cost arithmetic."""

from __future__ import annotations

import random
from decimal import Decimal

import httpx2
import pytest

from app import catalog
from app.config import RetryConfig
from app.routing.retry import Backoff, attempt_timeout_s


def test_full_jitter_stays_within_exponential_cap():
    cfg = RetryConfig(base_delay_s=0.5, max_delay_s=4.0, max_total_wait_s=3600)  # the largest allowed
    for n in range(6):
        cap = min(4.0, 0.5 * 2**n)
        draws = [Backoff(cfg, random.Random(seed)).next_delay(n, None) for seed in range(300)]
        assert all(0.0 <= d <= cap for d in draws)
        # full jitter: draws spread over the whole range, not bunched at the cap
        assert min(draws) < cap * 0.1 and max(draws) > cap * 0.9


def test_retry_after_is_a_capped_floor():
    cfg = RetryConfig(base_delay_s=0.1, retry_after_cap_s=5.0, max_total_wait_s=100)
    b = Backoff(cfg, random.Random(1))
    assert b.next_delay(0, 2.0) >= 2.0
    assert b.next_delay(0, 60.0) == 5.0


def test_total_wait_is_bounded():
    cfg = RetryConfig(base_delay_s=1.0, max_delay_s=8.0, max_total_wait_s=3.0, retry_after_cap_s=10)
    b = Backoff(cfg, random.Random(1))
    assert b.next_delay(0, 2.5) is not None
    assert b.next_delay(1, 2.5) is None  # 2.5 + 2.5 > 3.0
    assert b.waited_s <= 3.0


def test_timeout_grows_with_prompt_and_long_prompts_get_60s():
    cfg = RetryConfig()
    short, medium = attempt_timeout_s(30, 100, cfg), attempt_timeout_s(30, 6000, cfg)
    assert short < medium < 60
    assert attempt_timeout_s(30, 8001, cfg) >= 60
    assert attempt_timeout_s(10, 9000, cfg) >= 60


def test_router_passes_the_grown_timeout_to_the_sdk(client_factory, sqlite_url):
    import httpx2

    seen = []

    def handler(request):
        seen.append(request.extensions.get("timeout", {}).get("read"))
        return httpx2.Response(500, json={"error": {"message": "x"}})

    client = client_factory(sqlite_url, transports={"direct": httpx2.MockTransport(handler)})
    from app.routing import AllRoutesFailed

    with pytest.raises(AllRoutesFailed):
        client.chat([{"role": "user", "content": "x" * 40_000}], route="fallback")
    # The read timeout is the grown 60 s attempt budget, capped at the transport by what is left of
    # the attempt's deadline (issue 7 #6), so a few milliseconds under 60 by the time it is sent.
    assert seen and all(59 < t <= 60 for t in seen)


@pytest.mark.parametrize(
    "model,inp,cached_in,out,dollars",
    [
        # 12,345 prompt tokens of which 2,345 cached, 678 completion tokens; worked by hand:
        # 10,000 x 0.28 + 2,345 x 0.028 + 678 x 0.42 = 3,150.42 -> per million = 0.00315042
        ("deepseek-chat-v3.2", "0.28", "0.028", "0.42", 0.00315042),
        # 10,000 x 0.30 + 2,345 x 0.03 + 678 x 2.50 = 4,765.35
        ("gemini-2.5-flash", "0.30", "0.03", "2.50", 0.00476535),
        # 10,000 x 3.00 + 2,345 x 0.30 + 678 x 15.00 = 40,873.5
        ("claude-sonnet-4-20250514", "3.00", "0.30", "15.00", 0.0408735),
        # 10,000 x 2.00 + 2,345 x 0.50 + 678 x 8.00 = 26,596.5
        ("gpt-4.1", "2.00", "0.50", "8.00", 0.0265965),
    ],
)
def test_cost_formula_and_default_prices(model, inp, cached_in, out, dollars):
    info = catalog.get(model)
    assert (info.input, info.cached_input, info.output) == (Decimal(inp), Decimal(cached_in), Decimal(out))
    assert catalog.cost_usd(model, 12_345, 2_345, 678) == dollars


def test_cost_of_one_million_output_tokens_is_the_output_price():
    assert catalog.cost_usd("claude-sonnet-4-20250514", 0, 0, 1_000_000) == 15.0
    assert catalog.cost_usd("deepseek-chat-v3.2", 1_000_000, 1_000_000, 0) == pytest.approx(0.028)


def _usage_reply(request: httpx2.Request) -> httpx2.Response:
    """An upstream that reports 10,000 prompt tokens (2,000 of them cached) and 500 completion tokens."""
    return httpx2.Response(
        200,
        json={
            "id": "chatcmpl-cost",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4.1",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": 10_000,
                "completion_tokens": 500,
                "total_tokens": 10_500,
                "prompt_tokens_details": {"cached_tokens": 2_000},
            },
        },
    )


def test_router_cost_is_the_usage_priced_in_dollars(client_factory, sqlite_url):
    from sqlalchemy import select

    from db.models import RequestLog

    client = client_factory(sqlite_url, transports={"direct": httpx2.MockTransport(_usage_reply)})
    r = client.chat([{"role": "user", "content": "hello"}], model="gpt-4.1", route="fallback")
    assert (r.usage.prompt_tokens, r.usage.cached_tokens, r.usage.completion_tokens) == (10_000, 2_000, 500)
    # gpt-4.1: 8,000 uncached x $2.00 + 2,000 cached x $0.50 + 500 out x $8.00 = $21,000 per million = $0.021
    assert r.cost_usd == 0.021
    client.flush()
    with client.engine.connect() as conn:
        assert conn.execute(select(RequestLog.cost_usd)).scalars().all() == [pytest.approx(0.021, abs=1e-12)]
