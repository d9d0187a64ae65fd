"""Run-time fault injection for simulated providers: all its SQL.

A provider without a row uses the fault settings from the gateway config; the dashboard writes a row
to rehearse an outage and deletes it to go back to the config's values.
"""

from __future__ import annotations

import time

from sqlalchemy import Engine, delete, insert, select, update

from core.faults import FaultSettings
from db.models import SimFault

_FIELDS = list(FaultSettings.model_fields)


def get_faults(engine: Engine, provider: str) -> FaultSettings | None:
    """The database override for ``provider``, or ``None`` when the config's values apply."""
    with engine.connect() as conn:
        row = conn.execute(select(SimFault).where(SimFault.provider == provider)).mappings().first()
    if row is None:
        return None
    return FaultSettings(**{f: row[f] for f in _FIELDS})


def all_faults(engine: Engine) -> dict[str, FaultSettings]:
    with engine.connect() as conn:
        rows = conn.execute(select(SimFault)).mappings().all()
    return {r["provider"]: FaultSettings(**{f: r[f] for f in _FIELDS}) for r in rows}


def set_faults(engine: Engine, provider: str, faults: FaultSettings, *, actor: str) -> None:
    values = {**faults.model_dump(), "updated_at": time.time(), "updated_by": actor}
    with engine.begin() as conn:
        res = conn.execute(update(SimFault).where(SimFault.provider == provider).values(**values))
        if res.rowcount == 0:
            conn.execute(insert(SimFault).values(provider=provider, **values))


def clear_faults(engine: Engine, provider: str) -> None:
    with engine.begin() as conn:
        conn.execute(delete(SimFault).where(SimFault.provider == provider))
