"""Issue 18 point 11: a program of its own that uses ``RoutingClient`` and is sent SIGTERM loses no
answered request (was 63 of 392 rows lost: Python's default SIGTERM runs no exit hooks). Real
subprocesses on a SQLite file, with a log flush interval long enough that answered requests are
still queued when the signal comes:

- the program left SIGTERM alone: the gateway's handler flushes the log, then the process still
  ends killed by SIGTERM (what a supervisor expects of the default);
- the program has a SIGTERM handler of its own: it is kept (never replaced), and its
  ``client.close()`` is what flushes."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.shutdown import DRAIN_S, SHUTDOWN_FLUSH_S
from tests.support import paths
from tests.support.chaos_upstream import ChaosUpstream, hang, server_error

REPO = paths.REPO
ANSWERED_BEFORE_SIGNAL = 60

PROGRAM = """
import signal, sys
from app.routing import RoutingClient

own_handler = sys.argv[1] == "own"
if own_handler:
    def stop(signum, frame):
        client.close()
        print("closed by the program's own handler", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
client = RoutingClient.from_config()
h = signal.getsignal(signal.SIGTERM)
print("handler", "own" if own_handler and h is stop else getattr(h, "__name__", str(h)), flush=True)
i = 0
while True:
    r = client.chat([{"role": "user", "content": f"hello {i}"}], session_id=f"s{i}")
    print("answered", r.request_id, flush=True)
    i += 1
"""


def run_and_terminate(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, list[str], list[str]]:
    config = tmp_path / "gateway.toml"
    # A 30 s flush interval and a batch larger than the run: every answered row is still queued.
    config.write_text(
        (REPO / "gateway.toml").read_text()
        + "\n[simulator]\nlatency_scale = 0\n[telemetry]\nflush_interval_s = 30\nbatch_size = 5000\n"
    )
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    db = tmp_path / "gateway.db"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DASHBOARD_PASSWORD",)},
        "GATEWAY_CONFIG": str(config),
        "DATABASE_URL": f"sqlite:///{db}",
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.Popen(
        [sys.executable, str(script), mode], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    answered: list[str] = []
    for line in proc.stdout:  # bounded by the program: it answers until the signal
        lines.append(line.strip())
        if line.startswith("answered "):
            answered.append(line.split()[1])
            if len(answered) == ANSWERED_BEFORE_SIGNAL:
                proc.send_signal(signal.SIGTERM)
                break
    rest, _ = proc.communicate(timeout=60)
    lines += rest.splitlines()
    answered += [line.split()[1] for line in rest.splitlines() if line.startswith("answered ")]
    con = sqlite3.connect(db)
    try:
        logged = {r[0] for r in con.execute("select distinct request_id from request_log")}
    finally:
        con.close()
    missing = [rid for rid in answered if rid not in logged]
    return proc, lines, missing


def test_a_program_without_a_handler_keeps_every_answered_row_and_still_dies_by_sigterm(tmp_path):
    proc, lines, missing = run_and_terminate(tmp_path, "default")
    assert missing == [], f"{len(missing)} answered requests not in request_log"
    assert lines[0] == "handler _close_then_default"
    assert proc.returncode == -signal.SIGTERM  # the default action, after the flush


def test_a_program_with_its_own_handler_keeps_it_and_closes_itself(tmp_path):
    proc, lines, missing = run_and_terminate(tmp_path, "own")
    assert lines[0] == "handler own"  # the gateway did not replace it
    assert "closed by the program's own handler" in lines
    assert missing == []
    assert proc.returncode == 143


LOCK_HELD_PROGRAM = """
import os, signal, sys, threading, time
sys.path.insert(0, sys.argv[1])
from app.shutdown import flush_on_sigterm

class Gateway:  # what flush_on_sigterm needs of one: its writer and close()
    telemetry = None
    _closed = False

    def close(self):
        print("closed", flush=True)

gateway = Gateway()
assert flush_on_sigterm(gateway)
print("installed", flush=True)
# The handler runs between two bytecodes of the main thread, which may hold a lock the flush needs:
# here the threading module's own. A thread started inside the handler to flush could not start
# until the handler returned, so the flush would be given up at its bound, the log unwritten.
with threading._active_limbo_lock:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
print("not killed", flush=True)
"""


def test_sigterm_landing_while_the_main_thread_holds_a_lock_still_flushes_and_dies_by_sigterm(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(LOCK_HELD_PROGRAM)
    proc = subprocess.run(
        [sys.executable, str(script), str(REPO)], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.stdout.splitlines() == ["installed", "closed"], proc.stderr
    assert proc.returncode == -signal.SIGTERM, proc.stderr


# -- signals ---------------------------------------------------------------------------------------
# Issue 7 #10: SIGTERM and SIGINT, sent to real ``python -m app`` processes in the middle of their work.
#
# Each command stops cleanly within a bounded wait, exits ``128 + signal`` (a shell's convention), and
# leaves every request it answered in the request log: ``chat`` interrupted during a hanging attempt
# keeps the attempt that had already failed; ``loadgen`` prints its report and every request the
# report counts is in the log; with the database locked, shutdown still ends within its bound.
#
# Waits are on conditions (the chaos upstream saw the request, the log holds N rows) with a bound; no
# test asserts a duration. The bounds (``communicate(timeout=...)``) are far above what a clean
# shutdown takes and far below what an unbounded one would.


KEY_ENV = "CHAOS_SIGNALS_KEY"
SIGNALS = [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGINT, id="SIGINT")]
# Far above a clean shutdown (milliseconds to a few seconds on a loaded machine), far below an
# unbounded one on a locked database (six retries of a 10 s lock wait).
EXIT_BOUND_S = 40.0


def _env(tmp_path: Path, config: str) -> tuple[dict[str, str], str]:
    path = tmp_path / "gateway.toml"
    path.write_text(config)
    db = tmp_path / "signals.db"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "GATEWAY_CONFIG")}
    env.update(
        DATABASE_URL=f"sqlite:///{db}", GATEWAY_CONFIG=str(path), PYTHONUNBUFFERED="1", **{KEY_ENV: "sk-signals"}
    )
    return env, str(db)


def _simulated(tmp_path: Path) -> tuple[dict[str, str], str]:
    return _env(tmp_path, (REPO / "gateway.toml").read_text() + "\n[simulator]\nlatency_scale = 0\n")


def _start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "app", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test started; any still running at the end (a failed test) is killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.communicate()


def _rows(db: str) -> list[tuple]:
    """(request_id, attempt, final, status, http_status) of every logged attempt; [] before the schema."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        return conn.execute(
            "select request_id, attempt, final, status, http_status, error_class from request_log order by attempt"
        ).fetchall()
    except sqlite3.OperationalError:  # the table does not exist yet
        return []
    finally:
        conn.close()


