"""The simulator over loopback HTTP, driven by the openai SDK with its default HTTP client."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx2
import openai
import pytest

from app.simulator import SimulatedProvider, SimulatorHTTPServer, make_server
from core.faults import FaultSettings

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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


SERVE_SCRIPT = """
import sys
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
        assert b"Traceback" not in stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
