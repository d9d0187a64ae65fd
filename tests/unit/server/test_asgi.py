"""The gateway's ASGI app (app/server/asgi.py) through the openai SDK and raw HTTP: endpoints, auth,
errors, streaming, headers, and a real uvicorn server for client-disconnect cancellation."""

from __future__ import annotations

import asyncio
import json

import anyio
import httpx2
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.server import wire
from app.server.asgi import ChatReply, GatewayApp
from app.server.auth import KeyAuthenticator
from db.keys import create_key, revoke_key
from tests.support import wire_bodies as bodies
from tests.support.echo_app import GOOD, HELLO, LIMITED, MODELS, make_app


def run(coro_fn):
    return anyio.run(coro_fn)


def sdk(app: GatewayApp, key: str = GOOD) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://gw.test/v1",
        api_key=key,
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app)),
    )


def raw(app: GatewayApp) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://gw.test")


def test_sdk_non_streamed_and_streamed():
    app = make_app()

    async def go():
        async with sdk(app) as client:
            r = await client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=HELLO)
            c = r.parse()
            assert c.choices[0].message.content == "ih" and c.usage.prompt_tokens_details.cached_tokens == 1
            assert r.headers["x-gateway-provider"] == "direct" and r.headers["x-gateway-key"] == "good"
            assert len(r.headers["x-request-id"]) == 32
            stream = await client.chat.completions.create(
                model="auto",
                messages=[{"role": "user", "content": "abc"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [c async for c in stream]
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "cba"
            assert chunks[-1].usage.completion_tokens == 3

    run(go)


def test_stream_headers_and_framing_over_raw_http():
    app = make_app()

    async def go():
        async with raw(app) as http:
            body = {"model": "gpt-4.1", "messages": HELLO, "stream": True}
            r = await http.post(
                "/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {GOOD}", "x-request-id": "abc-123"},
            )
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["x-request-id"] == "abc-123" and r.headers["x-gateway-attempts"] == "1"
            assert r.text.endswith("data: [DONE]\n\n")
            # A request id that is not a safe token is replaced, not echoed.
            r = await http.get("/healthz", headers={"x-request-id": "bad id; <script>"})
            assert r.headers["x-request-id"] != "bad id" and len(r.headers["x-request-id"]) == 32

    run(go)


def test_models_health_ready_metrics():
    app = make_app()

    async def go():
        async with raw(app) as http:
            r = await http.get("/v1/models", headers={"Authorization": f"Bearer {GOOD}"})
            assert [m["id"] for m in r.json()["data"]] == ["auto", *MODELS]
            assert r.json()["object"] == "list"
            r = await http.get("/v1/models", headers={"Authorization": f"Bearer {LIMITED}"})
            assert [m["id"] for m in r.json()["data"]] == ["auto", "gemini-2.5-flash"]
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            r = await http.get("/readyz")
            assert r.status_code == 200 and r.json()["checks"] == {"database": True}
            await http.get("/v1/models")  # unauthorised: counted
            r = await http.get("/metrics")
            assert r.headers["content-type"].startswith("text/plain")
            fams = {f.name: f for f in text_string_to_metric_families(r.text)}
            denials = {s.labels["reason"]: s.value for s in fams["gateway_key_denials"].samples}
            assert denials["unauthorized"] == 1

    run(go)


@pytest.mark.parametrize(
    ("ready", "checks"),
    [
        (lambda: {"database": False, "providers": True}, {"database": False, "providers": True}),
        (lambda: 1 / 0, {"ready_check": False}),
    ],
)
def test_readyz_503_when_a_check_fails(ready, checks):
    async def go():
        async with raw(make_app(ready=ready)) as http:
            r = await http.get("/readyz")
            assert r.status_code == 503 and r.json() == {"status": "unavailable", "checks": checks}

    run(go)


def test_async_ready_check():
    async def ready():
        return {"database": True}

    async def go():
        async with raw(make_app(ready=ready)) as http:
            assert (await http.get("/readyz")).status_code == 200

    run(go)


@pytest.mark.parametrize(
    ("key", "model", "exc", "code"),
    [
        ("gw-wrong", "gpt-4.1", openai.AuthenticationError, "invalid_api_key"),
        (LIMITED, "gpt-4.1", openai.PermissionDeniedError, "model_not_allowed"),
        (GOOD, "no-such-model", openai.NotFoundError, "model_not_found"),
    ],
)
def test_auth_and_model_errors_through_the_sdk(key, model, exc, code):
    async def go():
        async with sdk(make_app(), key) as client:
            with pytest.raises(exc) as info:
                await client.chat.completions.create(model=model, messages=HELLO)
            assert info.value.code == code

    run(go)


def test_error_statuses_over_raw_http():
    async def limited(req, key):
        raise wire.rate_limited("slow down", 17)

    async def broken(req, key):
        raise RuntimeError("secret prompt text in an exception")

    async def go():
        auth = {"Authorization": f"Bearer {GOOD}", "Content-Type": "application/json"}
        async with raw(make_app(max_body_bytes=200)) as http:
            r = await http.post("/v1/chat/completions", content=b"{}", headers={})
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            r = await http.post("/v1/chat/completions", content=b"{}", headers={"Authorization": "Basic x"})
            assert r.status_code == 401
            r = await http.post("/v1/chat/completions", content=b"[1]", headers=auth)
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
            big = json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": "x" * 500}]})
            r = await http.post("/v1/chat/completions", content=big, headers=auth)
            assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
            r = await http.get("/v1/chat/completions", headers=auth)
            assert r.status_code == 405
            r = await http.get("/v2/nothing")
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
        async with raw(make_app(handler=limited)) as http:
            r = await http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO}, headers=auth)
            assert r.status_code == 429 and r.headers["retry-after"] == "17"
            assert r.json()["error"]["code"] == "rate_limit_exceeded"
        async with raw(make_app(handler=broken)) as http:
            r = await http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO}, headers=auth)
            assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
            assert "secret" not in r.text and "Traceback" not in r.text
            assert r.headers["x-request-id"] in r.json()["error"]["message"]

    run(go)


