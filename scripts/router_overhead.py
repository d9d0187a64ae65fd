"""Router overhead over real loopback sockets: the bare openai SDK against RoutingClient (explicit
model, and model="auto"), the simulator served by ``python -m app simulate`` in its own process.

Calls are interleaved one by one in a shuffled order, so machine load hits every variant alike; the
figure is the median over rounds of (router p50 - bare p50). ``--cpu`` times the calling thread's
CPU (``time.thread_time``) instead of the wall clock: on a loaded machine the wall-clock gap is the
CPU gap stretched by the scheduler.

    python scripts/router_overhead.py [rounds] [calls_per_round] [--cpu]

A quick diagnostic, not a benchmark (those live in benchmarks/).
"""

import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app.config import load_settings
from app.gateway import build_gateway
from db.canary import set_ratio

args = [a for a in sys.argv[1:] if not a.startswith("--")]
timer = time.thread_time if "--cpu" in sys.argv else time.perf_counter
rounds = int(args[0]) if args else 15
n = int(args[1]) if len(args) > 1 else 100
tmp = Path(tempfile.mkdtemp())
s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()
models = '["deepseek-chat-v3.2", "claude-sonnet-4-20250514", "gemini-2.5-flash", "gpt-4.1"]'
(tmp / "sim.toml").write_text(f"""
[routing]
primary = "holysheep"
fallback = "direct"
[providers.holysheep]
base_url = "sim://holysheep"
models = {models}
default_model = "gemini-2.5-flash"
[providers.direct]
base_url = "sim://direct"
models = {models}
default_model = "gpt-4.1"
[simulator]
latency_scale = 0
seed = 1
""")
(tmp / "router.toml").write_text(f"""
[routing]
primary = "holysheep"
fallback = "direct"
[providers.holysheep]
base_url = "http://127.0.0.1:{port}/holysheep/v1"
api_key_env = "K"
models = {models}
default_model = "gemini-2.5-flash"
[providers.direct]
base_url = "http://127.0.0.1:{port}/direct/v1"
api_key_env = "K"
models = {models}
default_model = "gpt-4.1"
""")
env = {**os.environ, "GATEWAY_CONFIG": str(tmp / "sim.toml"), "DATABASE_URL": f"sqlite:///{tmp}/sim.db"}
sim = subprocess.Popen(
    [sys.executable, "-m", "app", "simulate", "--port", str(port)], env=env, stderr=subprocess.DEVNULL
)
try:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    settings = load_settings(tmp / "router.toml", env={"DATABASE_URL": f"sqlite:///{tmp}/router.db"})
    gw = build_gateway(settings, env={"K": "x"})
    set_ratio(gw.engine, 0.5, expected_version=None, actor="bench", reason="half")
    gw.refresh()
    client = gw.client
    bare = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/holysheep/v1", api_key="x", max_retries=0)
    import httpx2

    bare_hc = openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/holysheep/v1", api_key="x", max_retries=0, http_client=httpx2.Client()
    )
    msgs = [{"role": "user", "content": "Summarise the benefits of a canary rollout in two sentences."}]
    variants = {
        "bare": lambda i: bare.chat.completions.create(model="gpt-4.1", messages=msgs),
        "bare_hc": lambda i: bare_hc.chat.completions.create(model="gpt-4.1", messages=msgs),
        "nohints": lambda i: client.chat(msgs, model="gpt-4.1", session_id=f"s{i % 50}", cache_hints=False),
        "explicit": lambda i: client.chat(msgs, model="gpt-4.1", session_id=f"s{i % 50}"),
        "auto": lambda i: client.chat(msgs, model="auto", session_id=f"s{i % 50}"),
    }
    for f in variants.values():
        for i in range(30):
            f(i)
    # Interleaved call by call (the order shuffled every round) so machine load hits every variant alike.
    per = {k: [] for k in variants}
    calls = {k: [] for k in variants}
    rng = random.Random(1)
    for _round in range(rounds):
        for i in range(n):
            order = list(variants)
            rng.shuffle(order)
            for k in order:
                t0 = timer()
                variants[k](i)
                calls[k].append(timer() - t0)
        for k in variants:
            per[k].append(statistics.median(calls[k][-n:]) * 1000)
    med = {k: statistics.median(v) for k, v in per.items()}
    for k in ("bare_hc", "nohints", "explicit", "auto"):
        diffs = [a - b for a, b in zip(per[k], per["bare"], strict=True)]
        q = statistics.quantiles(diffs, n=4)
        added = statistics.median(diffs)
        print(f"{k:9s} added p50 {added:.3f} ms (IQR {q[0]:.3f}..{q[2]:.3f}); ", end="")
        print(f"call p50 {med[k]:.3f} ms vs bare {med['bare']:.3f} ms")
    gw.close()
finally:
    sim.terminate()
    sim.wait()
