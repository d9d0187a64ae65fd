"""A non-simulated provider over real HTTP on loopback: the router's network path (the SDK's
default httpx2 transport, the Authorization header, SSE over a socket), with the simulator served
by ``app.simulator.make_server`` standing in for a remote gateway."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx2
import openai
import pytest

from app.simulator import SimulatedProvider, SimulatorHTTPServer, make_server
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


# -- simulator http --------------------------------------------------------------------------------
# The simulator over loopback HTTP, driven by the openai SDK with its default HTTP client.


HELLO = [{"role": "user", "content": "Say hello over a real socket."}]


class Faults:
    """A fault source the test can switch while the server runs."""

    def __init__(self) -> None:
        self.settings = FaultSettings()

    def __call__(self) -> FaultSettings:
        return self.settings


@pytest.fixture
def faults() -> Faults:
    return Faults()


@pytest.fixture
def server(faults: Faults) -> Iterator[SimulatorHTTPServer]:
    providers = {
        "holysheep": SimulatedProvider("holysheep", ["gemini-2.5-flash"], latency_scale=0.01, seed=1, faults=faults),
        "direct": SimulatedProvider("direct", ["gpt-4.1"], latency_scale=0.01, seed=2),
    }
    srv = make_server(providers, "127.0.0.1", 0, hold_s=10.0)
    thread = srv.start_in_thread()
    yield srv
    srv.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()


def client_for(server: SimulatorHTTPServer, prefix: str = "", **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}{prefix}/v1", api_key="sim", max_retries=0, **kwargs)


def test_non_streamed_and_streamed_completions_over_http(server: SimulatorHTTPServer) -> None:
    with client_for(server, "/direct") as client:
        reply = client.chat.completions.create(model="gpt-4.1", messages=HELLO)
        assert reply.choices[0].message.content.startswith("[simulated direct/gpt-4.1]")
        assert reply._request_id.startswith("req-sim-")

        stream = client.chat.completions.create(
            model="gpt-4.1", messages=HELLO, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == reply.usage.prompt_tokens // 16 * 16


def test_plain_v1_reaches_the_first_provider(server: SimulatorHTTPServer) -> None:
    with client_for(server) as client:
        assert [m.id for m in client.models.list()] == ["gemini-2.5-flash"]
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-4.1", messages=HELLO)


def test_unknown_provider_is_404(server: SimulatorHTTPServer) -> None:
    response = httpx2.get(f"{server.url}/nobody/v1/models")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_url"


def test_faults_over_http(server: SimulatorHTTPServer, faults: Faults) -> None:
    with client_for(server, "/holysheep") as client:
        faults.settings = FaultSettings(rate_limit_rate=1.0, retry_after_s=0.25)
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="gemini-2.5-flash", messages=HELLO)
        assert caught.value.response.headers["retry-after-ms"] == "250"

        faults.settings = FaultSettings(stream_break_rate=1.0)
        stream = client.chat.completions.create(model="gemini-2.5-flash", messages=HELLO, stream=True)
        received: list[str] = []
        with pytest.raises(openai.APIConnectionError):
            for chunk in stream:
                received.append(chunk.choices[0].delta.content or "")
        assert received == ["", "["]


def test_timeout_fault_holds_the_connection_until_the_client_gives_up(
    server: SimulatorHTTPServer, faults: Faults
) -> None:
    faults.settings = FaultSettings(timeout_rate=1.0)
    with client_for(server, "/holysheep", timeout=0.3) as client:
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(model="gemini-2.5-flash", messages=HELLO)
        assert time.monotonic() - started >= 0.3
    faults.settings = FaultSettings()
    with client_for(server, "/holysheep") as client:  # the server still answers others
        assert client.chat.completions.create(model="gemini-2.5-flash", messages=HELLO).choices


def test_stopping_ends_every_connection_and_its_thread_within_a_bound(faults: Faults) -> None:
    """An idle keep-alive connection and a request held by the timeout fault are both ended by
    ``stop()``: no connection thread is left running for the interpreter's exit to race."""
    provider = SimulatedProvider("solo", ["gpt-4.1"], latency_scale=0, faults=faults)
    srv = make_server({"solo": provider}, "127.0.0.1", 0, hold_s=60.0)
    serving = srv.start_in_thread()
    before = set(threading.enumerate())
    host, port = srv.server_address[:2]
    idle = socket.create_connection((host, port), timeout=5)
    idle.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    assert idle.recv(12) == b"HTTP/1.1 200"  # answered, and kept alive
    faults.settings = FaultSettings(timeout_rate=1.0)
    held = socket.create_connection((host, port), timeout=5)
    body = b'{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}'
    held.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
    held.sendall(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    deadline = time.monotonic() + 5
    conn_threads = lambda: [t for t in set(threading.enumerate()) - before if t.is_alive()]  # noqa: E731
    while len(conn_threads()) < 2:
        assert time.monotonic() < deadline, "the two connections were not being served"
        time.sleep(0.01)
    started = time.monotonic()
    srv.stop()
    stopped_in = time.monotonic() - started
    serving.join(timeout=5)
    try:
        assert not serving.is_alive()
        assert stopped_in < 3.0, stopped_in
        assert conn_threads() == []
        for conn in (idle, held):  # closed by the server (EOF after what was sent), not left open
            while conn.recv(65536):
                pass
    finally:
        idle.close()
        held.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# The child takes Ctrl-C's default (KeyboardInterrupt) whatever it inherits: a test run started in
# the background of a non-interactive shell ignores SIGINT, and so would every child it starts.
SERVE_SCRIPT = """
import signal
import sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from app.simulator import SimulatedProvider, serve
serve({"solo": SimulatedProvider("solo", ["gpt-4.1"], latency_scale=0)}, "127.0.0.1", int(sys.argv[1]))
"""


def test_serve_answers_until_ctrl_c_then_exits_cleanly() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE_SCRIPT, str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                response = httpx2.get(f"http://127.0.0.1:{port}/solo/v1/models", timeout=1)
                break
            except httpx2.TransportError:
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "simulator did not come up"
                time.sleep(0.1)
        assert response.json()["data"][0]["id"] == "gpt-4.1"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=10)
        assert process.returncode == 0, stderr
        assert b"Traceback" not in stderr, stderr.decode(errors="replace")[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# -- the simulator's surface over HTTP -------------------------------------------------------------
# The simulator's whole surface over loopback HTTP, driven by the openai SDK with its default HTTP
# client: Responses SSE with ``event:`` lines, streamed tool calls, embeddings, legacy completions,
# stored responses, models, the ``apis`` restriction, OpenAI's headers and a stream-break fault.


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class Faults_wire:
    def __init__(self) -> None:
        self.settings = FaultSettings()

    def __call__(self) -> FaultSettings:
        return self.settings


@pytest.fixture
def server_wire(faults: Faults_wire) -> Iterator[SimulatorHTTPServer]:
    providers = {
        "full": SimulatedProvider(
            "full", ["gpt-4.1", "text-embedding-3-small"], latency_scale=0, seed=1, faults=faults
        ),
        "chatonly": SimulatedProvider("chatonly", ["gpt-4.1"], latency_scale=0, seed=2, apis={"chat"}),
    }
    srv = make_server(providers, "127.0.0.1", 0, hold_s=5.0)
    thread = srv.start_in_thread()
    yield srv
    srv.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()


def client_for_wire(server_wire: SimulatorHTTPServer, name: str = "full") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server_wire.url}/{name}/v1", api_key="sim", max_retries=0)


