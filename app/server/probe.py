"""Is the gateway server up? One ``GET /healthz`` with a short timeout, for the dashboard's Overview.

The address comes from ``GATEWAY_SERVER_URL`` (``make run`` sets it to the server it started),
else the default ``http://127.0.0.1:8000``. The probes of a process share one HTTP client: building
one loads the system trust store, which takes longer than the probe itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache

import httpx2

from app.server.defaults import DEFAULT_HOST, DEFAULT_PORT

ENV = "GATEWAY_SERVER_URL"
TIMEOUT_S = 0.5


@dataclass(frozen=True)
class ServerStatus:
    url: str  # the OpenAI base_url clients use (…/v1)
    up: bool
    detail: str  # "up" or why not, one line

    def line(self) -> str:
        return f"Gateway server {self.url}: {'up' if self.up else 'down (' + self.detail + ')'}"


def server_url(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return (env.get(ENV) or f"http://{DEFAULT_HOST}:{DEFAULT_PORT}").rstrip("/")


@cache
def _client() -> httpx2.Client:
    return httpx2.Client()


def _get(url: str, *, timeout: float) -> httpx2.Response:
    return _client().get(url, timeout=timeout)


def server_status(
    url: str | None = None, *, get: Callable[..., httpx2.Response] = _get, timeout_s: float = TIMEOUT_S
) -> ServerStatus:
    root = (url or server_url()).rstrip("/")
    if root.endswith("/v1"):
        root = root[:-3]
    base = root + "/v1"
    try:
        r = get(root + "/healthz", timeout=timeout_s)
    except httpx2.TimeoutException:
        return ServerStatus(base, False, f"no answer within {timeout_s:g} s")
    except httpx2.TransportError:
        return ServerStatus(base, False, "not running; start it with `make run` or `python -m app serve`")
    if r.status_code != 200:
        return ServerStatus(base, False, f"/healthz answered {r.status_code}")
    return ServerStatus(base, True, "up")
