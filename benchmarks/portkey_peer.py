"""Portkey's gateway as a peer of ``python -m benchmarks proxy``: npm ``@portkey-ai/gateway@1.15.2``
under Debian's ``nodejs``, installed on first use into ``benchmarks/_work/portkey``.

* ``@hono/node-server`` is pinned to 1.13.8 through npm ``overrides``: with newer ones Portkey's
  streams answer 500.
* Portkey listens on every interface; a ``node --import`` preload rewrites ``listen`` to bind
  127.0.0.1 only.
* It is routed per request with ``x-portkey-provider: openai`` and ``x-portkey-custom-host`` (the
  upstream's ``/v1``), with a bearer key the upstream ignores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

VERSION = "1.15.2"
HONO_NODE_SERVER = "1.13.8"
WORK = Path(__file__).resolve().parent / "_work" / "portkey"
ENTRY = WORK / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
PRELOAD = WORK / "bind-local.mjs"

_PRELOAD_SOURCE = """// Bind every listening socket of this process to 127.0.0.1 (Portkey listens on all interfaces).
import net from "node:net";
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number") {
    const callbacks = args.slice(1).filter((a) => typeof a === "function");
    return listen.call(this, args[0], "127.0.0.1", ...callbacks);
  }
  if (args[0] && typeof args[0] === "object" && !args[0].path) args[0] = { ...args[0], host: "127.0.0.1" };
  return listen.apply(this, args);
};
"""


def ensure() -> str | None:
    """None when Portkey is installed (installing it if needed); else why not."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return "Debian's nodejs/npm are not installed. Fix: apt-get install nodejs npm"
    WORK.mkdir(parents=True, exist_ok=True)
    PRELOAD.write_text(_PRELOAD_SOURCE)
    if ENTRY.exists():
        return None
    package = {
        "name": "bench-portkey-peer",
        "private": True,
        "dependencies": {"@portkey-ai/gateway": VERSION},
        "overrides": {"@hono/node-server": HONO_NODE_SERVER},
    }
    (WORK / "package.json").write_text(json.dumps(package, indent=2) + "\n")
    try:
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts"],
            cwd=WORK,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        return "npm install of @portkey-ai/gateway did not finish within 10 minutes"
    if done.returncode != 0 or not ENTRY.exists():
        return f"npm install of @portkey-ai/gateway@{VERSION} failed: {done.stderr.strip()[-300:]}"
    return None


def command(port: int) -> list[str]:
    node = shutil.which("node") or "node"
    return [node, "--import", str(PRELOAD), str(ENTRY), "--headless", f"--port={port}"]


def env() -> dict[str, str]:
    return dict(os.environ, NODE_ENV="production")


def headers(upstream: str) -> dict[str, str]:
    """The per-request routing headers (``upstream`` = ``http://127.0.0.1:PORT``)."""
    return {
        "x-portkey-provider": "openai",
        "x-portkey-custom-host": f"{upstream}/v1",
        "Authorization": "Bearer sk-bench-upstream",
    }