def test_responses_stream_is_event_and_data_lines(server_wire: SimulatorHTTPServer) -> None:
    body = {"model": "gpt-4.1", "input": "Stream over a socket.", "stream": True}
    with httpx2.stream("POST", f"{server_wire.url}/full/v1/responses", json=body, timeout=10) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    blocks = [b for b in text.split("\n\n") if b.strip()]
    assert "[DONE]" not in text  # the Responses API ends with response.completed, not [DONE]
    numbers = []
    for block in blocks:
        event_line, data_line = block.split("\n")
        payload = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {payload['type']}"
        numbers.append(payload["sequence_number"])
    assert numbers == list(range(len(blocks)))
    assert json.loads(blocks[-1].split("\n")[1].removeprefix("data: "))["type"] == "response.completed"


def test_sdk_responses_over_http(server_wire: SimulatorHTTPServer) -> None:
    with client_for_wire(server_wire) as client:
        with client.responses.stream(model="gpt-4.1", input="What is the weather in Oslo?", tools=[WEATHER]) as stream:
            final = stream.get_final_response()
        [call] = final.output
        assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Oslo"}
        follow = client.responses.create(
            model="gpt-4.1",
            previous_response_id=final.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 18 C"}],
        )
        assert "sunny" in follow.output_text
        assert client.responses.retrieve(follow.id).id == follow.id
        deleted = client.responses.delete(follow.id)
        assert deleted is None  # the SDK returns nothing for a delete
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(follow.id)


