"""``python -m benchmarks proxy``: the gateway server as a hop, side by side with LiteLLM's proxy.

Three targets, one loopback upstream (a minimal asyncio HTTP/1.1 server in its own process that
answers a fixed completion, or a 200-chunk SSE stream, with no think time), one client (the openai
SDK):

* ``bare``: the SDK straight to the upstream (the floor);
* ``ours``: the SDK through ``python -m app serve`` (a gateway key, the shipped routing policy,
  the request log on SQLite);
* ``litellm``: the SDK through ``litellm --config ...`` (``litellm[proxy]==1.108.7`` in its own
  virtualenv, installed on first use into ``benchmarks/_work/litellm-venv``; ``BENCH_LITELLM_PYTHON``
  may name an interpreter that already has it; ``BENCH_LITELLM=0`` skips it).

Measured in interleaved rounds (the order rotates each round): added latency per hop at p50/p99 at
concurrency 1, throughput with 64 concurrent non-streamed requests (AsyncOpenAI, fixed duration per
round), added time to first token of a 200-chunk stream, and each server process's RSS afterwards.
Budgets: our added p50 at most 1/5 of LiteLLM's, our throughput at least 3x LiteLLM's.

While one target is measured the other proxy's processes are paused (SIGSTOP, then SIGCONT), so
each is measured alone on the two cores. Unpaused, a peer costs whichever target runs beside it: in
one run with LiteLLM running beside us our added p50 was 2.06 ms, against 1.10-1.26 ms paused, though
each idle proxy uses under 1 % of a core (reported as "CPU after load"); the cause was not found.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai

from benchmarks.harness import Dist, quantile, row, say

REPO = Path(__file__).resolve().parent.parent
MODEL = "gpt-4.1"
MESSAGES: list[Any] = [{"role": "user", "content": "Say hello in one short sentence."}]
STREAM_CHUNKS = 200
ROUNDS = int(os.environ.get("BENCH_PROXY_ROUNDS", "6"))
PER_ROUND = int(os.environ.get("BENCH_PROXY_PER_ROUND", "60"))
STREAM_PER_ROUND = 10
CONCURRENCY = 64
TPUT_SECONDS = float(os.environ.get("BENCH_PROXY_TPUT_S", "4"))
TPUT_ROUNDS = 2
# BENCH_PROXY_BASELINE = the path of an older checkout: its server is measured beside ours as "before".
BASELINE = os.environ.get("BENCH_PROXY_BASELINE", "")
LITELLM_MASTER_KEY = "sk-bench-proxy-not-the-default-7c1d"


# ------------------------------------------------------------------------------------ the upstream

_BODY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there!"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }
).encode()


def _sse() -> bytes:
    def chunk(delta: dict, finish: str | None, usage: dict | None = None, choices: bool = True) -> bytes:
        obj = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else [],
        }
        if usage is not None:
            obj["usage"] = usage
        data = b"data: " + json.dumps(obj).encode() + b"\n\n"
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"

    parts = [chunk({"role": "assistant", "content": ""}, None)]
    parts += [chunk({"content": f"w{i} "}, None) for i in range(STREAM_CHUNKS)]
    parts.append(chunk({}, "stop"))
    parts.append(chunk({}, None, {"prompt_tokens": 12, "completion_tokens": STREAM_CHUNKS, "total_tokens": 212}, False))
    done = b"data: [DONE]\n\n"
    parts.append(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
    return b"".join(parts)


class _Upstream(asyncio.Protocol):
    """Keep-alive HTTP/1.1: a JSON completion, or the SSE stream when the body asks to stream."""

    plain = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(_BODY)).encode()
        + b"\r\n\r\n"
        + _BODY
    )
    stream = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + _sse()
    models = b'{"object":"list","data":[{"id":"' + MODEL.encode() + b'","object":"model"}]}'

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buf = b""
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].lower()
            length = 0
            for line in head.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4 : head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length :]
            if head.startswith(b"get") and b"/models" in head.split(b"\r\n", 1)[0]:
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                    + str(len(self.models)).encode()
                    + b"\r\n\r\n"
                    + self.models
                )
            elif b'"stream":true' in body.replace(b" ", b""):
                self.transport.write(self.stream)
            else:
                self.transport.write(self.plain)


def serve_upstream(port: int) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Upstream, "127.0.0.1", port, backlog=1024)
        await server.serve_forever()

    asyncio.run(main())


# ------------------------------------------------------------------------------------ processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(proc: subprocess.Popen, port: int, what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-800:] if proc.stderr else ""
            raise RuntimeError(f"{what} exited ({proc.returncode}): {err}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen within {timeout_s:.0f} s") from None
            time.sleep(0.1)  # waiting for a process to listen, bounded


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and its children (LiteLLM may fork workers), MiB."""
    total = 0
    pids = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(c) for c in children]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024.0