def test_error_mid_stream_reaches_the_sdk():
    async def failing(req, key):
        async def events():
            enc = bodies.ChunkStream(completion_id="c", created=1, model=req.model, include_usage=False)
            yield enc.role()
            yield enc.content("par")
            raise ConnectionResetError("upstream reset")

        return events()  # a bare async iterator is a stream too

    async def go():
        async with sdk(make_app(handler=failing)) as client:
            stream = await client.chat.completions.create(model="auto", messages=HELLO, stream=True)
            got = []
            with pytest.raises(openai.APIError, match="stream failed mid-way"):
                async for c in stream:
                    got.append(c)
            assert got[-1].choices[0].delta.content == "par"

    run(go)


def test_auth_off_passes_none_key():
    seen = []

    async def handler(req, key):
        seen.append(key)
        return bodies.completion_body(completion_id="c", created=1, model=req.model, content="x")

    async def go():
        async with raw(make_app(handler=handler, authenticate=None)) as http:
            r = await http.post("/v1/chat/completions", json={"model": "auto", "messages": HELLO})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "x"

    run(go)
    assert seen == [None]


# ------------------------------------------------------------------------------------ key cache


def test_key_authenticator_caches_by_hash_and_sees_revocation_after_ttl(engine):
    _rec, key = create_key(engine, "cached")
    now = [0.0]
    calls = []

    def counting_lookup(eng, token):
        from db.keys import lookup_key

        calls.append(1)
        return lookup_key(eng, token)

    auth = KeyAuthenticator(engine, ttl_s=2.0, clock=lambda: now[0], lookup=counting_lookup)

    async def go():
        assert (await auth(key)).name == "cached"
        assert (await auth(key)).name == "cached"
        assert len(calls) == 1
        assert await auth("gw-wrong") is None and await auth("gw-wrong") is None
        assert len(calls) == 2  # misses are cached too
        assert await auth(None) is None and len(calls) == 2
        revoke_key(engine, "cached")
        assert (await auth(key)) is not None  # within the TTL
        now[0] = 2.5
        assert await auth(key) is None

    run(go)
    assert key not in repr(auth._cache)


# ------------------------------------------------------------------------------------ real server


# -- server overload -------------------------------------------------------------------------------
# Admission before saturation (issue 16): a server process serves at most [server] max_in_flight
# routed requests at once; one more gets a clear 503 gateway_overloaded with Retry-After, counted as
# the gateway's overload (never an upstream failure) and logged once, while the others finish.


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
