"""A non-simulated provider over real HTTP on loopback: the router's network path (the SDK's
default httpx2 transport, the Authorization header, SSE over a socket), with the simulator served
by ``app.simulator.make_server`` standing in for a remote gateway."""

from __future__ import annotations

import pytest

from app.simulator import SimulatedProvider, make_server
from core.faults import FaultSettings
from db.canary import set_ratio

KEY = "sk-loopback-test-key"
MODELS = ["gemini-2.5-flash", "gpt-4.1"]


@pytest.fixture
def remote():
    state = {"faults": FaultSettings()}
    seen_auth: list[str | None] = []
    provider = SimulatedProvider("remote", MODELS, faults=lambda: state["faults"], latency_scale=0.0, seed=1)
    original = provider.respond

    def respond(request):
        seen_auth.append(request.headers.get("authorization"))
        return original(request)

    provider.respond = respond  # record what reached the "remote" side
    server = make_server({"remote": provider}, port=0)
    server.start_in_thread()
    yield type("Remote", (), {"url": server.url, "state": state, "auth": seen_auth})
    server.stop()


def config(url: str) -> str:
    return f"""
[routing]
primary = "gateway"
fallback = "direct"
[providers.gateway]
base_url = "{url}/remote/v1"
api_key_env = "LOOPBACK_GATEWAY_KEY"
models = {MODELS!r}
default_model = "gemini-2.5-flash"
[providers.direct]
base_url = "sim://direct"
models = ["gpt-4.1", "gemini-2.5-flash"]
default_model = "gpt-4.1"
""".replace("'", '"')


def test_chat_and_stream_over_loopback_http(remote, client_factory, sqlite_url):
    client = client_factory(sqlite_url, toml=config(remote.url), env={"LOOPBACK_GATEWAY_KEY": KEY})
    set_ratio(client.engine, 1.0, expected_version=None, actor="t", reason="all to the gateway")
    client.refresh()
    r = client.chat([{"role": "user", "content": "hello over http"}], session_id="h1")
    assert r.provider == "gateway" and not r.fallback_used and r.text.startswith("[simulated remote/")
    stream = client.chat([{"role": "user", "content": "stream it"}], session_id="h1", stream=True)
    text = "".join(stream)
    assert text == stream.result.text and stream.result.ttft_ms is not None
    assert stream.result.usage.completion_tokens > 0
    assert remote.auth and all(a == f"Bearer {KEY}" for a in remote.auth)


def test_remote_failure_over_http_falls_back_to_the_simulator(remote, client_factory, sqlite_url):
    remote.state["faults"] = FaultSettings(error_rate=1.0)
    client = client_factory(sqlite_url, toml=config(remote.url), env={"LOOPBACK_GATEWAY_KEY": KEY})
    set_ratio(client.engine, 1.0, expected_version=None, actor="t", reason="all to the gateway")
    client.refresh()
    r = client.chat([{"role": "user", "content": "hello"}])
    assert r.provider == "direct" and r.fallback_used
    assert [a.http_status for a in r.attempt_log[:-1]] == [500] * client.settings.retry.max_attempts


def test_unreachable_gateway_is_a_connection_error_then_fallback(client_factory, sqlite_url):
    import socket

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = client_factory(sqlite_url, toml=config(f"http://127.0.0.1:{port}"), env={"LOOPBACK_GATEWAY_KEY": KEY})
    set_ratio(client.engine, 1.0, expected_version=None, actor="t", reason="all to the gateway")
    client.refresh()
    r = client.chat([{"role": "user", "content": "hello"}])
    assert r.provider == "direct" and r.attempt_log[0].error_class == "connection"
