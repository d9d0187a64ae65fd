"""``python -m benchmarks stream-cpu``: the gateway server's CPU per streamed chunk, from a fixed
amount of work, so that the figure holds on a loaded machine.

A rate (streams/s, as ``streams`` measures) depends on how much of the machine the server gets;
the CPU time one stream costs hardly does. Here each target serves exactly ``BENCH_STREAM_CPU_C``
(default 500) connections x ``BENCH_STREAM_CPU_K`` (default 2) streams from the nginx streaming
upstream of ``streams`` (50 content chunks ``BENCH_STREAMS_GAP_MS`` apart, then finish, usage,
``[DONE]``), read whole by an asyncio client of raw sockets in this process; the figure is the
target's CPU (utime + stime of its processes, from ``/proc``) over the chunks it forwarded. Targets:
``ours`` (this checkout) and, with ``BENCH_STREAM_CPU_BASELINE=<checkout>``, ``before``; rounds
interleave them (``BENCH_STREAM_CPU_ROUNDS``, default 3), the one not measured paused.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks import nginx_upstream, streams_bench
from benchmarks.harness import row, say
from benchmarks.proxy_bench import REPO, _cpu_s, _family, _start_ours, _stop

C = int(os.environ.get("BENCH_STREAM_CPU_C", "500"))
K = int(os.environ.get("BENCH_STREAM_CPU_K", "2"))
ROUNDS = int(os.environ.get("BENCH_STREAM_CPU_ROUNDS", "3"))
BASELINE = os.environ.get("BENCH_STREAM_CPU_BASELINE", "")
# A directory: each round of ``ours`` is also recorded by py-spy (``PY_SPY`` or ``py-spy`` on PATH),
# collapsed stacks per round, for where a chunk's time goes.
PROFILE = os.environ.get("BENCH_STREAM_CPU_PROFILE", "")


async def _connection(host: str, port: int, key: str, done: list[int]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    body = streams_bench.BODY.encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    try:
        for _ in range(K):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"the gateway answered {head[:60]!r}")
            seen = b""
            while not seen.endswith(b"0\r\n\r\n"):  # the chunked body's end
                part = await reader.read(65536)
                if not part:
                    raise RuntimeError("the gateway closed a stream early")
                seen = seen[-16:] + part
            done[0] += 1
    finally:
        writer.close()


async def _drive(url: str, key: str) -> int:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    done = [0]
    await asyncio.gather(*(_connection(host, int(port), key, done) for _ in range(C)))
    return done[0]


def _profile(pid: int, label: str) -> subprocess.Popen:
    out = Path(PROFILE) / f"{label}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    if os.environ.get("BENCH_STREAM_CPU_PROFILER") == "perf":  # CPU time by native symbol, kernel included
        pids = ",".join(str(p) for p in _family(pid))
        cmd = ["perf", "record", "-e", "cpu-clock", "-F", "1000", "-g", "-p", pids, "-o", str(out.with_suffix(".data"))]
    else:  # py-spy: Python frames, but wall time of threads it thinks busy (a loaded machine skews it)
        spy = os.environ.get("PY_SPY") or shutil.which("py-spy") or "py-spy"
        extra = os.environ.get("BENCH_STREAM_CPU_PYSPY_ARGS", "").split()
        cmd = [spy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw", "--output", str(out), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the work begins
    return proc


def run() -> list[dict]:
    why = nginx_upstream.available()
    if why:
        say(f"  stream-cpu skipped: {why}")
        return []
    tmp = Path(tempfile.mkdtemp(prefix="bench-stream-cpu-"))
    nginx = streams_bench._start_nginx(tmp / "nginx")
    targets: list[tuple[str, object, str, str]] = []
    try:
        repos = [("ours", REPO)] + ([("before", Path(BASELINE))] if BASELINE else [])
        for name, repo in repos:
            proc, url, key = _start_ours(nginx.upstream, tmp / name, repo=repo)
            targets.append((name, proc, url, key))
        per_chunk: dict[str, list[float]] = {name: [] for name, *_ in targets}
        for rnd in range(ROUNDS):
            for name, proc, url, key in targets if rnd % 2 == 0 else targets[::-1]:
                others = [t[1] for t in targets if t[0] != name]
                for other in others:
                    for pid in _family(other.pid):  # type: ignore[attr-defined]
                        os.kill(pid, signal.SIGSTOP)
                pids = _family(proc.pid)  # type: ignore[attr-defined]
                spy = _profile(proc.pid, f"{name}-round{rnd + 1}") if PROFILE else None  # type: ignore[attr-defined]
                cpu0, t0 = _cpu_s(pids), time.monotonic()
                streams = asyncio.run(_drive(url, key))
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=30)
                time.sleep(0.3)  # the last requests' log writes
                cpu = _cpu_s(pids) - cpu0
                for other in others:
                    for pid in _family(other.pid):  # type: ignore[attr-defined]
                        os.kill(pid, signal.SIGCONT)
                us = 1e6 * cpu / (streams * streams_bench.EVENTS)
                per_chunk[name].append(us)
                wall = time.monotonic() - t0
                say(f"    {name:7s} round {rnd + 1}: {streams} streams in {wall:.1f} s, {us:.1f} us/chunk")
                time.sleep(1)
    finally:
        for _, proc, _, _ in targets:
            _stop(proc)  # type: ignore[arg-type]
        nginx.stop()
    load = os.getloadavg()[0]
    say(
        f"  stream-cpu: {C} connections x {K} streams of {streams_bench.EVENTS} events per target and round, "
        f"{ROUNDS} interleaved rounds; load average {load:.1f} at the end"
    )
    out = []
    for name, values in per_chunk.items():
        spread = f"min {min(values):.1f}, max {max(values):.1f}"
        budget = 40.0 if name == "ours" else None
        out.append(
            row(
                f"stream CPU per chunk {name}",
                statistics.median(values),
                "us",
                budget=budget,
                n=len(values),
                spread=spread,
            )
        )
    return out
