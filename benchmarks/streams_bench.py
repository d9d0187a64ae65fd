"""``python -m benchmarks streams``: streamed chat answers through each hop, at the concurrency
chat products run at.

The upstream is nginx + Lua streaming ``BENCH_STREAMS_CHUNKS`` (default 50) content chunks
``BENCH_STREAMS_GAP_MS`` (default 40) ms apart, as a model does (2 s an answer), then the finish and
usage chunks and ``[DONE]``. ``wrk`` keeps C connections busy, each reading whole streams one after
another (wrk counts a request when its chunked body ends), at ``BENCH_STREAMS_LEVELS`` (default
200, 1000, 3000) connections for ``BENCH_STREAMS_SECONDS`` (default 10) s each. Targets: ``bare``
(wrk straight to the upstream), ``floor`` (nginx ``proxy_pass``), ``ours`` (``serve``, one
process), ``ours_w2`` (``--workers 2``), and Portkey's gateway when it can be installed. They are
measured in ``BENCH_STREAMS_ROUNDS`` (default 2) interleaved rounds with a rotating order; the
servers not measured are paused with SIGSTOP, and a server is left to go idle before it is paused.

Reported per target and level, medians over rounds: completed streams/s, stream p50/p99 (and
added over bare), CPU per stream and per chunk of the target's processes, its RSS, and the CPU
that wrk and nginx took in the same run (were they the bottleneck, the comparison would say
nothing). Budgets at 1000 streams, each against the same run: CPU per chunk <= 40 us; streams/s
>= 1.25x Portkey's and >= 0.9x bare; added p99 <= 300 ms; ``--workers 2`` >= 1.6x one worker at
3000 (only meaningful where wrk and nginx leave a core free: the report says whether they did).
``BENCH_STREAMS_MAX_IN_FLIGHT=N`` sets our servers' ``[server] max_in_flight`` (default 1,024 a
process): past it a process answers 503 with ``Retry-After``, which wrk retries at once, so at 3,000
connections the default bound measures a flood of refusals, and N above the level measures how
many streams a process carries. ``BENCH_STREAMS_ROUTE=1`` adds ``ours_route``: one process serving
the model through a ``[routes]`` entry of two weighted deployments, measured in the same rounds as
``ours`` (the two-sided config).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks import nginx_upstream, portkey_peer
from benchmarks.harness import row, say
from benchmarks.proxy_bench import (
    MODEL,
    WRK,
    Target,
    _cpu_s,
    _drain,
    _family,
    _free_port,
    _paused_all_but,
    _rss_mib,
    _start_ours,
    _start_portkey,
    _stop,
    wrk_counts,
)

CHUNKS = int(os.environ.get("BENCH_STREAMS_CHUNKS", "50"))
GAP_MS = float(os.environ.get("BENCH_STREAMS_GAP_MS", "40"))
LEVELS = tuple(int(x) for x in os.environ.get("BENCH_STREAMS_LEVELS", "200,1000,3000").split(","))
SECONDS = float(os.environ.get("BENCH_STREAMS_SECONDS", "10"))
ROUNDS = int(os.environ.get("BENCH_STREAMS_ROUNDS", "2"))
PATH = "/v1/chat/completions"
BODY = json.dumps({"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "Tell me a short story."}]})
ROUTE_TOO = os.environ.get("BENCH_STREAMS_ROUTE", "0") == "1"
# ``[server] max_in_flight`` for our servers; unset, the default (1,024). Above the level, the run
# measures how many streams a process carries rather than its refusals: wrk retries a 503 at once.
_BOUND = os.environ.get("BENCH_STREAMS_MAX_IN_FLIGHT", "")
MAX_IN_FLIGHT = int(_BOUND) if _BOUND else None
EVENTS = CHUNKS + 3  # role chunk, content chunks, finish, usage (the caller asked for none: withheld)


def stream_pieces(n: int) -> tuple[bytes, bytes, bytes]:
    """The SSE pieces of a benchmark stream of ``n`` output chunks, as an upstream sends them: the
    role chunk, one output chunk (sent ``n`` times), and the end (finish, usage, ``[DONE]``)."""
    chunk = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": "w "}, "finish_reason": None}],
    }
    first = dict(chunk, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    last = dict(chunk, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}])
    usage = dict(chunk, choices=[], usage={"prompt_tokens": 12, "completion_tokens": n, "total_tokens": 12 + n})

    def sse(obj: dict) -> bytes:
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    return sse(first), sse(chunk), sse(last) + sse(usage) + b"data: [DONE]\n\n"


def _lua_config(work: Path, port: int, floor_port: int) -> str:
    """nginx streaming one answer per request: the role chunk at once, then a chunk every gap."""
    head = nginx_upstream.config(work, port, floor_port, MODEL, CHUNKS)
    first, chunk, last = stream_pieces(CHUNKS)
    (work / "s-first.sse").write_bytes(first)
    (work / "s-chunk.sse").write_bytes(chunk)
    (work / "s-last.sse").write_bytes(last)
    stream_lua = f"""
                ngx.header["Content-Type"] = "text/event-stream"
                ngx.print(S_FIRST)
                ngx.flush(true)
                for i = 1, {CHUNKS} do
                    ngx.sleep({GAP_MS / 1000.0})
                    ngx.print(S_CHUNK)
                    ngx.flush(true)
                end
                ngx.print(S_LAST)
    """
    slurps = f"""
        S_FIRST = slurp("{work}/s-first.sse")
        S_CHUNK = slurp("{work}/s-chunk.sse")
        S_LAST = slurp("{work}/s-last.sse")
    """
    conf = head.replace(
        'MODELS = slurp("' + str(work) + '/models.json")', 'MODELS = slurp("' + str(work) + '/models.json")' + slurps
    )
    conf = conf.replace("                    ngx.print(STREAM)\n", stream_lua)
    conf = conf.replace("worker_connections 8192;", "worker_connections 16384;")
    conf = conf.replace("worker_processes 1;", "worker_processes 1;\nworker_rlimit_nofile 65536;")
    return conf


def _start_nginx(work: Path) -> nginx_upstream.Nginx:
    work.mkdir(parents=True, exist_ok=True)
    port, floor = _free_port(), _free_port()
    conf = _lua_config(work, port, floor)
    return nginx_upstream.start(work, port, floor, model=MODEL, chunks=CHUNKS, config_text=conf)


def _script(target: Target, work: Path) -> Path:
    script = work / f"wrk-streams-{target.name}.lua"
    lines = [
        'wrk.method = "POST"',
        f"wrk.body = {json.dumps(BODY)}",
        'wrk.headers["Content-Type"] = "application/json"',
    ]
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in target.headers.items()]
    script.write_text("\n".join(lines) + "\n")
    return script


def _measure(target: Target, connections: int, work: Path, nginx_pids: list[int]) -> dict[str, float]:
    script = _script(target, work)
    pids = target.pids()
    cpu0, up0 = _cpu_s(pids), _cpu_s(nginx_pids)
    t0 = time.monotonic()
    threads = 2 if connections >= 1000 else 1
    cmd = [
        WRK,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{SECONDS:g}s",
        "--timeout",
        "30s",
        "--latency",
        "-s",
        str(script),
    ]
    done = subprocess.run(
        [*cmd, target.base + PATH], capture_output=True, text=True, check=False, preexec_fn=_many_files
    )
    wall = time.monotonic() - t0
    cpu, up = _cpu_s(pids) - cpu0, _cpu_s(nginx_pids) - up0
    ok, errors, elapsed, lat = wrk_counts(done, target.name)
    result = {
        "streams_s": ok / elapsed if elapsed > 0 else 0.0,
        "errors": float(errors),
        "p50_ms": lat.get("50", float("nan")),
        "p99_ms": lat.get("99", float("nan")),
        "upstream_cpu_share": up / wall,
    }
    if pids and ok:
        result["cpu_ms_per_stream"] = 1000.0 * cpu / ok
        result["cpu_us_per_chunk"] = 1e6 * cpu / (ok * EVENTS)
    return result


def _many_files() -> None:
    """wrk's open-file limit raised to the hard limit: 3,000 connections need more than 1,024."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _wrk_cpu_share() -> float:
    """The CPU wrk took, in cores, read from the children's rusage after each run."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run() -> list[dict]:
    why = nginx_upstream.available()
    if why or not Path(WRK).exists():
        reason = why or "wrk is not installed. Fix: apt-get install wrk"
        say(f"  streams benchmark NOT run: {reason}")
        return [{**row("streams benchmark not run", 0.0, "n/a"), "value": None, "note": reason}]
    tmp = Path(tempfile.mkdtemp(prefix="bench-streams-"))
    procs: list[subprocess.Popen] = []
    notes: dict[str, str] = {}
    nginx = _start_nginx(tmp / "nginx")
    nginx_pids = _family(nginx.proc.pid)
    try:
        upstream = nginx.upstream
        targets = [Target("bare", upstream, {}, None), Target("floor", nginx.floor, {}, None)]
        ours, url, key = _start_ours(upstream, tmp / "ours", max_in_flight=MAX_IN_FLIGHT)
        procs.append(ours)
        targets.append(Target("ours", url, {"Authorization": f"Bearer {key}"}, ours))
        if ROUTE_TOO:
            ours_r, url_r, key_r = _start_ours(upstream, tmp / "ours_route", route=True, max_in_flight=MAX_IN_FLIGHT)
            procs.append(ours_r)
            targets.append(Target("ours_route", url_r, {"Authorization": f"Bearer {key_r}"}, ours_r))
        ours2, url2, key2 = _start_ours(upstream, tmp / "ours2", workers=2, max_in_flight=MAX_IN_FLIGHT)
        procs.append(ours2)
        targets.append(Target("ours_w2", url2, {"Authorization": f"Bearer {key2}"}, ours2))
        portkey, purl = _start_portkey(upstream, tmp)
        if portkey is None:
            notes["portkey"] = purl
            say(f"  Portkey NOT measured: {purl}")
        else:
            procs.append(portkey)
            targets.append(Target("portkey", purl, portkey_peer.headers(upstream), portkey))
        for t in targets:  # warm-up
            with _paused_all_but(t, targets):
                _measure(t, 50, tmp, nginx_pids)
                _drain(t)
        data: dict[str, dict[int, dict[str, list[float]]]] = {}
        wrk_cpu: dict[str, dict[int, list[float]]] = {}
        for r in range(ROUNDS):
            order = targets[r % len(targets) :] + targets[: r % len(targets)]
            say(f"  round {r + 1}/{ROUNDS}: {', '.join(t.name for t in order)}")
            for t in order:
                for level in LEVELS:
                    with _paused_all_but(t, targets):
                        w0 = _wrk_cpu_share()
                        t0 = time.monotonic()
                        got = _measure(t, level, tmp, nginx_pids)
                        wrk_cpu.setdefault(t.name, {}).setdefault(level, []).append(
                            (_wrk_cpu_share() - w0) / (time.monotonic() - t0)
                        )
                        _drain(t, bound_s=40)
                    for k, v in got.items():
                        data.setdefault(t.name, {}).setdefault(level, {}).setdefault(k, []).append(v)
                    say(
                        f"    {t.name:8s} c={level:5d}: {got['streams_s']:7.1f} streams/s, p99 {got['p99_ms']:7.0f} ms"
                        + (f", {got['cpu_us_per_chunk']:.1f} us/chunk" if "cpu_us_per_chunk" in got else "")
                        + f", errors {got['errors']:.0f}"
                    )
        rss = {t.name: _rss_mib(t.proc.pid) for t in targets if t.proc is not None}
        return _report(data, wrk_cpu, rss, notes)
    finally:
        for p in reversed(procs):
            _stop(p)
        nginx.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _num(x: float | None) -> float:
    return float("nan") if x is None else x


def _med(xs: list[float] | None) -> float | None:
    xs = [x for x in xs or [] if x == x]
    return statistics.median(xs) if xs else None


def _report(
    data: dict[str, dict[int, dict[str, list[float]]]],
    wrk_cpu: dict[str, dict[int, list[float]]],
    rss: dict[str, float],
    notes: dict[str, str],
) -> list[dict]:
    rows: list[dict] = []

    def m(name: str, level: int, key: str) -> float | None:
        return _med(data.get(name, {}).get(level, {}).get(key))

    say("\n  target      conns  streams/s   p50 ms   p99 ms  added p99  us/chunk  nginx cores  wrk cores  errors")
    for name in data:
        for level in LEVELS:
            s, p50, p99 = m(name, level, "streams_s"), m(name, level, "p50_ms"), m(name, level, "p99_ms")
            bare99 = m("bare", level, "p99_ms")
            added = p99 - bare99 if p99 is not None and bare99 is not None else None
            chunk = m(name, level, "cpu_us_per_chunk")
            up = m(name, level, "upstream_cpu_share")
            wrk = _med(wrk_cpu.get(name, {}).get(level))
            err = m(name, level, "errors")
            say(
                f"  {name:10s} {level:6d} {s or 0:10.1f} {p50 or 0:8.0f} {p99 or 0:8.0f} "
                f"{_num(added):10.0f} {_num(chunk):9.1f} "
                f"{up or 0:12.2f} {wrk or 0:10.2f} {err or 0:7.0f}"
            )
            rows.append(
                {
                    "name": f"streams {name} c={level}",
                    "value": s,
                    "unit": "str/s",
                    "ok": True,
                    "n": len(data.get(name, {}).get(level, {}).get("streams_s", [])),
                    "spread": f"p50 {_num(p50):.0f} ms, p99 {_num(p99):.0f} ms, {_num(chunk):.1f} us/chunk",
                    "streams_s": s,
                    "p50_ms": p50,
                    "p99_ms": p99,
                    "added_p99_ms": added,
                    "cpu_us_per_chunk": chunk,
                    "cpu_ms_per_stream": m(name, level, "cpu_ms_per_stream"),
                    "upstream_cores": up,
                    "wrk_cores": wrk,
                    "errors": err,
                    "rss_mib": rss.get(name),
                    "rounds": len(data.get(name, {}).get(level, {}).get("streams_s", [])),
                }
            )
    budgets = []
    at = 1000 if 1000 in LEVELS else LEVELS[len(LEVELS) // 2]
    chunk = m("ours", at, "cpu_us_per_chunk")
    budgets.append((f"CPU per chunk at {at} <= 40 us", chunk, chunk is not None and chunk <= 40))
    ours_s, bare_s, pk_s = m("ours", at, "streams_s"), m("bare", at, "streams_s"), m("portkey", at, "streams_s")
    if pk_s is not None:
        budgets.append(("streams/s >= 1.25x Portkey", ours_s, ours_s is not None and ours_s >= 1.25 * pk_s))
    budgets.append(
        ("streams/s >= 0.9x bare", ours_s, ours_s is not None and bare_s is not None and ours_s >= 0.9 * bare_s)
    )
    p99, b99 = m("ours", at, "p99_ms"), m("bare", at, "p99_ms")
    added = p99 - b99 if p99 is not None and b99 is not None else None
    budgets.append(("added p99 <= 300 ms", added, added is not None and added <= 300))
    top = max(LEVELS)
    w1, w2 = m("ours", top, "streams_s"), m("ours_w2", top, "streams_s")
    free = (_med(wrk_cpu.get("ours_w2", {}).get(top)) or 0) + (m("ours_w2", top, "upstream_cpu_share") or 0) < 1.0
    budgets.append(
        (
            f"--workers 2 >= 1.6x one worker at {top}" + ("" if free else " (wrk + nginx left no core free)"),
            w2 / w1 if w1 and w2 else None,
            bool(w1 and w2 and w2 >= 1.6 * w1),
        )
    )
    say("\n  budgets:")
    for what, value, met in budgets:
        say(f"    {'met    ' if met else 'NOT met'}  {what}: {value if value is None else round(value, 2)}")
        rows.append({"name": f"budget: {what}", "value": value, "unit": "", "ok": met, "met": met})
    for k, v in notes.items():
        rows.append({"name": f"note {k}", "value": None, "unit": "", "ok": True, "note": v})
    return rows
