"""One source of truth for breaker state (issue 28, item 2), with real processes: a ``loadgen``
process opens holysheep's breaker and is killed with it open; once its heartbeat is older than
:data:`db.breakers.LIVE_S`, the Overview's incident banner no longer shows the breaker, while the
merged transitions in ``ops_event`` still end in "open" (what the banner read before), and the
``serve`` process that stayed up says "closed" both in the database and on ``/metrics``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx2

from core.faults import FaultSettings
from db.breakers import LIVE_S, live_breakers
from db.engine import dispose_all, get_engine
from db.faults import clear_faults, set_faults
from db.incidents import breaker_transitions
from tests.support import serve_process
from tests.support.serve_process import REPO, env_for, wait_for

CONFIG = """
[routing]
primary = "holysheep"
fallback = "direct"
initial_ratio = 1.0

[providers.holysheep]
base_url = "sim://holysheep"
api_key_env = "HOLYSHEEP_API_KEY"
models = ["gpt-4.1", "gemini-2.5-flash"]
default_model = "gpt-4.1"

[providers.direct]
base_url = "sim://direct"
api_key_env = "OPENAI_API_KEY"
models = ["gpt-4.1", "gemini-2.5-flash"]
default_model = "gpt-4.1"

[breaker]
min_attempts = 5
cooldown_s = 600        # the killed process's breaker stays open: nothing but its death ends it

[guardrail]
enabled = false

[simulator]
latency_scale = 0.0

[telemetry]
flush_interval_s = 0.05
"""


def _metric(url: str, provider: str) -> float:
    body = httpx2.get(f"{url}/metrics", timeout=5).text
    for line in body.splitlines():
        if line.startswith("gateway_circuit_breaker_state{") and f'gen_ai_system="{provider}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no breaker gauge for {provider} in /metrics")


def _breaker_incident(engine, now: float):
    from app.monitor.incidents import current_incidents

    # No last-minute counts: only the breaker can raise the banner here.
    found = current_incidents(engine, ["holysheep", "direct"], now=now, last_minute={}, primary="holysheep")
    return [i for i in found if i.breaker_state is not None]


def test_a_process_killed_with_its_breaker_open_stops_counting(tmp_path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG)
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    engine = get_engine(url)
    set_faults(engine, "holysheep", FaultSettings(error_rate=1.0), actor="test")
    serve = serve_process.start(config, url)
    loadgen = subprocess.Popen(
        [sys.executable, "-m", "app", "loadgen", "--rps", "20", "--duration", "300", "--seed", "1"],
        cwd=REPO,
        env=env_for(config, url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        held = wait_for(
            # Both processes' reports: the loadgen's open breaker can land before serve's first one.
            lambda: (
                (b := live_breakers(engine, now=time.time()).get("holysheep"))
                and b.processes == 2
                and b.state == "open"
                and b
            ),
            timeout_s=60,
            what="the loadgen process to report holysheep's breaker open, and serve its own",
        )
        assert held.state == "open" and held.holding == 1  # the loadgen holds it; serve reports closed
        banner = _breaker_incident(engine, time.time())
        assert [(i.provider, i.breaker_state) for i in banner] == [("holysheep", "open")]
        assert _metric(serve.url, "holysheep") == 0  # serve's own breaker never saw a failure

        os.kill(loadgen.pid, signal.SIGKILL)  # mid-incident: no clean close, no "closed" event
        loadgen.wait(timeout=30)
        clear_faults(engine, "holysheep")

        wait_for(
            lambda: live_breakers(engine, now=time.time())["holysheep"].state == "closed",
            timeout_s=LIVE_S + 30,
            what="the killed process's report to go stale",
        )
        now = time.time()
        # What the banner used to read still ends in "open": the killed process never closed it.
        assert breaker_transitions(engine, since=now - 3600, until=now)["holysheep"][-1][1] == "open"
        assert _breaker_incident(engine, now) == []
        assert _metric(serve.url, "holysheep") == 0  # the banner and /metrics agree
        still = live_breakers(engine, now=now)["holysheep"]
        assert (still.processes, still.holding) == (1, 1)  # serve alone, reporting closed
    finally:
        if loadgen.poll() is None:
            loadgen.kill()
        assert serve.terminate() == 0
        dispose_all()
    # serve's clean exit took its rows with it.
    engine = get_engine(url)
    try:
        assert live_breakers(engine, now=time.time()) == {}
    finally:
        dispose_all()
