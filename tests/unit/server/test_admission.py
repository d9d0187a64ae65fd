"""Key admission for the async server (app/server/admission.py): limits and budgets as OpenAI 429s,
settlement that survives cancellation, metrics of refusals and budget use."""

from __future__ import annotations

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.server import wire
from app.server.admission import Admission
from app.server.metrics import GatewayMetrics
from core.messages import estimate_prompt_tokens
from db.keys import create_key
from db.limits import spend, window_usage

T0 = 1_790_000_040.0


def metric(m: GatewayMetrics, name: str, **labels) -> float:
    for fam in text_string_to_metric_families(m.exposition().decode()):
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def test_rate_limit_refusal_is_429_with_retry_after(engine):
    key, _ = create_key(engine, "r", rpm=1)
    m = GatewayMetrics()
    adm = Admission(engine, m, clock=lambda: T0 + 15)

    async def go():
        assert await adm.admit(key)
        with pytest.raises(wire.WireError) as info:
            await adm.admit(key)
        return info.value

    err = anyio.run(go)
    # Sliding window: the admission at T0+15 counts until T0+76.
    assert (err.status, err.code, err.headers["Retry-After"]) == (429, "rate_limit_exceeded", "61")
    assert metric(m, "gateway_key_denials_total", reason="rate_limit_exceeded") == 1


def test_budget_refusal_and_settlement_update_the_gauge(engine):
    key, _ = create_key(engine, "b", budget_usd=1.0, period="day", tpm=10_000)
    m = GatewayMetrics()
    adm = Admission(engine, m, clock=lambda: T0)

    async def go():
        rid = await adm.admit(key, est_tokens=100, est_cost_usd=0.9)
        with pytest.raises(wire.WireError) as held:  # fits once the first settles: retry
            await adm.admit(key, est_cost_usd=0.2)
        assert (held.value.code, held.value.type, held.value.headers["Retry-After"]) == (
            "budget_reserved",
            "requests",
            "1",
        )
        assert await adm.settle(key, rid, tokens=40, cost_usd=0.75) is True
        assert await adm.settle(key, rid, tokens=40, cost_usd=0.75) is False
        with pytest.raises(wire.WireError) as info:  # 0.75 spent + 0.3: used up, no retry
            await adm.admit(key, est_cost_usd=0.3)
        assert info.value.code == "budget_exceeded" and "Retry-After" not in info.value.headers

    anyio.run(go)
    assert spend(engine, key, now=T0).spent_micro_usd == 750_000
    assert window_usage(engine, key, now=T0) == (1, 40)
    assert metric(m, "gateway_key_budget_used_ratio", key_name="b", period="day") == 0.75
    assert metric(m, "gateway_key_denials_total", reason="budget_exceeded") == 1
    assert metric(m, "gateway_key_denials_total", reason="budget_reserved") == 1


def test_a_budget_refusal_says_which_it_is_with_the_worst_case_and_the_fix(engine):
    """Issue 28: a $0.01/day key refused at $0 spent said "used up". The worst case alone over the
    whole budget, the budget used up, and too little left are three different refusals."""
    key, _ = create_key(engine, "tiny", budget_usd=0.01, period="day")
    adm = Admission(engine, clock=lambda: T0)
    note = "its prompt, about 9 tokens, plus 32,768 output tokens (gpt-4.1's output limit)"

    async def refusal(cost: float) -> wire.WireError:
        with pytest.raises(wire.WireError) as info:
            await adm.admit(key, est_cost_usd=cost, worst_case=note)
        return info.value

    async def go():
        too_big = await refusal(0.262)
        assert (too_big.status, too_big.code) == (429, "budget_exceeded")
        assert too_big.message.startswith(f"this request's worst case, $0.262 ({note}), is more than this key's daily")
        assert "budget of $0.01" in too_big.message and "not used up" in too_big.message
        assert "Fix: set max_tokens" in too_big.message and "used up (" not in too_big.message
        rid = await adm.admit(key, est_cost_usd=0.008)
        await adm.settle(key, rid, tokens=10, cost_usd=0.007)
        left = await refusal(0.004)
        assert "is more than the $0.003 left of this key's daily budget of $0.01 ($0.007 spent)" in left.message
        assert "lower max_tokens" in left.message
        rid = await adm.admit(key, est_cost_usd=0.003)
        await adm.settle(key, rid, tokens=10, cost_usd=0.003)
        used_up = await refusal(0.001)
        assert used_up.message.startswith("this key's daily budget of $0.01 is used up ($0.01 spent)")
        assert "worst case" not in used_up.message

    anyio.run(go)


