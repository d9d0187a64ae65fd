"""A real ``python -m app serve`` process for tests: a free loopback port, its own config and
database, started and waited for (``/healthz``, bounded), stopped with SIGTERM.

The config points both providers at a :class:`tests.support.chaos_upstream.ChaosUpstream`
(``holysheep`` = primary, ``direct`` = fallback); ``initial_ratio = 0`` sends every request to
``direct`` with no fallback route, so each test scripts exactly one upstream answer per request.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx2

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_KEY = "sk-upstream-test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chaos_config(
    upstream_url: str,
    *,
    ratio: float = 0.0,
    timeout_s: float = 10.0,
    max_attempts: int = 1,
    models: tuple[str, ...] = ("gpt-4.1", "gemini-2.5-flash"),
    apis: tuple[str, ...] | None = None,
) -> str:
    """``models``: what both providers serve (the first is their default model); ``apis``: the
    APIs they serve (default: every one; without "responses" the gateway bridges that API to chat)."""
    listed = ", ".join(f'"{m}"' for m in models)
    served = "" if apis is None else "apis = [" + ", ".join(f'"{a}"' for a in apis) + "]\n"

    def provider(name: str) -> str:
        return (
            f'[providers.{name}]\nbase_url = "{upstream_url}/{name}/v1"\napi_key_env = "CHAOS_KEY"\n'
            f'models = [{listed}]\ndefault_model = "{models[0]}"\ntimeout_s = {timeout_s}\n{served}'
        )

    return (
        f'[routing]\nprimary = "holysheep"\nfallback = "direct"\ninitial_ratio = {ratio}\n'
        f"[retry]\nmax_attempts = {max_attempts}\nbase_delay_s = 0\n"
        "[telemetry]\nflush_interval_s = 0.05\n" + provider("holysheep") + provider("direct")
    )


@dataclass
class ServeProcess:
    proc: subprocess.Popen
    port: int
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def terminate(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def stderr(self) -> str:
        return self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""


def env_for(config_path: Path, database_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GATEWAY_CONFIG=str(config_path),
        DATABASE_URL=database_url,
        CHAOS_KEY=UPSTREAM_KEY,
        PYTHONPATH=str(REPO),
        LOG_LEVEL="WARNING",
    )
    return env


def _spawn(
    config_path: Path,
    database_url: str,
    port: int | None,
    args: tuple[str, ...],
    preexec_fn: Callable[[], None] | None,
    stdout: int | None,
) -> ServeProcess:
    port = port or free_port()
    env = env_for(config_path, database_url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port), *args],
        cwd=REPO,
        env=env,
        stdout=stdout,
        stderr=subprocess.PIPE,
        preexec_fn=preexec_fn,
    )
    return ServeProcess(proc, port, env)


def _wait_ready(sp: ServeProcess, deadline: float, wait_s: float) -> None:
    proc = sp.proc
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"serve exited with {proc.returncode}: {sp.stderr()}")
        try:
            if httpx2.get(f"{sp.url}/healthz", timeout=1).status_code == 200:
                return
        except httpx2.TransportError:
            pass
        time.sleep(0.05)  # polling a condition with a bound
    sp.terminate()
    raise RuntimeError(f"serve did not answer /healthz within {wait_s}s")


def start(
    config_path: Path,
    database_url: str,
    *,
    port: int | None = None,
    wait_s: float = 60.0,
    args: tuple[str, ...] = (),
    preexec_fn: Callable[[], None] | None = None,
    stdout: int | None = subprocess.DEVNULL,
) -> ServeProcess:
    """``preexec_fn`` runs in the child before ``serve`` starts (e.g. lowering its open-file limit)."""
    sp = _spawn(config_path, database_url, port, args, preexec_fn, stdout)
    _wait_ready(sp, time.monotonic() + wait_s, wait_s)
    return sp


def start_many(
    n: int, config_path: Path, database_url: str, *, wait_s: float = 60.0, args: tuple[str, ...] = ()
) -> list[ServeProcess]:
    """``n`` serve processes on one config and database, started together (their interpreters load
    at the same time instead of one after another) and each waited for as :func:`start` does. A new
    SQLite file is migrated once though they start together (db/test_migrate.py checks that)."""
    procs = [_spawn(config_path, database_url, None, args, None, subprocess.DEVNULL) for _ in range(n)]
    deadline = time.monotonic() + wait_s
    try:
        for sp in procs:
            _wait_ready(sp, deadline, wait_s)
    except BaseException:
        for sp in procs:
            sp.terminate()
        raise
    return procs


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def wait_for(predicate, *, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)  # polling a condition with a bound, not a timed assertion
    raise AssertionError(f"timed out waiting for {what}")
