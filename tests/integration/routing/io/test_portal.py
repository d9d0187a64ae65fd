"""The sync client as a blocking portal over the async driver (:mod:`app.routing.io.portal`), over
real loopback HTTP: a stream the caller stops reading is cancelled on the loop (connection closed,
attempt logged ``cancelled``) before ``close()`` returns; calls from many threads at once share the
one loop; a forked child routes through a loop of its own; a process that exits without closing
its client exits cleanly.

Built like tests/integration/routing/io/test_client.py (``make_router``): primary ``chaos`` is the
loopback chaos upstream, fallback ``direct`` the instant simulator.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import pytest

from app.routing import AllRoutesFailed, RoutingClient, StreamBrokenError
from app.routing.io.portal import PORTAL
from tests.integration.routing.io.test_client import HI, KEY, KEY_ENV, OK_TEXT, flushed, log_rows, make_router
from tests.support.chaos_upstream import ChaosUpstream, mid_stream_drop, ok, stall_after, unauthorized_echo

BOUND_S = 10.0  # a bound on each wait, never a timing assertion
REPO = Path(__file__).resolve().parents[4]


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


def test_closing_a_sync_stream_early_closes_the_upstream_and_logs_it_cancelled(router, up):
    up.set_default(stall_after(3), provider="chaos")
    client = router(sections={"retry": "stream_idle_timeout_s = 60"})
    stream = client.chat(HI, stream=True)
    pieces = iter(stream)
    assert next(pieces) == "one"
    stream.close()  # returns once the loop has cancelled the stream
    assert stream.result is None
    (req,) = up.wait_for_requests(1, BOUND_S)
    assert req.served.wait(BOUND_S)  # the upstream saw its connection closed
    assert flushed(client)
    rows = log_rows(client)
    assert [(r["provider"], r["error_class"], r["final"]) for r in rows] == [("chaos", "cancelled", True)]


def test_leaving_the_loop_early_cancels_the_stream_too(router, up):
    up.set_default(stall_after(3), provider="chaos")
    client = router(sections={"retry": "stream_idle_timeout_s = 60"})
    stream = client.chat(HI, stream=True)
    for piece in stream:
        assert piece == "one"
        break
    (req,) = up.wait_for_requests(1, BOUND_S)
    assert req.served.wait(BOUND_S)
    assert flushed(client)
    assert [r["error_class"] for r in log_rows(client)] == ["cancelled"]


def test_many_threads_share_the_loop_and_each_gets_its_own_answer(router, up):
    up.set_default(ok(OK_TEXT), provider="chaos")
    client = router()

    def one(i: int) -> tuple[str, str, str]:
        plain = client.chat(HI, session_id=f"s{i}")
        stream = client.chat(HI, stream=True, session_id=f"s{i}")
        text = "".join(stream)
        assert stream.result is not None
        return plain.text, text, threading.current_thread().name

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, range(32)))
    assert {(plain, text) for plain, text, _ in got} == {(OK_TEXT, OK_TEXT)}
    assert len({name for *_, name in got}) > 1
    assert flushed(client)
    assert len(log_rows(client)) == 64


def test_exceptions_reach_the_sync_caller_with_their_classes(router, up):
    up.set_default(unauthorized_echo(), provider="chaos")
    client = router()
    with pytest.raises(AllRoutesFailed) as plain:
        client.chat(HI, route="primary")  # one side, no fallback
    with pytest.raises(AllRoutesFailed):
        list(client.chat(HI, stream=True, route="primary"))
    assert [a.provider for a in plain.value.attempts] == ["chaos"]
    up.set_default(mid_stream_drop(2), provider="chaos")
    got: list[str] = []
    with pytest.raises(StreamBrokenError):
        for piece in client.chat(HI, stream=True):
            got.append(piece)
    assert got  # text was delivered, so no fall-back: the break is the caller's


def test_a_forked_child_routes_through_a_loop_of_its_own(router, up):
    """The portal's loop and the driver are built again in the child. Its providers here are
    in-process (a transport, the simulator): pyreqwest refuses to build a client in a child forked
    after its runtime started, so a child that reaches real upstreams must be forked before the
    parent's first request (as ``serve --workers`` does) or started with ``spawn``."""
    answer = completion_body(OK_TEXT)
    client = router(transports={"chaos": httpx2.MockTransport(lambda request: _answer(request, answer))})
    assert client.chat(HI).text == OK_TEXT  # the parent's loop and driver exist before the fork
    generation = PORTAL.generation
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running the parent's exit hooks
        code = 1
        try:
            os.close(read)
            r = client.chat(HI)
            streamed = "".join(client.chat(HI, stream=True))
            moved = PORTAL.generation != generation
            os.write(write, f"{r.text}|{streamed}|{moved}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, said
    assert said == f"{OK_TEXT}|{OK_TEXT}|True"
    assert client.chat(HI).text == OK_TEXT  # the parent's loop is untouched
    assert PORTAL.generation == generation


def completion_body(text: str) -> dict:
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4.1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
    }


def _answer(request: httpx2.Request, body: dict) -> httpx2.Response:
    if not json.loads(request.content).get("stream"):
        return httpx2.Response(200, json=body)
    text = body["choices"][0]["message"]["content"]
    chunks = [
        {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4.1", "choices": [c]}
        for c in (
            {"index": 0, "delta": {"content": text}, "finish_reason": None},
            {"index": 0, "delta": {}, "finish_reason": "stop"},
        )
    ]
    chunks.append({**chunks[0], "choices": [], "usage": body["usage"]})
    sse = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    return httpx2.Response(200, content=sse, headers={"content-type": "text/event-stream"})


def test_a_process_that_exits_without_closing_its_client_exits_cleanly(up, tmp_path):
    """The portal's loop thread, the driver and its pyreqwest clients are closed at exit, in
    order: the process ends with status 0 and says nothing on stderr."""
    program = textwrap.dedent(
        f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from tests.integration.routing.io.test_client import make_router
        client = make_router(
            Path({str(tmp_path / "exit.toml")!r}), "sqlite:///{tmp_path / "exit.db"}", None,
            base_url={up.base_url("chaos")!r},
        )
        print(client.chat([{{"role": "user", "content": "hi"}}]).text)
        print("".join(client.chat([{{"role": "user", "content": "hi"}}], stream=True)))
        """
    )
    up.set_default(ok(OK_TEXT), provider="chaos")
    env = {**os.environ, KEY_ENV: KEY, "DATABASE_URL": ""}
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [*OK_TEXT.split(), *OK_TEXT.split()]
    assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr
