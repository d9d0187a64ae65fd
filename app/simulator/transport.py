"""The mock transport that puts a ``SimulatedProvider`` under the OpenAI SDK's HTTP client."""

from __future__ import annotations

import httpx2

from app.simulator.server import SimulatedProvider

__all__ = ["make_transport"]


def make_transport(provider: SimulatedProvider) -> httpx2.MockTransport:
    """``httpx2.Client(transport=make_transport(p))`` sends every request to ``p`` in-process."""
    return httpx2.MockTransport(provider.handle)
