"""The configuration's built-in simulated providers (``sim://NAME``), each following its fault
settings: the database's override when one is set, else the config's.

The gateway serves them in-process through the SDK's mock transport and ``python -m app simulate``
serves them over loopback HTTP: both build them here, so both behave the same and both follow the
fault injection set from the dashboard. The fault settings are kept current by the gateway's
background :class:`~app.refresh.Refresher`; a simulated request reads the last loaded value.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from functools import partial

from sqlalchemy import Engine

from app.config import Settings
from app.refresh import Refreshed, Refresher
from app.simulator import SimulatedProvider
from core.faults import FaultSettings, effective_faults


@dataclass(frozen=True)
class SimulatedUpstream:
    provider: SimulatedProvider
    faults: Refreshed[FaultSettings]


def _current_faults(engine: Engine, name: str, configured: FaultSettings) -> FaultSettings:
    from db.faults import get_faults

    return effective_faults(get_faults(engine, name), configured)


def simulated_upstreams(
    settings: Settings, engine: Engine, refresher: Refresher, skip: Container[str] = ()
) -> dict[str, SimulatedUpstream]:
    """One simulator per ``sim://`` provider, keyed by the provider's name in the config; each one's
    fault settings are registered with ``refresher`` as ``faults:NAME``."""
    out: dict[str, SimulatedUpstream] = {}
    for name, p in settings.providers.items():
        if not p.is_simulated or name in skip:
            continue
        faults = refresher.add(f"faults:{name}", partial(_current_faults, engine, name, p.faults))
        provider = SimulatedProvider(
            p.sim_name,
            p.models,
            faults=faults.get,
            latency_scale=settings.simulator.latency_scale,
            seed=settings.simulator.seed,
            apis=set(p.apis),  # a simulated provider serves what its config says, no more
        )
        out[name] = SimulatedUpstream(provider, faults)
    return out
