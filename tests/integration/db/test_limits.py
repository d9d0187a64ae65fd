"""Key limits across processes: two processes race for one key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from db.keys import create_key
from db.limits import (
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
