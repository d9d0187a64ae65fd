"""The composition root: the one place the gateway's object graph is built and torn down.

:func:`build_gateway` is :func:`app.runtime.assemble` with the routing client
(:class:`~app.routing.io.client.RoutingClient`). The CLI, the dashboard, the server, the load generator
and the benchmarks all build through it; every constructor below it only stores what it is given.
"""

from __future__ import annotations

from typing import Any

from app.config import Settings
from app.routing.io.client import RoutingClient
from app.runtime import RATIO, Gateway, assemble

__all__ = ["RATIO", "Gateway", "build_gateway"]


def build_gateway(settings: Settings | None = None, **kwargs: Any) -> Gateway[RoutingClient]:
    """Build the whole object graph from ``settings`` (default: ``GATEWAY_CONFIG`` and
    ``DATABASE_URL``); ``kwargs`` are :func:`app.runtime.assemble`'s (transports, engine, env,
    secrets, source, clocks, rng, stop, telemetry, guardrail)."""
    return assemble(settings, RoutingClient, **kwargs)
