"""The configuration's built-in simulated providers (``sim://NAME``), each with its fault settings
read from the database (falling back to the config's) at most every half second.

The RoutingClient serves them in-process through the SDK's mock transport and
``python -m app simulate`` serves them over loopback HTTP: both build them here, so both behave the
same and both follow the fault injection set from the dashboard.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from functools import partial

from sqlalchemy import Engine

from app.config import Settings
from app.routing.canary import Refreshing
from app.simulator import SimulatedProvider
from core.faults import FaultSettings

FAULT_REFRESH_S = 0.5


@dataclass(frozen=True)
class SimulatedUpstream:
    provider: SimulatedProvider
    faults: Refreshing[FaultSettings]  # invalidate() to apply a change made by this process at once


def _current_faults(engine: Engine, name: str, configured: FaultSettings) -> FaultSettings:
    from db.faults import get_faults

    return get_faults(engine, name) or configured


def simulated_upstreams(settings: Settings, engine: Engine, skip: Container[str] = ()) -> dict[str, SimulatedUpstream]:
    """One simulator per ``sim://`` provider, keyed by the provider's name in the config."""
    out: dict[str, SimulatedUpstream] = {}
    for name, p in settings.providers.items():
        if not p.is_simulated or name in skip:
            continue
        faults = Refreshing(partial(_current_faults, engine, name, p.faults), FAULT_REFRESH_S)
        provider = SimulatedProvider(
            p.sim_name,
            p.models,
            faults=faults.get,
            latency_scale=settings.simulator.latency_scale,
            seed=settings.simulator.seed,
        )
        out[name] = SimulatedUpstream(provider, faults)
    return out
