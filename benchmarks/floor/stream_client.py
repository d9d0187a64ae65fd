"""One HTTP client reading streams: ``python stream_client.py NAME CONC STREAMS URL`` (run by
``benchmarks.stream_floor_bench`` in the upstream-clients virtualenv). NAME: ``pyreqwest`` (HTTP/1.1,
``H2=1``: HTTP/2 with prior knowledge) or ``aiohttp``. CONC tasks each read STREAMS streams in turn.
Prints JSON: chunks read, this process's CPU seconds, CPU us per chunk, wall seconds."""

import asyncio
import json
import os
import resource
import sys
import time
from datetime import timedelta

import uvloop

NAME, CONC, PER, URL = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
BODY = json.dumps({"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": "x"}]}).encode()
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer bench"}


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def main() -> None:
    chunks = [0]
    if NAME == "pyreqwest":
        from pyreqwest.client import ClientBuilder

        builder = (
            ClientBuilder().http2_prior_knowledge() if os.environ.get("H2") == "1" else ClientBuilder().http1_only()
        )
        client = builder.tcp_nodelay(True).no_proxy().pool_max_idle_per_host(4096).gzip(False).build()

        async def one() -> None:
            request = client.post(URL).body_bytes(BODY).headers(HEADERS).timeout(timedelta(seconds=60))
            async with request.streamed_read_buffer_limit(0).build_streamed() as response:
                reader = response.body_reader
                while await reader.read_chunk() is not None:
                    chunks[0] += 1

    else:
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)

        async def one() -> None:
            async with session.post(URL, data=BODY, headers=HEADERS) as response:
                async for _ in response.content.iter_any():
                    chunks[0] += 1

    async def worker() -> None:
        for _ in range(PER):
            await one()

    await worker()  # warm: connections, first-use costs
    chunks[0] = 0
    c0, t0 = cpu(), time.monotonic()
    await asyncio.gather(*(worker() for _ in range(CONC)))
    used = cpu() - c0
    wall = time.monotonic() - t0
    print(json.dumps({"chunks": chunks[0], "cpu_s": used, "us_per_chunk": 1e6 * used / chunks[0], "wall": wall}))


uvloop.run(main())
