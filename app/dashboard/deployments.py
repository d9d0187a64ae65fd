"""The routes table of the Overview: each ``[routes]`` entry's deployments as configured (strategy,
weight, limits, canary) beside what they served in the window, from the rollups (a deployment is
a route's provider and the model sent to it, which the rollups key by), and its health across the
gateway's live processes (a cooldown lives in the process that saw the failures; each process
reports its own: :func:`db.breakers.live_cooldowns`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.config import Settings, deployment_model
from core.histogram import percentile
from db.breakers import LiveCooldown
from db.monitor import ProviderSums

HEALTHY = "ok"


def health_text(cooling: Sequence[LiveCooldown], now: float) -> str:
    """``cooling down (N s left) in server pid X`` for the process with the most left (and how
    many others hold it out too), or :data:`HEALTHY`."""
    if not cooling:
        return HEALTHY
    first = max(cooling, key=lambda c: c.until)
    text = f"cooling down ({first.left_s(now):.0f} s left) in {first.source} pid {first.pid}"
    others = len(cooling) - 1
    return text + (f" and {others} other process{'es' if others > 1 else ''}" if others else "")


def deployment_rows(
    settings: Settings,
    sums: Mapping[tuple[str, str, str], ProviderSums],
    route_ratios: Mapping[str, float],
    cooldowns: Mapping[str, Sequence[LiveCooldown]] | None = None,
    now: float = 0.0,
) -> list[dict]:
    """One row per deployment of every route, in configuration order (the canary last).
    ``cooldowns``: each deployment cooling down in a live process (:func:`db.breakers.live_cooldowns`
    at ``now``)."""
    rows: list[dict] = []
    for name, r in settings.routes.items():
        deps = [(d, False) for d in r.deployments] + ([(r.canary, True)] if r.canary is not None else [])
        total = sum(d.weight for d, canary in deps if not canary)
        for d, canary in deps:
            model = deployment_model(name, d)
            got = sums.get((name, d.provider, model))
            if canary:
                share = f"canary, {route_ratios.get(name, 0.0):.0%}"
            elif r.strategy == "weighted":
                share = f"weight {d.weight:g} of {total:g}"
            elif r.strategy == "ordered":
                share = f"priority {r.deployments.index(d) + 1}"
            else:
                share = r.strategy
            limits = ", ".join(x for x in (f"rpm {d.rpm:,}" if d.rpm else "", f"tpm {d.tpm:,}" if d.tpm else "") if x)
            p50 = percentile(got.lat, 0.5) if got is not None and got.lat else None
            rows.append(
                {
                    "route": name,
                    "strategy": r.strategy,
                    "deployment": f"{d.provider}/{model}",
                    "share": share,
                    "health": health_text((cooldowns or {}).get(f"{d.provider}/{model}", ()), now),
                    "limits": limits,
                    "attempts": got.attempts if got is not None else 0,
                    "error rate": (got.errors / got.attempts) if got is not None and got.attempts else None,
                    "p50 ms": round(p50) if p50 is not None else None,
                }
            )
    return rows
