"""Every request is in the log exactly once, whatever ends it (issue 17): refused by its key (none,
unknown, a model it may not use), by its rate limit or its budget in the server, or answered. The
whole server (build_server: auth, admission, handler, metrics) in one process over ASGI, on a
scripted loopback upstream; what the callers saw is compared with the log."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path

import httpx2
import pytest
from sqlalchemy import text

from app.config import load_settings
from app.gateway import build_gateway
from app.server.serve import build_server
from db.keys import create_key
from tests.support.chaos_upstream import ChaosUpstream
from tests.support.serve_process import chaos_config

HI = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def server(tmp_path: Path):
    with ChaosUpstream() as up:
        cfg = tmp_path / "gw.toml"
        cfg.write_text(chaos_config(up.url))
        env = {"CHAOS_KEY": "k", "DATABASE_URL": f"sqlite:///{tmp_path / 'gw.sqlite'}"}
        gw = build_gateway(load_settings(cfg, env=env), env=env, stop=threading.Event(), guardrail=False)
        srv = build_server(gw)
        loop = asyncio.new_event_loop()
        try:
            yield srv, loop
        finally:
            loop.run_until_complete(srv.handler.aclose())
            loop.close()
            gw.close()


def call(srv, loop, token: str | None, body: dict) -> int:
    async def go() -> int:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        transport = httpx2.ASGITransport(app=srv.app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://gw") as c:
            return (await c.post("/v1/chat/completions", json=body, headers=headers)).status_code

    return loop.run_until_complete(go())


def test_what_callers_saw_is_what_the_log_holds(server):
    srv, loop = server
    engine = srv.gateway.engine
    _, ok_key = create_key(engine, "ok")
    _, narrow = create_key(engine, "narrow", models=["gemini-2.5-flash"])
    _, limited = create_key(engine, "limited", rpm=1)
    _, broke = create_key(engine, "broke", budget_usd=0.000001, period="day")
    seen = [
        call(srv, loop, None, HI),  # no key
        call(srv, loop, "gw-not-a-key", HI),  # unknown key
        call(srv, loop, narrow, HI),  # a model the key may not use
        call(srv, loop, limited, HI),  # its one request this minute
        call(srv, loop, limited, HI),  # over its rate limit
        call(srv, loop, broke, {**HI, "max_tokens": 100_000}),  # over its budget
        call(srv, loop, ok_key, HI),
    ]
    assert seen == [401, 401, 403, 200, 429, 429, 200]
    srv.gateway.client.flush()
    with engine.connect() as conn:
        rows = conn.execute(text("select provider, status, http_status, error_class, key_name, final from request_log"))
        rows = [tuple(r) for r in rows]
    assert len(rows) == len(seen) and all(r[5] for r in rows)  # one final row per request
    assert Counter(r[2] for r in rows) == Counter(seen)
    refused = sorted((r[3], r[4]) for r in rows if r[0] == "gateway")
    assert refused == [
        ("budget_exceeded", "broke"),
        ("gateway_rate_limited", "limited"),
        ("key_refused", None),
        ("key_refused", None),
        ("model_not_allowed", "narrow"),
    ]