def _start_ours(upstream: str, tmp: Path, repo: Path = REPO) -> tuple[subprocess.Popen, str, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = tmp / "gateway.toml"
    providers = "".join(
        f'[providers.{n}]\nbase_url = "{upstream}/{n}/v1"\napi_key_env = "BENCH_UPSTREAM_KEY"\n'
        f'models = ["{MODEL}"]\ndefault_model = "{MODEL}"\n'
        for n in ("holysheep", "direct")
    )
    cfg.write_text('[routing]\nprimary = "holysheep"\nfallback = "direct"\n' + providers)
    env = dict(
        os.environ,
        GATEWAY_CONFIG=str(cfg),
        DATABASE_URL=f"sqlite:///{tmp / 'gateway.db'}",
        BENCH_UPSTREAM_KEY="bench",
        PYTHONPATH=str(repo),
    )
    made = subprocess.run(
        [sys.executable, "-m", "app", "keys", "create", "--name", "bench", "--json"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    key = json.loads(made.stdout)["key"]
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port)],
        cwd=repo,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _wait_port(proc, port, "the gateway server")
    return proc, f"http://127.0.0.1:{port}/v1", key


def _litellm_python() -> tuple[str | None, str]:
    """(interpreter with litellm[proxy], note) or (None, why not)."""
    if os.environ.get("BENCH_LITELLM", "1") == "0":
        return None, "skipped (BENCH_LITELLM=0)"
    given = os.environ.get("BENCH_LITELLM_PYTHON")
    if given:
        return given, f"litellm from BENCH_LITELLM_PYTHON={given}"
    from benchmarks.litellm_peer import PYTHON, VERSION, ensure_venv

    say(f"  preparing litellm[proxy]=={VERSION} in benchmarks/_work/litellm-venv (first run installs it)")
    reason = ensure_venv()
    return (None, reason) if reason else (str(PYTHON), f"litellm[proxy]=={VERSION} in benchmarks/_work/litellm-venv")


def _start_litellm(python: str, upstream: str, tmp: Path) -> tuple[subprocess.Popen, str]:
    cfg = tmp / "litellm.yaml"
    cfg.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        f"    litellm_params: {{model: openai/{MODEL}, api_base: '{upstream}/v1', api_key: bench}}\n"
        "litellm_settings:\n  num_retries: 0\n  request_timeout: 30\n"
    )
    port = _free_port()
    exe = str(Path(python).parent / "litellm")
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_MASTER_KEY=LITELLM_MASTER_KEY)
    env.pop("DATABASE_URL", None)
    proc = subprocess.Popen(
        [exe, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _wait_port(proc, port, "the LiteLLM proxy")
    return proc, f"http://127.0.0.1:{port}"


# ------------------------------------------------------------------------------------ measurements


def _call(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES)
    if not r.choices:
        raise RuntimeError("no choices in the answer")


def _ttft(client: openai.OpenAI) -> float:
    t0 = time.perf_counter()
    first = None
    n = 0
    for chunk in client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            if first is None:
                first = (time.perf_counter() - t0) * 1000.0
            n += 1
    if first is None or n != STREAM_CHUNKS:
        raise RuntimeError(f"stream delivered {n} content chunks, expected {STREAM_CHUNKS}")
    return first


def _family(pid: int) -> list[int]:
    """``pid`` and every process descended from it (a proxy's workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            continue
    return total


@contextmanager
def _alone(measured: str, servers: dict[str, subprocess.Popen]) -> Iterator[None]:
    """Pause every proxy but the measured one (bare: both) for the duration."""
    frozen = [p for n, proc in servers.items() if n != measured for p in _family(proc.pid)]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)


def _idle_cpu(servers: dict[str, subprocess.Popen], seconds: float = 5.0) -> dict[str, float]:
    """Each idle proxy's CPU use, in % of one core, over ``seconds`` with no requests."""
    families = {n: _family(proc.pid) for n, proc in servers.items()}
    before = {n: _cpu_s(f) for n, f in families.items()}
    time.sleep(seconds)
    return {n: 100.0 * (_cpu_s(f) - before[n]) / seconds for n, f in families.items()}


def _rounds(
    clients: dict[str, openai.OpenAI], fn, per_round: int, rounds: int, servers: dict[str, subprocess.Popen]
) -> dict[str, Dist]:
    names = list(clients)
    out = {n: Dist() for n in names}
    for n in names:  # warm-up: connections, first-call imports
        for _ in range(3):
            fn(clients[n])
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            with _alone(n, servers):
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    got = fn(clients[n])
                    out[n].samples.append(got if isinstance(got, float) else (time.perf_counter() - t0) * 1000.0)
    return out


async def _throughput_once(base_url: str, key: str, seconds: float) -> tuple[float, int]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)
    done = errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done, errors
        while time.perf_counter() < stop_at:
            try:
                await client.chat.completions.create(model=MODEL, messages=MESSAGES)
                done += 1
            except openai.APIError:
                errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(CONCURRENCY)])
    elapsed = time.perf_counter() - t0
    await client.close()
    return done / elapsed, errors