def test_chat_tool_call_stream_over_http(server_wire: SimulatorHTTPServer) -> None:
    tools = [{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}]
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    with client_for_wire(server_wire) as client:
        with client.chat.completions.stream(model="gpt-4.1", messages=messages, tools=tools) as stream:
            final = stream.get_final_completion()
        [call] = final.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Oslo"})


def test_embeddings_and_completions_over_http(server_wire: SimulatorHTTPServer) -> None:
    with client_for_wire(server_wire) as client:
        default = client.embeddings.create(model="text-embedding-3-small", input=["a", "b"], dimensions=32)
        floats = client.embeddings.create(
            model="text-embedding-3-small", input=["a", "b"], dimensions=32, encoding_format="float"
        )
        for decoded, plain in zip(default.data, floats.data, strict=True):
            assert decoded.embedding == pytest.approx(plain.embedding)
        assert [len(d.embedding) for d in floats.data] == [32, 32]
        streamed = list(client.completions.create(model="gpt-4.1", prompt="over http", stream=True))
        whole = client.completions.create(model="gpt-4.1", prompt="over http")
        assert "".join(c.choices[0].text for c in streamed if c.choices) == whole.choices[0].text


def test_openai_headers_over_http(server_wire: SimulatorHTTPServer) -> None:
    with client_for_wire(server_wire) as client:
        raw = client.responses.with_raw_response.create(model="gpt-4.1", input="headers")
        for header in (
            "x-request-id",
            "openai-processing-ms",
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-requests",
            "x-ratelimit-reset-tokens",
        ):
            assert raw.headers.get(header), header
        stream = client.chat.completions.with_raw_response.create(
            model="gpt-4.1", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert stream.headers["x-ratelimit-remaining-requests"]
        list(stream.parse())


def test_models_and_apis_over_http(server_wire: SimulatorHTTPServer) -> None:
    with client_for_wire(server_wire) as client:
        assert client.models.retrieve("text-embedding-3-small").id == "text-embedding-3-small"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("nope")
    with client_for_wire(server_wire, "chatonly") as client:
        assert client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "hi"}]).choices
        with pytest.raises(openai.NotFoundError) as caught:
            client.responses.create(model="gpt-4.1", input="x")
        assert caught.value.body["code"] == "unknown_url"


def test_stream_break_over_http_on_a_responses_stream(server_wire: SimulatorHTTPServer, faults: Faults_wire) -> None:
    faults.settings = FaultSettings(stream_break_rate=1.0)
    with client_for_wire(server_wire) as client:
        received: list[str] = []
        with pytest.raises(openai.APIConnectionError):
            for event in client.responses.create(model="gpt-4.1", input="x", stream=True):
                received.append(event.type)
        assert "response.output_text.delta" in received
        assert "response.completed" not in received