def test_settle_survives_cancellation_of_the_request(engine):
    key, _ = create_key(engine, "c", budget_usd=1.0, period="day")
    adm = Admission(engine, clock=lambda: T0)

    async def go():
        rid = await adm.admit(key, est_cost_usd=0.1)
        with anyio.CancelScope() as scope:
            scope.cancel()  # the client went away; the settle in the cleanup must still happen
            try:
                await anyio.sleep_forever()
            finally:
                await adm.settle(key, rid, tokens=0, cost_usd=0.05)

    anyio.run(go)
    s = spend(engine, key, now=T0)
    assert (s.spent_micro_usd, s.reserved_micro_usd) == (50_000, 0)


def test_estimate_prompt_tokens():
    msgs = [{"role": "user", "content": "x" * 40}, {"role": "user", "content": [{"type": "text", "text": "y" * 8}]}]
    assert estimate_prompt_tokens(msgs) == 10 + 2 + 8


def test_the_handler_reserves_the_requests_worst_case_and_holds_the_models():
    """Issue 18 item 7: the estimate admission reserves counts the request's own output limit
    (any of its three names, times ``n``), or the catalog's output limit when it sets none; the
    hold is always the model's output limit."""
    from types import SimpleNamespace

    from app import catalog
    from app.server.handler import DEFAULT_EST_COMPLETION, ChatHandler

    settings = SimpleNamespace(intents=None, routes={})
    client = SimpleNamespace(core=SimpleNamespace(forwardable=frozenset()), settings=settings)
    handler = ChatHandler(client, engine=None, driver=object())  # type: ignore[arg-type]
    msgs = [{"role": "user", "content": "hi"}]
    prompt = estimate_prompt_tokens(msgs)
    limit = catalog.output_limit("gpt-4.1")
    assert limit == 32768

    def est(api: str, body: dict):
        return handler._estimate(wire.validate_api_request(api, {"model": "gpt-4.1", **body}))[:3]

    def what(body: dict) -> str:
        return handler._estimate(wire.validate_api_request("chat", {"model": "gpt-4.1", **body}))[3]

    cost = lambda completion: catalog.cost_usd("gpt-4.1", prompt, 0, completion)  # noqa: E731
    assert est("chat", {"messages": msgs, "max_tokens": 1}) == (prompt + 1, cost(1), cost(limit))
    assert est("chat", {"messages": msgs, "max_completion_tokens": 100, "n": 3}) == (
        prompt + 300,
        cost(300),
        cost(3 * limit),
    )
    assert est("chat", {"messages": msgs}) == (prompt + DEFAULT_EST_COMPLETION, cost(limit), cost(limit))
    assert what({"messages": msgs}) == (
        f"its prompt, about {prompt:,} tokens, plus 32,768 output tokens "
        "(gpt-4.1's output limit, as the request sets no max_tokens)"
    )
    assert what({"messages": msgs, "max_tokens": 50, "n": 2}).endswith(
        "plus 100 output tokens (its max_tokens, times n=2)"
    )
    assert est("responses", {"input": "hi", "max_output_tokens": 7})[1] == catalog.cost_usd(
        "gpt-4.1", estimate_prompt_tokens([{"role": "user", "content": "hi"}]), 0, 7
    )
