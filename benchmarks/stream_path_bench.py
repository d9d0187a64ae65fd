"""``python -m benchmarks stream-path``: the gateway's own Python work per streamed chunk, in one
process, with no socket and no other thread, so the figure is the same on a quiet and a loaded
machine (up to the CPU's speed) and a profile of it is exact.

The real server application (``build_server``: keys, admission, routing, the async driver, the
stream accounting, the handler, the ASGI app, the request log's writer) serves
``BENCH_STREAM_PATH_STREAMS`` (default 2,000) streamed chat requests, ``BENCH_STREAM_PATH_C``
(default 200) at once, each of the ``streams`` suite's upstream answer (a role chunk,
``BENCH_STREAMS_CHUNKS`` content chunks, the finish and usage chunks, ``[DONE]``), one chunk per
read. What is left out is what no Python code of ours does: the caller's socket (uvicorn's
protocol, the ``send()`` call) and the upstream's (pyreqwest's read, on its own thread): the
provider's :class:`HttpUpstream` is given a response whose body reader hands over the chunks from
memory, through the real :class:`UpstreamStream`. ``stream-cpu`` measures the whole server.

Reports CPU microseconds per chunk (the process's CPU time over the chunks delivered; the writer
thread's inserts included) and, split by fitting two stream lengths, the fixed cost per stream and
the marginal cost per chunk. ``BENCH_STREAM_PATH_PROFILE=FILE`` writes a cProfile of one run.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import row, say
from benchmarks.streams_bench import MODEL, stream_pieces

STREAMS = int(os.environ.get("BENCH_STREAM_PATH_STREAMS", "2000"))
C = int(os.environ.get("BENCH_STREAM_PATH_C", "200"))
ROUNDS = int(os.environ.get("BENCH_STREAM_PATH_ROUNDS", "3"))
PROFILE = os.environ.get("BENCH_STREAM_PATH_PROFILE", "")
PROVIDERS = ("holysheep", "direct")


def _chunks(n: int) -> list[bytes]:
    first, chunk, last = stream_pieces(n)
    return [first] + [chunk] * n + [last]


class _Bytes:
    __slots__ = ("_b",)

    def __init__(self, b: bytes):
        self._b = b

    def to_bytes(self) -> bytes:
        return self._b

    def __len__(self) -> int:
        return len(self._b)


class _Reader:
    """pyreqwest's body reader over chunks in memory: each read gives the loop a turn, as a real
    read that waits for the network does."""

    def __init__(self, chunks: list[bytes]):
        self._chunks = iter(chunks)

    async def read_chunk(self) -> _Bytes | None:
        await asyncio.sleep(0)
        b = next(self._chunks, None)
        return None if b is None else _Bytes(b)


class _Headers:
    def __init__(self, pairs: list[tuple[str, str]]):
        self._pairs = pairs

    def items(self) -> list[tuple[str, str]]:
        return list(self._pairs)

    def getall(self, name: str) -> list[str]:
        return [v for k, v in self._pairs if k.lower() == name]


class _Response:
    def __init__(self, chunks: list[bytes]):
        self.status = 200
        self.headers = _Headers([("content-type", "text/event-stream"), ("transfer-encoding", "chunked")])
        self.body_reader = _Reader(chunks)


class _Context:
    async def __aexit__(self, *exc: object) -> None:
        return None


class _MemoryUpstream:
    """The provider's :class:`HttpUpstream`, answering every stream from memory through the real
    :class:`UpstreamStream` (and ``_Call``: headers, body decoding, the size limit)."""

    def __init__(self, real: Any, chunks: list[bytes]):
        self._real = real
        self._chunks = chunks

    async def post(self, path: str, body: Any, *, headers: Any, timeout_s: float, stream: bool) -> Any:
        from app.routing.io.upstream_http import UpstreamStream, _Call

        assert stream, "stream-path serves streams only"
        call = _Call(_Context(), _Response(self._chunks), self._real.max_response_bytes)
        return UpstreamStream(self._real, call, f"{self._real.base_url}/{path}")


def _setup(tmp: Path, chunks: int) -> tuple[Any, str, Any]:
    cfg = tmp / "gateway.toml"
    providers = "".join(
        f'[providers.{n}]\nbase_url = "http://127.0.0.1:9/{n}/v1"\napi_key_env = "BENCH_UPSTREAM_KEY"\n'
        f'models = ["{MODEL}"]\ndefault_model = "{MODEL}"\n'
        for n in PROVIDERS
    )
    cfg.write_text('[routing]\nprimary = "holysheep"\nfallback = "direct"\n' + providers)
    os.environ.update(
        GATEWAY_CONFIG=str(cfg), DATABASE_URL=f"sqlite:///{tmp / 'gateway.db'}", BENCH_UPSTREAM_KEY="bench"
    )
    from app.server.serve import _tune_gc, build_server
    from db.keys import create_key

    server = build_server()
    _, key = create_key(server.gateway.engine, "bench")
    upstreams = server.handler.driver._upstreams
    for name in PROVIDERS:
        upstreams[name] = _MemoryUpstream(upstreams[name], _chunks(chunks))
    _tune_gc()  # as ``serve`` does once it is built
    return server, key, upstreams


async def _one(app: Any, key: str, body: bytes, delivered: list[int]) -> None:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": [
            (b"host", b"gw"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    sent = False
    never: asyncio.Future = asyncio.get_running_loop().create_future()

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await never  # the caller stays until the answer ends

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"the gateway answered {message['status']}")
        if message["type"] == "http.response.body":
            delivered[0] += message.get("body", b"").count(b"data: ")

    await app(scope, receive, send)


async def _drive(app: Any, key: str, streams: int) -> int:
    import json

    body = json.dumps(
        {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "Tell me a short story."}]}
    ).encode()
    delivered = [0]
    left = [streams]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            await _one(app, key, body, delivered)

    await asyncio.gather(*(worker() for _ in range(C)))
    return delivered[0]


def _measure(server: Any, key: str, streams: int) -> tuple[float, int]:
    import uvloop

    gateway = server.gateway
    cpu0, main0 = time.process_time(), time.thread_time()
    delivered = uvloop.run(_drive(server.app, key, streams))
    main = time.thread_time() - main0
    gateway.telemetry.flush()
    cpu = time.process_time() - cpu0
    if os.environ.get("BENCH_STREAM_PATH_THREADS"):
        print(f"main thread {main:.3f} s, other threads {cpu - main:.3f} s", file=sys.stderr)
    return cpu, delivered


def _child(chunks: int) -> None:
    """One measurement in this process: prints ``cpu_s delivered``."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-stream-path-"))
    server, key, _ = _setup(tmp, chunks)
    _measure(server, key, min(STREAMS, 200))  # warm: first-use imports, caches, the log's first pages
    if PROFILE:
        prof = cProfile.Profile()
        prof.enable()
    cpu, delivered = _measure(server, key, STREAMS)
    if PROFILE:
        prof.disable()
        prof.dump_stats(PROFILE)
    print(f"{cpu} {delivered}")
    server.gateway.close()


