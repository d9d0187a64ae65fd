"""Admission before saturation (issue 16): a server process serves at most [server] max_in_flight
routed requests at once; one more gets a clear 503 gateway_overloaded with Retry-After, counted as
the gateway's overload (never an upstream failure) and logged once, while the others finish."""

from __future__ import annotations

import asyncio

import httpx2
from prometheus_client.parser import text_string_to_metric_families

from app.server import wire
from app.server.asgi import ChatReply, GatewayApp

HI = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}


def counter(app: GatewayApp, name: str) -> float:
    for fam in text_string_to_metric_families(app.metrics.exposition().decode()):
        for s in fam.samples:
            if s.name == name:
                return s.value
    raise AssertionError(name)


def test_past_the_bound_a_request_is_refused_with_503_and_the_rest_are_served():
    release = asyncio.Event()
    refused: list[tuple] = []

    async def slow(req: wire.ChatRequest, key) -> ChatReply:
        await release.wait()
        return ChatReply({"ok": True})

    app = GatewayApp(
        chat_handler=slow,
        models=["gpt-4.1"],
        authenticate=None,
        max_in_flight=2,
        on_refused=lambda api, model, key, err: refused.append((api, model, err.code)),
    )

    async def main():
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://gw") as c:
            first = [asyncio.create_task(c.post("/v1/chat/completions", json=HI)) for _ in range(2)]
            await asyncio.sleep(0.05)  # both are in flight now
            third = await c.post("/v1/chat/completions", json=HI)
            release.set()
            return [await t for t in first], third

    served, third = asyncio.run(main())
    assert [r.status_code for r in served] == [200, 200]
    assert third.status_code == 503 and third.headers["retry-after"] == "1"
    assert third.json()["error"]["code"] == "gateway_overloaded"
    assert refused == [("chat", "gpt-4.1", "gateway_overloaded")]
    assert counter(app, "gateway_overload_refusals_total") == 1
    assert counter(app, "gateway_in_flight_requests") == 0


def test_the_bound_is_off_at_zero():
    async def quick(req: wire.ChatRequest, key) -> ChatReply:
        await asyncio.sleep(0.01)
        return ChatReply({"ok": True})

    app = GatewayApp(chat_handler=quick, models=["gpt-4.1"], authenticate=None)

    async def main():
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://gw") as c:
            return await asyncio.gather(*[c.post("/v1/chat/completions", json=HI) for _ in range(20)])

    assert app.max_in_flight == 0
    assert [r.status_code for r in asyncio.run(main())] == [200] * 20