def _throughput(targets: dict[str, tuple[str, str]], servers: dict[str, subprocess.Popen]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {n: [] for n in targets}
    for url, key in targets.values():  # warm-up: 64 connections each
        asyncio.run(_throughput_once(url, key, 0.5))
    names = list(targets)
    for r in range(TPUT_ROUNDS):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            with _alone(n, servers):
                rps, errors = asyncio.run(_throughput_once(*targets[n], TPUT_SECONDS))
            if errors:
                say(f"    {n}: {errors} failed requests in a throughput round")
            out[n].append(rps)
    return out


def run() -> list[dict]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    up_port = _free_port()
    upstream_proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.proxy_bench", "--upstream", str(up_port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    ours_proc = litellm_proc = before_proc = None
    rows: list[dict] = []
    try:
        _wait_port(upstream_proc, up_port, "the loopback upstream")
        upstream = f"http://127.0.0.1:{up_port}"
        ours_proc, ours_url, ours_key = _start_ours(upstream, tmp)
        targets = {"bare": (f"{upstream}/v1", "bench"), "ours": (ours_url, ours_key)}
        if BASELINE:  # an older checkout of ours, measured side by side ("must not get slower")
            before_proc, before_url, before_key = _start_ours(upstream, tmp / "before", Path(BASELINE))
            targets["before"] = (before_url, before_key)
        python, note = _litellm_python()
        if python is not None:
            try:
                litellm_proc, litellm_url = _start_litellm(python, upstream, tmp)
                targets["litellm"] = (litellm_url, LITELLM_MASTER_KEY)
            except RuntimeError as exc:
                python, note = None, f"the LiteLLM proxy did not start: {exc}"
        if python is None:
            say(f"  LiteLLM proxy NOT measured: {note}")
            rows.append({**row("LiteLLM proxy not measured", 0.0, "n/a"), "value": None, "note": note})
        servers = {"ours": ours_proc}
        if before_proc is not None:
            servers["before"] = before_proc
        if litellm_proc is not None:
            servers["litellm"] = litellm_proc
        clients = {n: openai.OpenAI(base_url=u, api_key=k, max_retries=0, timeout=60) for n, (u, k) in targets.items()}
        say(f"  latency at concurrency 1: {ROUNDS} rounds x {PER_ROUND} calls per target ({', '.join(targets)})")
        lat = _rounds(clients, _call, PER_ROUND, ROUNDS, servers)
        say(f"  time to first token, {STREAM_CHUNKS}-chunk stream: {ROUNDS} rounds x {STREAM_PER_ROUND}")
        ttft = _rounds(clients, _ttft, STREAM_PER_ROUND, ROUNDS, servers)
        for c in clients.values():
            c.close()
        say("  CPU of each proxy in the 5 s after the rounds (no requests)")
        idle = _idle_cpu(servers)
        say(f"  throughput: {CONCURRENCY} concurrent, {TPUT_ROUNDS} rounds x {TPUT_SECONDS:g} s per target")
        tput = _throughput(targets, servers)
        rss = {"ours": _rss_mib(ours_proc.pid)}
        if before_proc is not None:
            rss["before"] = _rss_mib(before_proc.pid)
        if litellm_proc is not None:
            rss["litellm"] = _rss_mib(litellm_proc.pid)
        rows += _report(lat, ttft, tput, rss, note)
        for n, pct in idle.items():
            rows.append(
                row(
                    f"{n}: CPU after load, idle",
                    pct,
                    "% of a core",
                    measured="CPU time of the proxy's processes over the 5 s after the latency rounds",
                    digits=1,
                )
            )
    finally:
        _stop(litellm_proc)
        _stop(before_proc)
        _stop(ours_proc)
        _stop(upstream_proc)
    return rows


def _report(
    lat: dict[str, Dist], ttft: dict[str, Dist], tput: dict[str, list[float]], rss: dict[str, float], note: str
) -> list[dict]:
    bare = lat["bare"]
    rows: list[dict] = []
    added = {}
    what = (
        "openai SDK chat.completions.create at concurrency 1 against one asyncio loopback upstream: bare, through "
        "`python -m app serve` (gateway key, shipped policy, SQLite request log) and through the LiteLLM proxy "
        f"({note}); interleaved rounds, rotating order, the other proxy paused; added = hop p50/p99 - bare p50/p99"
    )
    rows.append(row("bare SDK -> upstream p50", bare.p50, "ms", n=bare.n, spread=_iqr(bare), measured=what))
    for n in ("ours", "before", "litellm"):
        if n not in lat:
            continue
        d = lat[n]
        added[n] = d.p50 - bare.p50
        rows.append(row(f"{n}: hop p50", d.p50, "ms", n=d.n, spread=_iqr(d)))
        rows.append(row(f"{n}: added latency p50", d.p50 - bare.p50, "ms", n=d.n))
        rows.append(row(f"{n}: added latency p99", d.q(0.99) - bare.q(0.99), "ms", n=d.n))
    if "litellm" in added:
        budget = added["litellm"] / 5
        rows.append(
            row(
                "ours added p50 vs 1/5 of LiteLLM's",
                added["ours"],
                "ms",
                budget=round(budget, 4),
                measured="budget: our added p50 <= 1/5 of LiteLLM's added p50 in the same run",
            )
        )
    t_what = (
        f"{STREAM_CHUNKS}-chunk stream (stream_options.include_usage), time from the call to the first content "
        "chunk; added = hop - bare, p50"
    )
    for n in ("ours", "before", "litellm"):
        if n in ttft:
            rows.append(
                row(
                    f"{n}: added TTFT p50",
                    ttft[n].p50 - ttft["bare"].p50,
                    "ms",
                    n=ttft[n].n,
                    spread=f"hop {ttft[n].p50:.3f} ms vs bare {ttft['bare'].p50:.3f} ms",
                    measured=t_what,
                )
            )
    p_what = f"AsyncOpenAI, {CONCURRENCY} concurrent non-streamed requests for {TPUT_SECONDS:g} s, median of rounds"
    med = {n: statistics.median(v) for n, v in tput.items()}
    for n in ("bare", "ours", "before", "litellm"):
        if n in med:
            rows.append(
                row(
                    f"{n}: throughput at {CONCURRENCY} concurrent",
                    med[n],
                    "req/s",
                    n=len(tput[n]),
                    spread="rounds " + ", ".join(f"{x:.0f}" for x in tput[n]),
                    measured=p_what,
                    digits=1,
                )
            )
    if "litellm" in med:
        rows.append(
            row(
                "ours throughput vs 3x LiteLLM's",
                med["ours"],
                "req/s",
                budget=round(3 * med["litellm"], 1),
                lower_is_better=False,
                measured="budget: our throughput at 64 concurrent >= 3x LiteLLM's in the same run",
                digits=1,
            )
        )
    for n, mib in rss.items():
        rows.append(row(f"{n}: server RSS after the run", mib, "MiB", measured="VmRSS of the server process", digits=1))
    return rows


def _iqr(d: Dist) -> str:
    return f"IQR {quantile(d.samples, 0.25):.3f}-{quantile(d.samples, 0.75):.3f} ms, p99 {d.q(0.99):.3f}"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--upstream":
        serve_upstream(int(sys.argv[2]))
