"""``make run``: the dashboard and the gateway server together, both on 127.0.0.1.

Both ports are checked before anything starts: a taken port is one clear line and exit 2, never a
silent move to another port. Ctrl-C (SIGINT from the terminal reaches both children, they share
our process group) or SIGTERM (forwarded) stops both: the server drains its in-flight requests and
flushes the request log; if one child exits on its own, the other is stopped too.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

HOST = "127.0.0.1"
STOP_WAIT_S = 35.0  # the server's graceful drain (30 s) plus its log flush


@dataclass(frozen=True)
class Child:
    name: str
    argv: list[str]
    url: str


def port_problem(port: int, host: str = HOST) -> str | None:
    """Why ``port`` cannot be used, or None when it is free."""
    if not 1 <= port <= 65535:
        return f"port {port} is not between 1 and 65535"
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return f"{host}:{port} is already in use"
    return None


def children(dashboard_port: int, gateway_port: int, python: str = sys.executable) -> list[Child]:
    return [
        Child(
            "gateway server",
            [python, "-m", "app", "serve", "--host", HOST, "--port", str(gateway_port)],
            f"http://{HOST}:{gateway_port}/v1",
        ),
        Child(
            "dashboard",
            [
                python,
                "-m",
                "app",
                "dashboard",
                "--server.address",
                HOST,
                "--server.port",
                str(dashboard_port),
                "--server.headless",
                "true",
            ],
            f"http://{HOST}:{dashboard_port}",
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.launch", description=__doc__.splitlines()[0])
    parser.add_argument("--dashboard-port", type=int, default=8501)
    parser.add_argument("--gateway-port", type=int, default=8000)
    args = parser.parse_args(argv)

    problems = [
        f"{what} port: {problem}. Fix: stop what listens there, or choose another, e.g. make run {var}={port + 100}"
        for what, var, port in (
            ("dashboard", "DASHBOARD_PORT", args.dashboard_port),
            ("gateway", "GATEWAY_PORT", args.gateway_port),
        )
        if (problem := port_problem(port)) is not None
    ]
    if args.dashboard_port == args.gateway_port:
        problems.append("the dashboard and the gateway need two different ports")
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2

    kids = children(args.dashboard_port, args.gateway_port)
    env = dict(os.environ, GATEWAY_SERVER_URL=kids[0].url)
    procs = [subprocess.Popen(k.argv, env=env) for k in kids]
    print(
        f"\n  dashboard       {kids[1].url}\n  gateway server  {kids[0].url}  (OpenAI base_url)\n"
        "  first call:     python -m app keys create --name me   (prints a key once), then\n"
        f'                  curl {kids[0].url}/chat/completions -H "Authorization: Bearer $KEY" '
        '-d \'{"model":"auto","messages":[{"role":"user","content":"hi"}]}\'\n'
        "  Ctrl-C stops both (the server finishes its requests and flushes the log).\n",
        flush=True,
    )

    def forward(signum: int, frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    try:
        while all(p.poll() is None for p in procs):
            time.sleep(0.2)  # supervising two children; nothing to wake us sooner portably
    except KeyboardInterrupt:
        pass  # the terminal sent SIGINT to the children as well
    for proc in procs:  # one child ended (or Ctrl-C): stop the other gracefully
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    codes = {k.name: p.returncode for k, p in zip(kids, procs, strict=True)}
    print("stopped: " + ", ".join(f"{n} (exit {c})" for n, c in codes.items()), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
