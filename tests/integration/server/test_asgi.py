"""The ASGI app under a real uvicorn server: the SDK over loopback, client disconnects, forked workers."""

from __future__ import annotations

import json
import re
import socket
import threading

import anyio
import openai
import pytest
import uvicorn

from app.server.asgi import ChatStreamReply
from tests.support import wire_bodies as bodies
from tests.support.echo_app import GOOD, HELLO, make_app


class Server:
    """uvicorn on 127.0.0.1, port 0, in a thread."""

    def __init__(self, app):
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        for _ in range(2000):
            if self.server.started:
                break
            threading.Event().wait(0.005)
        assert self.server.started, "uvicorn did not start"
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)


def _post_raw(port: int, body: dict, stream: bool) -> socket.socket:
    payload = json.dumps({**body, "stream": stream}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer gw-good\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload
    )
    return s


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_cancels_the_handler(stream):
    started = threading.Event()
    cancelled = threading.Event()

    async def hanging(req, key):
        if not req.stream:
            started.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled.set()
                raise

        async def events():
            enc = bodies.ChunkStream(completion_id="c", created=1, model=req.model, include_usage=False)
            yield enc.role()
            started.set()
            try:
                await anyio.sleep_forever()  # an upstream that never sends the next chunk
                yield b""
            finally:
                cancelled.set()

        return ChatStreamReply(events())

    with Server(make_app(handler=hanging)) as srv:
        s = _post_raw(srv.port, {"model": "auto", "messages": HELLO}, stream)
        assert started.wait(10), "handler never started"
        if stream:
            assert b"200 OK" in s.recv(65536)
        s.close()
        assert cancelled.wait(10), "the handler was not cancelled when the client went away"


def test_real_server_with_the_sdk():
    with Server(make_app()) as srv:
        with openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key=GOOD, max_retries=0) as client:
            r = client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "abc"}])
            assert r.choices[0].message.content == "cba"
            chunks = list(client.chat.completions.create(model="gpt-4.1", messages=HELLO, stream=True))
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == "ih"


def test_request_ids_are_uuid_shaped_unique_and_differ_in_a_forked_worker():
    import os

    from app.server.asgi import _new_request_id

    ids = {_new_request_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker of serve --workers N: its own prefix
        os.write(write, _new_request_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    os.close(write)
    assert child[:16] != _new_request_id()[:16]