def _wait_for_final_rows(db: str, proc: subprocess.Popen[str], n: int, within_s: float = 90.0) -> None:
    deadline = time.monotonic() + within_s
    while sum(1 for r in _rows(db) if r[2]) < n:
        assert proc.poll() is None, f"exited early: {proc.communicate()}"
        assert time.monotonic() < deadline, f"fewer than {n} requests logged within {within_s}s"
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[str], sig: int) -> tuple[str, str]:
    proc.send_signal(sig)
    try:
        return proc.communicate(timeout=EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
        pytest.fail(f"no exit within {EXIT_BOUND_S}s of {signal.Signals(sig).name}; stderr: {err[-2000:]}")


# -- chat --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS)
def test_chat_interrupted_during_an_attempt_exits_and_keeps_the_attempts_before_it(tmp_path, procs, sig):
    with ChaosUpstream() as up:
        up.script(server_error(), hang(), provider="chaos")
        env, db = _env(
            tmp_path,
            f"""
[routing]
primary = "chaos"
fallback = "direct"
initial_ratio = 1.0
[retry]
base_delay_s = 0
[providers.chaos]
base_url = "{up.base_url("chaos")}"
api_key_env = "{KEY_ENV}"
models = ["gpt-4.1"]
default_model = "gpt-4.1"
[providers.direct]
base_url = "sim://direct"
models = ["gpt-4.1"]
default_model = "gpt-4.1"
[simulator]
latency_scale = 0
""",
        )
        proc = _start(env, "chat", "hi")
        procs.append(proc)
        up.wait_for_requests(2, timeout_s=90)  # the 500 answered, the retry now hangs
        out, err = _stop(proc, sig)
    assert proc.returncode == 128 + sig, err
    assert err.strip().splitlines() == [f"interrupted by {signal.Signals(sig).name}"]
    assert "Traceback" not in err and out == ""
    rows = _rows(db)
    # The failed attempt is logged, and so is the one the signal cut (the upstream had it), as the
    # request's last: nothing was answered after it.
    assert [(r[1], r[3], r[4], r[5]) for r in rows] == [
        (1, "error", 500, "server_error"),
        (2, "error", None, "cancelled"),
    ]
    assert not rows[0][2] and rows[1][2]


# -- loadgen -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", SIGNALS)
def test_loadgen_stopped_mid_traffic_prints_its_report_and_loses_nothing(tmp_path, procs, sig):
    env, db = _simulated(tmp_path)
    proc = _start(env, "loadgen", "--rps", "40", "--duration", "600", "--seed", "7", "--quiet")
    procs.append(proc)
    _wait_for_final_rows(db, proc, 20)
    out, err = _stop(proc, sig)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["interrupted"] == signal.Signals(sig).name
    assert 20 <= report["sent"] < 40 * 600 and report["planned"] == report["sent"] + report["unfinished"]
    assert report["unfinished"] == 0  # the instant simulator answers well within the drain
    rows = _rows(db)
    final = [r for r in rows if r[2]]
    assert len(final) == len({r[0] for r in final}) == report["sent"]  # every answered request, once
    assert sum(1 for r in final if r[3] == "ok") == report["ok"]


def test_loadgen_on_a_locked_database_still_exits_within_its_bound(tmp_path, procs):
    """SQLite locked by another process: the log cannot be written, and shutdown must not wait for
    it. The records it could not write are either kept in the journal (replayed by the next process
    that opens the log) or counted on stderr; this test accepts either, and checks the replay when
    no loss was reported."""
    env, db = _simulated(tmp_path)
    proc = _start(env, "loadgen", "--rps", "40", "--duration", "600", "--seed", "8", "--quiet")
    procs.append(proc)
    _wait_for_final_rows(db, proc, 10)
    locker = sqlite3.connect(db, timeout=30, isolation_level=None)
    locker.execute("begin exclusive")
    try:
        out, err = _stop(proc, signal.SIGTERM)
    finally:
        locker.execute("rollback")
        locker.close()
    assert proc.returncode == 128 + signal.SIGTERM, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["interrupted"] == "SIGTERM" and report["sent"] >= 10
    warned = [line for line in err.splitlines() if "did not flush within" in line]
    if warned:  # the loss is stated, with the bound
        assert f"{SHUTDOWN_FLUSH_S:g} s" in warned[0] and "not written" in warned[0]
    else:  # nothing lost: what the database did not take is replayed by the next process
        chat = subprocess.run(
            [sys.executable, "-m", "app", "chat", "hi"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
        )
        assert chat.returncode == 0, chat.stderr
        final = [r for r in _rows(db) if r[2]]
        assert len({r[0] for r in final}) == report["sent"] + 1


def test_the_shutdown_bounds_fit_a_container_stop():
    """Docker's default grace between SIGTERM and SIGKILL is 10 s: drain plus flush must fit in it."""
    assert DRAIN_S + SHUTDOWN_FLUSH_S < 10


# -- simulate and dashboard ----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(proc: subprocess.Popen[str], port: int, within_s: float = 90.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        assert proc.poll() is None, f"exited early: {proc.communicate()}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "not listening in time"
            time.sleep(0.05)


def _wait_healthy(proc: subprocess.Popen[str], port: int, within_s: float = 90.0) -> None:
    import urllib.request

    deadline = time.monotonic() + within_s
    while True:
        assert proc.poll() is None, f"exited early: {proc.communicate()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, "dashboard not healthy in time"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", SIGNALS)
def test_simulate_stops_serving_on_a_signal(tmp_path, procs, sig):
    env, _ = _simulated(tmp_path)
    port = _free_port()
    proc = _start(env, "simulate", "--port", str(port))
    procs.append(proc)
    _wait_listening(proc, port)
    _, err = _stop(proc, sig)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err, err[-3000:]
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()


@pytest.mark.parametrize("sig", SIGNALS)
def test_dashboard_stops_on_a_signal(tmp_path, procs, sig):
    """``dashboard`` execs Streamlit, whose own handler stops the server on SIGTERM and SIGINT and
    exits 0; the request log of a session's client is flushed by the writer's exit hook."""
    env, _ = _simulated(tmp_path)
    port = _free_port()
    proc = _start(env, "dashboard", "--server.port", str(port), "--server.headless", "true")
    procs.append(proc)
    _wait_healthy(proc, port)  # Streamlit's handler is installed once the server has started
    _, err = _stop(proc, sig)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
