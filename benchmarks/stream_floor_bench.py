"""``python -m benchmarks stream-floor``: what a streamed chunk costs below the gateway, for the
budget of CPU per chunk to be judged against what is possible.

Against the ``streams`` suite's nginx upstream (50 chunks 40 ms apart), 500 streams at once, 2
each (``BENCH_STREAM_CPU_C`` / ``_K``), in ``BENCH_STREAM_FLOOR_ROUNDS`` (default 2) interleaved
rounds, CPU per chunk of:

- the upstream clients alone, reading the streams (``benchmarks/floor/stream_client.py``):
  pyreqwest over HTTP/1.1 (what the gateway uses), aiohttp, and pyreqwest over HTTP/2 against nginx
  speaking h2c with its default limit of 128 concurrent streams per connection (wall time too: hyper
  queues requests past the limit on its one connection per host);
- minimal proxies (``benchmarks/floor/stream_proxy.py``): each upstream read written straight to
  the caller as one chunk, the upstream read by pyreqwest, or by the event loop itself with no HTTP
  parsing at all; and the reads sent through a bare ASGI app on uvicorn, as the gateway serves
  them, by pyreqwest (whose runtime thread takes the GIL from the loop for every read) and by
  aiohttp (whose reads complete on the loop's own thread): the server layer's cost, and what the
  hand-over between the two threads costs.

The clients run in the ``upstream-clients`` suite's virtualenv (``benchmarks/_work/clients-venv``).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks import nginx_upstream, stream_cpu_bench, streams_bench
from benchmarks.harness import json_of, row, say
from benchmarks.proxy_bench import _cpu_s, _family, _free_port
from benchmarks.upstream_clients_bench import PYTHON, ensure_venv

HERE = Path(__file__).resolve().parent / "floor"
ROUNDS = int(os.environ.get("BENCH_STREAM_FLOOR_ROUNDS", "2"))


def _h2c(config: str, port: int) -> str:
    return config.replace(f"listen 127.0.0.1:{port} backlog=4096;", f"listen 127.0.0.1:{port} backlog=4096 http2;")


def _client(name: str, url: str, h2: bool = False) -> dict:
    conc, per = str(stream_cpu_bench.C), str(stream_cpu_bench.K)
    cmd = [str(PYTHON), str(HERE / "stream_client.py"), name, conc, per, url]
    return json_of(cmd, name, env=dict(os.environ, H2="1" if h2 else "0"))


def _proxy(mode: str, url: str) -> float:
    port = _free_port()
    proc = subprocess.Popen([str(PYTHON), str(HERE / "stream_proxy.py"), mode, str(port), url])
    try:
        time.sleep(1.5)  # the proxy listens
        pids = _family(proc.pid)
        cpu0 = _cpu_s(pids)
        streams = asyncio.run(stream_cpu_bench._drive(f"http://127.0.0.1:{port}", "floor"))
        return 1e6 * (_cpu_s(pids) - cpu0) / (streams * streams_bench.EVENTS)
    finally:
        proc.kill()
        proc.wait()


def run() -> list[dict]:
    why = nginx_upstream.available() or ensure_venv()
    if why:
        say(f"  stream-floor skipped: {why}")
        return []
    tmp = Path(tempfile.mkdtemp(prefix="bench-stream-floor-"))
    h1 = streams_bench._start_nginx(tmp / "h1")
    plain = streams_bench._lua_config
    streams_bench._lua_config = lambda work, port, floor: _h2c(plain(work, port, floor), port)
    try:
        h2 = streams_bench._start_nginx(tmp / "h2")
    finally:
        streams_bench._lua_config = plain
    path = "/holysheep/v1/chat/completions"
    figures: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    try:
        for rnd in range(ROUNDS):
            for label, run_one in (
                ("client pyreqwest http/1.1", lambda: _client("pyreqwest", h1.upstream + path)),
                ("client aiohttp http/1.1", lambda: _client("aiohttp", h1.upstream + path)),
                (
                    "client pyreqwest http/2 (h2c, 128 streams a connection)",
                    lambda: _client("pyreqwest", h2.upstream + path, True),
                ),
                ("proxy pyreqwest", lambda: {"us_per_chunk": _proxy("pyreqwest", h1.upstream + path)}),
                ("proxy raw socket", lambda: {"us_per_chunk": _proxy("raw", h1.upstream + path)}),
                (
                    "proxy pyreqwest through uvicorn (bare ASGI app)",
                    lambda: {"us_per_chunk": _proxy("asgi", h1.upstream + path)},
                ),
                (
                    "proxy aiohttp through uvicorn (bare ASGI app)",
                    lambda: {"us_per_chunk": _proxy("asgi-aiohttp", h1.upstream + path)},
                ),
            ):
                got = run_one()
                figures.setdefault(label, []).append(got["us_per_chunk"])
                if "wall" in got:
                    walls.setdefault(label, []).append(got["wall"])
                say(f"    round {rnd + 1}: {label}: {got['us_per_chunk']:.1f} us per chunk")
    finally:
        h1.stop()
        h2.stop()
    say(f"  stream-floor: load average {os.getloadavg()[0]:.1f} at the end")
    out = []
    for label, values in figures.items():
        spread = f"min {min(values):.1f}, max {max(values):.1f}"
        out.append(
            row(f"stream floor: {label}, CPU per chunk", statistics.median(values), "us", n=len(values), spread=spread)
        )
    for label, values in walls.items():
        out.append(row(f"stream floor: {label}, wall for the work", statistics.median(values), "s", n=len(values)))
    return out