def run() -> list[dict]:
    import subprocess

    lengths = (10, int(os.environ.get("BENCH_STREAMS_CHUNKS", "50")), 100)
    per: dict[int, list[float]] = {n: [] for n in lengths}
    for rnd in range(ROUNDS):
        for n in lengths:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.stream_path_bench", str(n)],
                capture_output=True,
                text=True,
                env=dict(os.environ, BENCH_STREAM_PATH_PROFILE=""),
            )
            if out.returncode != 0:
                raise RuntimeError(out.stderr[-3000:])
            cpu, delivered = out.stdout.split()[-2:]
            events = n + 3
            expect = STREAMS * (events + 1)  # every event and [DONE]
            if int(delivered) < STREAMS * events:
                raise RuntimeError(f"{delivered} events delivered, {expect} expected")
            us = 1e6 * float(cpu) / (STREAMS * events)
            per[n].append(us)
            say(f"    round {rnd + 1}, {n} chunks: {us:.1f} us per chunk")
    med = {n: statistics.median(v) for n, v in per.items()}
    lo, hi = lengths[0], lengths[-1]
    marginal = (med[hi] * (hi + 3) - med[lo] * (lo + 3)) / (hi - lo)
    fixed = med[lo] * (lo + 3) - marginal * (lo + 3)
    say(f"  stream-path: {STREAMS} streams, {C} at once, {ROUNDS} rounds; load average {os.getloadavg()[0]:.1f}")
    out = [
        row(f"stream path CPU per chunk ({n} chunks a stream)", med[n], "us", n=ROUNDS, spread=_spread(per[n]))
        for n in lengths
    ]
    out.append(row("stream path: marginal CPU per chunk", marginal, "us", n=ROUNDS))
    out.append(row("stream path: fixed CPU per stream", fixed, "us", n=ROUNDS))
    return out


def _spread(values: list[float]) -> str:
    return f"min {min(values):.1f}, max {max(values):.1f}"


if __name__ == "__main__":
    _child(int(sys.argv[1]))
