"""The floor of a stream proxy in Python: ``python stream_proxy.py MODE PORT UPSTREAM_URL`` serves
each request on PORT by streaming UPSTREAM_URL's answer to it, each upstream read written straight
to the caller's socket as one HTTP/1.1 chunk, and nothing else (no routing, no accounting, no
checks). MODE ``pyreqwest``: the upstream read with pyreqwest, as the gateway reads it; ``raw``: the
upstream's socket read on the event loop itself, its framing not even parsed (a floor below any
HTTP client); ``asgi``: pyreqwest's reads sent through an ASGI app served by uvicorn (httptools,
uvloop), as the gateway serves them, with nothing of the gateway's own; ``asgi-aiohttp``: the same
with aiohttp, whose reads complete on the event loop's own thread (pyreqwest's complete on its
runtime thread, which must take the GIL from the loop for each). Run by
``benchmarks.stream_floor_bench``."""

import asyncio
import json
import os
import sys
import time
from datetime import timedelta

import uvloop

MODE, PORT, UP = sys.argv[1], int(sys.argv[2]), sys.argv[3]
BODY = json.dumps({"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": "x"}]}).encode()
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
HOST, REST = UP.split("//")[1].split(":", 1)
UPORT, PATH = REST.split("/", 1)
REQUEST = (
    b"POST /%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    % (PATH.encode(), len(BODY))
) + BODY
TASKS: set[asyncio.Task] = set()
if MODE in ("pyreqwest", "asgi"):
    from pyreqwest.client import ClientBuilder

    CLIENT = ClientBuilder().http1_only().tcp_nodelay(True).no_proxy().pool_max_idle_per_host(4096).gzip(False).build()


class Upstream(asyncio.Protocol):
    """The raw mode's upstream connection: every byte after the head goes to the caller as it is."""

    def __init__(self, down: asyncio.Transport, done: asyncio.Future):
        self.down, self.done, self.head = down, done, True

    def data_received(self, data: bytes) -> None:
        if self.head:
            data = data[data.find(b"\r\n\r\n") + 4 :]
            self.head = False
        if data:
            self.down.write(data)
        if data.endswith(b"0\r\n\r\n"):
            self.done.set_result(None)


class Downstream(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        task = asyncio.ensure_future(self.serve())
        TASKS.add(task)
        task.add_done_callback(TASKS.discard)

    async def serve(self) -> None:
        out = self.transport
        out.write(HEAD)
        if MODE == "pyreqwest":
            request = CLIENT.post(UP).body_bytes(BODY).headers({"Content-Type": "application/json"})
            request = request.timeout(timedelta(seconds=60)).streamed_read_buffer_limit(0)
            async with request.build_streamed() as response:
                reader = response.body_reader
                while (chunk := await reader.read_chunk()) is not None:
                    data = chunk.to_bytes()
                    out.write(b"%x\r\n%s\r\n" % (len(data), data))
            out.write(b"0\r\n\r\n")
        else:
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            up, _ = await loop.create_connection(lambda: Upstream(out, done), HOST, int(UPORT))
            up.write(REQUEST)
            await done
            up.close()


async def main() -> None:
    server = await asyncio.get_running_loop().create_server(Downstream, "127.0.0.1", PORT, backlog=4096)
    await server.serve_forever()


SESSION = None
# FLOOR_BURN_US: Python work per read in the asgi modes, a stand-in for the gateway's own, so the
# loop is as busy as the gateway's and the threads' hand-over of the GIL costs what it costs there.
BURN_S = float(os.environ.get("FLOOR_BURN_US", "0")) / 1e6


def burn() -> None:
    if BURN_S:
        end = time.thread_time() + BURN_S
        while time.thread_time() < end:
            pass


async def app(scope, receive, send) -> None:
    """The ``asgi`` modes: each upstream read is one ``http.response.body`` message."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    if MODE == "asgi-aiohttp":
        global SESSION
        if SESSION is None:
            import aiohttp

            SESSION = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        async with SESSION.post(UP, data=BODY, headers={"Content-Type": "application/json"}) as answer:
            async for data in answer.content.iter_any():
                burn()
                await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    request = CLIENT.post(UP).body_bytes(BODY).headers({"Content-Type": "application/json"})
    request = request.timeout(timedelta(seconds=60)).streamed_read_buffer_limit(0)
    async with request.build_streamed() as response:
        reader = response.body_reader
        while (chunk := await reader.read_chunk()) is not None:
            burn()
            await send({"type": "http.response.body", "body": chunk.to_bytes(), "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


if MODE.startswith("asgi"):
    import uvicorn

    uvicorn.run(
        app, host="127.0.0.1", port=PORT, http="httptools", loop="uvloop", lifespan="off", log_level="warning",
        access_log=False, backlog=4096, server_header=False, date_header=False,
    )  # fmt: skip
else:
    uvloop.run(main())
