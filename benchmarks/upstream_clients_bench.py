"""``python -m benchmarks upstream-clients``: the HTTP clients the server could reach its upstreams
with, side by side (issue 16: "measure the upstream HTTP client candidates and pick on numbers").

One process per candidate and concurrency (uvloop, as the server runs), ``BENCH_CLIENT_CALLS``
(default 6000) POSTs of a chat body to nginx returning a fixed completion
(:mod:`benchmarks.nginx_upstream`), 16, 64 and 256 at once, the body read whole; CPU time of the
process (every thread: pyreqwest runs its own) per call. ``BENCH_CLIENT_ROUNDS`` (default 3)
interleaved rounds, the order rotating; medians with their spread.

Candidates: ``pyreqwest`` (0.15.1, Rust's reqwest on hyper: what the server uses), ``pyqwest``
(0.12.0, also reqwest), ``aiohttp`` (3.14.5) and ``httpx2`` (an ``AsyncClient``, pool raised to the
concurrency). They are installed on
the first run into ``benchmarks/_work/clients-venv`` (with this checkout's httpx2, httptools and
uvloop pins), where every candidate runs, so all share one interpreter.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import nginx_upstream
from benchmarks.harness import json_of, row, say

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / "benchmarks" / "_work" / "clients-venv"
PYTHON = VENV / "bin" / "python"
PEERS = ["aiohttp==3.14.5", "pyreqwest==0.15.1", "pyqwest==0.12.0"]
CANDIDATES = ("pyreqwest", "pyqwest", "aiohttp", "httpx2")
LEVELS = (16, 64, 256)
CALLS = int(os.environ.get("BENCH_CLIENT_CALLS", "6000"))
ROUNDS = int(os.environ.get("BENCH_CLIENT_ROUNDS", "3"))
MODEL = "gpt-4.1"

# The measured program: argv = candidate, concurrency, calls, url. Prints the CPU ms per call.
PROGRAM = r"""
import asyncio, json, resource, sys
import uvloop
name, conc, calls, url = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
BODY = json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": "Say hello."}]}).encode()
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer bench"}
base, path = url.rsplit("/v1/", 1)

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

async def make():
    if name == "pyqwest":
        import pyqwest
        t = pyqwest.HTTPTransport(http_version=pyqwest.HTTPVersion.HTTP1, follow_redirects=False,
                                  enable_gzip=False, enable_brotli=False, enable_zstd=False, enable_otel=False,
                                  pool_max_idle_per_host=1024, read_timeout=None)
        h = pyqwest.Headers(HEADERS)
        async def call():
            r = await t.execute(pyqwest.Request("POST", url, h, BODY))
            body = b"".join([bytes(c) async for c in r.content])
            assert r.status == 200 and body
        return call
    if name == "httpx2":
        import httpx2
        limits = httpx2.Limits(max_connections=conc, max_keepalive_connections=conc)
        c = httpx2.AsyncClient(limits=limits, headers=HEADERS)
        async def call():
            r = await c.post(url, content=BODY)
            assert r.status_code == 200 and r.content
        return call
    if name == "aiohttp":
        import aiohttp
        s = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1024, limit_per_host=0, ttl_dns_cache=300),
            headers=HEADERS, cookie_jar=aiohttp.DummyCookieJar())
        to = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=30)
        async def call():
            r = await s.post(url, data=BODY, timeout=to, allow_redirects=False)
            assert r.status == 200 and await r.read()
        return call
    if name == "pyreqwest":
        from pyreqwest.client import ClientBuilder
        c = await ClientBuilder().max_connections(1024).default_headers(HEADERS).build().__aenter__()
        async def call():
            r = await c.post(url).body_bytes(BODY).build().send()
            assert r.status == 200 and await r.bytes()
        return call
    raise SystemExit(f"unknown candidate {name}")

async def main():
    call = await make()
    for _ in range(200):
        await call()
    left = calls
    async def worker():
        nonlocal left
        while left > 0:
            left -= 1
            await call()
    c0 = cpu()
    await asyncio.gather(*[worker() for _ in range(conc)])
    print(json.dumps({"cpu_ms": 1000 * (cpu() - c0) / calls}))

uvloop.run(main())
"""


def _pin(name: str) -> str:
    text = (REPO / "requirements.txt").read_text()
    m = re.search(rf"^{name}==([^\s\\]+)", text, re.M)
    return f"{name}=={m.group(1)}" if m else name


def ensure_venv() -> str | None:
    """Create the candidates' virtualenv once; the reason when it cannot be made."""
    try:
        if not PYTHON.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, capture_output=True)
            pkgs = [*PEERS, _pin("httpx2"), _pin("httptools"), _pin("uvloop"), _pin("uvicorn")]
            subprocess.run([str(PYTHON), "-m", "pip", "install", "-q", *pkgs], check=True, capture_output=True)
        elif subprocess.run([str(PYTHON), "-c", "import uvicorn"], capture_output=True).returncode != 0:
            # uvicorn came later (the stream floor's ASGI proxies): added to a virtualenv made before
            pip = [str(PYTHON), "-m", "pip", "install", "-q", _pin("uvicorn")]
            subprocess.run(pip, check=True, capture_output=True)
    except subprocess.CalledProcessError as exc:
        return f"cannot install {', '.join(PEERS)}: {(exc.stderr or b'').decode(errors='replace')[-300:]}"
    return None


def _once(name: str, conc: int, url: str) -> float:
    cmd = [str(PYTHON), "-c", PROGRAM, name, str(conc), str(CALLS), url]
    out = json_of(cmd, f"{name} at {conc}", cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    return float(out["cpu_ms"])


def run() -> list[dict]:
    why = nginx_upstream.available() or ensure_venv()
    if why:
        say(f"  upstream-clients benchmark NOT run: {why}")
        return [{**row("upstream-clients benchmark not run", 0.0, "n/a"), "value": None, "note": why}]
    from benchmarks.proxy_bench import _free_port

    tmp = Path(tempfile.mkdtemp(prefix="bench-clients-"))
    nginx = nginx_upstream.start(tmp, _free_port(), _free_port(), model=MODEL, chunks=10)
    samples: dict[tuple[str, int], list[float]] = {}
    try:
        url = f"{nginx.upstream}/holysheep/v1/chat/completions"
        for r in range(ROUNDS):
            order = CANDIDATES[r % len(CANDIDATES) :] + CANDIDATES[: r % len(CANDIDATES)]
            say(f"  round {r + 1}/{ROUNDS}: {', '.join(order)}")
            for name in order:
                for conc in LEVELS:
                    samples.setdefault((name, conc), []).append(_once(name, conc, url))
    finally:
        nginx.stop()
    rows = []
    for name in CANDIDATES:
        for conc in LEVELS:
            xs = samples[(name, conc)]
            rows.append(
                row(
                    f"{name}: CPU ms per upstream call at {conc} at once",
                    statistics.median(xs),
                    "ms",
                    n=len(xs),
                    spread=f"rounds {', '.join(f'{x:.3f}' for x in xs)}",
                    measured=f"{CALLS} POSTs to nginx on loopback in one uvloop process, body read; CPU of the "
                    "process (all threads) / calls; median over interleaved rounds",
                )
            )
    return rows
