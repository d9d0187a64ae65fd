"""Router overhead: what ``RoutingClient.chat`` adds to a bare openai SDK call to the same upstream.

Measured path (ours): ``router.chat(messages, model="auto", session_id=...)`` with the default route:
message validation, the intent rules choosing the model, the canary ratio lookup and the session's
side, the SDK request, the attempt record, its cost and the telemetry hand-off (the background
writer into SQLite runs concurrently; what it still has to do after a block of calls is drained
untimed and reported on its own row). Peer: ``openai.OpenAI(...).chat.completions.create`` with the
model and provider the router chose, on the same upstream.

Two upstream paths, both a zero-latency simulator:
  * ``mock``: in-process, through the SDK's ``MockTransport`` (no sockets; the router's own cost is
    most visible here);
  * ``loopback``: real HTTP on 127.0.0.1 to ``python -m app simulate`` in a subprocess (the other
    core), with the providers configured as ordinary (non-simulated) OpenAI-compatible URLs.

Rounds are interleaved (ours/peer alternating, first mover swapped each round). Reported per path:
p50 with IQR, p99, n, and the added latency per call (ours minus bare) at p50 and p99. Budget (issue
10, item 11): added < 0.15 ms at p50 over real sockets; printed as met or missed, never asserted.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx2
import openai

from app.config import Settings, load_settings
from app.routing import RoutingClient
from app.simulator import SimulatedProvider, make_transport
from benchmarks.harness import Comparison, dist_rows, interleaved, per_call, row, say

REPO = Path(__file__).resolve().parents[1]
ROUNDS = int(os.environ.get("BENCH_ROUTER_ROUNDS", "30"))
PER_ROUND = int(os.environ.get("BENCH_ROUTER_PER_ROUND", "100"))
WARMUP = 200
SESSION = "bench-session-1"
MESSAGES = [{"role": "user", "content": "Summarise the benefits of a canary rollout."}]
ADDED_P50_BUDGET_MS = 0.15  # over real loopback sockets
KEYS = {"HOLYSHEEP_API_KEY": "bench-key", "OPENAI_API_KEY": "bench-key"}


def build_router(settings: Settings, **kwargs) -> RoutingClient:
    """The one place this benchmark constructs the router: through the composition root, as every
    process does (no guardrail timer: the benchmark measures the request path)."""
    from app.gateway import build_gateway

    return build_gateway(settings, guardrail=False, **kwargs).client


def _settings(toml: str, tmp: Path) -> Settings:
    path = tmp / f"gateway-{len(list(tmp.iterdir()))}.toml"
    path.write_text(toml)
    s = load_settings(path, env={"DATABASE_URL": f"sqlite:///{tmp / 'router.db'}"})
    return s.model_copy(update={"simulator": s.simulator.model_copy(update={"latency_scale": 0.0, "seed": 1})})


def _compare(router: RoutingClient, bare_for: dict[str, openai.OpenAI], label: str) -> tuple[Comparison, str]:
    first = router.chat(MESSAGES, model="auto", session_id=SESSION)
    if first.fallback_used:
        raise RuntimeError(f"{label}: the benchmark request fell back ({first.attempt_log}); the upstream is failing")
    bare = bare_for[first.provider]
    model = first.model

    def ours() -> None:
        router.chat(MESSAGES, model="auto", session_id=SESSION)

    def peer() -> None:
        bare.chat.completions.create(model=model, messages=MESSAGES)

    what = (
        f"{label}: router.chat(model='auto', session_id={SESSION!r}) -> intent {first.intent!r}, "
        f"side {first.side!r}, {first.provider}/{model}; peer: bare SDK create(model={model!r}) on the same upstream"
    )
    say("  " + what)
    cmp = interleaved(ours, peer, rounds=ROUNDS, per_round=PER_ROUND, warmup=WARMUP, ours_settle=router.flush)
    return cmp, what


def _rows(label: str, cmp: Comparison, what: str, budget: float | None) -> list[dict]:
    deltas = sorted(cmp.round_deltas_p50)
    q1, q3 = deltas[len(deltas) // 4], deltas[(3 * len(deltas)) // 4]
    n = f"{cmp.rounds} interleaved rounds x {cmp.per_round} calls per side"
    out = [
        *dist_rows(f"{label}: router.chat", cmp.ours, measured=what),
        *dist_rows(f"{label}: bare SDK", cmp.peer),
        row(
            f"{label}: added per call at p50 (router - bare)",
            cmp.added_p50,
            "ms",
            budget=budget,
            n=cmp.ours.n,
            spread=f"per-round p50 deltas: median {statistics.median(deltas):.4f}, IQR {q1:.4f}-{q3:.4f} ms ({n})",
        ),
        row(f"{label}: added per call at p99 (router - bare)", cmp.added_p99, "ms", n=cmp.ours.n),
        row(f"{label}: router/bare p50 ratio", cmp.ours.p50 / cmp.peer.p50, "x", n=cmp.ours.n),
    ]
    if cmp.ours_settle_wall:
        out.append(
            row(
                f"{label}: telemetry left to write after a block, CPU per call",
                statistics.median(cmp.ours_settle_cpu_per_call),
                "ms",
                n=len(cmp.ours_settle_wall),
                spread=f"drain wall time per block: median {statistics.median(cmp.ours_settle_wall):.1f} ms "
                "(mostly the writer's flush_interval_s batching wait)",
                measured=(
                    "router.flush() after each block of router calls, outside the per-call samples: the "
                    "process CPU it took (the writer thread inserting the block's records) per call; "
                    "off the request path, so not in 'added per call', but it competes for the cores"
                ),
            )
        )
    return out


def _mock(tmp: Path) -> list[dict]:
    settings = _settings((REPO / "gateway.toml").read_text(), tmp)
    transports, bare = {}, {}
    for name, provider in settings.providers.items():
        sim = SimulatedProvider(name, provider.models, latency_scale=0.0, seed=1)
        transports[name] = make_transport(sim)
        bare[name] = openai.OpenAI(
            api_key="sim",
            base_url=f"http://{name}.sim/v1",
            max_retries=0,
            http_client=httpx2.Client(transport=transports[name]),
        )
    router = build_router(settings, transports=transports)
    try:
        cmp, what = _compare(router, bare, "mock transport")
    finally:
        router.close()
        for c in bare.values():
            c.close()
    return _rows("mock transport", cmp, what, None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_simulator() -> tuple[subprocess.Popen, str]:
    """The simulator's HTTP server (``app.simulator.make_server``, what ``python -m app simulate``
    serves) on a free loopback port, in its own process so it runs on the other core."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.router_bench", "--serve", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"simulator process exited: {proc.communicate()[1].strip()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the simulator did not listen within 60 s") from None
            threading.Event().wait(0.05)


