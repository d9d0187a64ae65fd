"""Secrets never reach the database, prompts only on opt-in, and a missing key is a clear error.

A non-simulated provider is configured with a real-looking https URL; the test injects a
MockTransport for it (no network) that answers in the OpenAI wire format and checks the key arrives
in the Authorization header, i.e. the key is really in use while we look for it in storage.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest
from sqlalchemy import create_engine, inspect, text

from app.routing import AllRoutesFailed, RoutingClient

SECRET = "sk-live-SECRET-abc123"
PROMPT_MARKER = "zebra-PROMPT-MARKER-7f3a"
FAIL_MARKER = "please-FAIL-now"

TOML = """
[routing]
primary = "gw"
fallback = "direct"
initial_ratio = 1.0
fallback_enabled = {fallback_enabled}

[providers.gw]
base_url = "https://gateway.example.test/v1"
api_key_env = "TEST_GW_KEY"
models = ["gpt-4.1", "gemini-2.5-flash"]
default_model = "gpt-4.1"

[providers.direct]
base_url = "sim://direct"
api_key_env = "OPENAI_API_KEY"
models = ["gpt-4.1", "gemini-2.5-flash"]
default_model = "gpt-4.1"

[telemetry]
store_prompts = {store_prompts}
"""


def toml(*, store_prompts: bool = False, fallback_enabled: bool = True) -> str:
    return TOML.format(store_prompts=str(store_prompts).lower(), fallback_enabled=str(fallback_enabled).lower())


class Upstream:
    """An OpenAI-compatible upstream on a MockTransport; fails requests whose prompt has FAIL_MARKER."""

    def __init__(self, key: str = SECRET) -> None:
        self.key = key
        self.requests: list[httpx2.Request] = []
        self.auth_ok: list[bool] = []

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        ok = request.headers.get("authorization") == f"Bearer {self.key}"
        self.auth_ok.append(ok)
        assert request.url.host == "gateway.example.test"
        if not ok:
            return httpx2.Response(401, json={"error": {"message": "invalid api key", "type": "auth"}})
        if request.url.path != "/v1/chat/completions":
            return httpx2.Response(404, json={"error": {"message": "no such route"}})
        body = json.loads(request.content)
        prompt = " ".join(str(m.get("content")) for m in body["messages"])
        if FAIL_MARKER in prompt:
            return httpx2.Response(500, json={"error": {"message": "upstream exploded", "type": "server_error"}})
        model = body["model"]
        usage = {
            "prompt_tokens": 11,
            "completion_tokens": 3,
            "total_tokens": 14,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        if body.get("stream"):

            def chunk(delta: dict, finish: str | None) -> str:
                return (
                    "data: "
                    + json.dumps(
                        {
                            "id": "chatcmpl-gw",
                            "object": "chat.completion.chunk",
                            "created": 1,
                            "model": model,
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                        }
                    )
                    + "\n\n"
                )

            events = [
                chunk({"role": "assistant", "content": "hello "}, None),
                chunk({"content": "from gw"}, None),
                chunk({}, "stop"),
            ]
            events.append(
                "data: "
                + json.dumps(
                    {
                        "id": "chatcmpl-gw",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": model,
                        "choices": [],
                        "usage": usage,
                    }
                )
                + "\n\n"
            )
            events.append("data: [DONE]\n\n")
            return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content="".join(events).encode())
        return httpx2.Response(
            200,
            json={
                "id": "chatcmpl-gw",
                "object": "chat.completion",
                "created": 1,
                "model": model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hello from gw"}, "finish_reason": "stop"}
                ],
                "usage": usage,
            },
        )


def _db_text(url: str) -> bytes:
    """Everything the database holds, as bytes: the SQLite file (+WAL), or every row of every table."""
    from db.engine import dispose_all

    dispose_all()
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        data = path.read_bytes()
        for suffix in ("-wal", "-journal"):
            side = Path(str(path) + suffix)
            if side.exists():
                data += side.read_bytes()
        assert len(data) > 0
        return data
    engine = create_engine(url)
    try:
        chunks: list[str] = []
        with engine.connect() as conn:
            tables = inspect(engine).get_table_names()
            assert "request_log" in tables
            for table in tables:
                cols = [c["name"] for c in inspect(engine).get_columns(table) if c["type"].python_type is str]
                for col in cols:
                    chunks.extend(
                        str(v) for v in conn.execute(text(f'SELECT "{col}" FROM "{table}"')).scalars() if v is not None
                    )
                # And the whole row as text, whatever the column types.
                chunks.extend(conn.execute(text(f'SELECT CAST(t AS text) FROM "{table}" t')).scalars())
        return "\n".join(chunks).encode()
    finally:
        engine.dispose()


def _send_traffic(client: RoutingClient) -> list[str]:
    ids = []
    r = client.chat([{"role": "user", "content": f"hello {PROMPT_MARKER}"}], session_id="sess-1")
    assert r.provider == "gw" and r.text == "hello from gw"
    ids.append(r.request_id)
    r = client.chat([{"role": "user", "content": f"explain {PROMPT_MARKER}"}], model="gpt-4.1")
    assert r.provider == "gw"
    ids.append(r.request_id)
    stream = client.chat([{"role": "user", "content": f"stream {PROMPT_MARKER}"}], stream=True)
    assert "".join(stream) == "hello from gw"
    assert stream.result is not None and stream.result.provider == "gw"
    ids.append(stream.result.request_id)
    # A 500 from the real provider: retried, then served by the simulated fallback.
    r = client.chat([{"role": "user", "content": f"{FAIL_MARKER} {PROMPT_MARKER}"}])
    assert r.fallback_used and r.provider == "direct"
    assert any(a.http_status == 500 for a in r.attempt_log)
    assert SECRET not in json.dumps(r.to_dict(), default=str)
    ids.append(r.request_id)
    return ids


def _rows(url: str) -> list[dict]:
    from sqlalchemy import select

    from db.engine import get_engine
    from db.models import RequestLog

    with get_engine(url).connect() as conn:
        return [dict(r) for r in conn.execute(select(RequestLog)).mappings().all()]


def test_api_key_never_reaches_the_database(db_url: str, client_factory) -> None:
    up = Upstream()
    client = client_factory(
        db_url, toml(), transports={"gw": httpx2.MockTransport(up.handler)}, env={"TEST_GW_KEY": SECRET}
    )
    _send_traffic(client)
    client.close()
    assert up.requests and all(up.auth_ok), "the key was not sent in the Authorization header"

    rows = _rows(db_url)
    assert any(r["status"] == "error" and r["http_status"] == 500 and r["provider"] == "gw" for r in rows)
    assert sum(r["final"] for r in rows) == 4
    assert all(r["prompt_text"] is None for r in rows)

    data = _db_text(db_url)
    assert SECRET.encode() not in data
    assert b"SECRET-abc123" not in data
    assert b"Authorization" not in data and b"authorization" not in data
    assert b"Bearer" not in data
    # Prompts are not stored unless the operator opts in.
    assert PROMPT_MARKER.encode() not in data
    # Sanity: the dump does contain what was logged.
    assert b"gemini-2.5-flash" in data or b"gpt-4.1" in data
    assert b"upstream exploded" in data


def test_prompts_are_stored_only_when_opted_in_and_still_no_key(db_url: str, client_factory) -> None:
    up = Upstream()
    client = client_factory(
        db_url,
        toml(store_prompts=True),
        transports={"gw": httpx2.MockTransport(up.handler)},
        env={"TEST_GW_KEY": SECRET},
    )
    _send_traffic(client)
    client.close()
    rows = _rows(db_url)
    assert rows and all(PROMPT_MARKER in (r["prompt_text"] or "") for r in rows)

    data = _db_text(db_url)
    assert PROMPT_MARKER.encode() in data
    assert SECRET.encode() not in data
    assert b"Bearer" not in data


def test_missing_key_is_a_clear_error_with_no_fallback(sqlite_url: str, client_factory) -> None:
    up = Upstream()
    # Construction succeeds without the key: it is only needed when the provider is used.
    client = client_factory(
        sqlite_url, toml(fallback_enabled=False), transports={"gw": httpx2.MockTransport(up.handler)}, env={}
    )
    with pytest.raises(AllRoutesFailed) as info:
        client.chat([{"role": "user", "content": "hi"}])
    assert "not configured: set TEST_GW_KEY" in str(info.value)
    assert info.value.attempts and "not configured: set TEST_GW_KEY" in (info.value.attempts[0].error or "")
    assert info.value.attempts[0].error_class == "not_configured"
    assert up.requests == []  # nothing was sent without a key
    client.close()
    rows = _rows(sqlite_url)
    assert len(rows) == 1
    assert rows[0]["status"] == "error" and "TEST_GW_KEY" in rows[0]["error_message"]


def test_missing_key_falls_back_and_says_why(sqlite_url: str, client_factory) -> None:
    up = Upstream()
    client = client_factory(
        sqlite_url, toml(), transports={"gw": httpx2.MockTransport(up.handler)}, env={"UNRELATED": "x"}
    )
    r = client.chat([{"role": "user", "content": "hi"}])
    assert r.provider == "direct" and r.fallback_used
    assert r.attempt_log[0].provider == "gw"
    assert "not configured: set TEST_GW_KEY" in (r.attempt_log[0].error or "")
    assert up.requests == []


def test_wrong_key_is_refused_by_upstream_and_not_stored(sqlite_url: str, client_factory) -> None:
    up = Upstream()
    client = client_factory(
        sqlite_url,
        toml(fallback_enabled=False),
        transports={"gw": httpx2.MockTransport(up.handler)},
        env={"TEST_GW_KEY": "sk-live-WRONG-999"},
    )
    with pytest.raises(AllRoutesFailed) as info:
        client.chat([{"role": "user", "content": "hi"}])
    assert info.value.attempts[0].error_class == "auth"
    assert up.auth_ok == [False]
    client.close()
    data = _db_text(sqlite_url)
    assert b"sk-live-WRONG-999" not in data
    assert b"Bearer" not in data


def test_key_state_reports_presence_never_the_key(settings_factory) -> None:
    from app.config import ProviderNotConfigured, key_state, resolve_api_key

    s = settings_factory(toml())
    gw = s.providers["gw"]
    assert key_state(gw, env={}) == "missing"
    assert key_state(gw, env={"TEST_GW_KEY": SECRET}) == "set"
    assert key_state(s.providers["direct"], env={}) == "simulated"
    assert resolve_api_key("gw", gw, env={"TEST_GW_KEY": SECRET}) == SECRET
    with pytest.raises(ProviderNotConfigured, match="not configured: set TEST_GW_KEY"):
        resolve_api_key("gw", gw, env={})
    assert SECRET not in s.model_dump_json()
