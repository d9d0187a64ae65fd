"""``python -m benchmarks proxy``: the gateway server as a hop, side by side with Portkey's gateway,
LiteLLM's proxy and nginx, under one fast upstream and one load generator (issue 16).

* **Upstream**: Debian's nginx answering a fixed completion, or a 200-chunk SSE stream, from Lua
  (:mod:`benchmarks.nginx_upstream`; 10k+ req/s here, never what a hop waits for).
* **Targets**: ``bare`` (wrk straight to the upstream: the reference every "added" figure is taken
  from), ``floor`` (nginx ``proxy_pass``, a hop that does nothing), ``ours`` (``python -m app serve``,
  one process: gateway key, shipped routing policy, SQLite request log), ``ours_w2`` (``--workers 2``,
  measured at 256 connections only), ``portkey`` (``@portkey-ai/gateway@1.15.2`` under Debian's
  node, :mod:`benchmarks.portkey_peer`), ``litellm`` (``litellm[proxy]==1.108.7`` in its own
  virtualenv; ``BENCH_LITELLM=0`` skips it), and ``before`` (``BENCH_PROXY_BASELINE=<checkout>``:
  an older checkout of ours).
* **Load**: Debian's ``wrk`` with a Lua script for the POST body (and each target's headers), one
  thread, at 1, 16, 64 and 256 connections, ``BENCH_PROXY_SECONDS`` (default 5) each; p50/p99 from
  wrk's latency distribution at 1 connection, req/s (2xx only) at each; CPU ms per request from
  ``/proc/PID/stat`` of the target's processes over the run; RSS at the end.
* **Streams**: ``BENCH_PROXY_STREAMS`` (default 10) sequential 200-chunk streams per round on a fresh
  connection each: time to the first content chunk and to ``[DONE]``.

``BENCH_PROXY_ROUNDS`` (default 5) interleaved rounds, the order rotating each round; while one
target is measured every other server is paused (SIGSTOP, then SIGCONT), so each has the two cores
alone. Medians over rounds, with their spread. Each finished round is saved to
``benchmarks/_work/proxy-rounds.json``; ``BENCH_PROXY_RESUME=1`` continues from it (same targets and
settings) after an interruption. A quick look: ``BENCH_PROXY_ROUNDS=1 BENCH_PROXY_SECONDS=2``.
``BENCH_ROUTE=1`` routes ours through a route of two deployments (``[routes]``), for both suites.

Budgets (issue 16), each against Portkey in the same run, one process each: req/s at 64 and at 256
>= 1.25x Portkey's; CPU ms per request at 64 <= Portkey's; req/s at 256 >= 0.95x req/s at 16;
added p50 at 1 connection <= 1.0 ms; added time to first token below Portkey's and LiteLLM's;
``--workers 2`` >= 1.7x one worker at 256.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import nginx_upstream, portkey_peer
from benchmarks.harness import row, say

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "benchmarks" / "_work"
STATE = WORK / "proxy-rounds.json"
MODEL = "gpt-4.1"
STREAM_CHUNKS = 200
PATH = "/v1/chat/completions"
BODY = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Say hello in one short sentence."}]})
STREAM_BODY = json.dumps(
    {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "Say hello in one short sentence."}]}
)
CONCURRENCY = (1, 16, 64, 256)
ROUNDS = int(os.environ.get("BENCH_PROXY_ROUNDS", "5"))
SECONDS = float(os.environ.get("BENCH_PROXY_SECONDS", "5"))
STREAMS = int(os.environ.get("BENCH_PROXY_STREAMS", "10"))
RESUME = os.environ.get("BENCH_PROXY_RESUME", "0") == "1"
# BENCH_ROUTE=1: ours serves the model through a [routes] entry of two weighted deployments (both
# loopback providers) instead of the two-sided routing; the peers are unchanged.
ROUTE = os.environ.get("BENCH_ROUTE", "0") == "1"
# BENCH_PROXY_BASELINE = the path of an older checkout: its server is measured beside ours as "before".
BASELINE = os.environ.get("BENCH_PROXY_BASELINE", "")
LITELLM_MASTER_KEY = "sk-bench-proxy-not-the-default-7c1d"
WRK = shutil.which("wrk") or "/usr/bin/wrk"
_FIRST_TEXT = re.compile(rb'"content":\s*"w0 ')  # the first content chunk, however a peer spaces its JSON


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


def _start_ours(
    upstream: str,
    tmp: Path,
    repo: Path = REPO,
    workers: int = 1,
    route: bool = ROUTE,
    max_in_flight: int | None = None,
) -> tuple[subprocess.Popen, str, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = tmp / "gateway.toml"
    providers = "".join(
        f'[providers.{n}]\nbase_url = "{upstream}/{n}/v1"\napi_key_env = "BENCH_UPSTREAM_KEY"\n'
        f'models = ["{MODEL}"]\ndefault_model = "{MODEL}"\n'
        for n in ("holysheep", "direct")
    )
    route = (
        f'[routes."{MODEL}"]\ndeployments = [{{ provider = "holysheep" }}, {{ provider = "direct" }}]\n'
        if route
        else ""
    )
    server = f"[server]\nmax_in_flight = {max_in_flight}\n" if max_in_flight is not None else ""
    cfg.write_text(server + '[routing]\nprimary = "holysheep"\nfallback = "direct"\n' + providers + route)
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
        [sys.executable, "-m", "app", "serve", "--port", str(port), "--workers", str(workers)],
        cwd=repo,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _wait_port(proc, port, "the gateway server")
    return proc, f"http://127.0.0.1:{port}", key


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


# ------------------------------------------------------------------------------------ measurements


@dataclass
class Target:
    name: str
    base: str  # http://127.0.0.1:PORT
    headers: dict[str, str]
    proc: subprocess.Popen | None  # None: nginx itself (bare, floor)
    levels: tuple[int, ...] = CONCURRENCY

    def pids(self) -> list[int]:
        return _family(self.proc.pid) if self.proc is not None else []


@dataclass
class WrkRun:
    rps: float
    ok: int
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    cpu_ms_per_req: float | None


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if m is None:
        raise ValueError(f"wrk latency {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _lua(target: Target, body: str, work: Path) -> Path:
    script = work / f"wrk-{target.name}.lua"
    lines = [
        'wrk.method = "POST"',
        f"wrk.body = {json.dumps(body)}",
        'wrk.headers["Content-Type"] = "application/json"',
    ]
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in target.headers.items()]
    script.write_text("\n".join(lines) + "\n")
    return script


def _wrk(target: Target, connections: int, seconds: float, work: Path) -> WrkRun:
    script = _lua(target, BODY, work)
    pids = target.pids()
    cpu0 = _cpu_s(pids)
    cmd = [WRK, "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s", "--latency", "-s", str(script)]
    done = subprocess.run([*cmd, target.base + PATH], capture_output=True, text=True, check=False)
    cpu = _cpu_s(pids) - cpu0
    ok, errors, elapsed, lat = wrk_counts(done, target.name)
    return WrkRun(
        rps=ok / elapsed if elapsed > 0 else 0.0,
        ok=ok,
        errors=errors,
        p50_ms=lat.get("50"),
        p99_ms=lat.get("99"),
        cpu_ms_per_req=1000.0 * cpu / ok if pids and ok else None,
    )


def wrk_counts(done: subprocess.CompletedProcess, name: str) -> tuple[int, int, float, dict[str, float]]:
    """(requests answered 2xx/3xx, errors, elapsed s, {"50": ms, "99": ms}) from a finished wrk run."""
    out = done.stdout
    total = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", out)
    if done.returncode != 0 or total is None:
        raise RuntimeError(f"wrk failed against {name}: {done.stderr.strip()[-300:] or out[-300:]}")
    n, elapsed = int(total.group(1)), _ms(total.group(2) + total.group(3)) / 1000.0
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = int(bad.group(1)) if bad else 0
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if sock:
        errors += sum(int(x) for x in sock.groups())
    ok = max(0, n - (int(bad.group(1)) if bad else 0))
    lat = {k: _ms(v) for k, v in re.findall(r"^\s+(50|99)%\s+(\S+)\s*$", out, re.M)}
    return ok, errors, elapsed, lat


def _stream_once(target: Target) -> tuple[float, float]:
    """(time to the first content chunk, time to [DONE]) in ms, for one 200-chunk stream on a new
    connection."""
    host, port = target.base.removeprefix("http://").split(":")
    body = STREAM_BODY.encode()
    head = [f"POST {PATH} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json"]
    head += [f"{k}: {v}" for k, v in target.headers.items()]
    head += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    request = "\r\n".join(head).encode() + body
    t0 = time.perf_counter()
    first = None
    seen = b""
    with socket.create_connection((host, int(port)), timeout=15) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(request)
        while True:
            data = s.recv(65536)
            if not data:
                break
            seen = seen[-64:] + data
            if first is None and _FIRST_TEXT.search(seen):
                first = (time.perf_counter() - t0) * 1000.0
            if b"[DONE]" in seen:
                break
    total = (time.perf_counter() - t0) * 1000.0
    if first is None or b"[DONE]" not in seen:
        raise RuntimeError(f"{target.name}: the stream did not deliver its chunks and [DONE]")
    return first, total


@dataclass
class Samples:
    """Per target, per measure: one value per round."""

    data: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    rounds_done: int = 0

    def add(self, target: str, measure: str, value: float | None) -> None:
        if value is not None:
            self.data.setdefault(target, {}).setdefault(measure, []).append(value)

    def get(self, target: str, measure: str) -> list[float]:
        return self.data.get(target, {}).get(measure, [])


def _measure(target: Target, samples: Samples, work: Path) -> None:
    for c in target.levels:
        run = _wrk(target, c, SECONDS, work)
        samples.add(target.name, f"rps@{c}", run.rps)
        samples.add(target.name, f"errors@{c}", float(run.errors))
        samples.add(target.name, f"cpu@{c}", run.cpu_ms_per_req)
        if c == 1:
            samples.add(target.name, "p50@1", run.p50_ms)
            samples.add(target.name, "p99@1", run.p99_ms)
    if 1 in target.levels:  # the stream measure goes with the full set
        firsts, totals = [], []
        failed = 0
        for _ in range(STREAMS):
            try:
                f, t = _stream_once(target)
            except (OSError, RuntimeError) as exc:  # a stuck or broken stream is counted, not fatal
                failed += 1
                say(f"    {target.name}: stream failed: {type(exc).__name__}: {exc}")
                continue
            firsts.append(f)
            totals.append(t)
        samples.add(target.name, "stream_errors", float(failed))
        if firsts:
            samples.add(target.name, "ttft", statistics.median(firsts))
            samples.add(target.name, "stream_total", statistics.median(totals))


def _drain(target: Target, quiet_share: float = 0.06, bound_s: float = 15.0) -> None:
    """Wait (bounded) until ``target`` has finished the requests wrk left in flight, before it is
    paused: a server stopped with requests in flight finds their deadlines passed when it resumes,
    and the timeouts it then logs (rightly) open its breakers for the next round. Idle = under
    ``quiet_share`` of a core over 0.2 s."""
    pids = target.pids()
    if not pids:
        return
    until = time.monotonic() + bound_s
    while time.monotonic() < until:
        before = _cpu_s(pids)
        time.sleep(0.2)  # sampling the CPU counters, bounded by bound_s
        if _cpu_s(pids) - before < quiet_share * 0.2:
            return


@contextmanager
def _paused_all_but(measured: Target, targets: list[Target]) -> Iterator[None]:
    frozen = [p for t in targets if t.name != measured.name for p in t.pids()]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)


def _settings_key(targets: list[Target]) -> dict:
    return {"targets": [t.name for t in targets], "seconds": SECONDS, "streams": STREAMS}


def _load_state(targets: list[Target]) -> Samples:
    if RESUME and STATE.exists():
        try:
            saved = json.loads(STATE.read_text())
            if saved.get("settings") == _settings_key(targets):
                say(f"  resuming: {saved['rounds_done']} round(s) already measured ({STATE})")
                return Samples(saved["data"], saved["rounds_done"])
            say("  saved rounds are for other targets or settings: starting over")
        except (OSError, ValueError, KeyError):
            say("  saved rounds unreadable: starting over")
    return Samples()


def _save_state(targets: list[Target], samples: Samples) -> None:
    STATE.parent.mkdir(parents=True, exist_ok=True)
    state = {"settings": _settings_key(targets), "rounds_done": samples.rounds_done, "data": samples.data}
    STATE.write_text(json.dumps(state))


def _start_portkey(upstream: str, tmp: Path) -> tuple[subprocess.Popen | None, str]:
    why = portkey_peer.ensure()
    if why:
        return None, why
    port = _free_port()
    proc = subprocess.Popen(
        portkey_peer.command(port),
        cwd=portkey_peer.WORK,
        env=portkey_peer.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _wait_port(proc, port, "Portkey's gateway")
    return proc, f"http://127.0.0.1:{port}"


def run() -> list[dict]:
    why = nginx_upstream.available()
    if why or not Path(WRK).exists():
        reason = why or "wrk is not installed. Fix: apt-get install wrk"
        say(f"  proxy benchmark NOT run: {reason}")
        return [{**row("proxy benchmark not run", 0.0, "n/a"), "value": None, "note": reason}]
    tmp = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    procs: list[subprocess.Popen] = []
    notes: dict[str, str] = {}
    nginx = nginx_upstream.start(tmp / "nginx", _free_port(), _free_port(), model=MODEL, chunks=STREAM_CHUNKS)
    try:
        upstream = nginx.upstream
        targets = [Target("bare", upstream, {}, None), Target("floor", nginx.floor, {}, None)]
        ours, url, key = _start_ours(upstream, tmp / "ours")
        procs.append(ours)
        targets.append(Target("ours", url, {"Authorization": f"Bearer {key}"}, ours))
        ours2, url2, key2 = _start_ours(upstream, tmp / "ours2", workers=2)
        procs.append(ours2)
        targets.append(Target("ours_w2", url2, {"Authorization": f"Bearer {key2}"}, ours2, levels=(256,)))
        if BASELINE:
            before, burl, bkey = _start_ours(upstream, tmp / "before", Path(BASELINE))
            procs.append(before)
            targets.append(Target("before", burl, {"Authorization": f"Bearer {bkey}"}, before))
        portkey, purl = _start_portkey(upstream, tmp)
        if portkey is None:
            notes["portkey"] = purl
            say(f"  Portkey NOT measured: {purl}")
        else:
            procs.append(portkey)
            targets.append(Target("portkey", purl, portkey_peer.headers(upstream), portkey))
        python, note = _litellm_python()
        if python is not None:
            try:
                litellm, lurl = _start_litellm(python, upstream, tmp)
                procs.append(litellm)
                targets.append(Target("litellm", lurl, {"Authorization": f"Bearer {LITELLM_MASTER_KEY}"}, litellm))
            except RuntimeError as exc:
                note = f"the LiteLLM proxy did not start: {exc}"
                python = None
        if python is None:
            notes["litellm"] = note
            say(f"  LiteLLM NOT measured: {note}")
        for t in targets:  # warm-up: connections, first-call imports, JIT
            _wrk(t, 16, 1.0, tmp)
            try:
                _stream_once(t)
            except (OSError, RuntimeError) as exc:
                say(f"    {t.name}: warm-up stream failed: {type(exc).__name__}: {exc}")
        samples = _load_state(targets)
        for r in range(samples.rounds_done, ROUNDS):
            order = targets[r % len(targets) :] + targets[: r % len(targets)]
            say(f"  round {r + 1}/{ROUNDS}: {', '.join(t.name for t in order)}")
            for t in order:
                with _paused_all_but(t, targets):
                    _measure(t, samples, tmp)
                    _drain(t)
            samples.rounds_done = r + 1
            _save_state(targets, samples)
        rss = {t.name: _rss_mib(t.proc.pid) for t in targets if t.proc is not None}
        return _report(samples, rss, notes)
    finally:
        for p in reversed(procs):
            _stop(p)
        nginx.stop()


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _spread(xs: list[float], digits: int = 2) -> str:
    if not xs:
        return ""
    return f"rounds {', '.join(f'{x:.{digits}f}' for x in xs)}; min-max {min(xs):.{digits}f}-{max(xs):.{digits}f}"


def _report(samples: Samples, rss: dict[str, float], notes: dict[str, str]) -> list[dict]:
    get = samples.get
    names = list(samples.data)
    rows: list[dict] = []
    what = (
        f"wrk -t1 with a Lua POST script against nginx returning a fixed completion; {samples.rounds_done} "
        f"interleaved rounds x {SECONDS:g} s per level, the other servers SIGSTOPped; medians over rounds; "
        "added = target - bare (wrk straight to the upstream)"
    )
    bare_p50, bare_p99 = _med(get("bare", "p50@1")), _med(get("bare", "p99@1"))
    bare_ttft, bare_total = _med(get("bare", "ttft")), _med(get("bare", "stream_total"))
    added: dict[str, float] = {}
    added_ttft: dict[str, float] = {}
    for n in names:
        p50s, p99s = get(n, "p50@1"), get(n, "p99@1")
        if p50s and n != "bare" and bare_p50 is not None:
            added[n] = statistics.median(p50s) - bare_p50
            rows.append(
                row(f"{n}: added p50 at c=1", added[n], "ms", n=len(p50s), spread=_spread(p50s, 3), measured=what)
            )
            if p99s and bare_p99 is not None:
                rows.append(row(f"{n}: added p99 at c=1", statistics.median(p99s) - bare_p99, "ms", n=len(p99s)))
        elif p50s:
            rows.append(row(f"{n}: p50 at c=1", statistics.median(p50s), "ms", n=len(p50s), spread=_spread(p50s, 3)))
        for c in CONCURRENCY:
            xs = get(n, f"rps@{c}")
            if xs:
                errs = sum(get(n, f"errors@{c}"))
                extra = f"; {errs:.0f} errors" if errs else ""
                rows.append(
                    row(
                        f"{n}: req/s at c={c}",
                        statistics.median(xs),
                        "req/s",
                        n=len(xs),
                        spread=_spread(xs, 0) + extra,
                        digits=1,
                    )
                )
        cpu = get(n, "cpu@64") or get(n, "cpu@256")
        if cpu:
            at = 64 if get(n, "cpu@64") else 256
            rows.append(
                row(
                    f"{n}: CPU ms/request at c={at}",
                    statistics.median(cpu),
                    "ms",
                    n=len(cpu),
                    spread=_spread(cpu, 3),
                    measured="user+system CPU of the server's processes (/proc/PID/stat) over the run / 2xx answers",
                )
            )
        ttft, total = get(n, "ttft"), get(n, "stream_total")
        if ttft and n != "bare" and bare_ttft is not None and bare_total is not None:
            added_ttft[n] = statistics.median(ttft) - bare_ttft
            rows.append(
                row(
                    f"{n}: added TTFT, 200-chunk stream",
                    added_ttft[n],
                    "ms",
                    n=len(ttft),
                    spread=f"hop {statistics.median(ttft):.2f} ms vs bare {bare_ttft:.2f} ms; " + _spread(ttft),
                    measured=f"{STREAMS} sequential streams per round, new connection each, to the first content chunk",
                )
            )
            rows.append(
                row(
                    f"{n}: added stream total, 200-chunk stream",
                    statistics.median(total) - bare_total,
                    "ms",
                    n=len(total),
                    spread=f"hop {statistics.median(total):.2f} ms vs bare {bare_total:.2f} ms",
                )
            )
        stream_errors = sum(get(n, "stream_errors"))
        if stream_errors:
            rows.append(row(f"{n}: streams that failed or stalled 15 s", stream_errors, "streams", digits=0))
        if n in rss:
            rows.append(
                row(f"{n}: RSS after the run", rss[n], "MiB", measured="VmRSS of the server's processes", digits=1)
            )
    for peer, why in notes.items():
        rows.append({**row(f"{peer} not measured", 0.0, "n/a"), "value": None, "note": why})
    rows += _budgets(samples, added, added_ttft)
    return rows


def _budgets(samples: Samples, added: dict[str, float], added_ttft: dict[str, float]) -> list[dict]:
    get = samples.get
    rows: list[dict] = []
    m = {(n, k): _med(get(n, k)) for n in samples.data for k in ("rps@16", "rps@64", "rps@256", "cpu@64", "rps@1")}
    pk = "portkey" in samples.data
    for c in (64, 256):
        ours, peer = m.get(("ours", f"rps@{c}")), m.get(("portkey", f"rps@{c}"))
        if ours is not None and pk and peer is not None:
            rows.append(
                row(
                    f"budget: ours req/s at c={c} >= 1.25x Portkey's",
                    ours,
                    "req/s",
                    budget=round(1.25 * peer, 1),
                    lower_is_better=False,
                    digits=1,
                    measured=f"Portkey {peer:.1f} req/s in the same run",
                )
            )
    ours_cpu, peer_cpu = m.get(("ours", "cpu@64")), m.get(("portkey", "cpu@64"))
    if ours_cpu is not None and peer_cpu is not None:
        # <= : row() tests value < budget, so the budget is nudged by the rounding step
        rows.append(
            row(
                "budget: ours CPU ms/request at c=64 <= Portkey's",
                ours_cpu,
                "ms",
                budget=round(peer_cpu, 4) + 1e-4,
                measured=f"Portkey {peer_cpu:.3f} ms in the same run",
            )
        )
    r16, r256 = m.get(("ours", "rps@16")), m.get(("ours", "rps@256"))
    if r16 is not None and r256 is not None:
        rows.append(
            row(
                "budget: ours req/s at c=256 >= 0.95x at c=16",
                r256,
                "req/s",
                budget=round(0.95 * r16, 1),
                lower_is_better=False,
                digits=1,
                measured=f"ours {r16:.1f} req/s at c=16",
            )
        )
    if "ours" in added:
        rows.append(row("budget: ours added p50 at c=1 <= 1.0 ms", added["ours"], "ms", budget=1.0001))
    if "ours" in added_ttft:
        for peer in ("portkey", "litellm"):
            if peer in added_ttft:
                rows.append(
                    row(
                        f"budget: ours added TTFT below {peer}'s",
                        added_ttft["ours"],
                        "ms",
                        budget=round(added_ttft[peer], 4),
                    )
                )
    w2 = m.get(("ours_w2", "rps@256"))
    if w2 is not None and r256 is not None:
        rows.append(
            row(
                "budget: --workers 2 req/s at c=256 >= 1.7x one worker",
                w2,
                "req/s",
                budget=round(1.7 * r256, 1),
                lower_is_better=False,
                digits=1,
                measured=f"one worker {r256:.1f} req/s at c=256",
            )
        )
    return rows