def serve(port: int) -> None:
    """Serve both configured providers instantly (latency_scale 0) until terminated (the
    simulator's HTTP server sets TCP_NODELAY, so no 40 ms Nagle stall hides the difference)."""
    from app.simulator import make_server

    settings = load_settings(REPO / "gateway.toml", env={"DATABASE_URL": "sqlite:///unused.db"})
    providers = {
        name: SimulatedProvider(name, p.models, latency_scale=0.0, seed=1) for name, p in settings.providers.items()
    }
    server = make_server(providers, "127.0.0.1", port)
    server.serve_forever()


def _loopback(tmp: Path) -> list[dict]:
    proc, url = _start_simulator()
    try:
        toml = (REPO / "gateway.toml").read_text()
        for name in ("holysheep", "direct"):
            toml = toml.replace(f'"sim://{name}"', f'"{url}/{name}/v1"')
        settings = _settings(toml, tmp)
        assert all(not p.base_url.startswith("sim://") for p in settings.providers.values())
        bare = {
            name: openai.OpenAI(api_key="bench-key", base_url=f"{url}/{name}/v1", max_retries=0)
            for name in settings.providers
        }
        router = build_router(settings, env=KEYS)
        try:
            cmp, what = _compare(router, bare, "loopback HTTP")
            rows = _rows("loopback HTTP", cmp, what, ADDED_P50_BUDGET_MS)
            rows += _litellm(router, url)
        finally:
            router.close()
            for c in bare.values():
                c.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return rows


def _litellm(router: RoutingClient, url: str) -> list[dict]:
    """Ours vs ``litellm.Router`` (in its own venv and process) on the same loopback upstream.

    Optional (BENCH_LITELLM=0 skips it): when LiteLLM cannot be installed, say so and report ours."""
    label = "loopback HTTP vs LiteLLM"
    if os.environ.get("BENCH_LITELLM", "1") == "0":
        say(f"  {label}: skipped (BENCH_LITELLM=0)")
        return []
    from benchmarks.litellm_peer import VERSION, LiteLLMPeer, ensure_venv

    say(f"  {label}: preparing litellm[proxy]=={VERSION} in benchmarks/_work/litellm-venv (first run installs it)")
    reason = ensure_venv()
    if reason:
        say(f"  {label}: LiteLLM peer NOT measured: {reason}")
        return [{**row(f"{label}: LiteLLM peer not measured", 0.0, "n/a"), "value": None, "note": reason}]
    first = router.chat(MESSAGES, model="auto", session_id=SESSION)
    peer = LiteLLMPeer(f"{url}/{first.provider}/v1", first.model, MESSAGES)
    try:
        cmp = interleaved(
            per_call(lambda: router.chat(MESSAGES, model="auto", session_id=SESSION)),
            peer.block,
            rounds=ROUNDS,
            per_round=PER_ROUND,
            warmup=WARMUP,
            ours_settle=router.flush,
            blocks=True,
        )
    finally:
        peer.close()
    what = (
        f"{label}: router.chat(model='auto') vs litellm {VERSION} Router.completion(model={first.model!r}, "
        "num_retries=0) in its own process, timed there; same upstream, interleaved blocks"
    )
    say("  " + what)
    return [
        *dist_rows(f"{label}: litellm.Router.completion", cmp.peer, measured=what),
        row(f"{label}: router.chat p50 in this comparison", cmp.ours.p50, "ms", n=cmp.ours.n),
        row(f"{label}: router - LiteLLM per call at p50", cmp.added_p50, "ms", n=cmp.ours.n),
        row(f"{label}: router - LiteLLM per call at p99", cmp.added_p99, "ms", n=cmp.ours.n),
    ]


def run() -> list[dict]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-router-"))
    (tmp / "mock").mkdir()
    (tmp / "loopback").mkdir()
    say(f"  router: {ROUNDS} rounds x {PER_ROUND} calls per side per path (BENCH_ROUTER_ROUNDS / _PER_ROUND)")
    return [*_mock(tmp / "mock"), *_loopback(tmp / "loopback")]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(int(sys.argv[2]))
    else:
        for r in run():
            print(r)
