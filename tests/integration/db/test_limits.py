"""Key limits across processes: two processes race for one key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from db.keys import create_key
from db.limits import (
    admit,
    spend,
    window_usage,
)
from tests.support import paths

REPO = paths.REPO


T0 = 1_790_000_040.0  # a whole minute (epoch seconds divisible by 60)


RPM = 50


_WORKER = r"""
import json, sys, threading
from concurrent.futures import ThreadPoolExecutor
from db.engine import get_engine
from db.keys import get_key
from db.limits import admit
url, name, now, n_threads, per_thread, go_file = sys.argv[1:7]
engine = get_engine(url)
key = get_key(engine, name)
print("ready", flush=True)
sys.stdin.readline()  # both processes start together
def work(_):
    return [admit(engine, key, est_cost_usd=0.01, now=float(now)).allowed for _ in range(int(per_thread))]
with ThreadPoolExecutor(int(n_threads)) as pool:
    allowed = sum(sum(b) for b in pool.map(work, range(int(n_threads))))
print(json.dumps({"allowed": allowed}), flush=True)
"""


def test_two_processes_race_for_one_key_exactly_rpm_admitted(db_url):
    from db.engine import dispose_all, get_engine

    engine = get_engine(db_url)  # migrate once here, so the workers only race for the key
    key, _ = create_key(engine, "shared", rpm=RPM, budget_usd=100, period="day")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, db_url, "shared", str(T0 + 7), "3", "15", ""],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(REPO),
        )
        for _ in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=120) for p in procs]
        for p, (_out, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, err
        per_process = [json.loads(out.strip().splitlines()[-1])["allowed"] for out, _ in outs]
        assert sum(per_process) == RPM  # 90 attempts across two processes, exactly 50 admitted
        assert window_usage(engine, key, now=T0 + 7)[0] == RPM
        assert spend(engine, key, now=T0).reserved_micro_usd == RPM * 10_000
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        dispose_all()


def test_rpm_never_above_the_limit_in_any_60_s_window_across_a_minute_boundary(engine):
    """Issue 18 item 8: rpm = 20 with a client retrying every 0.1 s around a minute boundary (an
    injected clock, one call per tick): the fixed window admitted 40 within 5.3 s; a sliding window
    admits at most 20 in every 60 s span."""
    key, _ = create_key(engine, "edge", rpm=20)
    admitted: list[float] = []
    for i in range(1500):  # T0 + 30 s .. T0 + 180 s, every 0.1 s
        ts = T0 + 30 + i / 10
        if admit(engine, key, now=ts).allowed:
            admitted.append(ts)
    assert len(admitted) >= 40  # it keeps admitting, minute after minute
    for i, ts in enumerate(admitted):  # the densest window starts at an admission
        in_window = [t for t in admitted[i:] if t - ts <= 60]
        assert len(in_window) <= 20, f"{len(in_window)} admitted in the 60 s from {ts - T0:.1f}"
    # The first 20 go at once, near T0+59.9 the fixed window would have reset: nothing new until T0+91.
    assert admitted[19] - T0 < 32 and min(t for t in admitted[20:]) - T0 >= 91
